// MoE on the GPU, without host synchronization except in the per-expert cuBLAS form:
//   route (a warp per token, DeepSeek's selection rule as in route_one_token)
//   → stable sort of the (token, slot) entries by expert (one block for ≤ 512 entries, else
//   the counting sort of cuda_moe_sort.cu) → per-expert row offsets, 64-row tile offsets and
//   the active experts
//   → gather rows as bf16 → grouped GEMM gate|up → SiLU·mul →
//   grouped GEMM down → weighted combine in slot order (deterministic: no float atomics).
// Shared experts may ride along (MoeArgs::n_shared): extra experts after the routed ones, in
// every token's last slots with weight 1, so one launch per stage serves both.
// The forms of the grouped GEMMs (MoeArgs::form; cuda::moe_form picks by the step's size and
// mode, cuda_moe_form.h):
//  - GEMV (decode, 1–2 tokens in the default mode; FP8 weights 1): the decode GEMV
//    (cuda_gemv.cu) — weights streamed once at the copy rate, fp32 FMAs on the CUDA cores (the
//    weights' bandwidth, not the math, is the limit at a row or two per expert). After the
//    one-block sort it reads the tokens' rows through the permutation and applies SiLU·mul in
//    the gate|up epilogue (no gather, no separate SiLU·mul launch);
//  - per-expert cuBLAS (prefill): the row counts are read back (one host synchronization, never
//    inside a graph) and each expert with rows gets one tensor-core GEMM;
//  - tiled: tensor cores over each expert's 64-row tiles, sync-free for any size — version 3
//    (mma.sync via PTX, 64×256 tiles, 4-stage cp.async pipeline, ldmatrix) where K % 8 == 0
//    (kUseTiledV3), else version 1 (WMMA, 64×64 tiles, scalar staging); version 2 (WMMA, 64×128,
//    register-staged double buffering) stays as the reference the tests compare against. All
//    three fold K identically (bitwise equal), with or without the batch-invariant K splits;
//  - small-M (≤ 512 routed rows): small_m_gemm (cuda_invariant_gemm.cu), bitwise equal to the
//    tiled form with the invariant K structure — or, MoeArgs::one_chain (K in one split), to the
//    tiled and wgmma forms without it.
//  - wgmma (bf16 weights, sm_90, beyond 512 routed rows): bf16_wgmma_grouped_gemm
//    (cuda_bf16_wgmma.cu), 128×256 tiles of each expert's rows fed by TMA, sync-free;
//  - W8A8 (FP8 weights, sm_90, every step beyond one token; in the batch-invariant mode every
//    step): each token's row quantized per 1×128 group once
//    (quantize_fp8_rows_bf16: no bf16 copy), then copied to its slots (gather_quantized_kernel),
//    the FP8 wgmma GEMM (cuda_fp8_wgmma.cu; its block form where the per-row scales are uniform
//    over 128-row blocks) writing gate|up in bf16, SiLU·mul straight into the down GEMM's
//    quantized input (silu_mul_quantize_fp8) — or, MoeArgs::glu_fused, the GEMM's epilogue
//    writing that input itself (fp8_wgmma_glu_quantize: the same codes) —, the down GEMM (bf16
//    out), the combine —
//    DeepSeek's "fp8" GEMM path (activations lose ~2^-4 per element, gate|up and each expert's
//    output ~2^-9, as in the reference system's bf16 GEMM outputs), sync-free.
#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_moe_route.cuh"
#include "backend/cuda/cuda_moe_slots.cuh"
#include "backend/cuda/cuda_norm_row.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_search.cuh"

#include <algorithm>
#include <type_traits>
#include <vector>
#include <cuda_fp8.h>
#include <mma.h>

namespace deepinfer::cuda {
namespace {

constexpr int kMaxExperts = kRouteMaxExperts;  // routed experts (the router's limit)
constexpr int kMaxSharedExperts = kMaxExperts;  // shared-expert slices run as extra experts (MoeArgs::n_shared)
static_assert(kMaxExperts + kMaxSharedExperts <= kMoeSortMaxExperts, "moe_sort takes every expert");
constexpr int kMaxGroups = kRouteMaxGroups;

constexpr int kRouteWarps = 4;

// One warp per token (kRouteWarps tokens per block): route_row (cuda_moe_route.cuh).
__global__ void __launch_bounds__(kRouteWarps * 32) route_kernel(RouteArgs a) {
  pdl_wait();
  pdl_trigger();
  __shared__ float smem[kRouteWarps][kRouteSmemFloats];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= a.T) return;  // whole warps leave; no block-wide barrier follows
  route_row(a, a.logits + t * a.E, smem[warp], lane, a.ids + t * a.top_k, a.weights + t * a.top_k);
}

constexpr int64_t kSmallSortMax = 512;  // routed rows sorted by small_sort_kernel

// Decode-sized steps (R ≤ kSmallSortMax entries): one 1024-thread block does what moe_sort's
// three launches do — perm lists the (token, slot) entries by expert, ties
// in entry order (an entry's rank is the number of earlier entries of its expert: O(R²/1024)
// compares, ≤ 256 per thread) and its inverse inv, plus offsets, tile offsets and the
// active-expert list. Counts use shared-memory atomics (exact integers: order-free). Shared:
// ids [512], starts [E + 1]. Entries: slot_expert (kt = k + n_shared; E counts both).
template <int kBM>
__global__ void __launch_bounds__(1024) small_sort_kernel(const int32_t* ids, int64_t k, int64_t kt, int64_t R,
                                                          int64_t E, int32_t* perm, int32_t* inv, int32_t* offsets,
                                                          int32_t* tiles, int32_t* active, int64_t n_active) {
  pdl_wait();
  pdl_trigger();
  __shared__ int32_t s_ids[kSmallSortMax];
  __shared__ int32_t s_start[kMaxExperts + kMaxSharedExperts + 1];
  const int t = threadIdx.x;
  const int64_t e_routed = E - (kt - k);
  for (int e = t; e <= E; e += blockDim.x) s_start[e] = 0;
  for (int i = t; i < R; i += blockDim.x) s_ids[i] = slot_expert(ids, i, k, kt, e_routed);
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
    inv[i] = s_start[e] + rank;
  }
}

// Four values rounded to bf16 (round to nearest even), packed for one 8-byte store.
__device__ __forceinline__ uint2 bf16x4(float a, float b, float c, float d) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
}

// xa[i] = bf16(x[perm[i] / k]).
__global__ void permute_kernel(const float* x, const int32_t* perm, int64_t k, int64_t D, bf16* xa) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = blockIdx.x;
  const int64_t entry = perm[i], t = entry / k;
  const float* src = x + t * D;
  bf16* dst = xa + i * D;
  if (D % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {  // 4 values per load (rows stay 16-byte aligned)
    const int n4 = static_cast<int>(D / 4);
    for (int j = threadIdx.x; j < n4; j += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(src)[j];
      reinterpret_cast<uint2*>(dst)[j] = bf16x4(v.x, v.y, v.z, v.w);  // xa: step arena (256-B aligned), D % 4 == 0
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) dst[j] = __float2bfloat16(src[j]);
}

// Row i of q / sq ← row perm[i] / k of qx / sqx: the slots' rows from each token's quantized row
// (a row's quantization does not depend on its slot, so these are the bits of quantizing the
// gathered rows). qx [T, D] e4m3, sqx [T, kb] fp32, q [R, D], sq [R, kb]; D % 16 == 0, the rows
// 16-byte aligned. A warp per row (kGatherRows per block), its 16-byte loads issued together
// before its stores: a block per row of 128 threads waited on two dependent round trips per
// 2 KB row (32 µs per V2-Lite layer at 4,096 tokens, ~1.9 TB/s, run s21-3).
constexpr int kGatherRows = 8;
__global__ void __launch_bounds__(32 * kGatherRows)
    gather_quantized_kernel(const uint8_t* qx, const float* sqx, const int32_t* perm, int64_t R, int64_t k, int64_t D,
                            int64_t kb, uint8_t* q, float* sq) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = int64_t{blockIdx.x} * kGatherRows + threadIdx.x / 32;
  if (i >= R) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t src = perm[i] / k, n16 = D / 16;
  const auto* from = reinterpret_cast<const uint4*>(qx + src * D);
  auto* to = reinterpret_cast<uint4*>(q + i * D);
  constexpr int kUnroll = 4;
  for (int64_t c0 = lane; c0 < n16; c0 += 32 * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + 32 * u < n16) v[u] = from[c0 + 32 * u];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + 32 * u < n16) to[c0 + 32 * u] = v[u];
  }
  for (int64_t g = lane; g < kb; g += 32) sq[i * kb + g] = sqx[src * kb + g];
}

