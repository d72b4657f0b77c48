// MoE on the GPU, without host synchronization except in the per-expert cuBLAS form:
//   route (a warp per token, DeepSeek's selection rule as in route_one_token)
//   → stable sort of the (token, slot) entries by expert (one block for ≤ 512 entries, else
//   cub's radix sort) → per-expert row offsets, 64-row tile offsets and the active experts
//   → gather rows as bf16 → grouped GEMM gate|up → SiLU·mul →
//   grouped GEMM down → weighted combine in slot order (deterministic: no float atomics).
// Three forms of the grouped GEMMs (MoeArgs::form; CudaBackend picks by the step's size):
//  - skinny (decode): grouped_gemv_kernel, one block per (8 weight rows, active expert),
//    weights streamed once per 8 rows of the expert with 16-byte loads, fp32 FMAs on the CUDA
//    cores — the weights' bandwidth, not the math, is the limit at a few rows per expert;
//  - per-expert cuBLAS (prefill): the row counts are read back (one host synchronization, never
//    inside a graph) and each expert with rows gets one tensor-core GEMM;
//  - tiled: WMMA over each expert's 64-row tiles, sync-free for any size — version 2 (64×128
//    tiles, 8 warps, 16-byte loads one K step ahead, double-buffered) where K % 8 == 0, else
//    version 1 (64×64 tiles, scalar staging).
#include "backend/cuda/cuda_common.h"

#include <algorithm>
#include <vector>
#include <cub/cub.cuh>
#include <cuda_fp8.h>
#include <mma.h>

namespace deepinfer::cuda {
namespace {

constexpr int kMaxExperts = 256;
constexpr int kMaxGroups = 64;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kRouteWarps = 4;

// One warp per token (kRouteWarps tokens per block): DeepSeek's selection rule as in the
// reference's route_one_token. Lane l owns experts l, l + 32, …; scores and choice scores sit
// in the warp's shared slice ([2 · kMaxExperts + kMaxGroups] floats) so group scores can read
// whole groups. Top-k: k rounds of a warp arg-max over (choice desc, id asc) — the reference's
// scan keeps the first maximum, i.e. the lowest id on ties, −inf entries included.
__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(RouteArgs a) {
  __shared__ float smem[kRouteWarps][2 * kMaxExperts + kMaxGroups];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= a.T) return;  // whole warps leave; no block-wide barrier follows
  float* scores = smem[warp];
  float* choice = scores + kMaxExperts;
  float* group_score = choice + kMaxExperts;
  const float* lg = a.logits + t * a.E;
  const int E = static_cast<int>(a.E);
  if (a.scoring == 0) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0;
    for (int e = lane; e < E; e += 32) sum += (scores[e] = expf(lg[e] - mx));
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) scores[e] /= sum;
  } else {
    for (int e = lane; e < E; e += 32) scores[e] = 1.0f / (1.0f + expf(-lg[e]));
  }
  for (int e = lane; e < E; e += 32) choice[e] = scores[e] + (a.bias != nullptr ? a.bias[e] : 0.0f);
  __syncwarp();
  if (a.method != 0 && a.n_group > 1) {
    const int per = static_cast<int>(a.E / a.n_group), G = static_cast<int>(a.n_group);
    for (int g = lane; g < G; g += 32) {
      const float* c = choice + g * per;
      if (a.method == 1) {
        float m = c[0];
        for (int e = 1; e < per; ++e) m = fmaxf(m, c[e]);
        group_score[g] = m;
      } else {
        float x = -INFINITY, y = -INFINITY;
        for (int e = 0; e < per; ++e) {
          if (c[e] > x) { y = x; x = c[e]; } else if (c[e] > y) { y = c[e]; }
        }
        group_score[g] = x + y;
      }
    }
    __syncwarp();
    // Keep the topk_group best groups (stable: ties to the lower group id); mask the others.
    for (int g = lane; g < G; g += 32) {
      int rank = 0;
      for (int o = 0; o < G; ++o) rank += group_score[o] > group_score[g] || (group_score[o] == group_score[g] && o < g);
      if (rank >= a.topk_group)
        for (int e = 0; e < per; ++e) choice[g * per + e] = -INFINITY;
    }
    __syncwarp();
  }
  int32_t* ids = a.ids + t * a.top_k;
  float* w = a.weights + t * a.top_k;
  uint32_t taken = 0;  // bit i: this lane's expert lane + 32 i is chosen
  float wsum = 0;
  for (int64_t j = 0; j < a.top_k; ++j) {
    float bv = -INFINITY;
    int be = INT_MAX;
    for (int i = 0, e = lane; e < E; ++i, e += 32) {
      if (taken & (1u << i)) continue;
      if (be == INT_MAX || choice[e] > bv) {
        bv = choice[e];
        be = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (oe != INT_MAX && (be == INT_MAX || ov > bv || (ov == bv && oe < be))) {
        bv = ov;
        be = oe;
      }
    }
    if (be % 32 == lane) taken |= 1u << (be / 32);
    const float sj = scores[be];
    wsum += sj;
    if (lane == 0) {
      ids[j] = be;
      w[j] = sj;
    }
  }
  if (lane != 0) return;
  if (a.norm_topk_prob) {
    const float sum = wsum + 1e-20f;
    for (int64_t j = 0; j < a.top_k; ++j) w[j] /= sum;
  }
  for (int64_t j = 0; j < a.top_k; ++j) w[j] *= a.scale;
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) v[i] = static_cast<int32_t>(i);
}

