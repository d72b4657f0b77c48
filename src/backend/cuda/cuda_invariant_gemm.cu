// GEMMs whose per-element reduction order is fixed, for the batch-invariant mode
// (DEEPINFER_BATCH_INVARIANT=1): an output element never depends on how many rows the launch
// has, which rows share its tile, or which kernel of this family computed it.
//  - small_m_gemm: bf16 operands (FP8 weights widened to bf16 with their block scale, rounded as
//    the tiled grouped GEMM rounds them), fp32 accumulation on tensor cores through WMMA
//    m16n16k16 fragments in the batch-invariant K structure (cuda_common.h: 512-wide K splits,
//    each folded chunk by chunk from zero, split sums added in order). The tiled grouped GEMM's
//    versions 1 and 2 (cuda_moe.cu) with split_k = 512 do the same arithmetic, so the three give
//    bitwise-equal results and the backend may pick by size. This one is shaped for few rows:
//    16-row × 64-column tiles, a 4-stage cp.async pipeline of 64-wide K steps, a grid over
//    N × active experts × K splits (partials to scratch, then sum_splits adds them in order).
//    FP8 weights at ≤ kSmallMFewRows rows per expert go to a persistent form of the same
//    arithmetic instead (cuda_small_m_fp8.cu).
//  - gemm_f32_ordered: fp32 × fp32 (the MoE router): each element's sum in one fixed order
//    (per 256-wide K chunk 32 fmaf chains over float4 steps and a butterfly, chunks added in order),
//    whatever the tiling: a chain per lane with the chunks in sequence or in parallel blocks, or
//    (`tiled`, many rows) 4 chains per thread over a 4 × 4 register tile.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_f32_ordered.cuh"
#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"

#include <algorithm>

#include <mma.h>

