#include "backend/linear_weight.h"

#include <algorithm>
#include <cstring>

#include <array>

#include "backend/cpu/simd.h"

namespace deepinfer {
namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

void LinearWeight::dequantize(int64_t n0, int64_t n_rows, int64_t k0, int64_t n_cols, float* out,
                              int64_t ld_out) const {
  DI_CHECK(n0 >= 0 && n0 + n_rows <= n_out() && k0 >= 0 && k0 + n_cols <= n_in());
  const int64_t ld = n_in();
  switch (weight.dtype()) {
    case DType::kF32: {
      const float* w = static_cast<const float*>(weight.raw_data());
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t k = 0; k < n_cols; ++k) out[r * ld_out + k] = w[(n0 + r) * ld + k0 + k];
      break;
    }
    case DType::kBF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.raw_data());
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t k = 0; k < n_cols; ++k) out[r * ld_out + k] = bf16_to_f32(w[(n0 + r) * ld + k0 + k]);
      break;
    }
    case DType::kF16: {
      const uint16_t* w = static_cast<const uint16_t*>(weight.raw_data());
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t k = 0; k < n_cols; ++k) out[r * ld_out + k] = f16_to_f32(w[(n0 + r) * ld + k0 + k]);
      break;
    }
    case DType::kF8E4M3: {
      // e4m3 → fp32 without a table: put the 7 magnitude bits where fp32's exponent and top
      // mantissa bits are (<< 20) and the sign at bit 31, then multiply by 2^120 (the bias
      // difference 127 - 7). Exact for normals and subnormals alike (e4m3 subnormals land on
      // fp32 subnormals and scale back up exactly). e4m3 NaN (0x7F) does not occur in weights.
      const uint8_t* w = static_cast<const uint8_t*>(weight.raw_data());
      const float* s = scale_inv.data<float>();
      const int64_t s_cols = scale_inv.size(1);
      const simd::v16f two_120 = simd::splat(0x1p120f);
      for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t n = n0 + r;
        const float* srow = s + (n / block_n) * s_cols;
        const uint8_t* wrow = w + n * ld;
        float* orow = out + r * ld_out;
        int64_t k = 0;
        while (k < n_cols) {
          const int64_t kk = k0 + k;
          const int64_t block_end = std::min(n_cols, (kk / block_k + 1) * block_k - k0);
          const float scale = srow[kk / block_k];
          const simd::v16f vscale = simd::splat(scale);
          for (; k + 16 <= block_end; k += 16) {
            const simd::v16u32 b = simd::load_u8_widen(wrow + k0 + k);
            const simd::v16u32 bits = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
            simd::store(orow + k, ((simd::v16f)bits * two_120) * vscale);
          }
          for (; k < block_end; ++k) orow[k] = e4m3_table()[wrow[k0 + k]] * scale;
        }
      }
      break;
    }
    default:
      DI_CHECK(false && "LinearWeight dtype validated at load");
  }
}

LinearWeight LinearWeight::rows(int64_t n0, int64_t n_rows) const {
  LinearWeight out = *this;
  out.weight = weight.slice_rows(n0, n0 + n_rows);
  if (weight.dtype() == DType::kF8E4M3) {
    DI_CHECK_EQ(n0 % block_n, 0);
    DI_CHECK(n_rows % block_n == 0 || n0 + n_rows == n_out());
    const int64_t s0 = n0 / block_n;
    const int64_t s1 = (n0 + n_rows + block_n - 1) / block_n;
    out.scale_inv = scale_inv.slice_rows(s0, s1);
  }
  out.uniform_row_blocks = uniform_row_blocks && n0 % 128 == 0;
  out.derived = Tensor();
  out.derived2 = Tensor();
  return out;
}

LinearWeight LinearWeight::columns(int64_t k0, int64_t n_cols) const {
  DI_CHECK(k0 >= 0 && n_cols >= 0 && k0 + n_cols <= n_in());
  LinearWeight out = *this;
  out.derived = Tensor();
  out.derived2 = Tensor();
  const int64_t n = n_out(), esize = static_cast<int64_t>(dtype_size(dtype()));
  out.weight = Tensor::empty_host(dtype(), {n, n_cols});
  const auto* src = static_cast<const uint8_t*>(weight.raw_data());
  auto* dst = static_cast<uint8_t*>(out.weight.raw_data());
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(dst + r * n_cols * esize, src + (r * n_in() + k0) * esize, static_cast<size_t>(n_cols * esize));
  if (dtype() == DType::kF8E4M3) {
    DI_CHECK_EQ(k0 % block_k, 0);
    DI_CHECK(n_cols % block_k == 0 || k0 + n_cols == n_in());
    const int64_t s_rows = scale_inv.size(0), s_cols = scale_inv.size(1);
    const int64_t c0 = k0 / block_k, nc = (n_cols + block_k - 1) / block_k;
    out.scale_inv = Tensor::empty_host(DType::kF32, {s_rows, nc});
    for (int64_t r = 0; r < s_rows; ++r)
      std::memcpy(out.scale_inv.data<float>() + r * nc, scale_inv.data<float>() + r * s_cols + c0,
                  sizeof(float) * static_cast<size_t>(nc));
  }
  return out;
}

LinearWeight concat_columns(const std::vector<const LinearWeight*>& parts) {
  DI_CHECK(!parts.empty());
  const LinearWeight& first = *parts[0];
  const int64_t n = first.n_out(), esize = static_cast<int64_t>(dtype_size(first.dtype()));
  const bool fp8 = first.dtype() == DType::kF8E4M3;
  int64_t K = 0, kb = 0;
  for (const LinearWeight* p : parts) {
    DI_CHECK(p->n_out() == n && p->dtype() == first.dtype());
    if (fp8) {
      DI_CHECK(p->block_n == first.block_n && p->block_k == first.block_k && K % first.block_k == 0);
      kb += p->scale_inv.size(1);
    }
    K += p->n_in();
  }
  LinearWeight out = first;
  out.weight = Tensor::empty_host(first.dtype(), {n, K});
  if (fp8) out.scale_inv = Tensor::empty_host(DType::kF32, {first.scale_inv.size(0), kb});
  int64_t k0 = 0, c0 = 0;
  for (const LinearWeight* p : parts) {
    const int64_t w = p->n_in();
    const auto* src = static_cast<const uint8_t*>(p->weight.raw_data());
    auto* dst = static_cast<uint8_t*>(out.weight.raw_data());
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst + (r * K + k0) * esize, src + r * w * esize, static_cast<size_t>(w * esize));
    if (fp8) {
      const int64_t nc = p->scale_inv.size(1);
      for (int64_t r = 0; r < out.scale_inv.size(0); ++r)
        std::memcpy(out.scale_inv.data<float>() + r * kb + c0, p->scale_inv.data<float>() + r * nc,
                    sizeof(float) * static_cast<size_t>(nc));
      c0 += nc;
    }
    k0 += w;
  }
  return out;
}

}  // namespace deepinfer
