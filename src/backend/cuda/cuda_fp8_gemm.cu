// FP8 (e4m3) block-scaled GEMM with DeepSeek/DeepGEMM semantics — 1×128 activation groups,
// block_n×128 weight blocks, per-K-block fp32 promotion — dense and grouped (MoE), plus the 1×128
// activation quantizer that feeds it. Owns: the quantizer, one mma.sync (sm_89+) tile kernel in
// three tile shapes (16, 64, 128 rows), the deterministic split-K reduction. Does not own: weight
// loading or scale repacking (ue8m0 bytes, MN-major scales), nor the wgmma/TMA form
// (cuda_fp8_wgmma.cu, variant 3, which the dispatch below picks for large M on sm_90).
// Measured on H200 (bench/fp8_gemm_bench): ptxas lowers mma.sync .e4m3 on sm_90a to an fp8→fp16
// unpack (F2FP.F16.E4M3.UNPACK_B) plus HMMA.16816, so the large-M tiles top out near 200 TFLOP/s
// (~0.17× torch's blockwise scaled_mm); only wgmma reaches Hopper's FP8 rate. The small-M
// (bandwidth) shapes are where this kernel is meant to be used as is.
#include <cuda_fp8.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_grouped_tile.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kGroupK = static_cast<int>(kFp8GroupK);  // K elements per scale block (128 bytes of e4m3)

// ---------------------------------------------------------------------------------------------
// Activation quantization.
// One warp per 1×128 group: lane l owns elements 4l..4l+3 of the group (one 16-byte fp32 or
// 8-byte bf16 load), the warp max-reduces |x| (exact), then cuda_fp8_quant.cuh's scale and codes
// (ue8m0: the scale rounded up to 2^ceil(log2 s) by bumping the exponent when the mantissa is
// non-zero). Lanes past K (a partial last group) contribute 0 and store nothing.
// Preconditions: K % 16 == 0.
// ---------------------------------------------------------------------------------------------
// A warp's 1×128 group (lane l holds elements 4l..4l+3 in v, zeros past K; `store`: they lie
// inside K): the scale into *scale (lane 0), the lane's 4 codes into q (4 bytes).
__device__ __forceinline__ void quantize_group(const float (&v)[4], bool store, bool ue8m0, uint8_t* q,
                                               float* scale) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float s = fp8_group_scale(amax);
  if (ue8m0) {
    uint32_t bits = __float_as_uint(s);  // s is a positive normal (≥ 1e-4/448)
    if (bits & 0x7fffffu) bits = (bits & 0xff800000u) + 0x800000u;
    s = __uint_as_float(bits);
  }
  if (store) {
    const float inv = fp8_scale_inverse(s);
    const __nv_fp8x2_storage_t lo = fp8_codes2(v[0], v[1], s, inv), hi = fp8_codes2(v[2], v[3], s, inv);
    *reinterpret_cast<uint32_t*>(q) = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  if (threadIdx.x % 32 == 0) *scale = s;
}

// 4 consecutive values at p as fp32 (one 16-byte fp32 or 8-byte bf16 load).
template <typename InT>
__device__ __forceinline__ void load4(const InT* p, float (&v)[4]) {
  if constexpr (sizeof(InT) == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __bfloat162float(b[i]);
  }
}

// Grid (M rows, ceil(n_kb / 8)), 256 threads: warp w of block (m, y) quantizes group 8y + w of
// row m (no integer division per group: the kernels are instruction-bound, not memory-bound, at
// one group per warp). Row m reads source row rows[m] / row_div (rows == null: row m) at pitch
// ldx; kRoundBf16: the fp32 values rounded to bf16 first (the bf16 copy a GEMM would otherwise be
// fed, the same bits). Launched with PDL (cuda_launch.cuh): x comes from the previous kernel.
constexpr int kQuantWarps = 8;
template <typename InT, bool kRoundBf16>
__global__ void __launch_bounds__(32 * kQuantWarps)
    quantize_fp8_rows_kernel(const InT* x, int64_t ldx, const int32_t* rows, int32_t row_div, int64_t K,
                             int64_t n_kb, uint8_t* x_q, float* scales, bool ue8m0) {
  const int64_t m = blockIdx.x, g = static_cast<int64_t>(blockIdx.y) * kQuantWarps + threadIdx.x / 32;
  if (g >= n_kb) return;  // whole warps
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x % 32;
  const int64_t k = g * kGroupK + lane * 4, src = rows != nullptr ? rows[m] / row_div : m;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (k < K) load4(x + src * ldx + k, v);
  if constexpr (kRoundBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __bfloat162float(__float2bfloat16(v[i]));
  }
  quantize_group(v, k < K, ue8m0, x_q + m * K + k, scales + m * n_kb + g);
}

