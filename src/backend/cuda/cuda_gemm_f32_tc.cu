// The default mode's fp32 GEMM at prefill sizes (the MoE router: fp32 rows × fp32 weights, as the
// references compute it) on the TF32 tensor cores in three passes ("3xTF32"): each fp32 operand
// is split into its TF32 rounding and the TF32 rounding of the remainder, x = x_big + x_small, and
// C = Σ x_small·w_big + x_big·w_small + x_big·w_big accumulated in fp32. Each product is exact
// (11 × 11 significant bits); the error is the dropped x_small·w_small term and the remainders'
// rounding, ~2⁻²¹ of |x·w| — the order of fp32's own rounding, at the tensor cores' rate. cuBLAS's
// fp32 SGEMM (CUBLAS_COMPUTE_32F_PEDANTIC) ran V2-Lite's 4,096 × 64 × 2,048 router in ~39 µs
// (two kernels, 32 column blocks), a SIMT FFMA kernel needs ≥ 18 µs at the FMA rate. Not the
// batch-invariant router (gemm_f32_ordered fixes its order) and not decode sizes (the GEMV).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ptx.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kRtBM = 32;            // rows per block: two m16 fragments
constexpr int kRtBN = 64;            // output columns per block: 4 column warps × 16
constexpr int kRtBK = 32;            // K per pipeline stage: 4 k8 MMA steps
constexpr int kRtStages = 6;         // ~70 KB of X and W in flight per block: the stream is latency-bound
constexpr int kRtLd = kRtBK + 4;     // fp32 row pitch in shared memory: lanes (g, t) hit bank 4g + t
constexpr int kRtThreads = 256;      // 8 warps: 2 row halves × 4 column quarters
static_assert(kRtBM * kRtBK / 4 == kRtThreads, "one 16-byte A chunk per thread and stage");
static_assert(kRtBN * kRtBK / 4 == 2 * kRtThreads, "two 16-byte W chunks per thread and stage");

// x's TF32 rounding (big) and the TF32 rounding of what remains (small; exact in fp32).
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
  big = tf32_round(x);
  small = tf32_round(x - __uint_as_float(big));
}