namespace deepinfer::cuda {
namespace {

constexpr int kSmRows = 16;    // rows per tile (one WMMA fragment tall)
constexpr int kSmCols = 64;    // output columns per block: 4 warps × 16
constexpr int kSmK = 64;       // K per pipeline stage: 4 fragment MMAs
constexpr int kSmStages = 4;
constexpr int kSmPad = 8;      // bf16 row padding in shared memory (bank spread; 16-byte aligned rows)
constexpr int kSmLd = kSmK + kSmPad;
constexpr int kSmThreads = 128;

constexpr size_t kSmABytes = sizeof(bf16) * kSmRows * kSmLd;          // one stage of A
constexpr size_t kSmWBf16Bytes = sizeof(bf16) * kSmCols * kSmLd;      // one stage of W (bf16)
constexpr size_t kSmWFp8Bytes = static_cast<size_t>(kSmCols) * kSmK;  // one stage of W (raw FP8)

template <bool kFp8>
constexpr size_t small_m_smem() {
  // Stages of A and W, plus (FP8) one bf16 W buffer the raw stage is widened into. The epilogue's
  // [16][68] fp32 tile aliases the stages once the pipeline is drained.
  return kSmStages * (kSmABytes + (kFp8 ? kSmWFp8Bytes : kSmWBf16Bytes)) + (kFp8 ? kSmWBf16Bytes : 0);
}
static_assert(small_m_smem<false>() <= 48 * 1024 && small_m_smem<true>() <= 48 * 1024, "static shared memory");

// C[r, n] (row stride ldc) = Σ_k A[r, k] · W[e·N + n, k] for the rows r of expert e (grouped:
// rows [offsets[e], offsets[e+1]) of A and C, e = active[blockIdx.y], −1 = idle) or, with
// active == null, rows [0, dense_rows). Block: 4 warps, columns [n0, n0 + 64) (warp w: 16 of
// them), the expert's rows in passes of 16 (weights re-read from L2 for each pass).
// Preconditions: K % 8 == 0 (bf16) or K % 16 == 0 (FP8: 16-byte chunks of FP8 rows).
template <bool kFp8>
__global__ void __launch_bounds__(kSmThreads) small_m_gemm_kernel(const bf16* A, int64_t K, const void* W,
                                                                  const float* wscale, int64_t n_kb, int64_t block_k,
                                                                  int64_t N, const int32_t* offsets,
                                                                  const int32_t* active, int64_t dense_rows, float* C,
                                                                  int64_t ldc, float* part, int64_t part_rows) {
  // Dense (active == null): the first pass's weight stages go out before the wait for the previous
  // kernel (weights are never written by a kernel, cuda_launch.cuh); the grouped form's experts
  // come from the previous kernel's output, so it waits first.
  const bool early = active == nullptr;
  if (!early) pdl_wait();
  // No early pdl_trigger: the dependents' CTAs would wait beside this multi-wave GEMM's last
  // wave (FP8 decode B = 32: 15.2 → 16.2 ms per step with it; bf16 B = 1 3.55 → 3.49; run s7-6).
  using namespace nvcuda;
  const int e = active != nullptr ? active[blockIdx.y] : 0;
  if (e < 0) return;
  const int64_t r0 = active != nullptr ? offsets[e] : 0;
  const int64_t n_rows = active != nullptr ? offsets[e + 1] - r0 : dense_rows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kSmCols;

  __shared__ __align__(128) unsigned char smem[small_m_smem<kFp8>()];
  // FP8: each stage's block scales, one per (row, 16-column group), copied with the stage (the
  // widening then reads shared memory instead of waiting on a global load every step).
  __shared__ float s_scale[kFp8 ? kSmStages : 1][kFp8 ? kSmCols : 1][kSmK / 16];
  constexpr size_t kWStage = kFp8 ? kSmWFp8Bytes : kSmWBf16Bytes;
  // Stage s of A: bf16 [16][72]; of W: bf16 [64][72] or raw FP8 [64][64]; FP8's widened W: bf16 [64][72].
  auto a_stage = [&](int s) { return reinterpret_cast<bf16*>(smem + s * kSmABytes); };
  auto w_stage = [&](int s) { return smem + kSmStages * kSmABytes + s * kWStage; };
  bf16* w_wide = reinterpret_cast<bf16*>(smem + kSmStages * (kSmABytes + kWStage));
  const int t = threadIdx.x, warp = t / 32;
  // This block's K split: [k_begin, k_end). With several splits it writes its partial sums.
  const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * kInvariantSplitK;
  const int64_t k_end = gridDim.z > 1 ? min(K, k_begin + kInvariantSplitK) : K;
  const int64_t n_steps = (k_end - k_begin + kSmK - 1) / kSmK;
  float* out = C;
  int64_t ld_out = ldc;
  if (gridDim.z > 1) {
    out = part + static_cast<int64_t>(blockIdx.z) * part_rows * N;
    ld_out = N;
  }

  for (int64_t mc = 0; mc < n_rows; mc += kSmRows) {
    const int64_t rows = min(static_cast<int64_t>(kSmRows), n_rows - mc);
    const bf16* a_base = A + (r0 + mc) * K;
    // One stage: A 16 rows × 64 k (128 chunks of 8 bf16: one per thread); W 64 rows × 64 k
    // (bf16: 512 chunks, 4 per thread; FP8: 256 chunks of 16 bytes, 2 per thread).
    auto issue_a = [&](int64_t step) {
      const int s = static_cast<int>(step % kSmStages);
      const int64_t k0 = k_begin + step * kSmK;
      const int r = t / 8, c = (t % 8) * 8;
      const bool ok = r < rows && k0 + c < k_end;
      cp_async16(smem_u32(a_stage(s) + r * kSmLd + c), ok ? a_base + r * K + k0 + c : A, ok);
    };
    auto issue_w = [&](int64_t step) {
      const int s = static_cast<int>(step % kSmStages);
      const int64_t k0 = k_begin + step * kSmK;
      if constexpr (kFp8) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int idx = t + j * kSmThreads, r = idx / 4, c = (idx % 4) * 16;
          const int64_t n = n0 + r;
          const bool ok = n < N && k0 + c < k_end;
          const uint8_t* src = static_cast<const uint8_t*>(W) + (static_cast<int64_t>(e) * N + n) * K + k0 + c;
          cp_async16(smem_u32(w_stage(s) + r * kSmK + c), ok ? static_cast<const void*>(src) : W, ok);
          // Scale of row r, 16-column group idx % 4 (zero past N or K, as the codes).
          const int64_t kg = k0 + 16 * (idx % 4);
          const bool sok = n < N && kg < k_end;
          const float* ssrc = wscale + (static_cast<int64_t>(e) * N + n) * n_kb +
                              (sok ? static_cast<int>(kg) / static_cast<int>(block_k) : 0);
          cp_async4(smem_u32(&s_scale[s][r][idx % 4]), sok ? ssrc : wscale, sok);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int idx = t + j * kSmThreads, r = idx / 8, c = (idx % 8) * 8;
          const int64_t n = n0 + r;
          const bool ok = n < N && k0 + c < k_end;
          const bf16* src = static_cast<const bf16*>(W) + (static_cast<int64_t>(e) * N + n) * K + k0 + c;
          cp_async16(smem_u32(reinterpret_cast<bf16*>(w_stage(s)) + r * kSmLd + c),
                     ok ? static_cast<const void*>(src) : W, ok);
        }
      }
    };
    auto issue = [&](int64_t step) {
      issue_a(step);
      issue_w(step);
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    const bool pre = early && mc == 0;  // the first stages' weights before the wait
    if (pre) {
#pragma unroll
      for (int s = 0; s < kSmStages - 1; ++s)
        if (s < n_steps) issue_w(s);
      pdl_wait();
    }
#pragma unroll
    for (int s = 0; s < kSmStages - 1; ++s) {
      if (s < n_steps) {
        if (!pre) issue_w(s);
        issue_a(s);
      }
      cp_async_commit();  // empty groups keep the wait count uniform (the first also holds `pre`'s)
    }
    for (int64_t step = 0; step < n_steps; ++step) {
      cp_async_wait<kSmStages - 2>();
      __syncthreads();  // stage `step` visible to all; the buffer refilled below is free
      if (step + kSmStages - 1 < n_steps) issue(step + kSmStages - 1);
      cp_async_commit();
      const int s = static_cast<int>(step % kSmStages);
      const bf16* ws = reinterpret_cast<const bf16*>(w_stage(s));
      if constexpr (kFp8) {
        // Each warp widens its own 16 rows of the raw stage into its slice of w_wide:
        // bf16(fp8 · scale), the tiled kernels' rounding. Lane l: row l / 2, 32 columns from
        // (l % 2) · 32, in two 16-column groups (one scale each, staged in s_scale:
        // block_k % 16 == 0).
        const int lane = t % 32, r = warp * 16 + lane / 2, c0 = (lane % 2) * 32;
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          const int c = c0 + 16 * g;
          widen_fp8x16(*reinterpret_cast<const uint4*>(w_stage(s) + r * kSmK + c), s_scale[s][r][c / 16],
                       w_wide + r * kSmLd + c);
        }
        __syncwarp();
        ws = w_wide;
      }
#pragma unroll
      for (int kk = 0; kk < kSmK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, a_stage(s) + kk, kSmLd);
        wmma::load_matrix_sync(fb, ws + warp * 16 * kSmLd + kk, kSmLd);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      if constexpr (kFp8) __syncwarp();  // the warp's w_wide rows are rewritten by the next step
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp done with the stages: the epilogue tile may alias them
    float* cs = reinterpret_cast<float*>(smem);  // [16][68]
    wmma::store_matrix_sync(cs + warp * 16, acc, kSmCols + 4, wmma::mem_row_major);
    __syncthreads();
    for (int idx = t; idx < kSmRows * kSmCols; idx += kSmThreads) {
      const int r = idx / kSmCols, c = idx % kSmCols;
      if (r < rows && n0 + c < N) out[(r0 + mc + r) * ld_out + n0 + c] = cs[r * (kSmCols + 4) + c];
    }
    __syncthreads();  // the next pass refills the stages
  }
  if (early && n_rows == 0) pdl_wait();  // every thread waits once (no pass ran)
}

// C[r, n] = Σ_s part[s, r, n] in split order (the first term as is, then + each next).
__global__ void sum_splits_kernel(const float* part, int64_t n_splits, int64_t rows, int64_t N, float* C, int64_t ldc) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * N) return;
  float v = part[i];
  for (int64_t s = 1; s < n_splits; ++s) v = v + part[s * rows * N + i];
  C[(i / N) * ldc + i % N] = v;
}