// act[r, c] = bf16(silu(g) · u) with g = h[r, c], u = h[r, I + c] (h [R, 2I]), each the sum of
// n_parts partials h_p = h + p · stride added in order (the first as is): sum_splits then
// silu_mul in one pass, the same arithmetic. Block r (a row; grid-stride past 2^31 rows), its
// threads over the row's columns: 4 at a time (float4 loads, 8-byte stores) when vec (I % 4 == 0,
// h 16-byte aligned), else one at a time — the same values.
__global__ void sum_silu_mul_kernel(const float* h, int64_t n_parts, int64_t stride, int64_t R, int64_t I, bool vec,
                                    bf16* act) {
  pdl_wait();
  pdl_trigger();
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const float* hg = h + r * 2 * I;
    bf16* out = act + r * I;
    if (vec) {
      const int n4 = static_cast<int>(I / 4);
      for (int j = threadIdx.x; j < n4; j += blockDim.x) {
        float4 g = reinterpret_cast<const float4*>(hg)[j], u = reinterpret_cast<const float4*>(hg + I)[j];
        for (int64_t p = 1; p < n_parts; ++p) {
          const float4 gp = reinterpret_cast<const float4*>(hg + p * stride)[j];
          const float4 up = reinterpret_cast<const float4*>(hg + p * stride + I)[j];
          g = make_float4(g.x + gp.x, g.y + gp.y, g.z + gp.z, g.w + gp.w);
          u = make_float4(u.x + up.x, u.y + up.y, u.z + up.z, u.w + up.w);
        }
        reinterpret_cast<uint2*>(out)[j] =
            bf16x4(silu_times(g.x, u.x), silu_times(g.y, u.y), silu_times(g.z, u.z), silu_times(g.w, u.w));
      }
      continue;
    }
    for (int64_t c = threadIdx.x; c < I; c += blockDim.x) {
      float g = hg[c], u = hg[c + I];
      for (int64_t p = 1; p < n_parts; ++p) {
        g = g + hg[p * stride + c];
        u = u + hg[p * stride + c + I];
      }
      out[c] = __float2bfloat16(silu_times(g, u));
    }
  }
}

// out[t] = Σ_s w[t, s] · y[inv[t, s]] in slot order s = 0 .. k−1 (deterministic); w has kw ≤ k
// columns, the shared slots s ≥ kw weigh 1 (an exact product); y's rows are each the sum of
// n_parts partials y + p · stride, added in order first (sum_splits' arithmetic). For k ≤
// kCombineMaxK the token's k weights and rows are read once into shared memory (the output
// cannot alias them, so nothing is re-read per column), then float4 columns (vec);
// larger k reads them per column. vec: D % 4 == 0 and y, out 16-byte aligned. The same
// per-element arithmetic on every path. Block (token, kCombineCols columns) of
// kCombineThreads: a one-token step spreads its loads over D / 256 blocks (one block per
// token took 11 µs for V2-Lite's 8 slots × 3 partials, run s7-4). y fp32, or bf16 (the W8A8
// form's down GEMM output: half the bytes of the pass; vec then loads 8 bytes per 4 values, and
// `wide` — D % 8 == 0 — 16 bytes per 8 values, 2 · kCombineCols columns per block: half the
// load instructions; each value's arithmetic is the same).
constexpr int kCombineMaxK = 16;
constexpr int kCombineThreads = 64, kCombineCols = 4 * kCombineThreads;
__device__ __forceinline__ float4 load_y4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 bf16x4_to_float4(uint32_t a, uint32_t b) {
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&b));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float4 load_y4(const bf16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  return bf16x4_to_float4(raw.x, raw.y);
}
// Eight bf16 values at p (16-byte aligned) as two float4.
__device__ __forceinline__ void load_y8(const bf16* p, float4& lo, float4& hi) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  lo = bf16x4_to_float4(raw.x, raw.y);
  hi = bf16x4_to_float4(raw.z, raw.w);
}
__device__ __forceinline__ void add4(float4& v, const float4& q) {
  v.x = v.x + q.x;
  v.y = v.y + q.y;
  v.z = v.z + q.z;
  v.w = v.w + q.w;
}
__device__ __forceinline__ void add_weighted4(float4& acc, float w, const float4& v) {
  acc.x += w * v.x;
  acc.y += w * v.y;
  acc.z += w * v.z;
  acc.w += w * v.w;
}
// Columns j .. j + 3 of a token's combine (vec: j % 4 == 0, y and the addend row 16-byte aligned):
// its k slot rows (y + srow[s], each the sum of n_parts partials stride apart, added in order)
// weighted by sw[s] in slot order, then + addend_row[j..] (null: none) — the one spelling of the
// per-element arithmetic combine_kernel's vec path and combine_norm_kernel share.
template <typename YT>
__device__ __forceinline__ float4 combine4(const YT* __restrict__ y, int64_t n_parts, int64_t stride, const float* sw,
                                           const int64_t* srow, int64_t k, const float* __restrict__ addend_row,
                                           int64_t j) {
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
  for (int64_t s = 0; s < k; ++s) {
    float4 v = load_y4(y + srow[s] + j);
    for (int64_t p = 1; p < n_parts; ++p) add4(v, load_y4(y + p * stride + srow[s] + j));
    add_weighted4(acc, sw[s], v);
  }
  if (addend_row != nullptr) add4(acc, *reinterpret_cast<const float4*>(addend_row + j));
  return acc;
}
template <typename YT>
__global__ void combine_kernel(const YT* __restrict__ y, int64_t n_parts, int64_t stride,
                               const int32_t* __restrict__ inv, const float* __restrict__ w, int64_t kw, int64_t k,
                               int64_t D, bool vec, bool wide, const float* __restrict__ addend,
                               float* __restrict__ out) {
  pdl_wait();
  pdl_trigger();
  __shared__ float sw[kCombineMaxK];
  __shared__ int64_t srow[kCombineMaxK];
  const int64_t cols = wide ? 2 * kCombineCols : kCombineCols;
  const int64_t t = blockIdx.x, c0 = static_cast<int64_t>(blockIdx.y) * cols;
  const int64_t c_end = min(D, c0 + cols);
  auto weight = [&](int64_t s) { return s < kw ? w[t * kw + s] : 1.0f; };
  auto y_at = [&](int64_t at) {
    float v = static_cast<float>(y[at]);
    for (int64_t p = 1; p < n_parts; ++p) v = v + static_cast<float>(y[p * stride + at]);
    return v;
  };
  if (k > kCombineMaxK) {
    for (int64_t j = c0 + threadIdx.x; j < c_end; j += blockDim.x) {
      float acc = 0;
      for (int64_t s = 0; s < k; ++s) acc += weight(s) * y_at(static_cast<int64_t>(inv[t * k + s]) * D + j);
      out[t * D + j] = addend != nullptr ? acc + addend[t * D + j] : acc;
    }
    return;
  }
  if (threadIdx.x < k) {
    sw[threadIdx.x] = weight(threadIdx.x);
    srow[threadIdx.x] = static_cast<int64_t>(inv[t * k + threadIdx.x]) * D;
  }
  __syncthreads();
  if constexpr (sizeof(YT) == 2) {
    if (wide) {
      for (int64_t j = c0 + 8 * threadIdx.x; j < c_end; j += 8 * blockDim.x) {
        float4 acc0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), acc1 = acc0;
#pragma unroll 8
        for (int64_t s = 0; s < k; ++s) {
          float4 v0, v1;
          load_y8(y + srow[s] + j, v0, v1);
          for (int64_t p = 1; p < n_parts; ++p) {
            float4 q0, q1;
            load_y8(y + p * stride + srow[s] + j, q0, q1);
            add4(v0, q0);
            add4(v1, q1);
          }
          add_weighted4(acc0, sw[s], v0);
          add_weighted4(acc1, sw[s], v1);
        }
        if (addend != nullptr) {
          add4(acc0, *reinterpret_cast<const float4*>(addend + t * D + j));
          add4(acc1, *reinterpret_cast<const float4*>(addend + t * D + j + 4));
        }
        *reinterpret_cast<float4*>(out + t * D + j) = acc0;
        *reinterpret_cast<float4*>(out + t * D + j + 4) = acc1;
      }
      return;
    }
  }
  if (vec) {
    for (int64_t j = c0 + 4 * threadIdx.x; j < c_end; j += 4 * blockDim.x)
      *reinterpret_cast<float4*>(out + t * D + j) =
          combine4(y, n_parts, stride, sw, srow, k, addend != nullptr ? addend + t * D : nullptr, j);
    return;
  }
  for (int64_t j = c0 + threadIdx.x; j < c_end; j += blockDim.x) {
    float acc = 0;
    for (int64_t s = 0; s < k; ++s) acc += sw[s] * y_at(srow[s] + j);
    out[t * D + j] = addend != nullptr ? acc + addend[t * D + j] : acc;
  }
}