// offsets[e] = first sorted entry of expert e (lower bound); tiles[e] = Σ_{e' < e} ceil(count / kBM);
// active[j] = the j-th expert with rows, −1 past the last (n_active slots: min(E, n)).
template <int kBM>
__global__ void offsets_kernel(const int32_t* sorted, int64_t n, int64_t E, int32_t* offsets, int32_t* tiles,
                               int32_t* active, int64_t n_active) {
  for (int64_t e = threadIdx.x; e <= E; e += blockDim.x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < e) lo = mid + 1;
      else hi = mid;
    }
    offsets[e] = static_cast<int32_t>(lo);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t acc = 0;
    int64_t j = 0;
    for (int64_t e = 0; e < E; ++e) {
      tiles[e] = acc;
      acc += (offsets[e + 1] - offsets[e] + kBM - 1) / kBM;
      if (offsets[e + 1] > offsets[e] && j < n_active) active[j++] = static_cast<int32_t>(e);
    }
    tiles[E] = acc;
    for (; j < n_active; ++j) active[j] = -1;
  }
}

constexpr int kGemvWarps = 4;
constexpr int kGemvRowsPerWarp = 2;  // weight rows a warp streams together
constexpr int kGemvUnroll = 4;       // K steps unrolled: 2 · 4 loads of 16 B in flight per lane
constexpr int kGemvMaxM = 8;         // expert rows per pass over the weights
constexpr int kGemvVec = 8;          // elements per lane per load (16 B bf16, 8 B fp8)

// 8 consecutive weights of row wr from column k, as floats (FP8: times the row's block scale).
template <bool kFp8>
__device__ __forceinline__ void load_w8(const void* W, const float* wscale, int64_t n_kb, int64_t block_k, int64_t K,
                                        int64_t wr, int64_t k, float* w) {
  if constexpr (kFp8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(W) + wr * K + k);
    const float sc = wscale[wr * n_kb + k / block_k];
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      __nv_fp8_e4m3 q;
      q.__x = b[v];
      w[v] = static_cast<float>(q) * sc;
    }
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(W) + wr * K + k);
    const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int v = 0; v < 8; ++v) w[v] = __bfloat162float(b[v]);
  }
}