// C[m, n] (row stride ldc) = Σ_k X[m, k] · W[n, k] for m < M, n < N (X row stride ldx, W [N, K]).
// Block (blockIdx.x, blockIdx.y): rows [32·x, +32), columns [64·y, +64); warp w takes rows
// 16·(w / 4) .. +16 and columns 16·(w % 4) .. +16 of it (two m16n8k8 tiles, three MMAs each per
// k8 step; the small terms in their own accumulators, so each k8 step's three MMAs per tile form
// two dependency chains, not one). Shared memory (dynamic): kRtStages × (X [32][36] | W [64][36])
// fp32 = 82,944 bytes, filled by a cp.async pipeline of 32-wide K steps; rows beyond M or N and K
// beyond K read as zeros. Preconditions (gemm_f32_3xtf32_ok): K % 4 == 0, ldx % 4 == 0, X and W
// 16-byte aligned.
__global__ void __launch_bounds__(kRtThreads) gemm_f32_3xtf32_kernel(const float* __restrict__ X, int64_t ldx,
                                                                     const float* __restrict__ W, int64_t M,
                                                                     int64_t N, int64_t K, float* __restrict__ C,
                                                                     int64_t ldc) {
  extern __shared__ __align__(16) float smem[];
  auto sx = reinterpret_cast<float (*)[kRtBM][kRtLd]>(smem);                        // [stage][row][k]
  auto sw = reinterpret_cast<float (*)[kRtBN][kRtLd]>(smem + kRtStages * kRtBM * kRtLd);  // [stage][col][k]
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = (warp / 4) * 16, wn = (warp % 4) * 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kRtBM, n0 = static_cast<int64_t>(blockIdx.y) * kRtBN;
  const int64_t n_steps = (K + kRtBK - 1) / kRtBK;

  auto load = [&](int stage, int64_t step) {
    const int64_t k0 = step * kRtBK;
    {
      const int r = tid / 8, c = (tid % 8) * 4;
      const int64_t row = m0 + r, k = k0 + c;
      const bool ok = row < M && k < K;
      cp_async16(smem_u32(&sx[stage][r][c]), ok ? X + row * ldx + k : X, ok);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int idx = tid + i * kRtThreads, r = idx / 8, c = (idx % 8) * 4;
      const int64_t row = n0 + r, k = k0 + c;
      const bool ok = row < N && k < K;
      cp_async16(smem_u32(&sw[stage][r][c]), ok ? W + row * K + k : W, ok);
    }
  };

#pragma unroll
  for (int s = 0; s < kRtStages - 1; ++s) {
    if (s < n_steps) load(s, s);
    cp_async_commit();
  }
  float acc[2][4] = {}, acc_small[2][4] = {};  // [8-column tile][fragment element] fp32: big·big, the rest
  for (int64_t step = 0; step < n_steps; ++step) {
    cp_async_wait<kRtStages - 2>();  // this step's stage has landed (for this thread) …
    __syncthreads();                 // … for every thread, and the previous step's stage is free
    const int64_t next = step + kRtStages - 1;
    if (next < n_steps) load(static_cast<int>(next % kRtStages), next);
    cp_async_commit();
    const int st = static_cast<int>(step % kRtStages);
#pragma unroll
    for (int kk = 0; kk < kRtBK; kk += 8) {
      uint32_t xb[4], xs[4];
      split_tf32(sx[st][wm + g][kk + t], xb[0], xs[0]);
      split_tf32(sx[st][wm + g + 8][kk + t], xb[1], xs[1]);
      split_tf32(sx[st][wm + g][kk + t + 4], xb[2], xs[2]);
      split_tf32(sx[st][wm + g + 8][kk + t + 4], xb[3], xs[3]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t wb0, ws0, wb1, ws1;
        split_tf32(sw[st][wn + 8 * j + g][kk + t], wb0, ws0);
        split_tf32(sw[st][wn + 8 * j + g][kk + t + 4], wb1, ws1);
        mma_tf32_1688(acc_small[j], xs, wb0, wb1);
        mma_tf32_1688(acc_small[j], xb, ws0, ws1);
        mma_tf32_1688(acc[j], xb, wb0, wb1);
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int64_t col = n0 + wn + 8 * j + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + wm + g + 8 * h;
      if (row >= M) continue;
      if (col < N) C[row * ldc + col] = acc[j][2 * h] + acc_small[j][2 * h];
      if (col + 1 < N) C[row * ldc + col + 1] = acc[j][2 * h + 1] + acc_small[j][2 * h + 1];
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemm_f32_3xtf32_ok(int64_t K, int64_t ldx, const float* X, const float* W) {
  return K > 0 && K % 4 == 0 && ldx % 4 == 0 && aligned16(X) && aligned16(W);
}

void gemm_f32_3xtf32(const float* X, int64_t ldx, const float* W, int64_t M, int64_t N, int64_t K, float* C,
                     int64_t ldc, cudaStream_t s) {
  if (M == 0 || N == 0) return;
  DI_CUDA_REQUIRE_MSG(gemm_f32_3xtf32_ok(K, ldx, X, W), "3xTF32 GEMM: K and ldx % 4 == 0, 16-byte aligned rows");
  DI_CUDA_REQUIRE(ldc >= N && (N + kRtBN - 1) / kRtBN <= 65535);
  constexpr size_t kSmem = sizeof(float) * kRtStages * (kRtBM + kRtBN) * kRtLd;
  static bool attr = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(gemm_f32_3xtf32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem)));
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>((M + kRtBM - 1) / kRtBM), static_cast<unsigned>((N + kRtBN - 1) / kRtBN));
  gemm_f32_3xtf32_kernel<<<grid, kRtThreads, kSmem, s>>>(X, ldx, W, M, N, K, C, ldc);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
