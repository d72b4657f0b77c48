// The fixed-order fp32 dot products of the batch-invariant router GEMM (cuda_invariant_gemm.cu's
// gemm_f32_ordered family), shared with the kernels that compute router logits themselves
// (cuda_norm_route.cu) so every one gives the same bits: C[m, n] = Σ_k X[m, k] · W[n, k] in K
// chunks of kF32ChunkK; within chunk c lane l of a warp sums k = c·256 + 4l + q + 128j for
// j = 0, 1 and q = 0..3 in that order (j outer) with fmaf, skipping k ≥ K, the 32 lane sums meet
// in a butterfly (xor 16, 8, 4, 2, 1), and the chunk sums are added in chunk order (the first as
// is) by the caller.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {
namespace {

constexpr int64_t kF32ChunkK = 256;
static_assert(kF32ChunkK == 2 * 4 * 32, "a chunk is two float4 steps of a warp");

// Four consecutive values from k of a row (0 past its end, past K, or where !ok): one float4
// where vec (K % 4 == 0, rows 16-byte aligned: all four valid), else one by one.
__device__ __forceinline__ float4 load4_f32(const float* row, bool ok, int64_t k, int64_t K, bool vec) {
  if (!ok) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (vec) return *reinterpret_cast<const float4*>(row + k);
  return make_float4(k < K ? row[k] : 0.0f, k + 1 < K ? row[k + 1] : 0.0f, k + 2 < K ? row[k + 2] : 0.0f,
                     k + 3 < K ? row[k + 3] : 0.0f);
}

// One float4 step (k < K) of the chains of a kRows × kCols tile at (m0, n0): acc[i][jj] gets
// fmaf(X[m0 + i, k + q], W[n0 + jj, k + q], ·) for q = 0..3 in order, k + q < K only (rows past M
// and columns past N read zeros).
template <int kRows, int kCols>
__device__ __forceinline__ void chain_step(float (&acc)[kRows][kCols], const float* X, int64_t ldx, const float* W,
                                           int64_t M, int64_t N, int64_t K, int64_t m0, int64_t n0, int64_t k,
                                           bool vec) {
  const int n_valid = K - k < 4 ? static_cast<int>(K - k) : 4;
  float4 x[kRows], w[kCols];
#pragma unroll
  for (int i = 0; i < kRows; ++i) x[i] = load4_f32(X + (m0 + i) * ldx, m0 + i < M, k, K, vec);
#pragma unroll
  for (int jj = 0; jj < kCols; ++jj) w[jj] = load4_f32(W + (n0 + jj) * K, n0 + jj < N, k, K, vec);
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj) {
      float a = acc[i][jj];
      a = fmaf(x[i].x, w[jj].x, a);
      if (n_valid > 1) a = fmaf(x[i].y, w[jj].y, a);
      if (n_valid > 2) a = fmaf(x[i].z, w[jj].z, a);
      if (n_valid > 3) a = fmaf(x[i].w, w[jj].w, a);
      acc[i][jj] = a;
    }
}

// Chunk c's sums of the kRows × kCols tile at (m0, n0): lane l's chains over k = c·256 + 128j + 4l
// (j = 0, 1; chain_step), then the butterfly (xor 16 … 1): every lane holds all of them. An
// element's bits depend on neither the tile's shape nor its other elements.
template <int kRows, int kCols>
__device__ __forceinline__ void chunk_sums(float (&v)[kRows][kCols], const float* X, int64_t ldx, const float* W,
                                           int64_t M, int64_t N, int64_t K, int64_t m0, int64_t n0, int64_t c,
                                           int lane, bool vec) {
  float acc[kRows][kCols] = {};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int64_t k = c * kF32ChunkK + 128 * j + 4 * lane;
    if (k >= K) break;
    chain_step(acc, X, ldx, W, M, N, K, m0, n0, k, vec);
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int jj = 0; jj < kCols; ++jj) {
      float s = acc[i][jj];
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      v[i][jj] = s;
    }
}

}  // namespace
}  // namespace deepinfer::cuda