// Skinny grouped GEMM: C[r, n] = Σ_k A[r, k] · W[e·N + n, k] for the rows r of expert e (C's
// row stride ldc); with active == null, a dense skinny GEMM over rows [0, dense_rows).
// Sizing for bandwidth at one row: small blocks (4 warps × 2 weight rows) so a decode GEMM has
// hundreds of blocks, and the K loop unrolled so each lane keeps several loads in flight.
// grid (ceil(N / (kGemvWarps·kGemvRowsPerWarp)), n_active): block y serves active[y] (an
// expert with rows; −1: idle); each warp streams kGemvRowsPerWarp weight rows with 8-element
// loads per lane (lanes stride K by 256), multiplies them with up to kGemvMaxM of the expert's
// rows of A (bf16, read through L1: every warp of the block reads the same A), and reduces per
// (row, weight row) across the warp. Experts with more rows take several passes (the weights
// come from L2 again). Preconditions: K % 8 == 0; FP8: block_k % 8 == 0. Accumulation in fp32;
// the order (lane partial sums, then a butterfly) does not depend on the other experts' rows.
template <bool kFp8>
__global__ void __launch_bounds__(kGemvWarps * 32) grouped_gemv_kernel(const bf16* A, int64_t K, const void* W,
                                                                       const float* wscale, int64_t n_kb,
                                                                       int64_t block_k, int64_t N,
                                                                       const int32_t* offsets, const int32_t* active,
                                                                       int64_t dense_rows, float* C, int64_t ldc) {
  // Dense use (active == null): one "expert" 0 with rows [0, dense_rows).
  const int e = active != nullptr ? active[blockIdx.y] : 0;
  if (e < 0) return;
  const int64_t r0 = active != nullptr ? offsets[e] : 0;
  const int64_t rows = active != nullptr ? offsets[e + 1] - r0 : dense_rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp) * kGemvRowsPerWarp;
  if (n0 >= N) return;
  for (int64_t mc = 0; mc < rows; mc += kGemvMaxM) {
    const int m = static_cast<int>(min(static_cast<int64_t>(kGemvMaxM), rows - mc));
    float acc[kGemvRowsPerWarp][kGemvMaxM];
#pragma unroll
    for (int q = 0; q < kGemvRowsPerWarp; ++q)
#pragma unroll
      for (int i = 0; i < kGemvMaxM; ++i) acc[q][i] = 0.0f;
#pragma unroll kGemvUnroll
    for (int64_t k = static_cast<int64_t>(lane) * kGemvVec; k < K; k += 32 * kGemvVec) {
      float w[kGemvRowsPerWarp][kGemvVec];
#pragma unroll
      for (int q = 0; q < kGemvRowsPerWarp; ++q) {
        if (n0 + q < N) {
          load_w8<kFp8>(W, wscale, n_kb, block_k, K, static_cast<int64_t>(e) * N + n0 + q, k, w[q]);
        } else {
#pragma unroll
          for (int v = 0; v < kGemvVec; ++v) w[q][v] = 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < kGemvMaxM; ++i) {
        if (i < m) {
          const uint4 raw = *reinterpret_cast<const uint4*>(A + (r0 + mc + i) * K + k);
          const bf16* ab = reinterpret_cast<const bf16*>(&raw);
          float a[kGemvVec];
#pragma unroll
          for (int v = 0; v < kGemvVec; ++v) a[v] = __bfloat162float(ab[v]);
#pragma unroll
          for (int q = 0; q < kGemvRowsPerWarp; ++q)
#pragma unroll
            for (int v = 0; v < kGemvVec; ++v) acc[q][i] = fmaf(w[q][v], a[v], acc[q][i]);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kGemvRowsPerWarp; ++q)
#pragma unroll
      for (int i = 0; i < kGemvMaxM; ++i) {
        if (i < m) {
          const float v = warp_sum(acc[q][i]);
          if (lane == 0 && n0 + q < N) C[(r0 + mc + i) * ldc + n0 + q] = v;
        }
      }
  }
}

void grouped_gemv(const bf16* A, int64_t K, const void* W, const float* scale, bool fp8, int64_t block_k, int64_t N,
                  const int32_t* offsets, const int32_t* active, int64_t n_active, int64_t dense_rows, float* C,
                  int64_t ldc, cudaStream_t s) {
  DI_CUDA_REQUIRE(K % kGemvVec == 0);
  DI_CUDA_REQUIRE(!fp8 || block_k % kGemvVec == 0);
  DI_CUDA_REQUIRE(n_active <= 65535);
  const dim3 grid(grid_for(N, kGemvWarps * kGemvRowsPerWarp), static_cast<unsigned>(n_active));
  const int64_t n_kb = fp8 ? (K + block_k - 1) / block_k : 0;
  if (fp8)
    grouped_gemv_kernel<true><<<grid, kGemvWarps * 32, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, active,
                                                               dense_rows, C, ldc);
  else
    grouped_gemv_kernel<false><<<grid, kGemvWarps * 32, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, active,
                                                                dense_rows, C, ldc);
  DI_CUDA_LAUNCHED();
}