// combine_kernel's output folded into the next sublayer's input norm (MoeArgs::norm), one block
// of kNormThreads per token: thread t's float4 chunks j = t + kNormThreads·x (x < kVec) of the
// combine — combine4, combine_kernel's per-element arithmetic — are add_rms_norm's delta, kept in
// registers: then norm_row_chunk / block_sum / norm_row_store as add_rms_norm_vec_kernel<kVec,
// kRows> runs them (kRows 0: x; 1: x and its FP8 codes; 2: x and its bf16 rows). The bits of
// combine_kernel then that kernel; the combine's [T, D] fp32 output is neither written nor read
// back (V2-Lite at 4,096 tokens: 67 MB a layer). kStaged (bf16 rows of one part, k·D·2 bytes ≤
// kFoldStageBytes): the token's k slot rows first copied into shared memory 16 bytes a load, all
// of a thread's loads in flight together — a thread's chunks are 8 bytes of each bf16 row, which
// it otherwise reads 8 bytes at a time (run s37-7: the FP8 fold no faster than the two launches;
// staged, s38-1: 36.75 → 36.15 ms at the FP8 4K prefill, a tie with the two launches). The launch
// bound asks for one resident block per SM only: aiming at more, ptxas spilled 24–108 bytes; with
// it, 110 registers unstaged, 80 staged, no spills. Needs k ≤ kCombineMaxK, D % 4 == 0 (kRows 1: D % 128 == 0; kStaged: D % 8 == 0),
// D ≤ 4·kNormThreads·kVec, y / addend / residual / x 16-byte aligned.
constexpr int64_t kFoldStageBytes = 48 * 1024;
template <typename YT, int kVec, int kRows, bool kStaged>
__global__ void __launch_bounds__(kNormThreads, 1)
    combine_norm_kernel(const YT* __restrict__ y, int64_t n_parts, int64_t stride, const int32_t* __restrict__ inv,
                        const float* __restrict__ w, int64_t kw, int64_t k, int64_t D,
                        const float* __restrict__ addend, MoeArgs::NextNorm n) {
  NormWeight<kVec> nw;
  norm_row_weight(nw, n.w, n.we, D);  // before the wait: its HBM latency off the chain
  pdl_wait();
  pdl_trigger();
  __shared__ float sw[kCombineMaxK];
  __shared__ int64_t srow[kCombineMaxK], srow_staged[kCombineMaxK];
  extern __shared__ uint4 staged[];  // kStaged: [k][D / 8] the slot rows, 8 bf16 a chunk
  const int64_t t = blockIdx.x;
  if (threadIdx.x < k) {
    sw[threadIdx.x] = threadIdx.x < kw ? w[t * kw + threadIdx.x] : 1.0f;
    srow[threadIdx.x] = static_cast<int64_t>(inv[t * k + threadIdx.x]) * D;
    srow_staged[threadIdx.x] = threadIdx.x * D;
  }
  __syncthreads();
  const YT* rows = y;
  const int64_t* row_at = srow;
  if constexpr (kStaged) {
    const int n8 = static_cast<int>(D / 8);
    constexpr int kBatch = 8;  // slots whose 16-byte loads a thread has in flight at once
    for (int c = static_cast<int>(threadIdx.x); c < n8; c += kNormThreads)
      for (int s0 = 0; s0 < k; s0 += kBatch) {
        uint4 v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (s0 + b < k) v[b] = reinterpret_cast<const uint4*>(y + srow[s0 + b])[c];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (s0 + b < k) staged[(s0 + b) * n8 + c] = v[b];
      }
    __syncthreads();
    rows = reinterpret_cast<const YT*>(staged);
    row_at = srow_staged;
  }
  const int n4 = static_cast<int>(D / 4);
  const float4* r4 = reinterpret_cast<const float4*>(n.residual + t * D);
  NormRow<kVec> r;
  float ss = 0;
  // (No break out of this loop, unlike norm_row_add's: with one, ptxas kept the chunk index at
  // run time and r in local memory — 108 bytes of spill stores at kVec 2, kRows 1.)
#pragma unroll
  for (int x = 0; x < kVec; ++x) {
    const int j4 = static_cast<int>(threadIdx.x) + kNormThreads * x;
    if (j4 < n4) {
      const float4 acc = combine4(rows, kStaged ? 1 : n_parts, stride, sw, row_at, k,
                                  addend != nullptr ? addend + t * D : nullptr, 4 * int64_t{j4});
      norm_row_chunk(r, x, r4[j4], acc, ss);
    }
  }
  r.inv = rsqrtf(block_sum(ss) / static_cast<float>(D) + n.eps);
  uint8_t* q = kRows == 1 ? n.q + t * D : kRows == 2 ? reinterpret_cast<uint8_t*>(n.xb + t * D) : nullptr;
  norm_row_store<kVec, kRows>(r, nw, D, n.residual + t * D, n.x + t * D, q,
                              kRows == 1 ? n.sq + t * (D / kFp8GroupK) : nullptr, nullptr);
}

constexpr int kBM = 64, kBN = 64, kBK = 32, kPad = 8;

// Row tile `tile` of the sorted rows (tiles[e]: expert e's first 64-row tile): its expert, first
// row and row count (≤ kBM). False past the last tile. offsets == null: one dense "expert" 0 of
// rows [0, dense_rows).
__device__ __forceinline__ bool tile_rows(int64_t tile, const int32_t* offsets, const int32_t* tiles, int64_t E,
                                          int64_t dense_rows, int64_t* e, int64_t* m0, int64_t* rows) {
  if (offsets == nullptr) {
    *e = 0;
    *m0 = tile * kBM;
    *rows = min(static_cast<int64_t>(kBM), dense_rows - *m0);
    return *rows > 0;
  }
  if (tile >= tiles[E]) return false;
  const int64_t lo = last_at_most(tiles, E, tile);  // the largest e with tiles[e] ≤ tile
  *e = lo;
  *m0 = offsets[lo] + (tile - tiles[lo]) * kBM;
  *rows = min(static_cast<int64_t>(kBM), static_cast<int64_t>(offsets[lo + 1]) - *m0);
  return true;
}

// The batch-invariant K structure (split_k > 0, see invariant_k_splits): the 16-wide K chunks
// of [s·split_k, (s+1)·split_k) fold into a fresh accumulator `acc`, which joins the running
// `total` in split order (total = acc of split 0, then total += acc of each next split) — the
// order small_m_gemm's split blocks and their ordered sum produce. Called at each split's end.
// Applied to a warp's 2×2 accumulator fragments (tiled versions 1 and 2).
template <typename Frag>
__device__ __forceinline__ void close_k_split(Frag (&total)[2][2], Frag (&acc)[2][2], bool first) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int v = 0; v < acc[i][j].num_elements; ++v)
        total[i][j].x[v] = first ? acc[i][j].x[v] : total[i][j].x[v] + acc[i][j].x[v];
      nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
    }
}

// C[r, n] = Σ_k A[r, k] · W[e·N + n, k] for the rows r of expert e's segment. kInvariant: the
// batch-invariant K structure (close_k_split; a template flag, so the default kernel carries
// no extra accumulator registers).
template <bool kFp8, bool kInvariant, typename OutT>
__global__ void __launch_bounds__(128) grouped_gemm_kernel(const bf16* A, int64_t K, const void* W, const float* wscale,
                                                           int64_t n_kb, int64_t block_k, int64_t N,
                                                           const int32_t* offsets, const int32_t* tiles, int64_t E,
                                                           int64_t dense_rows, OutT* C, int64_t ldc) {
  using namespace nvcuda;
  constexpr int64_t split_k = kInvariant ? kInvariantSplitK : 0;
  int64_t e, m0, rows;
  if (!tile_rows(blockIdx.y, offsets, tiles, E, dense_rows, &e, &m0, &rows)) return;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;

  __shared__ __align__(32) bf16 As[kBM][kBK + kPad];
  __shared__ __align__(32) bf16 Bs[kBN][kBK + kPad];
  __shared__ __align__(32) float Cs[kBM][kBN + 4];
  const int warp = threadIdx.x / 32;
  const int wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2], total[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    if constexpr (kInvariant) {
      if (k0 > 0 && k0 % split_k == 0) close_k_split(total, acc, k0 == split_k);
    }
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
  if constexpr (kInvariant) close_k_split(total, acc, K <= split_k);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], kInvariant ? total[i][j] : acc[i][j], kBN + 4,
                              wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kBM * kBN; idx += blockDim.x) {
    const int r = idx / kBN, c = idx % kBN;
    if (r < rows && n0 + c < N) {
      const float v = Cs[r][c];
      if constexpr (sizeof(OutT) == 4) C[(m0 + r) * ldc + n0 + c] = v;
      else C[(m0 + r) * ldc + n0 + c] = __float2bfloat16(v);
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

template <bool kFp8, bool kInvariant>
__global__ void __launch_bounds__(256) grouped_gemm_v2_kernel(const bf16* A, int64_t K, const void* W,
                                                              const float* wscale, int64_t n_kb, int64_t block_k,
                                                              int64_t N, const int32_t* offsets, const int32_t* tiles,
                                                              int64_t E, int64_t dense_rows, float* C, int64_t ldc) {
  using namespace nvcuda;
  constexpr int64_t split_k = kInvariant ? kInvariantSplitK : 0;
  int64_t e, m0, rows;
  if (!tile_rows(blockIdx.y, offsets, tiles, E, dense_rows, &e, &m0, &rows)) return;
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

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2], total[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  load(0);
  store(0);
  __syncthreads();
  int buf = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kV2K) {
    if constexpr (kInvariant) {
      if (k0 > 0 && k0 % split_k == 0) close_k_split(total, acc, k0 == split_k);
    }
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
  if constexpr (kInvariant) close_k_split(total, acc, K <= split_k);
  auto Cs = reinterpret_cast<float(*)[kV2N + 4]>(smem);  // [64][132], aliasing A/B (all reads done)
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], kInvariant ? total[i][j] : acc[i][j],
                              kV2N + 4, wmma::mem_row_major);
  __syncthreads();
  for (int idx = t; idx < kV2M * kV2N; idx += blockDim.x) {
    const int r = idx / kV2N, c = idx % kV2N;
    if (r < rows && n0 + c < N) C[(m0 + r) * ldc + n0 + c] = Cs[r][c];
  }
}