// The gated MLP's activations quantized: row m's group g of bf16(silu_times(h[m, c], h[m, I + c]))
// (the same grid and launch as quantize_fp8_rows_kernel).
template <typename InT>
__global__ void __launch_bounds__(32 * kQuantWarps)
    silu_mul_quantize_kernel(const InT* h, int64_t I, int64_t n_kb, uint8_t* x_q, float* scales) {
  const int64_t m = blockIdx.x, g = static_cast<int64_t>(blockIdx.y) * kQuantWarps + threadIdx.x / 32;
  if (g >= n_kb) return;
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x % 32;
  const int64_t k = g * kGroupK + lane * 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (k < I) {
    float gate[4], up[4];
    load4(h + m * 2 * I + k, gate);
    load4(h + m * 2 * I + I + k, up);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __bfloat162float(__float2bfloat16(silu_times(gate[i], up[i])));
  }
  quantize_group(v, k < I, false, x_q + m * I + k, scales + m * n_kb + g);
}

// The same recipes, a half-warp per group (kernels …_g16): lane l of the half owns elements
// 8l..8l+7 (two 16-byte fp32 loads, one bf16), so each thread keeps twice the bytes in flight
// and the reduction takes 4 shuffles, and the grid is flat over the M × n_kb groups (block b's
// half-warp h takes group 16b + h: no idle warps where a row's groups are not a multiple of the
// block's), at one 32-bit division per group. The same codes and scales, bit for bit (|x|'s
// maximum is exact in any order). Run s17-3 had the one-warp forms at 2.3–2.9 TB/s at 4,096
// tokens (V2-Lite's MoE SiLU·mul-quantize 75 µs a layer).
constexpr int kG16Groups = 16;  // groups per 256-thread block
// 8 consecutive values at p as fp32 (p 16-byte aligned: two fp32 or one bf16 16-byte load).
template <typename InT>
__device__ __forceinline__ void load8(const InT* p, float (&v)[8]) {
  if constexpr (sizeof(InT) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(b[i]);
  }
}
// A g16 kernel thread's group: half-warp h of the grid takes group gi = h (row m = gi / n_kb,
// group g of the row), the thread its 8 values from column k = 128·g + 8·(lane % 16); live is
// false past the last group. False (the thread returns, before the PDL wait) for whole warps past
// the end; else it has waited for the previous kernel and triggered its dependents.
struct G16Item {
  bool live;
  uint32_t m, g;
  int64_t k;
};
__device__ __forceinline__ bool g16_item(uint32_t n_kb, uint32_t n_groups, G16Item& it) {
  const uint32_t gi = blockIdx.x * kG16Groups + threadIdx.x / 16;
  if (blockIdx.x * kG16Groups + (threadIdx.x / 32) * 2 >= n_groups) return false;  // whole warps past the end
  pdl_wait();
  pdl_trigger();
  it.live = gi < n_groups;
  it.m = it.live ? gi / n_kb : 0;
  it.g = it.live ? gi - it.m * n_kb : 0;
  it.k = int64_t{it.g} * kGroupK + (threadIdx.x % 16) * 8;
  return true;
}
// quantize_fp8_rows_kernel<float, true>'s recipe (rows rounded to bf16 first), the g16 layout:
// x fp32 with ldx % 4 == 0 and 16-byte aligned rows, K % 16 == 0.
__global__ void __launch_bounds__(32 * kQuantWarps)
    quantize_bf16_rows_g16_kernel(const float* x, int64_t ldx, const int32_t* rows, int32_t row_div, int64_t K,
                                  uint32_t n_kb, uint32_t n_groups, uint8_t* x_q, float* scales) {
  G16Item it;
  if (!g16_item(n_kb, n_groups, it)) return;
  const bool live = it.live;
  const uint32_t m = it.m, g = it.g;
  const int64_t k = it.k;
  const int64_t src = rows != nullptr ? rows[m] / row_div : m;
  float v[8] = {};
  if (live && k < K) {
    load8(x + src * ldx + k, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(__float2bfloat16(v[i]));
  }
  quantize_group8(v, live && k < K, x_q + int64_t{m} * K + k, scales + int64_t{m} * n_kb + g);
}
// silu_mul_quantize_kernel<bf16>'s recipe, the g16 layout: h bf16 [M, 2I], I % 16 == 0.
__global__ void __launch_bounds__(32 * kQuantWarps)
    silu_mul_quantize_g16_kernel(const bf16* h, int64_t I, uint32_t n_kb, uint32_t n_groups, uint8_t* x_q,
                                 float* scales) {
  G16Item it;
  if (!g16_item(n_kb, n_groups, it)) return;
  const bool live = it.live;
  const uint32_t m = it.m, g = it.g;
  const int64_t k = it.k;
  float v[8] = {};
  if (live && k < I) {
    float gate[8], up[8];
    load8(h + int64_t{m} * 2 * I + k, gate);
    load8(h + int64_t{m} * 2 * I + I + k, up);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(__float2bfloat16(silu_times(gate[i], up[i])));
  }
  quantize_group8(v, live && k < I, x_q + int64_t{m} * I + k, scales + int64_t{m} * n_kb + g);
}
// Blocks of the g16 kernels for n_groups groups (< 2^32).
unsigned g16_grid(int64_t M, int64_t n_kb) {
  DI_CUDA_REQUIRE_MSG(M * n_kb < (int64_t{1} << 32), "fp8 quantizer: too many groups");
  return static_cast<unsigned>((M * n_kb + kG16Groups - 1) / kG16Groups);
}

dim3 quant_grid(int64_t M, int64_t n_kb) {
  DI_CUDA_REQUIRE_MSG(M < (int64_t{1} << 31), "fp8 quantizer: too many rows");
  return dim3(static_cast<unsigned>(M), static_cast<unsigned>((n_kb + kQuantWarps - 1) / kQuantWarps));
}

// ---------------------------------------------------------------------------------------------
// PTX wrappers.
// ---------------------------------------------------------------------------------------------
// d[16×8] fp32 += a[16×32] e4m3 (row) · b[32×8] e4m3 (col).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------------------------------------
// The GEMM kernel.
// ---------------------------------------------------------------------------------------------
struct GemmParams {
  const uint8_t* a;  // [M, K] e4m3
  const float* sa;   // [M, n_kb]
  const uint8_t* w;  // [E·N, K] e4m3 (dense: E = 1)
  const float* sw;   // [E·ceil(N / block_n), n_kb]
  int64_t M, N, K, n_kb, block_n;
  void* c;             // [M, ldc] OutT (unused when ws is set)
  int64_t ldc;
  bool c_vec;          // ldc even and c 8-byte aligned: column pairs stored as one vector
  float* ws;           // split-K partials [gridDim.z, M, N] fp32, or null
  int64_t kb_per_split;
  const int32_t* offsets;  // grouped: [E + 1] row offsets of each expert's sorted rows
  int64_t E;
};

// Tile shape: kBM×kBN outputs per block, kWM×kWN warps each owning a (kBM/kWM)×(kBN/kWN) warp
// tile, K consumed one 128-wide scale block per pipeline stage, kStages stages.
template <int kBM_, int kBN_, int kWM_, int kWN_, int kStages_, int kMinBlocks_>
struct Tile {
  static constexpr int kBM = kBM_, kBN = kBN_, kWM = kWM_, kWN = kWN_, kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = kWM * kWN * 32;
  static constexpr int kWTM = kBM / kWM, kWTN = kBN / kWN;  // warp tile
  static constexpr int kMT = kWTM / 16, kNT = kWTN / 8;     // m16 and n8 fragments per warp
  static constexpr int kABytes = kBM * kGroupK, kBBytes = kBN * kGroupK;
  static constexpr int kStageBytes = kABytes + kBBytes + (kBM + kBN) * 4;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kWTM % 16 == 0 && kWTN % 16 == 0, "warp tile: m16 fragments, n8 fragments in pairs");
};
// Decode (M ≤ 16): one m16 row tile, 4 warps side by side over 128 columns; 3–4 blocks per SM.
using TileM16 = Tile<16, 128, 1, 4, 4, 3>;
// Mid (M ≤ 64): 2 × 4 warps of 32×32.
using TileM64 = Tile<64, 128, 2, 4, 4, 2>;
// Large M: 2 × 4 warps of 64×32; 128 fp32 accumulators per thread (partial + promoted): one block per SM.
using TileM128 = Tile<128, 128, 2, 4, 4, 1>;