constexpr int64_t kSmallSortMax = 512;  // routed rows sorted by small_sort_kernel

// Decode-sized steps (R ≤ kSmallSortMax entries): one 1024-thread block does what iota + the
// stable radix sort + offsets_kernel do — perm lists the (token, slot) entries by expert, ties
// in entry order (an entry's rank is the number of earlier entries of its expert: O(R²/1024)
// compares, ≤ 256 per thread), plus offsets, tile offsets and the active-expert list. Counts
// use shared-memory atomics (exact integers: order-free). Shared: ids [512], starts [E + 1].
template <int kBM>
__global__ void __launch_bounds__(1024) small_sort_kernel(const int32_t* ids, int64_t R, int64_t E, int32_t* perm,
                                                          int32_t* offsets, int32_t* tiles, int32_t* active,
                                                          int64_t n_active) {
  __shared__ int32_t s_ids[kSmallSortMax];
  __shared__ int32_t s_start[kMaxExperts + 1];
  const int t = threadIdx.x;
  for (int e = t; e <= E; e += blockDim.x) s_start[e] = 0;
  for (int i = t; i < R; i += blockDim.x) s_ids[i] = ids[i];
  __syncthreads();
  for (int i = t; i < R; i += blockDim.x) atomicAdd(&s_start[s_ids[i]], 1);
  __syncthreads();
  if (t == 0) {  // counts → starts; offsets, tiles, active list
    int32_t acc = 0, tile = 0;
    int64_t j = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t c = s_start[e];
      s_start[e] = acc;
      offsets[e] = acc;
      tiles[e] = tile;
      if (c > 0 && j < n_active) active[j++] = static_cast<int32_t>(e);
      acc += c;
      tile += (c + kBM - 1) / kBM;
    }
    offsets[E] = acc;
    tiles[E] = tile;
    for (; j < n_active; ++j) active[j] = -1;
  }
  __syncthreads();
  for (int i = t; i < R; i += blockDim.x) {
    const int32_t e = s_ids[i];
    int32_t rank = 0;
    for (int j = 0; j < i; ++j) rank += s_ids[j] == e;
    perm[s_start[e] + rank] = i;
  }
}

// xa[i] = bf16(x[perm[i] / k]); inv[perm[i]] = i.
__global__ void permute_kernel(const float* x, const int32_t* perm, int64_t k, int64_t D, bf16* xa, int32_t* inv) {
  const int64_t i = blockIdx.x;
  const int64_t entry = perm[i], t = entry / k;
  if (threadIdx.x == 0) inv[entry] = static_cast<int32_t>(i);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) xa[i * D + j] = __float2bfloat16(x[t * D + j]);
}

__global__ void combine_kernel(const float* y, const int32_t* inv, const float* w, int64_t k, int64_t D, float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float acc = 0;
    for (int64_t s = 0; s < k; ++s) acc += w[t * k + s] * y[static_cast<int64_t>(inv[t * k + s]) * D + j];
    out[t * D + j] = acc;
  }
}

constexpr int kBM = 64, kBN = 64, kBK = 32, kPad = 8;