// Version 3 of the tiled grouped GEMM (K % 8 == 0; FP8: block_k % 8 == 0): the same tiles of
// each expert's rows as versions 1 and 2 (64 rows from tile_rows), 256 output columns per block,
// on mma.sync m16n8k16 bf16 → fp32 through inline PTX.
//  - 256 threads = 8 warps side by side along N: warp w owns columns [n0 + 32w, n0 + 32w + 32)
//    of all 64 rows, a 64×32 warp tile = 4 (m16) × 4 (n8) MMA tiles, 64 fp32 accumulators per
//    lane (c0, c1: row lane/4, columns 2·(lane%4) + {0, 1}; c2, c3: row + 8).
//  - K in 32-wide steps through a 4-stage cp.async pipeline (16-byte copies; zero-filled past
//    the tile's rows, past N and past K), one barrier per step. Shared stages: A [64][32] bf16,
//    W [256][32] bf16 — 64-byte rows, the four 16-byte chunks XOR-swizzled by (row / 2) % 4 so
//    ldmatrix's 8 row addresses of a matrix hit 8 distinct bank groups (v3_swz).
//  - FP8 weights: the stage holds the raw bytes [256][32] e4m3 (16-byte copies when K % 16 == 0,
//    else 8-byte: FP8 rows are then only 8-byte aligned); each warp widens its own 32 rows into a
//    private [32][32] bf16 buffer (same swizzle) as bf16(fp8 · scale) — version 2's rounding —
//    with the scales of the next step loaded into registers while this step multiplies.
//  - Fragments by ldmatrix.x4 (A row-major m16×k16; W rows are B's columns, so no .trans).
// Bitwise contract: each output element gets one m16n8k16 per 16-wide K chunk, chunks in
// increasing K order, from a zero accumulator — exactly what WMMA m16n16k16 (two m16n8k16) does
// in versions 1 and 2 and in small_m_gemm; zero chunks past K add exact zeros. kInvariant: a fresh
// accumulator per kInvariantSplitK split, joined into `total` in split order (close_k_split's
// arithmetic on plain registers). K is never split across warps or blocks.
// Shared memory (dynamic): bf16 4 · (4 + 16) KB = 80 KB; FP8 4 · (4 + 8) KB + 8 · 2 KB = 64 KB:
// two blocks per SM where registers allow. ptxas (sm_90a, CUDA 13), no spills: 113 registers
// (bf16) and 128 (FP8) under the 2-block bound; the invariant form carries 64 more accumulators
// (186 / 216 registers, one block of 8 warps per SM).
// M tiles whose rows are all past the tile's rows, and warps whose columns are all past N, skip
// their MMAs (their outputs are never written).
constexpr int kV3M = 64, kV3N = 256, kV3K = 32, kV3Stages = 4, kV3Threads = 256;
constexpr int kV3RowBytes = kV3K * 2;              // one bf16 row of a stage: 64 bytes
constexpr int kV3ABytes = kV3M * kV3RowBytes;      // A stage: 4 KB
constexpr int kV3WBytes = kV3N * kV3RowBytes;      // W stage, bf16: 16 KB
constexpr int kV3W8Bytes = kV3N * kV3K;            // W stage, raw FP8: 8 KB
constexpr int kV3WideBytes = 32 * kV3RowBytes;     // a warp's widened FP8 rows: 2 KB
static_assert(kV3M == kBM, "version 3 reads the same 64-row tiles");
static_assert(kV3N == 32 * (kV3Threads / 32), "one 32-column slab per warp");
static_assert(kInvariantSplitK % kV3K == 0, "K splits end on step boundaries");

template <bool kFp8>
constexpr size_t v3_smem_bytes() {
  return kV3Stages * static_cast<size_t>(kV3ABytes + (kFp8 ? kV3W8Bytes : kV3WBytes)) +
         (kFp8 ? static_cast<size_t>(kV3Threads / 32) * kV3WideBytes : 0);
}

// Byte offset of 16-byte chunk c (0..3) of row r in a [rows][32] bf16 tile (64-byte rows): the
// chunk XOR (r / 2) % 4. Rows 2i and 2i + 1 share a 128-byte line, so the 8 consecutive rows an
// ldmatrix matrix reads at one logical chunk land on 8 distinct 16-byte bank groups.
__device__ __forceinline__ int v3_swz(int r, int c) { return r * kV3RowBytes + ((c ^ ((r >> 1) & 3)) << 4); }

// Two e4m3 codes (low byte first) → bf16x2 of (fp8 · scale), each rounded as
// __float2bfloat16(static_cast<float>(fp8) · scale): e4m3 → f16 → f32 is exact, one fp32
// multiply, round to nearest even.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two, float scale) {
  const float2 f = e4m3x2_to_float2(two & 0xffffu);
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const uint32_t*>(&b);
}