// C[m, n] = Σ_kb (Σ_{k ∈ kb} a[m, k]·w[n, k]) · sa[m, kb] · sw[n / block_n, kb] for the block's
// kBM×kBN tile, kb over the block's split [z·kb_per_split, min(n_kb, (z+1)·kb_per_split)).
// Grid: x = column tiles of kBN, y = row tiles (dense) or grouped tiles (kGrouped), z = K splits.
// Thread → data: warp (wm, wn) owns rows wm·kWTM.. and columns wn·kWTN.. of the tile; lane
// (g = lane/4, t = lane%4) holds, per m16×n8 fragment, rows g and g+8, columns 2t and 2t+1.
// Shared memory, per stage (kStageBytes): A [kBM][128] e4m3, W [kBN][128] e4m3 — 16-byte chunk c
// of row r stored at chunk c ^ (r % 8), so the 8 rows an ldmatrix phase reads hit 8 distinct
// bank groups — then sa [kBM] and sw [kBN] fp32 for the stage's K block. A stage is one 128-wide K
// block, so scales change exactly at stage boundaries.
// Pipeline: cp.async with kStages − 1 K blocks in flight; one barrier per K block.
// Promotion (DeepGEMM): the MMAs accumulate one K block in fp32 registers (`part`), which are then
// scaled by sa·sw and added into `acc` (fmaf, K-block order: deterministic, and the same
// per-element arithmetic in every tile shape, so results do not depend on M or on the variant).
// Out-of-range rows, columns and K chunks are zero-filled (K % 16 == 0, so 16-byte chunks are
// whole); only in-range outputs are written.
template <class T, bool kGrouped, typename OutT>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) fp8_gemm_kernel(const GemmParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int64_t tile_info[3];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / T::kWN, wn = warp % T::kWN;

  int64_t m0, rows, w_row0 = 0, sw_row0 = 0;
  if constexpr (kGrouped) {
    if (warp == 0) grouped_tile(blockIdx.y, p.offsets, p.E, T::kBM, lane, tile_info);
    __syncthreads();
    if (tile_info[0] < 0) return;  // past the last tile: the whole block leaves
    m0 = tile_info[1];
    rows = tile_info[2];
    w_row0 = tile_info[0] * p.N;
    sw_row0 = tile_info[0] * ((p.N + p.block_n - 1) / p.block_n);
  } else {
    m0 = static_cast<int64_t>(blockIdx.y) * T::kBM;
    rows = min(static_cast<int64_t>(T::kBM), p.M - m0);
  }
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * T::kBN;
  const int64_t kb_begin = static_cast<int64_t>(blockIdx.z) * p.kb_per_split;
  const int64_t kb_end = min(p.n_kb, kb_begin + p.kb_per_split);
  const int64_t n_iter = kb_end - kb_begin;
  const uint32_t smem0 = smem_u32(smem);

  auto load_stage = [&](int64_t kb, int stage) {
    const uint32_t sA = smem0 + stage * T::kStageBytes, sB = sA + T::kABytes;
    const uint32_t sSa = sB + T::kBBytes, sSw = sSa + T::kBM * 4;
    const int64_t k0 = kb * kGroupK;
#pragma unroll
    for (int i = tid; i < T::kBM * 8; i += T::kThreads) {
      const int r = i / 8, ch = i % 8;
      const bool ok = r < rows && k0 + ch * 16 < p.K;
      const uint8_t* src = ok ? p.a + (m0 + r) * p.K + k0 + ch * 16 : p.a;
      cp_async16(sA + r * kGroupK + ((ch ^ (r % 8)) * 16), src, ok);
    }
#pragma unroll
    for (int i = tid; i < T::kBN * 8; i += T::kThreads) {
      const int r = i / 8, ch = i % 8;
      const bool ok = n0 + r < p.N && k0 + ch * 16 < p.K;
      const uint8_t* src = ok ? p.w + (w_row0 + n0 + r) * p.K + k0 + ch * 16 : p.w;
      cp_async16(sB + r * kGroupK + ((ch ^ (r % 8)) * 16), src, ok);
    }
#pragma unroll
    for (int i = tid; i < T::kBM + T::kBN; i += T::kThreads) {
      if (i < T::kBM) {
        const bool ok = i < rows;
        cp_async4(sSa + i * 4, ok ? p.sa + (m0 + i) * p.n_kb + kb : p.sa, ok);
      } else {
        const int j = i - T::kBM;
        const bool ok = n0 + j < p.N;
        cp_async4(sSw + j * 4, ok ? p.sw + (sw_row0 + (n0 + j) / p.block_n) * p.n_kb + kb : p.sw, ok);
      }
    }
  };

  float acc[T::kMT][T::kNT][4];
  float part[T::kMT][T::kNT][4];
#pragma unroll
  for (int i = 0; i < T::kMT; ++i)
#pragma unroll
    for (int j = 0; j < T::kNT; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = part[i][j][v] = 0.0f;

#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < n_iter) load_stage(kb_begin + s, s);
    cp_async_commit();  // empty groups keep the wait count uniform
  }

  const int g = lane / 4, t = lane % 4;
  // ldmatrix lane addressing (row within a 16-row/16-column pair of 8×16-byte matrices).
  const int a_row = (lane % 8) + ((lane / 8) % 2) * 8, a_chunk = lane / 16;
  const int b_row = (lane % 8) + (lane / 16) * 8, b_chunk = (lane / 8) % 2;
  for (int64_t it = 0; it < n_iter; ++it) {
    cp_async_wait<T::kStages - 2>();
    __syncthreads();  // stage it % kStages landed for every thread; stage (it − 1) % kStages is free
    {
      const int64_t next = it + T::kStages - 1;
      if (next < n_iter) load_stage(kb_begin + next, static_cast<int>(next % T::kStages));
      cp_async_commit();
    }
    const int stage = static_cast<int>(it % T::kStages);
    const uint32_t sA = smem0 + stage * T::kStageBytes, sB = sA + T::kABytes;
    const float* sSa = reinterpret_cast<const float*>(smem + stage * T::kStageBytes + T::kABytes + T::kBBytes);
    const float* sSw = sSa + T::kBM;
#pragma unroll
    for (int ks = 0; ks < kGroupK / 32; ++ks) {
      // ldmatrix.x4 over e4m3 rows: four 8-row × 16-byte blocks; lane l addresses row l % 8 of
      // block l / 8 and receives, per block, bytes 4(l%4)..4(l%4)+3 of row l/4 — the m16n8k32
      // 8-bit fragment layout.
      uint32_t af[T::kMT][4], bfr[T::kNT][2];
#pragma unroll
      for (int i = 0; i < T::kMT; ++i) {
        const int r = wm * T::kWTM + i * 16 + a_row;
        ldmatrix_x4(af[i], sA + r * kGroupK + (((ks * 2 + a_chunk) ^ (r % 8)) * 16));
      }
#pragma unroll
      for (int j = 0; j < T::kNT / 2; ++j) {
        const int r = wn * T::kWTN + j * 16 + b_row;
        uint32_t q[4];
        ldmatrix_x4(q, sB + r * kGroupK + (((ks * 2 + b_chunk) ^ (r % 8)) * 16));
        bfr[2 * j][0] = q[0], bfr[2 * j][1] = q[1], bfr[2 * j + 1][0] = q[2], bfr[2 * j + 1][1] = q[3];
      }
#pragma unroll
      for (int i = 0; i < T::kMT; ++i)
#pragma unroll
        for (int j = 0; j < T::kNT; ++j) mma_e4m3(part[i][j], af[i], bfr[j][0], bfr[j][1]);
    }
    // Promotion of this K block.
    float s_w[T::kNT][2];
#pragma unroll
    for (int j = 0; j < T::kNT; ++j) {
      s_w[j][0] = sSw[wn * T::kWTN + j * 8 + 2 * t];
      s_w[j][1] = sSw[wn * T::kWTN + j * 8 + 2 * t + 1];
    }
#pragma unroll
    for (int i = 0; i < T::kMT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s_a = sSa[wm * T::kWTM + i * 16 + g + h * 8];
#pragma unroll
        for (int j = 0; j < T::kNT; ++j)
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            acc[i][j][h * 2 + v] = fmaf(part[i][j][h * 2 + v], s_a * s_w[j][v], acc[i][j][h * 2 + v]);
            part[i][j][h * 2 + v] = 0.0f;
          }
      }
  }
  cp_async_wait<0>();  // no copies outstanding at exit (the trailing groups are empty)

  // Epilogue straight from registers: column pairs (2t, 2t+1) as one 8-byte (fp32) or 4-byte
  // (bf16) store where both are in range and aligned.