// Row tile `tile` of the sorted rows (tiles[e]: expert e's first 64-row tile): its expert, first
// row and row count (≤ kBM). False past the last tile.
__device__ __forceinline__ bool tile_rows(int64_t tile, const int32_t* offsets, const int32_t* tiles, int64_t E,
                                          int64_t* e, int64_t* m0, int64_t* rows) {
  if (tile >= tiles[E]) return false;
  int64_t lo = 0, hi = E - 1;  // the largest e with tiles[e] ≤ tile
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (tiles[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  *e = lo;
  *m0 = offsets[lo] + (tile - tiles[lo]) * kBM;
  *rows = min(static_cast<int64_t>(kBM), static_cast<int64_t>(offsets[lo + 1]) - *m0);
  return true;
}

// C[r, n] = Σ_k A[r, k] · W[e·N + n, k] for the rows r of expert e's segment.
template <bool kFp8, typename OutT>
__global__ void __launch_bounds__(128) grouped_gemm_kernel(const bf16* A, int64_t K, const void* W, const float* wscale,
                                                           int64_t n_kb, int64_t block_k, int64_t N,
                                                           const int32_t* offsets, const int32_t* tiles, int64_t E,
                                                           OutT* C) {
  using namespace nvcuda;
  int64_t e, m0, rows;
  if (!tile_rows(blockIdx.y, offsets, tiles, E, &e, &m0, &rows)) return;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;

  __shared__ __align__(32) bf16 As[kBM][kBK + kPad];
  __shared__ __align__(32) bf16 Bs[kBN][kBK + kPad];
  __shared__ __align__(32) float Cs[kBM][kBN + 4];
  const int warp = threadIdx.x / 32;
  const int wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    for (int idx = threadIdx.x; idx < kBM * kBK; idx += blockDim.x) {
      const int r = idx / kBK, c = idx % kBK;
      const int64_t kk = k0 + c;
      As[r][c] = r < rows && kk < K ? A[(m0 + r) * K + kk] : __float2bfloat16(0.0f);
      const int64_t n = n0 + r;
      float wv = 0.0f;
      if (n < N && kk < K) {
        const int64_t wr = e * N + n;
        if constexpr (kFp8) {
          __nv_fp8_e4m3 q;
          q.__x = static_cast<const uint8_t*>(W)[wr * K + kk];
          wv = static_cast<float>(q) * wscale[wr * n_kb + kk / block_k];
          Bs[r][c] = __float2bfloat16(wv);
        } else {
          Bs[r][c] = static_cast<const bf16*>(W)[wr * K + kk];
        }
      } else {
        Bs[r][c] = __float2bfloat16(0.0f);
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &As[wm * 32 + i * 16][kk], kBK + kPad);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &Bs[wn * 32 + j * 16][kk], kBK + kPad);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kBN + 4, wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kBM * kBN; idx += blockDim.x) {
    const int r = idx / kBN, c = idx % kBN;
    if (r < rows && n0 + c < N) {
      const float v = Cs[r][c];
      if constexpr (sizeof(OutT) == 4) C[(m0 + r) * N + n0 + c] = v;
      else C[(m0 + r) * N + n0 + c] = __float2bfloat16(v);
    }
  }
}

// Version 2 of the tiled grouped GEMM (K % 8 == 0): C[r, n] = Σ_k A[r, k] · W[e·N + n, k] over
// the same 64-row tiles of each expert's rows (tiles[] from the sort), 128 output columns per
// block. 256 threads = 8 warps as 2 (rows) × 4 (columns), each a 32×32 tile of 2×2 WMMA 16×16
// fragments. Per 32-wide K step a thread moves one 16-byte chunk of A (64 rows × 4 chunks) and
// two of W (128 rows × 4 chunks; FP8: 8 bytes widened to bf16 with the row's block scale, as
// version 1 rounds it), loaded into registers one step ahead and stored into the other of two
// shared buffers, so global latency hides behind the MMAs; one barrier per step. Rows past the
// tile's rows and columns past N are zero-filled; the epilogue goes through shared memory
// (aliasing the A/B buffers) and writes only real rows and columns.
constexpr int kV2M = 64, kV2N = 128, kV2K = 32, kV2Pad = 8;
constexpr size_t kV2AbBytes = sizeof(bf16) * 2 * (kV2M + kV2N) * (kV2K + kV2Pad);
constexpr size_t kV2CBytes = sizeof(float) * kV2M * (kV2N + 4);
constexpr size_t kV2SmemBytes = kV2AbBytes > kV2CBytes ? kV2AbBytes : kV2CBytes;

template <bool kFp8>
__global__ void __launch_bounds__(256) grouped_gemm_v2_kernel(const bf16* A, int64_t K, const void* W,
                                                              const float* wscale, int64_t n_kb, int64_t block_k,
                                                              int64_t N, const int32_t* offsets, const int32_t* tiles,
                                                              int64_t E, float* C) {
  using namespace nvcuda;
  int64_t e, m0, rows;
  if (!tile_rows(blockIdx.y, offsets, tiles, E, &e, &m0, &rows)) return;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kV2N;

  __shared__ __align__(128) unsigned char smem[kV2SmemBytes];
  auto As = reinterpret_cast<bf16(*)[kV2M][kV2K + kV2Pad]>(smem);                       // [2][64][40]
  auto Bs = reinterpret_cast<bf16(*)[kV2N][kV2K + kV2Pad]>(smem + sizeof(bf16) * 2 * kV2M * (kV2K + kV2Pad));  // [2][128][40]
  const int t = threadIdx.x, warp = t / 32;
  const int wm = warp / 4, wn = warp % 4;
  const int lr = t / 4, lc = (t % 4) * 8;  // this thread's chunk: row lr (and lr + 64 of W), columns lc..lc+7

  uint4 ra, rb[2];
  auto load = [&](int64_t k0) {
    const int64_t kk = k0 + lc;
    ra = make_uint4(0, 0, 0, 0);
    if (lr < rows && kk < K) ra = *reinterpret_cast<const uint4*>(A + (m0 + lr) * K + kk);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t n = n0 + lr + 64 * j;
      rb[j] = make_uint4(0, 0, 0, 0);
      if (n >= N || kk >= K) continue;
      const int64_t wr = e * N + n;
      if constexpr (kFp8) {
        const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(W) + wr * K + kk);
        const float sc = wscale[wr * n_kb + kk / block_k];
        const uint8_t* b8 = reinterpret_cast<const uint8_t*>(&raw);
        bf16* out = reinterpret_cast<bf16*>(&rb[j]);
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          __nv_fp8_e4m3 q;
          q.__x = b8[v];
          out[v] = __float2bfloat16(static_cast<float>(q) * sc);
        }
      } else {
        rb[j] = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(W) + wr * K + kk);
      }
    }
  };
  auto store = [&](int buf) {
    *reinterpret_cast<uint4*>(&As[buf][lr][lc]) = ra;
    *reinterpret_cast<uint4*>(&Bs[buf][lr][lc]) = rb[0];
    *reinterpret_cast<uint4*>(&Bs[buf][lr + 64][lc]) = rb[1];
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  load(0);
  store(0);
  __syncthreads();
  int buf = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kV2K) {
    const bool more = k0 + kV2K < K;
    if (more) load(k0 + kV2K);
#pragma unroll
    for (int kk = 0; kk < kV2K; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &As[buf][wm * 32 + i * 16][kk], kV2K + kV2Pad);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &Bs[buf][wn * 32 + j * 16][kk], kV2K + kV2Pad);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    if (more) store(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }
  auto Cs = reinterpret_cast<float(*)[kV2N + 4]>(smem);  // [64][132], aliasing A/B (all reads done)
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kV2N + 4, wmma::mem_row_major);
  __syncthreads();
  for (int idx = t; idx < kV2M * kV2N; idx += blockDim.x) {
    const int r = idx / kV2N, c = idx % kV2N;
    if (r < rows && n0 + c < N) C[(m0 + r) * N + n0 + c] = Cs[r][c];
  }
}