template <bool kFp8, bool kInvariant>
__global__ void __launch_bounds__(kV3Threads, kInvariant ? 1 : 2)
    grouped_gemm_v3_kernel(const bf16* A, int64_t K, const void* W, const float* wscale, int64_t n_kb,
                           int64_t block_k, int64_t N, const int32_t* offsets, const int32_t* tiles, int64_t E,
                           int64_t dense_rows, float* C, int64_t ldc) {
  int64_t e, m0, rows;
  if (!tile_rows(blockIdx.y, offsets, tiles, E, dense_rows, &e, &m0, &rows)) return;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kV3N;
  constexpr int kWStage = kFp8 ? kV3W8Bytes : kV3WBytes;

  extern __shared__ __align__(128) unsigned char v3_smem[];
  // [kV3Stages] A stages | [kV3Stages] W stages | FP8: [8 warps] widened W rows
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const uint32_t a_smem = static_cast<uint32_t>(__cvta_generic_to_shared(v3_smem));
  const uint32_t w_smem = a_smem + kV3Stages * kV3ABytes;
  const uint32_t wide_smem = w_smem + kV3Stages * kWStage + warp * kV3WideBytes;
  unsigned char* const w_gen = v3_smem + kV3Stages * kV3ABytes;
  unsigned char* const wide_gen = w_gen + kV3Stages * kWStage + warp * kV3WideBytes;

  const int n_steps = static_cast<int>((K + kV3K - 1) / kV3K);

  // This thread's copies, fixed over the K loop (the source advances by kV3K columns a step):
  // A: row t / 4, chunk t % 4 (8 bf16). W bf16: rows t / 4 + 64 j, chunk t % 4 (j < 4). W FP8
  // with K % 16 == 0: rows t / 2 + 128 j, 16-byte chunk t % 2 (j < 2); else rows t / 4 + 64 j,
  // 8-byte chunk t % 4 (j < 4).
  const int a_r = t / 4, a_c = t % 4;
  const bool a_row_ok = a_r < rows;
  const bf16* const a_src = A + (m0 + a_r) * K + a_c * 8;
  const uint32_t a_dst = a_smem + v3_swz(a_r, a_c);
  const bool fp8_rows16 = kFp8 && K % 16 == 0;  // FP8 rows 16-byte aligned
  const int w_per_row = fp8_rows16 ? 2 : 4;     // copies per W row and step
  const int w_r = t / w_per_row, w_c = t % w_per_row;
  const int w_row_step = kV3Threads / w_per_row;  // rows between a thread's copies: 64 or 128
  const int w_col = w_c * (fp8_rows16 ? 16 : 8);  // first column of the copy within the step
  const size_t w_elem = kFp8 ? 1 : sizeof(bf16);
  const unsigned char* const w_src = static_cast<const unsigned char*>(W) + ((e * N + n0 + w_r) * K + w_col) * w_elem;
  const int64_t w_src_step = w_row_step * K * static_cast<int64_t>(w_elem);  // bytes between a thread's rows
  const uint32_t w_dst =
      w_smem + static_cast<uint32_t>(kFp8 ? w_r * kV3K + w_col : v3_swz(w_r, w_c));  // FP8 stages: no swizzle
  const uint32_t w_dst_step = static_cast<uint32_t>(w_row_step * (kFp8 ? kV3K : kV3RowBytes));

  // Copies of step `step` into its stage (zero-filled past the tile's rows, N and K).
  auto issue = [&](int step) {
    const int s = step % kV3Stages;
    const int64_t k0 = static_cast<int64_t>(step) * kV3K;
    {
      const bool ok = a_row_ok && k0 + a_c * 8 < K;
      cp_async16(a_dst + s * kV3ABytes, ok ? static_cast<const void*>(a_src + k0) : A, ok);
    }
    const bool k_ok = k0 + w_col < K;
    const uint32_t dst = w_dst + s * kWStage;
    const unsigned char* const src = w_src + k0 * static_cast<int64_t>(w_elem);
    if (fp8_rows16) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool ok = k_ok && n0 + w_r + j * w_row_step < N;
        cp_async16(dst + j * w_dst_step, ok ? static_cast<const void*>(src + j * w_src_step) : W, ok);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool ok = k_ok && n0 + w_r + j * w_row_step < N;
        const void* from = ok ? static_cast<const void*>(src + j * w_src_step) : W;
        if constexpr (kFp8) cp_async8(dst + j * w_dst_step, from, ok);
        else cp_async16(dst + j * w_dst_step, from, ok);
      }
    }
  };

  // FP8 widening: lane l handles the 16 columns 16·(l % 2) .. +15 of the warp's rows
  // l / 2 and 16 + l / 2 (passes p = 0, 1), two 8-column groups each with its own scale
  // (block_k % 8 == 0: a group never straddles a scale block). Scales past N or K are 0, so
  // the zero-filled bytes widen to +0 as in version 2.
  const float* sc_row[2];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    const int64_t n = n0 + warp * 32 + p * 16 + lane / 2;
    sc_row[p] = kFp8 && n < N ? wscale + (e * N + n) * n_kb : nullptr;
  }
  float sc[2][2];  // [pass][group] scales of the step being widened
  auto load_scales = [&](int step) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int64_t k = static_cast<int64_t>(step) * kV3K + (lane % 2) * 16 + 8 * g;
      const bool k_ok = k < K;
      const uint32_t kb = k_ok ? static_cast<uint32_t>(k) / static_cast<uint32_t>(block_k) : 0u;
#pragma unroll
      for (int p = 0; p < 2; ++p) sc[p][g] = k_ok && sc_row[p] != nullptr ? __ldg(sc_row[p] + kb) : 0.0f;
    }
  };
  auto widen = [&](int s) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int rl = p * 16 + lane / 2;  // row within the warp's 32
      const uint4 raw =
          *reinterpret_cast<const uint4*>(w_gen + s * kWStage + (warp * 32 + rl) * kV3K + (lane % 2) * 16);
      uint4 lo, hi;  // bf16 columns 0..7 and 8..15 of this lane's 16
      lo.x = fp8x2_to_bf16x2(raw.x, sc[p][0]);
      lo.y = fp8x2_to_bf16x2(raw.x >> 16, sc[p][0]);
      lo.z = fp8x2_to_bf16x2(raw.y, sc[p][0]);
      lo.w = fp8x2_to_bf16x2(raw.y >> 16, sc[p][0]);
      hi.x = fp8x2_to_bf16x2(raw.z, sc[p][1]);
      hi.y = fp8x2_to_bf16x2(raw.z >> 16, sc[p][1]);
      hi.z = fp8x2_to_bf16x2(raw.w, sc[p][1]);
      hi.w = fp8x2_to_bf16x2(raw.w >> 16, sc[p][1]);
      *reinterpret_cast<uint4*>(wide_gen + v3_swz(rl, 2 * (lane % 2))) = lo;
      *reinterpret_cast<uint4*>(wide_gen + v3_swz(rl, 2 * (lane % 2) + 1)) = hi;
    }
  };

  // ldmatrix row addresses for the two 16-wide K chunks of a step: A (matrices: rows 0-7 / 8-15
  // × k 0-7, then × k 8-15: the m16n8k16 A fragment order) and W (n 0-7 × k 0-7, k 8-15, then
  // n 8-15 × k 0-7, k 8-15: the B fragments of two n8 tiles). Swizzle rows advance by 16.
  uint32_t off_a[2], off_b[2];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    off_a[kk] = static_cast<uint32_t>(v3_swz(lane % 16, 2 * kk + lane / 16));
    off_b[kk] = static_cast<uint32_t>(v3_swz((lane / 16) * 8 + lane % 8, 2 * kk + (lane / 8) % 2));
  }
  const int m_tiles = static_cast<int>(min(static_cast<int64_t>(4), (rows + 15) / 16));
  const bool warp_live = n0 + warp * 32 < N;

  float acc[4][4][4], total[4][4][4];  // [m16 tile][n8 tile][c0..c3]
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;
  // The end of a K split (close_k_split on registers): split 0 is copied, later splits added.
  // Two functions rather than close_k_split's `first` select, which made ptxas spill here.
  auto open_total = [&] {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          total[i][j][v] = acc[i][j][v];
          acc[i][j][v] = 0.0f;
        }
  };
  auto add_to_total = [&] {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          total[i][j][v] = total[i][j][v] + acc[i][j][v];
          acc[i][j][v] = 0.0f;
        }
  };

  // One K step: wait for its stage, refill the stage freed last step, multiply.
  auto step_body = [&](int step) {
    cp_async_wait<kV3Stages - 2>();
    __syncthreads();  // stage `step` visible to all; the stage refilled below was drained last step
    if (step + kV3Stages - 1 < n_steps) issue(step + kV3Stages - 1);
    cp_async_commit();
    if (!warp_live) return;
    const int s = step % kV3Stages;
    uint32_t b_base = w_smem + s * kWStage + warp * 32 * kV3RowBytes;
    if constexpr (kFp8) {
      widen(s);
      __syncwarp();  // the warp's widened rows visible to its ldmatrix
      if (step + 1 < n_steps) load_scales(step + 1);
      b_base = wide_smem;
    }
    const uint32_t a_base = a_smem + s * kV3ABytes;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {  // the step's two 16-wide K chunks, in order
      uint32_t fb[2][4];  // n8 tiles 2jj, 2jj + 1: {b0, b1} each
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) ldmatrix_x4<true>(fb[jj], b_base + jj * 16 * kV3RowBytes + off_b[kk]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i >= m_tiles) break;
        uint32_t fa[4];
        ldmatrix_x4<true>(fa, a_base + i * 16 * kV3RowBytes + off_a[kk]);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          mma_bf16_16816(acc[i][2 * jj], fa, fb[jj][0], fb[jj][1]);
          mma_bf16_16816(acc[i][2 * jj + 1], fa, fb[jj][2], fb[jj][3]);
        }
      }
    }
  };

#pragma unroll
  for (int s = 0; s < kV3Stages - 1; ++s) {
    if (s < n_steps) issue(s);
    cp_async_commit();  // empty groups keep the wait count uniform
  }
  if constexpr (kFp8) {
    if (warp_live) load_scales(0);
  }
  // kInvariant: split 0 (the first kSplitSteps steps) into acc, copied to total; then each
  // later split (the last one possibly short) into a fresh acc, added to total at its end.
  constexpr int kSplitSteps = static_cast<int>(kInvariantSplitK / kV3K);
  const int first_end = kInvariant ? min(n_steps, kSplitSteps) : n_steps;
  int step = 0;
  for (; step < first_end; ++step) step_body(step);
  if constexpr (kInvariant) {
    open_total();
    for (; step < n_steps; ++step) {
      step_body(step);
      if ((step + 1) % kSplitSteps == 0 || step + 1 == n_steps) add_to_total();
    }
  }
  cp_async_wait<0>();
  if (!warp_live) return;

  // Epilogue straight from the accumulators: float2 stores where C's rows and base allow.
  const bool vec2 = (ldc % 2 == 0) && (reinterpret_cast<uintptr_t>(C) % 8 == 0);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = i * 16 + h * 8 + lane / 4;
      if (r >= rows) continue;
      float* c_row = C + (m0 + r) * ldc;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t n = n0 + warp * 32 + j * 8 + (lane % 4) * 2;
        const float v0 = kInvariant ? total[i][j][2 * h] : acc[i][j][2 * h];
        const float v1 = kInvariant ? total[i][j][2 * h + 1] : acc[i][j][2 * h + 1];
        if (vec2 && n + 1 < N) {
          *reinterpret_cast<float2*>(c_row + n) = make_float2(v0, v1);
        } else {
          if (n < N) c_row[n] = v0;
          if (n + 1 < N) c_row[n + 1] = v1;
        }
      }
    }
}