#pragma unroll
  for (int i = 0; i < T::kMT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = wm * T::kWTM + i * 16 + g + h * 8;
      if (r >= rows) continue;
      const int64_t m = m0 + r;
#pragma unroll
      for (int j = 0; j < T::kNT; ++j) {
        const int64_t n = n0 + wn * T::kWTN + j * 8 + 2 * t;
        if (n >= p.N) continue;
        const float v0 = acc[i][j][h * 2], v1 = acc[i][j][h * 2 + 1];
        const bool both = n + 1 < p.N;
        if (p.ws) {
          float* dst = p.ws + (static_cast<int64_t>(blockIdx.z) * p.M + m) * p.N + n;
          if (both && p.N % 2 == 0) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          } else {
            dst[0] = v0;
            if (both) dst[1] = v1;
          }
        } else if constexpr (sizeof(OutT) == 4) {
          float* dst = static_cast<float*>(p.c) + m * p.ldc + n;
          if (both && p.c_vec) {
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          } else {
            dst[0] = v0;
            if (both) dst[1] = v1;
          }
        } else {
          bf16* dst = static_cast<bf16*>(p.c) + m * p.ldc + n;
          if (both && p.c_vec) {
            *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
          } else {
            dst[0] = __float2bfloat16(v0);
            if (both) dst[1] = __float2bfloat16(v1);
          }
        }
      }
    }
}