// C[m, n] = Σ_k X[m, k] · W[n, k] in fp32, in one fixed order whatever the tiling: K in chunks
// of kF32ChunkK; within chunk c, lane l of a warp sums k = c·256 + 4l + q + 128j for j = 0, 1 and
// q = 0..3 in that order (j outer) with fmaf, skipping k ≥ K, and the 32 lane sums meet in a
// butterfly (xor 16, 8, 4, 2, 1); the chunk sums are added in chunk order (the first as is). A
// warp owns 4 rows × 4 columns (16 sums per lane; x and w read as float4 when rows are 16-byte
// aligned, else one by one — the same order), a block of 4 warps 4 rows × 16 columns. part ==
// null: a block adds its chunks in sequence; else block z computes chunk z only into part
// [chunks, M, N] (decode steps: 8× the blocks) and sum_splits adds them in the same order.
constexpr int kF32Rows = 4, kF32Cols = 4, kF32Warps = 4;

__global__ void __launch_bounds__(kF32Warps * 32) gemm_f32_ordered_kernel(const float* X, int64_t ldx, const float* W,
                                                                          int64_t M, int64_t N, int64_t K, float* C,
                                                                          int64_t ldc, float* part, bool vec) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kF32Rows;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kF32Warps + warp) * kF32Cols;
  if (n0 >= N) return;
  const int64_t c_begin = part != nullptr ? blockIdx.z : 0;
  const int64_t c_end = part != nullptr ? c_begin + 1 : (K + kF32ChunkK - 1) / kF32ChunkK;
  float total[kF32Rows][kF32Cols] = {};
  for (int64_t c = c_begin; c < c_end; ++c) {
    float v[kF32Rows][kF32Cols];
    chunk_sums(v, X, ldx, W, M, N, K, m0, n0, c, lane, vec);
#pragma unroll
    for (int i = 0; i < kF32Rows; ++i)
#pragma unroll
      for (int jj = 0; jj < kF32Cols; ++jj) total[i][jj] = c == c_begin ? v[i][jj] : total[i][jj] + v[i][jj];
  }
  float* out = part != nullptr ? part + c_begin * M * N : C;
  const int64_t ld_out = part != nullptr ? N : ldc;