// Dynamic shared memory above 48 KB for version 3, set on the first launch that may use it
// (eager: the first tiled GEMM of a model runs before any graph capture).
void set_v3_smem() {
  static const bool done = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_v3_kernel<false, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(v3_smem_bytes<false>())));
    DI_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_v3_kernel<false, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(v3_smem_bytes<false>())));
    DI_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_v3_kernel<true, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(v3_smem_bytes<true>())));
    DI_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_v3_kernel<true, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(v3_smem_bytes<true>())));
    return true;
  }();
  (void)done;
}

// Whether grouped_gemm (version 0: automatic) takes version 3 where its preconditions hold,
// instead of version 2. Off until version 3 is measured on the GPU.
constexpr bool kUseTiledV3 = true;

// offsets == null: dense rows [0, R) (tiles and E unused), C's row stride ldc. invariant: the
// batch-invariant K structure (close_k_split). version: 0 automatic (fp32 output with K % 8 == 0
// and FP8 block_k % 8 == 0: version 3 if kUseTiledV3, else 2; otherwise 1), or 1, 2, 3 forced
// (tests; 2 and 3 need those preconditions: checked). Every version does the same per-element
// arithmetic, so the choice never changes a bit of C.
template <typename OutT>
void grouped_gemm(const bf16* A, int64_t R, int64_t K, const void* W, const float* scale, bool fp8, int64_t block_k,
                  int64_t N, const int32_t* offsets, const int32_t* tiles, int64_t E, OutT* C, int64_t ldc,
                  cudaStream_t s, bool invariant = false, int version = 0) {
  const int64_t max_tiles = (R + kBM - 1) / kBM + (offsets != nullptr ? E : 0);
  DI_CUDA_REQUIRE(max_tiles <= 65535);  // grid.y limit: R = tokens·top_k rows per step
  const int64_t n_kb = fp8 ? (K + block_k - 1) / block_k : 0;
  const bool vec_ok = sizeof(OutT) == 4 && K % 8 == 0 && (!fp8 || block_k % 8 == 0);
  if (version == 0) version = vec_ok ? (kUseTiledV3 ? 3 : 2) : 1;
  DI_CUDA_REQUIRE(version >= 1 && version <= 3);
  DI_CUDA_REQUIRE(version == 1 || vec_ok);
  if constexpr (sizeof(OutT) == 4) {
    static_assert(kV2M == kBM, "version 2 reads the same 64-row tiles");
    if (version == 3) {
      DI_CUDA_REQUIRE(K <= INT32_MAX);  // 32-bit step counts and scale-block division
      set_v3_smem();
      const dim3 grid3(grid_for(N, kV3N), static_cast<unsigned>(max_tiles));
      auto launch = [&](auto kernel, size_t smem) {
        kernel<<<grid3, kV3Threads, smem, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, R, C, ldc);
      };
      if (fp8) {
        invariant ? launch(grouped_gemm_v3_kernel<true, true>, v3_smem_bytes<true>())
                  : launch(grouped_gemm_v3_kernel<true, false>, v3_smem_bytes<true>());
      } else {
        invariant ? launch(grouped_gemm_v3_kernel<false, true>, v3_smem_bytes<false>())
                  : launch(grouped_gemm_v3_kernel<false, false>, v3_smem_bytes<false>());
      }
      DI_CUDA_LAUNCHED();
      return;
    }
    if (version == 2) {
      const dim3 grid2(grid_for(N, kV2N), static_cast<unsigned>(max_tiles));
      auto launch = [&](auto kernel) {
        kernel<<<grid2, 256, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, R, C, ldc);
      };
      if (fp8) invariant ? launch(grouped_gemm_v2_kernel<true, true>) : launch(grouped_gemm_v2_kernel<true, false>);
      else invariant ? launch(grouped_gemm_v2_kernel<false, true>) : launch(grouped_gemm_v2_kernel<false, false>);
      DI_CUDA_LAUNCHED();
      return;
    }
  }
  const dim3 grid(grid_for(N, kBN), static_cast<unsigned>(max_tiles));
  auto launch = [&](auto kernel) {
    kernel<<<grid, 128, 0, s>>>(A, K, W, scale, n_kb, block_k, N, offsets, tiles, E, R, C, ldc);
  };
  if (fp8) invariant ? launch(grouped_gemm_kernel<true, true, OutT>) : launch(grouped_gemm_kernel<true, false, OutT>);
  else invariant ? launch(grouped_gemm_kernel<false, true, OutT>) : launch(grouped_gemm_kernel<false, false, OutT>);
  DI_CUDA_LAUNCHED();
}

}  // namespace

void moe_route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  DI_CUDA_REQUIRE(a.E <= kMaxExperts);
  DI_CUDA_REQUIRE(a.n_group <= kMaxGroups);
  DI_CUDA_REQUIRE(a.top_k >= 1 && a.top_k <= 32);  // one pick per lane
  launch_pdl(route_kernel, grid_for(a.T, kRouteWarps), kRouteWarps * 32, 0, s, a);
  DI_CUDA_LAUNCHED();
}

void dense_gemm_tiled(const bf16* A, int64_t M, int64_t K, const void* W, const float* scale, bool fp8,
                      int64_t block_k, int64_t N, float* C, int64_t ldc, cudaStream_t s) {
  if (M == 0) return;
  grouped_gemm<float>(A, M, K, W, scale, fp8, block_k, N, nullptr, nullptr, 0, C, ldc, s, true);
}

void tiled_gemm_for_test(int version, const bf16* A, int64_t M, int64_t K, const void* W, const float* scale, bool fp8,
                         int64_t block_k, int64_t N, float* C, int64_t ldc, bool invariant, cudaStream_t s) {
  if (M == 0) return;
  grouped_gemm<float>(A, M, K, W, scale, fp8, block_k, N, nullptr, nullptr, 0, C, ldc, s, invariant, version);
}

bool moe_wgmma_fp8_ok(int64_t E_all, int64_t D, int64_t I, int64_t block_k) {
  return bf16_wgmma_invariant_ok(D) && bf16_wgmma_invariant_ok(I) && widen_fp8_weights_ok(E_all * 2 * I, D, block_k) &&
         widen_fp8_weights_ok(E_all * D, I, block_k) &&
         static_cast<int64_t>(sizeof(bf16)) * E_all * std::max(2 * I * D, D * I) <= kMoeWidenMaxBytes;
}

bool moe_w8a8_ok(int64_t D, int64_t I, bool fp8, int64_t block_k) {
  return fp8 && block_k == kFp8GroupK && D % 16 == 0 && I % 16 == 0 && fp8_wgmma_available();
}

bool moe_gemv_ok(int64_t D, int64_t I, bool fp8, int64_t block_k) {
  // The step memory's buffers are 16-byte aligned: stand-in pointer.
  const Elem w = fp8 ? Elem::kF8 : Elem::kBF16;
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{256});
  return gemv_ok(Elem::kBF16, aligned, D, w, D, block_k) && gemv_ok(Elem::kBF16, aligned, I, w, I, block_k);
}

