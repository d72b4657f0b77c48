// MoE on the GPU without host synchronization:
//   route (one thread per token, DeepSeek's selection rule as in route_one_token)
//   → stable radix sort of the (token, slot) entries by expert (cub) → per-expert row offsets
//   and 64-row tile offsets → gather rows as bf16 → grouped GEMM gate|up → SiLU·mul →
//   grouped GEMM down → weighted combine in slot order (deterministic, no atomics).
// The grouped GEMM (part 1) is a plain WMMA kernel: 64×64 tiles, 4 warps, bf16 or FP8
// weights (dequantized while staging into shared memory); part 2 replaces it with wgmma.
#include "backend/cuda/cuda_common.h"

#include <cub/cub.cuh>
#include <cuda_fp8.h>
#include <mma.h>

namespace deepinfer::cuda {
namespace {

constexpr int kMaxExperts = 256;
constexpr int kMaxGroups = 64;

__global__ void route_kernel(RouteArgs a) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= a.T) return;
  const float* lg = a.logits + t * a.E;
  float scores[kMaxExperts], choice[kMaxExperts], group_score[kMaxGroups];
  if (a.scoring == 0) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < a.E; ++e) mx = fmaxf(mx, lg[e]);
    float sum = 0;
    for (int64_t e = 0; e < a.E; ++e) sum += (scores[e] = expf(lg[e] - mx));
    for (int64_t e = 0; e < a.E; ++e) scores[e] /= sum;
  } else {
    for (int64_t e = 0; e < a.E; ++e) scores[e] = 1.0f / (1.0f + expf(-lg[e]));
  }
  for (int64_t e = 0; e < a.E; ++e) choice[e] = scores[e] + (a.bias != nullptr ? a.bias[e] : 0.0f);
  if (a.method != 0 && a.n_group > 1) {
    const int64_t per = a.E / a.n_group;
    for (int64_t g = 0; g < a.n_group; ++g) {
      const float* c = choice + g * per;
      if (a.method == 1) {
        float m = c[0];
        for (int64_t e = 1; e < per; ++e) m = fmaxf(m, c[e]);
        group_score[g] = m;
      } else {
        float x = -INFINITY, y = -INFINITY;
        for (int64_t e = 0; e < per; ++e) {
          if (c[e] > x) { y = x; x = c[e]; } else if (c[e] > y) { y = c[e]; }
        }
        group_score[g] = x + y;
      }
    }
    // Keep the topk_group best groups (stable: ties to the lower group id); mask the others.
    for (int64_t g = 0; g < a.n_group; ++g) {
      int64_t rank = 0;
      for (int64_t o = 0; o < a.n_group; ++o)
        rank += group_score[o] > group_score[g] || (group_score[o] == group_score[g] && o < g);
      if (rank >= a.topk_group)
        for (int64_t e = 0; e < per; ++e) choice[g * per + e] = -INFINITY;
    }
  }
  int32_t* ids = a.ids + t * a.top_k;
  float* w = a.weights + t * a.top_k;
  for (int64_t j = 0; j < a.top_k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < a.E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= ids[i] == e;
      if (taken) continue;
      if (best < 0 || choice[e] > choice[best]) best = e;
    }
    ids[j] = static_cast<int32_t>(best);
    w[j] = scores[best];
  }
  if (a.norm_topk_prob) {
    float sum = 0;
    for (int64_t j = 0; j < a.top_k; ++j) sum += w[j];
    sum += 1e-20f;
    for (int64_t j = 0; j < a.top_k; ++j) w[j] /= sum;
  }
  for (int64_t j = 0; j < a.top_k; ++j) w[j] *= a.scale;
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) v[i] = static_cast<int32_t>(i);
}

// offsets[e] = first sorted entry of expert e (lower bound); tiles[e] = Σ_{e' < e} ceil(count / kBM).
template <int kBM>
__global__ void offsets_kernel(const int32_t* sorted, int64_t n, int64_t E, int32_t* offsets, int32_t* tiles) {
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
    for (int64_t e = 0; e < E; ++e) {
      tiles[e] = acc;
      acc += (offsets[e + 1] - offsets[e] + kBM - 1) / kBM;
    }
    tiles[E] = acc;
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

// C[r, n] = Σ_k A[r, k] · W[e·N + n, k] for the rows r of expert e's segment.
template <bool kFp8, typename OutT>
__global__ void __launch_bounds__(128) grouped_gemm_kernel(const bf16* A, int64_t K, const void* W, const float* wscale,
                                                           int64_t n_kb, int64_t block_k, int64_t N,
                                                           const int32_t* offsets, const int32_t* tiles, int64_t E,
                                                           OutT* C) {
  using namespace nvcuda;
  const int64_t tile = blockIdx.y;
  if (tile >= tiles[E]) return;
  int64_t lo = 0, hi = E - 1;  // expert: the largest e with tiles[e] ≤ tile
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (tiles[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const int64_t e = lo;
  const int64_t m0 = offsets[e] + (tile - tiles[e]) * kBM;
  const int64_t rows = min(static_cast<int64_t>(kBM), static_cast<int64_t>(offsets[e + 1]) - m0);
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

template <typename OutT>
void grouped_gemm(const bf16* A, int64_t R, int64_t K, const void* W, const float* scale, bool fp8, int64_t block_k,
                  int64_t N, const int32_t* offsets, const int32_t* tiles, int64_t E, OutT* C, cudaStream_t s) {
  const int64_t max_tiles = (R + kBM - 1) / kBM + E;
  DI_CUDA_REQUIRE(max_tiles <= 65535);  // grid.y limit: R = tokens·top_k rows per step
  const dim3 grid(grid_for(N, kBN), static_cast<unsigned>(max_tiles));
  const int64_t n_kb = fp8 ? (K + block_k - 1) / block_k : 0;
  if (fp8) grouped_gemm_kernel<true, OutT><<<grid, 128, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, C);
  else grouped_gemm_kernel<false, OutT><<<grid, 128, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, C);
  DI_CUDA_LAUNCHED();
}

}  // namespace

void moe_route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  DI_CUDA_REQUIRE(a.E <= kMaxExperts);
  DI_CUDA_REQUIRE(a.n_group <= kMaxGroups);
  route_kernel<<<grid_for(a.T, 64), 64, 0, s>>>(a);
  DI_CUDA_LAUNCHED();
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
  offsets_kernel<kBM><<<1, 256, 0, s>>>(keys_sorted, R, a.E, offsets, tiles);
  DI_CUDA_LAUNCHED();
  auto* xa = static_cast<bf16*>(get(sizeof(bf16) * R * a.D));
  permute_kernel<<<static_cast<unsigned>(R), 256, 0, s>>>(a.x, perm, a.k, a.D, xa, inv);
  DI_CUDA_LAUNCHED();
  auto* h13 = static_cast<float*>(get(sizeof(float) * R * 2 * a.I));
  grouped_gemm<float>(xa, R, a.D, a.w13, a.w13_scale, a.fp8, a.block_k, 2 * a.I, offsets, tiles, a.E, h13, s);
  auto* act = static_cast<bf16*>(get(sizeof(bf16) * R * a.I));
  silu_mul(h13, R, a.I, act, Elem::kBF16, s);
  auto* y = static_cast<float*>(get(sizeof(float) * R * a.D));
  grouped_gemm<float>(act, R, a.I, a.w2, a.w2_scale, a.fp8, a.block_k, a.D, offsets, tiles, a.E, y, s);
  combine_kernel<<<static_cast<unsigned>(a.T), 256, 0, s>>>(y, inv, a.weights, a.k, a.D, a.out);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