template <typename OutT>
void grouped_gemm(const bf16* A, int64_t R, int64_t K, const void* W, const float* scale, bool fp8, int64_t block_k,
                  int64_t N, const int32_t* offsets, const int32_t* tiles, int64_t E, OutT* C, cudaStream_t s) {
  const int64_t max_tiles = (R + kBM - 1) / kBM + E;
  DI_CUDA_REQUIRE(max_tiles <= 65535);  // grid.y limit: R = tokens·top_k rows per step
  const int64_t n_kb = fp8 ? (K + block_k - 1) / block_k : 0;
  if constexpr (sizeof(OutT) == 4) {
    static_assert(kV2M == kBM, "version 2 reads the same 64-row tiles");
    if (K % 8 == 0 && (!fp8 || block_k % 8 == 0)) {
      const dim3 grid2(grid_for(N, kV2N), static_cast<unsigned>(max_tiles));
      if (fp8)
        grouped_gemm_v2_kernel<true><<<grid2, 256, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, C);
      else
        grouped_gemm_v2_kernel<false><<<grid2, 256, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, C);
      DI_CUDA_LAUNCHED();
      return;
    }
  }
  const dim3 grid(grid_for(N, kBN), static_cast<unsigned>(max_tiles));
  if (fp8) grouped_gemm_kernel<true, OutT><<<grid, 128, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, C);
  else grouped_gemm_kernel<false, OutT><<<grid, 128, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, C);
  DI_CUDA_LAUNCHED();
}

}  // namespace