namespace {
// out[t] = the weighted sum of token t's slot rows of y (combine_kernel), y [n_parts, R, D] — or,
// with a.norm where combine_norm_kernel takes the shapes, that sum folded into the next norm
// (returns true; out not written).
template <typename YT>
bool combine(const MoeArgs& a, const YT* y, int64_t n_parts, int64_t R, const int32_t* inv, int64_t k_routed,
             cudaStream_t s) {
  const bool vec = a.D % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && reinterpret_cast<uintptr_t>(a.addend) % 16 == 0;
  const MoeArgs::NextNorm& n = a.norm;
  const bool fold = n.residual != nullptr && vec && a.k <= kCombineMaxK && a.D <= 4 * kNormThreads * 8 &&
                    reinterpret_cast<uintptr_t>(n.residual) % 16 == 0 && reinterpret_cast<uintptr_t>(n.x) % 16 == 0 &&
                    (n.q == nullptr || (a.D % kFp8GroupK == 0 && reinterpret_cast<uintptr_t>(n.q) % 4 == 0)) &&
                    (n.xb == nullptr || reinterpret_cast<uintptr_t>(n.xb) % 8 == 0) &&
                    (n.q == nullptr || n.xb == nullptr);
  if (fold) {
    const int rows = n.q != nullptr ? 1 : n.xb != nullptr ? 2 : 0;
    const bool narrow = a.D <= 4 * kNormThreads * 2;
    const int64_t stage_bytes = a.k * a.D * static_cast<int64_t>(sizeof(YT));
    const bool staged = sizeof(YT) == 2 && n_parts == 1 && a.D % 8 == 0 && stage_bytes <= kFoldStageBytes &&
                        reinterpret_cast<uintptr_t>(y) % 16 == 0;
    auto go = [&](auto kernel) {
      launch_pdl(kernel, static_cast<unsigned>(a.T), kNormThreads, staged ? static_cast<size_t>(stage_bytes) : 0, s, y,
                 n_parts, R * a.D, inv, a.weights, k_routed, a.k, a.D, a.addend, n);
    };
    auto pick = [&](auto vec_tag, auto staged_tag) {
      constexpr int kV = decltype(vec_tag)::value;
      constexpr bool kS = decltype(staged_tag)::value;
      rows == 0 ? go(combine_norm_kernel<YT, kV, 0, kS>) : rows == 1 ? go(combine_norm_kernel<YT, kV, 1, kS>)
                                                          : go(combine_norm_kernel<YT, kV, 2, kS>);
    };
    using V2 = std::integral_constant<int, 2>;
    using V8 = std::integral_constant<int, 8>;
    if (staged) {
      if constexpr (sizeof(YT) == 2) narrow ? pick(V2{}, std::true_type{}) : pick(V8{}, std::true_type{});
    } else {
      narrow ? pick(V2{}, std::false_type{}) : pick(V8{}, std::false_type{});
    }
    DI_CUDA_LAUNCHED();
    return true;
  }
  const bool wide = vec && sizeof(YT) == 2 && a.D % 8 == 0;
  const dim3 combine_grid(static_cast<unsigned>(a.T), grid_for(a.D, wide ? 2 * kCombineCols : kCombineCols));
  launch_pdl(combine_kernel<YT>, combine_grid, kCombineThreads, 0, s, y, n_parts, R * a.D, inv, a.weights, k_routed,
             a.k, a.D, vec, wide, a.addend, a.out);
  DI_CUDA_LAUNCHED();
  return false;
}
}  // namespace

