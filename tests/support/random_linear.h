// Random Linear weights for op tests: N(0, 1/k) values, either as F32 (device backends place
// them as BF16) or as F8E4M3 codes with 128×128 block scales (varying per block) — a
// checkpoint's FP8 layout, partial blocks included.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

#include "backend/linear_weight.h"
#include "core/dtype.h"

namespace deepinfer::testing {

// Weight [n, k] in `dtype` (kF32 or kF8E4M3), on the host.
inline LinearWeight random_linear(std::mt19937& rng, int64_t n, int64_t k, DType dtype) {
  LinearWeight w;
  const float std = 1.0f / std::sqrt(static_cast<float>(k));
  std::normal_distribution<float> d(0.0f, std);
  Tensor f = Tensor::empty_host(DType::kF32, {n, k});
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = d(rng);
  if (dtype != DType::kF8E4M3) {
    w.weight = f;
    return w;
  }
  w.block_n = w.block_k = 128;
  const int64_t sr = (n + 127) / 128, sc = (k + 127) / 128;
  w.weight = Tensor::empty_host(DType::kF8E4M3, {n, k});
  w.scale_inv = Tensor::empty_host(DType::kF32, {sr, sc});
  for (int64_t i = 0; i < sr * sc; ++i)
    w.scale_inv.data<float>()[i] = std / 64.0f * (1.0f + 0.1f * static_cast<float>(i % 3));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      w.weight.data<uint8_t>()[r * k + c] =
          f32_to_e4m3(f.data<float>()[r * k + c] / w.scale_inv.data<float>()[(r / 128) * sc + c / 128]);
  return w;
}

}  // namespace deepinfer::testing
