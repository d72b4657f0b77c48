// CPU matmul: out[M, N] = x[M, K] · Wᵀ with W [N, K] stored as F32, BF16, F16 or block-scaled FP8.
// Tiling: threads split N into column ranges; each walks M in blocks of kBlockM rows and, per
// block, N in tiles of kNr weight rows. A kMr x kNr micro-kernel keeps 16 vector accumulators
// (dot-product form along K, 8 loads per 16 FMAs), then reduces each with simd::hsum. The
// per-element arithmetic (16-lane partial sums in K order, fixed tree, scalar K tail) is the
// same for every M, tile and thread count: batch-invariant by construction.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"

namespace deepinfer {
namespace {

constexpr int kMr = 4;
constexpr int kNr = 4;
constexpr int64_t kBlockM = 64;

// W rows as fp32 (direct pointer) or bf16 (widened on load).
template <typename WT>
inline simd::v16f load_w(const WT* p);
template <>
inline simd::v16f load_w<float>(const float* p) { return simd::load(p); }
template <>
inline simd::v16f load_w<uint16_t>(const uint16_t* p) { return simd::load_bf16(p); }
template <typename WT>
inline float scalar_w(WT v);
template <>
inline float scalar_w<float>(float v) { return v; }
template <>
inline float scalar_w<uint16_t>(uint16_t v) { return bf16_to_f32(v); }

// out[i, j] = Σ_k x[i, k] w[j, k] for i < MR, j < nr (nr ≤ kNr).
template <int MR, typename WT>
inline void micro_kernel(const float* x, int64_t ldx, const WT* w, int64_t ldw, int nr, int64_t k, float* out,
                         int64_t ldo) {
  simd::v16f acc[MR][kNr];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kNr; ++j) acc[i][j] = simd::zero();
  const int64_t k16 = k / 16 * 16;
  if (nr == kNr) {
    for (int64_t kk = 0; kk < k16; kk += 16) {
      simd::v16f wv[kNr];
      for (int j = 0; j < kNr; ++j) wv[j] = load_w<WT>(w + j * ldw + kk);
      for (int i = 0; i < MR; ++i) {
        const simd::v16f xv = simd::load(x + i * ldx + kk);
        for (int j = 0; j < kNr; ++j) acc[i][j] = simd::fma(xv, wv[j], acc[i][j]);
      }
    }
  } else {
    for (int64_t kk = 0; kk < k16; kk += 16) {
      for (int j = 0; j < nr; ++j) {
        const simd::v16f wv = load_w<WT>(w + j * ldw + kk);
        for (int i = 0; i < MR; ++i) acc[i][j] = simd::fma(simd::load(x + i * ldx + kk), wv, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < nr; ++j) {
      float s = simd::hsum(acc[i][j]);
      for (int64_t kk = k16; kk < k; ++kk) s = std::fma(x[i * ldx + kk], scalar_w<WT>(w[j * ldw + kk]), s);
      out[i * ldo + j] = s;
    }
}

template <typename WT>
void tile_rows(const float* x, int64_t ldx, int64_t m, const WT* w, int64_t ldw, int nr, int64_t k, float* out,
               int64_t ldo) {
  int64_t i = 0;
  for (; i + kMr <= m; i += kMr) micro_kernel<kMr, WT>(x + i * ldx, ldx, w, ldw, nr, k, out + i * ldo, ldo);
  switch (m - i) {
    case 3: micro_kernel<3, WT>(x + i * ldx, ldx, w, ldw, nr, k, out + i * ldo, ldo); break;
    case 2: micro_kernel<2, WT>(x + i * ldx, ldx, w, ldw, nr, k, out + i * ldo, ldo); break;
    case 1: micro_kernel<1, WT>(x + i * ldx, ldx, w, ldw, nr, k, out + i * ldo, ldo); break;
    default: break;
  }
}

}  // namespace

void cpu_matmul_columns(const float* x, int64_t x_stride, int64_t m, const LinearWeight& w, int64_t n0, int64_t n1,
                        float* out, int64_t out_stride) {
  const int64_t k = w.n_in();
  const DType dt = w.dtype();
  // fp32 weights are read in place; bf16 in place for small M (decode), where widening on load
  // costs less than a scratch pass; everything else is dequantized per tile into scratch.
  const bool direct_f32 = dt == DType::kF32;
  const bool direct_bf16 = dt == DType::kBF16 && m <= kMr;
  std::vector<float> scratch;
  if (!direct_f32 && !direct_bf16) scratch.resize(static_cast<size_t>(kNr * k));
  for (int64_t mb = 0; mb < m; mb += kBlockM) {
    const int64_t mlen = std::min(kBlockM, m - mb);
    for (int64_t n = n0; n < n1; n += kNr) {
      const int nr = static_cast<int>(std::min<int64_t>(kNr, n1 - n));
      float* o = out + mb * out_stride + n;
      const float* xb = x + mb * x_stride;
      if (direct_f32) {
        tile_rows<float>(xb, x_stride, mlen, static_cast<const float*>(w.weight.raw_data()) + n * k, k, nr, k, o,
                         out_stride);
      } else if (direct_bf16) {
        tile_rows<uint16_t>(xb, x_stride, mlen, static_cast<const uint16_t*>(w.weight.raw_data()) + n * k, k, nr,
                            k, o, out_stride);
      } else {
        w.dequantize(n, nr, 0, k, scratch.data(), k);
        tile_rows<float>(xb, x_stride, mlen, scratch.data(), k, nr, k, o, out_stride);
      }
    }
  }
}

void CpuBackend::matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) {
  const int64_t m = out.size(0), n = w.n_out(), k = w.n_in();
  DI_CHECK_EQ(out.size(1), n);
  if (x_stride == 0) x_stride = k;
  if (m == 0 || n == 0) return;
  const float* xp = static_cast<const float*>(x.raw_data());
  float* op = out.data<float>();
  // Column ranges are multiples of kNr; the split never changes any element's arithmetic.
  pool_.parallel_for(n, kNr * 4, [&](int64_t n0, int64_t n1) { cpu_matmul_columns(xp, x_stride, m, w, n0, n1, op, n); });
}

}  // namespace deepinfer