void moe_route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  DI_CUDA_REQUIRE(a.E <= kMaxExperts);
  DI_CUDA_REQUIRE(a.n_group <= kMaxGroups);
  route_kernel<<<grid_for(a.T, kRouteWarps), kRouteWarps * 32, 0, s>>>(a);
  DI_CUDA_LAUNCHED();
}

void dense_gemv(const bf16* A, int64_t M, int64_t K, const void* W, const float* scale, bool fp8, int64_t block_k,
                int64_t N, float* C, int64_t ldc, cudaStream_t s) {
  if (M == 0) return;
  grouped_gemv(A, K, W, scale, fp8, block_k, N, nullptr, nullptr, 1, M, C, ldc, s);
}

bool moe_skinny_ok(int64_t D, int64_t I, bool fp8, int64_t block_k) {
  return D % kGemvVec == 0 && I % kGemvVec == 0 && (!fp8 || block_k % kGemvVec == 0);
}

void moe_experts(const MoeArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s) {
  if (a.T == 0) return;
  const int64_t R = a.T * a.k;
  auto get = [&](size_t bytes) { return alloc(ctx, bytes == 0 ? 16 : bytes); };
  auto* keys_sorted = static_cast<int32_t*>(get(sizeof(int32_t) * R));
  auto* entries = static_cast<int32_t*>(get(sizeof(int32_t) * R));
  auto* perm = static_cast<int32_t*>(get(sizeof(int32_t) * R));
  auto* inv = static_cast<int32_t*>(get(sizeof(int32_t) * R));
  auto* offsets = static_cast<int32_t*>(get(sizeof(int32_t) * (a.E + 1)));
  auto* tiles = static_cast<int32_t*>(get(sizeof(int32_t) * (a.E + 1)));
  const int64_t n_active = std::min(a.E, R);
  auto* active = static_cast<int32_t*>(get(sizeof(int32_t) * n_active));
  if (R <= kSmallSortMax) {  // decode: one block instead of iota + radix sort + offsets
    small_sort_kernel<kBM><<<1, 1024, 0, s>>>(a.ids, R, a.E, perm, offsets, tiles, active, n_active);
    DI_CUDA_LAUNCHED();
  } else {
    iota_kernel<<<grid_for(R, 256), 256, 0, s>>>(entries, R);
    DI_CUDA_LAUNCHED();
    int end_bit = 1;
    while ((int64_t{1} << end_bit) < a.E) ++end_bit;
    size_t temp_bytes = 0;
    DI_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, a.ids, keys_sorted, entries, perm,
                                                  static_cast<int>(R), 0, end_bit, s));
    void* temp = get(temp_bytes);
    DI_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, a.ids, keys_sorted, entries, perm,
                                                  static_cast<int>(R), 0, end_bit, s));
    offsets_kernel<kBM><<<1, 256, 0, s>>>(keys_sorted, R, a.E, offsets, tiles, active, n_active);
    DI_CUDA_LAUNCHED();
  }
  auto* xa = static_cast<bf16*>(get(sizeof(bf16) * R * a.D));
  permute_kernel<<<static_cast<unsigned>(R), 256, 0, s>>>(a.x, perm, a.k, a.D, xa, inv);
  DI_CUDA_LAUNCHED();
  DI_CUDA_REQUIRE(a.form != 1 || moe_skinny_ok(a.D, a.I, a.fp8, a.block_k));
  DI_CUDA_REQUIRE(a.form != 2 || a.blas != nullptr);
  std::vector<int32_t> host_offsets;
  bf16* wbuf = nullptr;  // form 2 with FP8 weights: one expert's weights dequantized
  if (a.form == 2) {
    host_offsets.resize(static_cast<size_t>(a.E + 1));
    DI_CUDA_CHECK(cudaMemcpyAsync(host_offsets.data(), offsets, sizeof(int32_t) * (a.E + 1), cudaMemcpyDeviceToHost, s));
    DI_CUDA_CHECK(cudaStreamSynchronize(s));
    if (a.fp8) wbuf = static_cast<bf16*>(get(sizeof(bf16) * std::max(2 * a.I * a.D, a.D * a.I)));
  }
  auto gemm = [&](const bf16* A, int64_t K, const void* W, const float* scale, int64_t N, float* C) {
    if (a.form == 1) {
      grouped_gemv(A, K, W, scale, a.fp8, a.block_k, N, offsets, active, n_active, 0, C, N, s);
    } else if (a.form == 0) {
      grouped_gemm<float>(A, R, K, W, scale, a.fp8, a.block_k, N, offsets, tiles, a.E, C, s);
    } else {  // C rows of expert e = A rows of e · W_eᵀ, one cuBLAS GEMM each (stream-ordered wbuf reuse)
      const int64_t n_kb = a.fp8 ? (K + a.block_k - 1) / a.block_k : 0;
      for (int64_t e = 0; e < a.E; ++e) {
        const int64_t r0 = host_offsets[static_cast<size_t>(e)], n = host_offsets[static_cast<size_t>(e) + 1] - r0;
        if (n == 0) continue;
        const bf16* We = static_cast<const bf16*>(W) + e * N * K;
        if (a.fp8) {
          dequant_fp8(static_cast<const uint8_t*>(W) + e * N * K, scale + e * N * n_kb, N, K, 1, a.block_k, n_kb, wbuf, s);
          We = wbuf;
        }
        cuda::gemm(a.blas, n, N, K, A + r0 * K, K, 0, We, K, 0, true, C + r0 * N, Elem::kF32, N, 0, 1);
      }
    }
  };
  auto* h13 = static_cast<float*>(get(sizeof(float) * R * 2 * a.I));
  gemm(xa, a.D, a.w13, a.w13_scale, 2 * a.I, h13);
  auto* act = static_cast<bf16*>(get(sizeof(bf16) * R * a.I));
  silu_mul(h13, R, a.I, act, Elem::kBF16, s);
  auto* y = static_cast<float*>(get(sizeof(float) * R * a.D));
  gemm(act, a.I, a.w2, a.w2_scale, a.D, y);
  combine_kernel<<<static_cast<unsigned>(a.T), 256, 0, s>>>(y, inv, a.weights, a.k, a.D, a.out);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