#pragma unroll
  for (int i = 0; i < kF32Rows; ++i)
#pragma unroll
    for (int jj = 0; jj < kF32Cols; ++jj)
      if (lane == i * kF32Cols + jj && m0 + i < M && n0 + jj < N) out[(m0 + i) * ld_out + n0 + jj] = total[i][jj];
}

// gemm_f32_ordered's parallel chunks in one launch: a block owns one 4 × 4 tile (rows m0.., columns
// n0..) and has a warp per K chunk; warp c runs the chunk's 32 chains and butterfly exactly as the
// partials form's block z = c does, lane i·4 + j leaves element (i, j)'s chunk sum in shared
// memory, and 16 threads add the chunk sums in chunk order (the first as is, then + each next —
// sum_splits). The same bits without the partials' second launch.
constexpr int kF32MaxChunkWarps = 32;
__global__ void __launch_bounds__(32 * kF32MaxChunkWarps)
    gemm_f32_chunks_kernel(const float* X, int64_t ldx, const float* W, int64_t M, int64_t N, int64_t K, float* C,
                           int64_t ldc, bool vec) {
  __shared__ float sums[kF32MaxChunkWarps][kF32Rows * kF32Cols];
  const int lane = static_cast<int>(threadIdx.x % 32), c = static_cast<int>(threadIdx.x / 32);
  const int n_chunks = static_cast<int>(blockDim.x / 32);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kF32Rows, n0 = static_cast<int64_t>(blockIdx.x) * kF32Cols;
  pdl_wait();
  float v[kF32Rows][kF32Cols];
  chunk_sums(v, X, ldx, W, M, N, K, m0, n0, c, lane, vec);
#pragma unroll
  for (int i = 0; i < kF32Rows; ++i)
#pragma unroll
    for (int jj = 0; jj < kF32Cols; ++jj)
      if (lane == i * kF32Cols + jj) sums[c][lane] = v[i][jj];
  __syncthreads();
  const int e = static_cast<int>(threadIdx.x);
  if (e >= kF32Rows * kF32Cols) return;
  const int64_t m = m0 + e / kF32Cols, n = n0 + e % kF32Cols;
  if (m >= M || n >= N) return;
  float total = sums[0][e];
  for (int ch = 1; ch < n_chunks; ++ch) total = total + sums[ch][e];
  C[m * ldc + n] = total;
}