// out[m, n] = Σ_{s < n_splits} ws[s, m, n], summed in split order (deterministic); one thread per
// output element.
template <typename OutT>
__global__ void splitk_reduce_kernel(const float* ws, int64_t n_splits, int64_t M, int64_t N, OutT* out,
                                     int64_t ldc) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  const int64_t m = i / N, n = i % N;
  float v = ws[i];
  for (int64_t s = 1; s < n_splits; ++s) v += ws[s * M * N + i];
  if constexpr (sizeof(OutT) == 4) out[m * ldc + n] = v;
  else out[m * ldc + n] = __float2bfloat16(v);
}

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------
// Raises the dynamic shared-memory limit of one kernel instance once per process.
template <class T, bool kGrouped, typename OutT>
void prepare_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<T, kGrouped, OutT>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  });
}

template <class T, bool kGrouped, typename OutT>
void launch_tile(const GemmParams& p, dim3 grid, cudaStream_t s) {
  prepare_kernel<T, kGrouped, OutT>();
  fp8_gemm_kernel<T, kGrouped, OutT><<<grid, T::kThreads, T::kSmemBytes, s>>>(p);
  DI_CUDA_LAUNCHED();
}

template <class T, bool kGrouped>
void launch_tile_out(const GemmParams& p, Elem c_elem, dim3 grid, cudaStream_t s) {
  if (c_elem == Elem::kF32 || p.ws) launch_tile<T, kGrouped, float>(p, grid, s);
  else launch_tile<T, kGrouped, bf16>(p, grid, s);
}