bool moe_experts(const MoeArgs& a_in, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s) {
  if (a_in.T == 0) return false;
  // From here E and k count the shared experts too (every token's slots k_routed .. k − 1).
  MoeArgs a = a_in;
  const int64_t k_routed = a.k, e_routed = a.E;
  a.E += a.n_shared;
  a.k += a.n_shared;
  DI_CUDA_REQUIRE(e_routed <= kMaxExperts && a.n_shared <= kMaxSharedExperts);
  const int64_t R = a.T * a.k;
  auto get = [&](size_t bytes) { return alloc(ctx, bytes == 0 ? 16 : bytes); };
  auto* perm = static_cast<int32_t*>(get(sizeof(int32_t) * R));
  auto* inv = static_cast<int32_t*>(get(sizeof(int32_t) * R));
  auto* offsets = static_cast<int32_t*>(get(sizeof(int32_t) * (a.E + 1)));
  auto* tiles = static_cast<int32_t*>(get(sizeof(int32_t) * (a.E + 1)));
  const int64_t n_active = std::min(a.E, R);
  auto* active = static_cast<int32_t*>(get(sizeof(int32_t) * n_active));
  if (R <= kSmallSortMax) {  // decode: one block instead of moe_sort's three launches
    launch_pdl(small_sort_kernel<kBM>, 1, 1024, 0, s, a.ids, k_routed, a.k, R, a.E, perm, inv, offsets, tiles, active,
               n_active);
    DI_CUDA_LAUNCHED();
  } else {  // perm, inv, offsets, tiles, active in three launches
    moe_sort(a.ids, k_routed, a.k, e_routed, R, kBM, perm, inv, offsets, tiles, active, n_active,
             get(moe_sort_scratch_bytes(R, a.E)), s);
  }
  // Form 1 at one token, after the one-block sort: three launches from here. The gate|up GEMV
  // reads the token's fp32 row through perm (rounded to bf16 as the gather would) and applies
  // SiLU·mul in its epilogue; the down GEMV reads those activations (fp32, rounded as it goes).
  // The same values as the gather + sum_silu_mul path, two launches fewer. Measured (run s8-8,
  // V2-Lite decode ms per step, fused vs not): B = 1 bf16 2.841 vs 2.869, FP8 2.906 vs 2.893;
  // B = 2 bf16 3.976 vs 3.982, FP8 4.46 vs 4.29 (fp32 rows and two-row passes cost the FP8
  // kernel more than the launches save), hence one token only.
  const bool fused_gemv = a.form == 1 && R <= kSmallSortMax && a.T == 1 &&
                          gemv_ok(Elem::kF32, a.x, a.D, a.fp8 ? Elem::kF8 : Elem::kBF16, a.D, a.block_k);
  DI_CUDA_REQUIRE(a.form != 1 || moe_gemv_ok(a.D, a.I, a.fp8, a.block_k));
  // Form 1's GEMV over the active experts (rows per expert ≤ T: a token's slots name distinct
  // experts); the caller sets A, W, N, K and C.
  auto grouped_gemv = [&] {
    GemvArgs g;
    g.w_elem = a.fp8 ? Elem::kF8 : Elem::kBF16, g.block_k = a.fp8 ? a.block_k : 0;
    g.offsets = offsets, g.active = active, g.n_active = n_active;
    g.max_rows = std::min<int64_t>(a.T, 4);
    g.ring = a.gemv_ring;
    return g;
  };
  if (fused_gemv) {
    GemvArgs g = grouped_gemv();
    g.a = a.x, g.a_elem = Elem::kF32, g.lda = a.D;
    g.a_rows = perm, g.a_row_div = a.k;
    auto* act = static_cast<float*>(get(sizeof(float) * R * a.I));
    g.w = a.w13, g.w_scale = a.w13_scale, g.N = a.I, g.K = a.D, g.glu = true;
    g.c = act, g.ldc = a.I;
    gemv(g, s);
    auto* y = static_cast<float*>(get(sizeof(float) * R * a.D));
    g.a = act, g.lda = a.I, g.a_rows = nullptr, g.a_row_div = 1;
    g.w = a.w2, g.w_scale = a.w2_scale, g.N = a.D, g.K = a.I, g.glu = false;
    g.c = y, g.ldc = a.D;
    gemv(g, s);
    return combine(a, y, 1, R, inv, k_routed, s);
  }
  if (a.form == 5) {  // W8A8: quantize+gather, GEMM, SiLU·mul+quantize, GEMM, combine (bf16 expert outputs)
    DI_CUDA_REQUIRE(moe_w8a8_ok(a.D, a.I, a.fp8, a.block_k));
    const int64_t kb_d = (a.D + kFp8GroupK - 1) / kFp8GroupK, kb_i = (a.I + kFp8GroupK - 1) / kFp8GroupK;
    Fp8GemmArgs g;
    g.w = static_cast<const uint8_t*>(a.w13), g.w_scale = a.w13_scale;
    g.M = R, g.N = 2 * a.I, g.K = a.D, g.block_n = 1, g.w_scale_uniform = a.w13_uniform && (2 * a.I) % 128 == 0;
    g.c_elem = Elem::kBF16;
    g.offsets = offsets, g.E = a.E;
    g.variant = 3;
    g.idle_skip = a.idle_skip;
    g.stagger = a.stagger;
    g.cluster = a.fp8_cluster;
    g.narrow_tails = a.narrow_tails;
    g.n192 = a.n192;
    const bool glu = a.glu_fused && fp8_wgmma_glu_ok(a.I, g.w_scale_uniform);
    if (a.k > 1) {
      // Each token's row quantized once, then its k copies gathered (1 + 1/k byte per element
      // instead of 4 gathered fp32 bytes per slot: run s15-8 measured the gathering quantizer at
      // 345 µs per V2-Lite layer at 16,384 tokens, ~4× its traffic at the copy rate) — by the
      // GEMM's loader where it takes them (MoeArgs::gather_a), else by a gather pass.
      const uint8_t* qx = a.xq;  // [T, D] e4m3
      const float* sqx = a.xq_scale;  // [T, D / 128]
      if (qx == nullptr) {
        auto* q1 = static_cast<uint8_t*>(get(static_cast<size_t>(a.T * a.D)));
        auto* s1 = static_cast<float*>(get(sizeof(float) * a.T * kb_d));
        quantize_fp8_rows_bf16(a.x, a.D, nullptr, 1, a.T, a.D, q1, s1, s);
        qx = q1, sqx = s1;
      }
      g.a = qx, g.a_scale = sqx;
      g.a_rows = perm, g.a_row_div = static_cast<int32_t>(a.k), g.a_src_rows = a.T;
      if (!a.gather_a || glu || !fp8_wgmma_gather_ok(g)) {  // else the GEMM's loader copies the rows
        auto* q = static_cast<uint8_t*>(get(static_cast<size_t>(R * a.D)));  // [R, D] e4m3
        auto* sq = static_cast<float*>(get(sizeof(float) * R * kb_d));       // [R, D / 128]
        launch_pdl(gather_quantized_kernel, static_cast<unsigned>((R + kGatherRows - 1) / kGatherRows),
                   32 * kGatherRows, 0, s, qx, sqx, perm, R, a.k, a.D, kb_d, q, sq);
        DI_CUDA_LAUNCHED();
        g.a = q, g.a_scale = sq, g.a_rows = nullptr, g.a_row_div = 1, g.a_src_rows = 0;
      }
    } else {
      auto* q = static_cast<uint8_t*>(get(static_cast<size_t>(R * a.D)));  // [R, D] e4m3
      auto* sq = static_cast<float*>(get(sizeof(float) * R * kb_d));       // [R, D / 128]
      quantize_fp8_rows_bf16(a.x, a.D, perm, a.k, R, a.D, q, sq, s);
      g.a = q, g.a_scale = sq;
    }
    auto* q2 = static_cast<uint8_t*>(get(static_cast<size_t>(R * a.I)));  // [R, I] e4m3
    auto* sq2 = static_cast<float*>(get(sizeof(float) * R * kb_i));       // [R, I / 128]
    if (glu) {  // the same codes, no bf16 [R, 2I]
      fp8_wgmma_glu_quantize(g, q2, sq2, s);
    } else {
      auto* h13 = static_cast<bf16*>(get(sizeof(bf16) * R * 2 * a.I));  // [R, 2I] gate | up
      g.c = h13, g.c_elem = Elem::kBF16, g.ldc = 2 * a.I;
      fp8_grouped_gemm(g, s);
      silu_mul_quantize_fp8(h13, Elem::kBF16, R, a.I, q2, sq2, s);
    }
    auto* y = static_cast<bf16*>(get(sizeof(bf16) * R * a.D));  // [R, D] each slot's expert output, bf16
    g.a = q2, g.a_scale = sq2;
    g.a_rows = nullptr, g.a_row_div = 1, g.a_src_rows = 0;  // the down GEMM's rows are in slot order
    g.w = static_cast<const uint8_t*>(a.w2), g.w_scale = a.w2_scale;
    g.N = a.D, g.K = a.I, g.w_scale_uniform = a.w2_uniform && a.D % 128 == 0;
    g.c = y, g.c_elem = Elem::kBF16, g.ldc = a.D;
    fp8_grouped_gemm(g, s);
    return combine(a, y, 1, R, inv, k_routed, s);
  }
  auto* xa = static_cast<bf16*>(get(sizeof(bf16) * R * a.D));
  launch_pdl(permute_kernel, static_cast<unsigned>(R), 256, 0, s, a.x, perm, a.k, a.D, xa);
  DI_CUDA_LAUNCHED();
  DI_CUDA_REQUIRE(a.form != 2 || a.blas != nullptr);
  DI_CUDA_REQUIRE(a.form != 3 || (small_m_gemm_ok(a.D, a.fp8, a.block_k) && small_m_gemm_ok(a.I, a.fp8, a.block_k)));
  DI_CUDA_REQUIRE(a.form != 4 || (bf16_wgmma_grouped_ok(a.D) && bf16_wgmma_grouped_ok(a.I)));
  DI_CUDA_REQUIRE(a.form != 4 || !(a.invariant || a.one_chain) ||
                  (bf16_wgmma_invariant_ok(a.D) && bf16_wgmma_invariant_ok(a.I)));
  DI_CUDA_REQUIRE(!a.one_chain || (!a.fp8 && !a.invariant));
  DI_CUDA_REQUIRE_MSG(a.form != 4 || !a.fp8 || (a.invariant && moe_wgmma_fp8_ok(a.E, a.D, a.I, a.block_k)),
                      "moe_experts: form 4 takes FP8 weights only batch-invariant, within the widening budget");
  std::vector<int32_t> host_offsets;
  bf16* wbuf = nullptr;  // FP8 weights in bf16: form 2 one expert's (dequantized), form 4 all (widened)
  if (a.form == 4 && a.fp8) wbuf = static_cast<bf16*>(get(sizeof(bf16) * a.E * std::max(2 * a.I * a.D, a.D * a.I)));
  if (a.form == 2) {
    host_offsets.resize(static_cast<size_t>(a.E + 1));
    DI_CUDA_CHECK(cudaMemcpyAsync(host_offsets.data(), offsets, sizeof(int32_t) * (a.E + 1), cudaMemcpyDeviceToHost, s));
    DI_CUDA_CHECK(cudaStreamSynchronize(s));
    if (a.fp8) wbuf = static_cast<bf16*>(get(sizeof(bf16) * std::max(2 * a.I * a.D, a.D * a.I)));
  }
  // Form 3's K splits: the invariant structure's, or one (MoeArgs::one_chain).
  auto form3_splits = [&](int64_t K) { return a.one_chain ? int64_t{1} : invariant_k_splits(K); };
  auto gemm = [&](const bf16* A, int64_t K, const void* W, const float* scale, int64_t N, float* C) {
    if (a.form == 1) {
      GemvArgs g = grouped_gemv();
      g.a = A, g.a_elem = Elem::kBF16, g.lda = K;
      g.w = W, g.w_scale = scale, g.N = N, g.K = K;
      g.c = C, g.ldc = N;
      gemv(g, s);
    } else if (a.form == 0) {
      grouped_gemm<float>(A, R, K, W, scale, a.fp8, a.block_k, N, offsets, tiles, a.E, C, N, s,
                          a.invariant);
    } else if (a.form == 4) {
      const bf16* Wb = static_cast<const bf16*>(W);
      if (a.fp8) {  // every expert's weights widened into wbuf (reused by the second GEMM, in stream order)
        widen_fp8_weights(static_cast<const uint8_t*>(W), scale, a.E * N, K, a.block_k, wbuf, s);
        Wb = wbuf;
      }
      bf16_wgmma_grouped_gemm(A, R, K, Wb, N, offsets, a.E, C, N, s, a.invariant);
    } else if (a.form == 3) {  // K splits: C holds the partials, added by the consumer (below)
      small_m_gemm(A, K, W, scale, a.fp8, a.block_k, N, offsets, active, n_active, R, a.T,
                   form3_splits(K) > 1 ? nullptr : C, N, C, s, !a.one_chain);
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
  // Form 3 leaves its K splits' partial sums [parts, R, N] to the next kernel, which adds them in
  // split order as sum_splits would (the same bits, one launch fewer per GEMM).
  const int64_t parts13 = a.form == 3 ? form3_splits(a.D) : 1, parts2 = a.form == 3 ? form3_splits(a.I) : 1;
  auto* act = static_cast<bf16*>(get(sizeof(bf16) * R * a.I));
  if (a.form == 4) {  // SiLU·mul in the gate|up GEMM's epilogue (the same values, no fp32 [R, 2I])
    const bf16* w13 = static_cast<const bf16*>(a.w13);
    if (a.fp8) {
      widen_fp8_weights(static_cast<const uint8_t*>(a.w13), a.w13_scale, a.E * 2 * a.I, a.D, a.block_k, wbuf, s);
      w13 = wbuf;
    }
    bf16_wgmma_grouped_glu(xa, R, a.D, w13, a.I, offsets, a.E, act, a.I, s, a.invariant);
    auto* y = static_cast<float*>(get(sizeof(float) * R * a.D));
    gemm(act, a.I, a.w2, a.w2_scale, a.D, y);
    return combine(a, y, 1, R, inv, k_routed, s);
  }
  auto* h13 = static_cast<float*>(get(sizeof(float) * parts13 * R * 2 * a.I));
  gemm(xa, a.D, a.w13, a.w13_scale, 2 * a.I, h13);
  const bool silu_vec = a.I % 4 == 0 && reinterpret_cast<uintptr_t>(h13) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(act) % 8 == 0 && (R * 2 * a.I) % 4 == 0;
  const int silu_threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (a.I / 4 + 31) / 32 * 32)));
  launch_pdl(sum_silu_mul_kernel, static_cast<unsigned>(std::min<int64_t>(R, 1 << 20)), silu_threads, 0, s, h13,
             parts13, R * 2 * a.I, R, a.I, silu_vec, act);
  DI_CUDA_LAUNCHED();
  auto* y = static_cast<float*>(get(sizeof(float) * parts2 * R * a.D));
  gemm(act, a.I, a.w2, a.w2_scale, a.D, y);
  return combine(a, y, parts2, R, inv, k_routed, s);
}

}  // namespace deepinfer::cuda