// gemm_f32_ordered's arithmetic for many rows, with more reuse per load: the 32 chains of a
// chunk (lane l's k = c·256 + 4l + q + 128j) are spread as 4 per thread — slot group g = lane % 8
// holds chains g, g + 8, g + 16, g + 24, whose butterfly levels 16 and 8 it adds in registers
// (a_g = p_g + p_{g+16}, a_{g+8} = p_{g+8} + p_{g+24}, b_g = a_g + a_{g+8}: the butterfly's own
// sums, since lanes l and l ^ o add the same two values), then levels 4, 2, 1 across the 8 slot
// groups by shuffles — the same fmaf chains and the same additions, so the same bits. A thread
// owns 4 rows × 4 columns of each of its 4 chains (64 partial sums); the warp's 4 element groups
// (lane / 8) take 4 adjacent 4-column groups of the same 4 rows, a block of 4 warps 16 rows × 16
// columns. Per 8 float4 loads a thread does 64 fmaf (the one-chain kernel: 8 per 16 plus 5
// shuffles per element and chunk). Chunks in sequence (no partials).
constexpr int kF32TiledRows = 4, kF32TiledCols = 4, kF32TiledGroups = 4, kF32TiledWarps = 4;
__global__ void __launch_bounds__(kF32TiledWarps * 32) gemm_f32_tiled_kernel(const float* X, int64_t ldx,
                                                                             const float* W, int64_t M, int64_t N,
                                                                             int64_t K, float* C, int64_t ldc,
                                                                             bool vec) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane % 8, eg = lane / 8;
  const int64_t m0 = (static_cast<int64_t>(blockIdx.y) * kF32TiledWarps + warp) * kF32TiledRows;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kF32TiledGroups + eg) * kF32TiledCols;
  if (m0 >= M) return;  // whole warps (the shuffles below stay within a warp's slot groups)
  const int64_t chunks = (K + kF32ChunkK - 1) / kF32ChunkK;
  float total[kF32TiledRows][kF32TiledCols] = {};
  for (int64_t c = 0; c < chunks; ++c) {
    float acc[4][kF32TiledRows][kF32TiledCols] = {};  // [chain g + 8·s][row][column]
#pragma unroll
    for (int sl = 0; sl < 4; ++sl)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int64_t k = c * kF32ChunkK + 128 * j + 4 * (g + 8 * sl);
        if (k >= K) continue;  // the one-chain kernel's break: its j = 1 steps lie further along K
        chain_step(acc[sl], X, ldx, W, M, N, K, m0, n0, k, vec);
      }
#pragma unroll
    for (int i = 0; i < kF32TiledRows; ++i)
#pragma unroll
      for (int jj = 0; jj < kF32TiledCols; ++jj) {
        float v = (acc[0][i][jj] + acc[2][i][jj]) + (acc[1][i][jj] + acc[3][i][jj]);
        for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        total[i][jj] = c == 0 ? v : total[i][jj] + v;
      }
  }
  // Slot group g stores elements 2g and 2g + 1 of its element group's 16.
#pragma unroll
  for (int i = 0; i < kF32TiledRows; ++i)
#pragma unroll
    for (int jj = 0; jj < kF32TiledCols; ++jj)
      if ((i * kF32TiledCols + jj) / 2 == g && m0 + i < M && n0 + jj < N) C[(m0 + i) * ldc + n0 + jj] = total[i][jj];
}