int tile_rows_of(int variant) { return variant == 0 ? TileM16::kBM : variant == 1 ? TileM64::kBM : TileM128::kBM; }

// Whether the size-based choice may take the wgmma form (variant 3) for these arguments.
bool wgmma_eligible(const Fp8GemmArgs& a) { return !a.batch_invariant && fp8_wgmma_available(); }

template <bool kGrouped>
void launch_variant(int variant, const GemmParams& p, Elem c_elem, dim3 grid, cudaStream_t s) {
  switch (variant) {
    case 0: launch_tile_out<TileM16, kGrouped>(p, c_elem, grid, s); break;
    case 1: launch_tile_out<TileM64, kGrouped>(p, c_elem, grid, s); break;
    default: launch_tile_out<TileM128, kGrouped>(p, c_elem, grid, s); break;
  }
}

template <class T>
int occupancy() {
  static const int n = [] {
    prepare_kernel<T, false, float>();
    int v = 0;
    DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, fp8_gemm_kernel<T, false, float>, T::kThreads,
                                                                T::kSmemBytes));
    return std::max(v, 1);
  }();
  return n;
}
// Blocks of one dense variant resident on an SM at once (registers and shared memory decide).
int blocks_per_sm(int variant) {
  if (variant == 3) return 1;
  return variant == 0 ? occupancy<TileM16>() : variant == 1 ? occupancy<TileM64>() : occupancy<TileM128>();
}

void check_common(const Fp8GemmArgs& a) {
  DI_CUDA_REQUIRE(a.M >= 0 && a.N >= 0 && a.K >= 0);
  DI_CUDA_REQUIRE_MSG(a.K % 16 == 0, "fp8_gemm: K must be a multiple of 16 (16-byte rows of e4m3)");
  DI_CUDA_REQUIRE_MSG(a.block_n == 1 || a.block_n == 128, "fp8_gemm: block_n must be 1 or 128");
  DI_CUDA_REQUIRE(a.c_elem == Elem::kF32 || a.c_elem == Elem::kBF16);
  DI_CUDA_REQUIRE(a.ldc >= (a.c2 != nullptr ? a.n_split : a.N));
  DI_CUDA_REQUIRE(a.variant >= -1 && a.variant <= 3);
  DI_CUDA_REQUIRE_MSG(a.c2 == nullptr || a.variant == 3, "fp8_gemm: a second output (c2) needs variant 3 (wgmma)");
  DI_CUDA_REQUIRE_MSG(a.variant != 3 || fp8_wgmma_available(), "fp8_gemm: variant 3 (wgmma) needs an sm_90 GPU");
  DI_CUDA_REQUIRE(a.splits >= 0);
  DI_CUDA_REQUIRE_MSG(reinterpret_cast<uintptr_t>(a.a) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
                      "fp8_gemm: a and w must be 16-byte aligned");
}

GemmParams base_params(const Fp8GemmArgs& a) {
  GemmParams p{};
  p.a = a.a;
  p.sa = a.a_scale;
  p.w = a.w;
  p.sw = a.w_scale;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.n_kb = (a.K + kGroupK - 1) / kGroupK;
  p.block_n = a.block_n;
  p.c = a.c;
  p.ldc = a.ldc;
  const size_t pair_bytes = a.c_elem == Elem::kF32 ? 8 : 4;
  p.c_vec = a.ldc % 2 == 0 && reinterpret_cast<uintptr_t>(a.c) % pair_bytes == 0;
  p.kb_per_split = p.n_kb;
  return p;
}

}  // namespace

