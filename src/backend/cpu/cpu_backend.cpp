#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/simd.h"

namespace deepinfer {

CpuBackend::CpuBackend(int n_threads) : pool_(n_threads) {}

namespace {

void rms_norm_row(const float* x, const Tensor& weight, float eps, int64_t d, float* out) {
  simd::v16f acc = simd::zero();
  int64_t j = 0;
  for (; j + 16 <= d; j += 16) {
    const simd::v16f v = simd::load(x + j);
    acc = simd::fma(v, v, acc);
  }
  float ss = simd::hsum(acc);
  for (; j < d; ++j) ss = std::fma(x[j], x[j], ss);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  if (weight.dtype() == DType::kF32) {
    const float* w = weight.data<float>();
    for (j = 0; j < d; ++j) out[j] = w[j] * (x[j] * inv);
  } else {
    for (j = 0; j < d; ++j) out[j] = load_float(weight, j) * (x[j] * inv);
  }
}

}  // namespace

void CpuBackend::rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) {
  const int64_t n = out.size(0), d = weight.numel(), od = out.size(1);
  DI_CHECK_GE(od, d);
  if (x_stride == 0) x_stride = d;
  const float* xp = static_cast<const float*>(x.raw_data());
  float* o = out.data<float>();
  pool_.parallel_for(n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rms_norm_row(xp + t * x_stride, weight, eps, d, o + t * od);
  });
}

void CpuBackend::add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) {
  const int64_t n = residual.size(0), d = residual.size(1);
  float* r = residual.data<float>();
  const float* dl = delta.data<float>();
  float* o = out.data<float>();
  pool_.parallel_for(n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < d; ++j) r[t * d + j] += dl[t * d + j];
      rms_norm_row(r + t * d, weight, eps, d, o + t * d);
    }
  });
}

void CpuBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  const int64_t n = out.size(0), inter = out.size(1);
  const float* g = gate_up.data<float>();
  float* o = out.data<float>();
  pool_.parallel_for(n * inter, 1024, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / inter, c = i % inter;
      const float a = g[t * 2 * inter + c];
      o[i] = a / (1.0f + std::exp(-a)) * g[t * 2 * inter + inter + c];
    }
  });
}

void CpuBackend::mlp(const Tensor& x, const MlpWeights& w, Tensor& out) {
  const int64_t n = x.size(0), inter = w.gate_proj.n_out();
  // gate and up land side by side in one [n, 2I] buffer, as silu_mul expects.
  Tensor gate_up = Tensor::empty_host(DType::kF32, {n, 2 * inter});
  const float* xp = x.data<float>();
  float* gu = gate_up.data<float>();
  const int64_t d = x.size(1);
  pool_.parallel_for(2 * inter, 16, [&](int64_t c0, int64_t c1) {
    // Columns [0, I) come from gate_proj, [I, 2I) from up_proj.
    if (c0 < inter) cpu_matmul_columns(xp, d, n, w.gate_proj, c0, std::min(c1, inter), gu, 2 * inter);
    if (c1 > inter)
      cpu_matmul_columns(xp, d, n, w.up_proj, std::max(c0, inter) - inter, c1 - inter, gu + inter, 2 * inter);
  });
  Tensor act = Tensor::empty_host(DType::kF32, {n, inter});
  silu_mul(gate_up, act);
  matmul(act, 0, w.down_proj, out);
}

void CpuBackend::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                             const std::vector<MlpWeights>& experts, Tensor& out) {
  const int64_t n = x.size(0), d = x.size(1), k = ids.size(1);
  const int64_t n_experts = static_cast<int64_t>(experts.size());
  const int32_t* id = ids.data<int32_t>();
  // Counting sort of (token, slot) pairs by expert; within an expert, ascending token order.
  std::vector<int64_t> count(static_cast<size_t>(n_experts + 1), 0);
  for (int64_t i = 0; i < n * k; ++i) {
    DI_CHECK(id[i] >= 0 && id[i] < n_experts);
    ++count[static_cast<size_t>(id[i]) + 1];
  }
  std::partial_sum(count.begin(), count.end(), count.begin());
  std::vector<int64_t> order(static_cast<size_t>(n * k));
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < n * k; ++i) order[static_cast<size_t>(fill[static_cast<size_t>(id[i])]++)] = i;
  }
  // Each expert's output rows go to y[(token, slot)], combined afterwards in slot order.
  Tensor y = Tensor::empty_host(DType::kF32, {n * k, d});
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t begin = count[static_cast<size_t>(e)], n_e = count[static_cast<size_t>(e) + 1] - begin;
    if (n_e == 0) continue;
    Tensor xe = Tensor::empty_host(DType::kF32, {n_e, d});
    for (int64_t r = 0; r < n_e; ++r) {
      const int64_t t = order[static_cast<size_t>(begin + r)] / k;
      std::copy(x.data<float>() + t * d, x.data<float>() + (t + 1) * d, xe.data<float>() + r * d);
    }
    Tensor ye = Tensor::empty_host(DType::kF32, {n_e, d});
    mlp(xe, experts[static_cast<size_t>(e)], ye);
    for (int64_t r = 0; r < n_e; ++r) {
      const int64_t slot = order[static_cast<size_t>(begin + r)];
      std::copy(ye.data<float>() + r * d, ye.data<float>() + (r + 1) * d, y.data<float>() + slot * d);
    }
  }
  const float* w = weights.data<float>();
  float* o = out.data<float>();
  pool_.parallel_for(n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* ot = o + t * d;
      std::fill(ot, ot + d, 0.0f);
      for (int64_t j = 0; j < k; ++j) simd::axpy(w[t * k + j], y.data<float>() + (t * k + j) * d, ot, d);
    }
  });
}

}  // namespace deepinfer