// out[r, c..c+15] = bf16(float(W[r, c + i]) · scale[r, c / block_k]) for 16-code chunk `chunk` =
// r·(K / 16) + c / 16 of each thread (grid-stride): widen_fp8x16, the small-M kernels' widening.
__global__ void __launch_bounds__(256) widen_fp8_weights_kernel(const uint8_t* W, const float* scale, uint32_t chunks,
                                                                 uint32_t row_chunks, uint32_t kb_chunks,
                                                                 uint32_t n_kb, bf16* out) {
  for (uint32_t c = blockIdx.x * 256u + threadIdx.x; c < chunks; c += gridDim.x * 256u) {
    const uint32_t r = c / row_chunks, j = c % row_chunks;
    const uint4 raw = *reinterpret_cast<const uint4*>(W + 16 * static_cast<uint64_t>(c));
    widen_fp8x16(raw, scale[static_cast<uint64_t>(r) * n_kb + j / kb_chunks], out + 16 * static_cast<uint64_t>(c));
  }
}

}  // namespace

bool widen_fp8_weights_ok(int64_t rows, int64_t K, int64_t block_k) {
  return K % 16 == 0 && block_k % 16 == 0 && rows * K / 16 < (int64_t{1} << 32);
}

void widen_fp8_weights(const uint8_t* W, const float* scale, int64_t rows, int64_t K, int64_t block_k, bf16* out,
                       cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(widen_fp8_weights_ok(rows, K, block_k),
                      "widen_fp8_weights: needs K and block_k multiples of 16 and < 2^32 chunks");
  if (rows == 0 || K == 0) return;
  const int64_t chunks = rows * K / 16;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((chunks + 255) / 256, 16 * sm_count()));
  widen_fp8_weights_kernel<<<grid, 256, 0, s>>>(W, scale, static_cast<uint32_t>(chunks), static_cast<uint32_t>(K / 16),
                                                static_cast<uint32_t>(block_k / 16),
                                                static_cast<uint32_t>((K + block_k - 1) / block_k), out);
  DI_CUDA_LAUNCHED();
}

bool small_m_gemm_ok(int64_t K, bool fp8, int64_t block_k) {
  return fp8 ? K % 16 == 0 && block_k % 16 == 0 : K % 8 == 0;
}

void small_m_gemm(const bf16* A, int64_t K, const void* W, const float* scale, bool fp8, int64_t block_k, int64_t N,
                  const int32_t* offsets, const int32_t* active, int64_t n_active, int64_t rows, int64_t max_rows,
                  float* C, int64_t ldc, float* partials, cudaStream_t s, bool k_splits) {
  DI_CUDA_REQUIRE(small_m_gemm_ok(K, fp8, block_k));
  DI_CUDA_REQUIRE(K <= INT32_MAX && block_k <= INT32_MAX);  // 32-bit scale-block division
  DI_CUDA_REQUIRE(n_active >= 1 && n_active <= 65535 && (active != nullptr || n_active == 1));
  DI_CUDA_REQUIRE_MSG(k_splits || !fp8, "small_m_gemm: one K split takes bf16 weights only");
  if (rows == 0) return;
  DI_CUDA_REQUIRE(max_rows >= 1 && (active != nullptr || max_rows == rows));
  const int64_t n_splits = k_splits ? invariant_k_splits(K) : 1;
  DI_CUDA_REQUIRE(n_splits == 1 || partials != nullptr);
  DI_CUDA_REQUIRE(n_splits > 1 || C != nullptr);
  if (fp8 && max_rows <= kSmallMFewRows) {  // the persistent FP8 kernel (cuda_small_m_fp8.cu): the same bits
    small_m_fp8_few_rows(A, K, static_cast<const uint8_t*>(W), scale, block_k, N, offsets, active, n_active, rows,
                         max_rows, n_splits > 1 ? partials : C, n_splits > 1 ? N : ldc, s);
  } else {
    const dim3 grid(grid_for(N, kSmCols), static_cast<unsigned>(n_active), static_cast<unsigned>(n_splits));
    const int64_t n_kb = fp8 ? (K + block_k - 1) / block_k : 0;
    const int64_t dense_rows = active == nullptr ? rows : 0;
    if (fp8)
      launch_pdl(small_m_gemm_kernel<true>, grid, kSmThreads, 0, s, A, K, W, scale, n_kb, block_k, N, offsets, active,
                 dense_rows, C, ldc, partials, rows);
    else
      launch_pdl(small_m_gemm_kernel<false>, grid, kSmThreads, 0, s, A, K, W, scale, n_kb, block_k, N, offsets,
                 active, dense_rows, C, ldc, partials, rows);
    DI_CUDA_LAUNCHED();
  }
  if (n_splits > 1 && C != nullptr) {
    launch_pdl(sum_splits_kernel, grid_for(rows * N, 256), 256, 0, s, partials, n_splits, rows, N, C, ldc);
    DI_CUDA_LAUNCHED();
  }
}