void quantize_fp8_rows(const void* x, Elem x_elem, int64_t M, int64_t K, uint8_t* x_q, float* scales, bool ue8m0,
                       cudaStream_t s, int64_t ldx) {
  DI_CUDA_REQUIRE(x_elem == Elem::kF32 || x_elem == Elem::kBF16);
  DI_CUDA_REQUIRE_MSG(K % 16 == 0, "quantize_fp8_rows: K must be a multiple of 16");
  DI_CUDA_REQUIRE_MSG(ldx == 0 || (ldx >= K && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0),
                      "quantize_fp8_rows: a row pitch must be ≥ K and a multiple of 4, the rows 16-byte aligned");
  if (ldx == 0) ldx = K;
  const int64_t n_kb = (K + kGroupK - 1) / kGroupK;
  if (M == 0 || K == 0) return;
  const dim3 grid = quant_grid(M, n_kb);
  const int32_t* no_rows = nullptr;
  if (x_elem == Elem::kF32)
    launch_pdl(quantize_fp8_rows_kernel<float, false>, grid, 32 * kQuantWarps, 0, s, static_cast<const float*>(x), ldx,
               no_rows, int32_t{1}, K, n_kb, x_q, scales, ue8m0);
  else
    launch_pdl(quantize_fp8_rows_kernel<bf16, false>, grid, 32 * kQuantWarps, 0, s, static_cast<const bf16*>(x), ldx,
               no_rows, int32_t{1}, K, n_kb, x_q, scales, ue8m0);
  DI_CUDA_LAUNCHED();
}

void quantize_fp8_rows_bf16(const float* x, int64_t ldx, const int32_t* rows, int64_t row_div, int64_t M, int64_t K,
                            uint8_t* x_q, float* scales, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(K % 16 == 0 && ldx % 4 == 0 && ldx >= K,
                      "quantize_fp8_rows_bf16: K must be a multiple of 16, the row pitch of 4, ≥ K");
  DI_CUDA_REQUIRE(row_div >= 1 && row_div < (int64_t{1} << 31) && reinterpret_cast<uintptr_t>(x) % 16 == 0);
  const int64_t n_kb = (K + kGroupK - 1) / kGroupK;
  if (M == 0 || K == 0) return;
  if (reinterpret_cast<uintptr_t>(x_q) % 8 == 0 && M * n_kb < (int64_t{1} << 32))
    launch_pdl(quantize_bf16_rows_g16_kernel, g16_grid(M, n_kb), 32 * kQuantWarps, 0, s, x, ldx, rows,
               static_cast<int32_t>(row_div), K, static_cast<uint32_t>(n_kb), static_cast<uint32_t>(M * n_kb), x_q,
               scales);
  else  // codes not 8-byte aligned: the one-warp form (4-byte stores)
    launch_pdl(quantize_fp8_rows_kernel<float, true>, quant_grid(M, n_kb), 32 * kQuantWarps, 0, s, x, ldx, rows,
               static_cast<int32_t>(row_div), K, n_kb, x_q, scales, false);
  DI_CUDA_LAUNCHED();
}

void silu_mul_quantize_fp8(const void* h, Elem h_elem, int64_t M, int64_t I, uint8_t* x_q, float* scales,
                           cudaStream_t s) {
  DI_CUDA_REQUIRE(h_elem == Elem::kF32 || h_elem == Elem::kBF16);
  DI_CUDA_REQUIRE_MSG(I % 16 == 0, "silu_mul_quantize_fp8: I must be a multiple of 16");
  DI_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(h) % 16 == 0);
  const int64_t n_kb = (I + kGroupK - 1) / kGroupK;
  if (M == 0 || I == 0) return;
  const dim3 grid = quant_grid(M, n_kb);
  if (h_elem == Elem::kF32)
    launch_pdl(silu_mul_quantize_kernel<float>, grid, 32 * kQuantWarps, 0, s, static_cast<const float*>(h), I, n_kb,
               x_q, scales);
  else if (reinterpret_cast<uintptr_t>(x_q) % 8 == 0 && M * n_kb < (int64_t{1} << 32))
    launch_pdl(silu_mul_quantize_g16_kernel, g16_grid(M, n_kb), 32 * kQuantWarps, 0, s, static_cast<const bf16*>(h), I,
               static_cast<uint32_t>(n_kb), static_cast<uint32_t>(M * n_kb), x_q, scales);
  else  // codes not 8-byte aligned: the one-warp form
    launch_pdl(silu_mul_quantize_kernel<bf16>, grid, 32 * kQuantWarps, 0, s, static_cast<const bf16*>(h), I, n_kb, x_q,
               scales);
  DI_CUDA_LAUNCHED();
}

Fp8GemmPlan fp8_gemm_plan(const Fp8GemmArgs& a) {
  Fp8GemmPlan plan;
  const int64_t n_kb = (a.K + kGroupK - 1) / kGroupK;
  plan.variant = a.variant >= 0 ? a.variant : a.M <= 16 ? 0 : a.M <= 64 ? 1 : wgmma_eligible(a) ? 3 : 2;
  const int64_t bm = tile_rows_of(plan.variant);
  const int64_t tiles = ((a.M + bm - 1) / bm) * ((a.N + 127) / 128);
  int64_t splits = 1;
  if (plan.variant == 3) {
    splits = 1;  // the wgmma form has no split-K
  } else if (a.splits > 0) {
    splits = a.splits;
  } else if (!a.batch_invariant && tiles > 0) {
    // One wave: as many splits as keep every tile's blocks resident at once (a partial second
    // wave would cost a whole extra pass), keeping ≥ 2 K blocks per split.
    const int64_t slots = static_cast<int64_t>(sm_count()) * blocks_per_sm(plan.variant);
    splits = std::max<int64_t>(1, std::min(slots / tiles, n_kb / 2));
  }
  splits = std::max<int64_t>(1, std::min(splits, std::max<int64_t>(1, n_kb)));
  plan.kb_per_split = (n_kb + splits - 1) / splits;
  plan.splits = plan.kb_per_split > 0 ? (n_kb + plan.kb_per_split - 1) / plan.kb_per_split : 1;
  plan.workspace_bytes = plan.splits > 1 ? sizeof(float) * static_cast<size_t>(plan.splits * a.M * a.N) : 0;
  return plan;
}

void fp8_gemm(const Fp8GemmArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s) {
  check_common(a);
  DI_CUDA_REQUIRE(a.offsets == nullptr);
  DI_CUDA_REQUIRE_MSG(a.a_rows == nullptr, "fp8_gemm: gathered A rows are a grouped form's");
  if (a.M == 0 || a.N == 0) return;
  const Fp8GemmPlan plan = fp8_gemm_plan(a);
  if (plan.variant == 3) return fp8_wgmma_gemm(a, s);
  GemmParams p = base_params(a);
  p.kb_per_split = plan.kb_per_split;
  if (plan.splits > 1) {
    DI_CUDA_REQUIRE(alloc != nullptr);
    p.ws = static_cast<float*>(alloc(ctx, plan.workspace_bytes));
  }
  const int64_t bm = tile_rows_of(plan.variant);
  const int64_t row_tiles = (a.M + bm - 1) / bm;
  DI_CUDA_REQUIRE(row_tiles <= 65535);
  const dim3 grid(grid_for(a.N, 128), static_cast<unsigned>(row_tiles), static_cast<unsigned>(plan.splits));
  launch_variant<false>(plan.variant, p, a.c_elem, grid, s);
  if (plan.splits > 1) {
    const unsigned rgrid = grid_for(a.M * a.N, 256);
    if (a.c_elem == Elem::kF32)
      splitk_reduce_kernel<float><<<rgrid, 256, 0, s>>>(p.ws, plan.splits, a.M, a.N, static_cast<float*>(a.c), a.ldc);
    else
      splitk_reduce_kernel<bf16><<<rgrid, 256, 0, s>>>(p.ws, plan.splits, a.M, a.N, static_cast<bf16*>(a.c), a.ldc);
    DI_CUDA_LAUNCHED();
  }
}

int fp8_grouped_gemm_variant(const Fp8GemmArgs& a) {
  if (a.variant >= 0) return a.variant;
  const int64_t per_expert = (a.M + std::min(a.E, a.M) - 1) / std::max<int64_t>(1, std::min(a.E, a.M));
  return per_expert <= 16 ? 0 : per_expert <= 64 ? 1 : wgmma_eligible(a) ? 3 : 2;
}

void fp8_grouped_gemm(const Fp8GemmArgs& a, cudaStream_t s) {
  check_common(a);
  DI_CUDA_REQUIRE(a.offsets != nullptr && a.E >= 1);
  DI_CUDA_REQUIRE_MSG(a.splits <= 1, "fp8_grouped_gemm: no split-K");
  if (a.M == 0 || a.N == 0) return;
  const int variant = fp8_grouped_gemm_variant(a);
  DI_CUDA_REQUIRE_MSG(a.a_rows == nullptr || variant == 3, "fp8_grouped_gemm: gathered A rows need variant 3 (wgmma)");
  if (variant == 3) return fp8_wgmma_gemm(a, s);
  GemmParams p = base_params(a);
  p.offsets = a.offsets;
  p.E = a.E;
  const int64_t bm = tile_rows_of(variant);
  const int64_t max_tiles = (a.M + bm - 1) / bm + std::min(a.E, a.M);
  DI_CUDA_REQUIRE_MSG(max_tiles <= 65535, "fp8_grouped_gemm: too many row tiles for grid.y");
  const dim3 grid(grid_for(a.N, 128), static_cast<unsigned>(max_tiles), 1);
  launch_variant<true>(variant, p, a.c_elem, grid, s);
}

}  // namespace deepinfer::cuda