int64_t gemm_f32_ordered_chunks(int64_t K) { return std::max<int64_t>(1, (K + kF32ChunkK - 1) / kF32ChunkK); }

void gemm_f32_ordered(const float* X, int64_t ldx, const float* W, int64_t M, int64_t N, int64_t K, float* C,
                      int64_t ldc, float* partials, cudaStream_t s, bool tiled) {
  if (M == 0 || N == 0) return;
  if (tiled && partials == nullptr) {
    constexpr int64_t kBlockRows = kF32TiledWarps * kF32TiledRows, kBlockCols = kF32TiledGroups * kF32TiledCols;
    DI_CUDA_REQUIRE((M + kBlockRows - 1) / kBlockRows <= 65535);
    const dim3 grid(grid_for(N, kBlockCols), static_cast<unsigned>((M + kBlockRows - 1) / kBlockRows), 1u);
    const bool vec = K % 4 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(X) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(W) % 16 == 0;
    gemm_f32_tiled_kernel<<<grid, kF32TiledWarps * 32, 0, s>>>(X, ldx, W, M, N, K, C, ldc, vec);
    DI_CUDA_LAUNCHED();
    return;
  }
  DI_CUDA_REQUIRE((M + kF32Rows - 1) / kF32Rows <= 65535);
  const int64_t chunks = gemm_f32_ordered_chunks(K);
  if (K == 0 || chunks == 1) partials = nullptr;  // one chunk: nothing to add
  DI_CUDA_REQUIRE(chunks <= 65535);
  const dim3 grid(grid_for(N, kF32Warps * kF32Cols), static_cast<unsigned>((M + kF32Rows - 1) / kF32Rows),
                  partials != nullptr ? static_cast<unsigned>(chunks) : 1u);
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(X) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(W) % 16 == 0;
  gemm_f32_ordered_kernel<<<grid, kF32Warps * 32, 0, s>>>(X, ldx, W, M, N, K, C, ldc, partials, vec);
  DI_CUDA_LAUNCHED();
  if (partials != nullptr) {
    launch_pdl(sum_splits_kernel, grid_for(M * N, 256), 256, 0, s, partials, chunks, M, N, C, ldc);
    DI_CUDA_LAUNCHED();
  }
}

bool gemm_f32_ordered_fused_ok(int64_t K) { return K > 0 && gemm_f32_ordered_chunks(K) <= kF32MaxChunkWarps; }

void gemm_f32_ordered_fused(const float* X, int64_t ldx, const float* W, int64_t M, int64_t N, int64_t K, float* C,
                            int64_t ldc, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(gemm_f32_ordered_fused_ok(K), "gemm_f32_ordered_fused: needs 0 < K <= 32 chunks of 256");
  if (M == 0 || N == 0) return;
  DI_CUDA_REQUIRE((M + kF32Rows - 1) / kF32Rows <= 65535);
  const dim3 grid(grid_for(N, kF32Cols), static_cast<unsigned>((M + kF32Rows - 1) / kF32Rows), 1u);
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(X) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(W) % 16 == 0;
  launch_pdl(gemm_f32_chunks_kernel, grid, static_cast<unsigned>(32 * gemm_f32_ordered_chunks(K)), 0, s, X, ldx, W, M,
             N, K, C, ldc, vec);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
