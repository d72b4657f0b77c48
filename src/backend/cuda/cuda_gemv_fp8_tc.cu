// The decode GEMV's FP8 form on the tensor cores: C[r, n] = Σ_b scale[n, b] · Σ_{k in block b}
// W[n, k] · bf16(A[r, k]) for weights in e4m3 with one fp32 scale per (row, 128 columns), one A
// row per pass — the MoE experts' gate|up and down GEMVs and other matrices with many rows at
// decode steps of one token (cuda_gemv.cu's kernel with its FP8 widening on the CUDA cores is
// instruction-bound there at 0.37–0.49 of the copy rate, run s8-3).
//
// A unit is (an active expert slot, 8 weight rows: the n of an m16n8k16 MMA; gated: 4 gate rows
// and their 4 up rows, 4 output columns). A warp walks a contiguous range of units (persistent
// grid, equal shares) and, per unit, the slot's A rows one pass each and the row's K in batches
// of 4 scale blocks. Lane l = 4·n + i holds weight row n's 16-byte chunks i and i + 4 of each
// 128-column block (8 loads in flight per batch, double-buffered across batches and units, the
// weights evict-first in L2); each chunk's 16 codes become 8 f16x2 registers (e4m3x2 → f16x2,
// exact) and feed 4 MMAs as B — the chunk's codes 4j..4j+3 are the MMA's k slots {2i, 2i+1,
// 2i+8, 2i+9} for MMA j, a permutation of K that A follows: A's row 0 (lanes 0..3; rows 1..15
// are zero) holds the same 16 activations. A block's 8 MMAs accumulate from zero in fp32; lanes
// 0..3 then add block sum · scale for their two columns (2i, 2i + 1) in K order.
// A is staged per warp in shared memory when its pass starts (stage_row_f16_warp,
// cuda_fp8_rows_dot.cuh): rounded to bf16 (the GEMV's contract), times 2^−e, then f16 — exact in
// the range that keeps; the sums are multiplied by 2^e at the end.
// Compared with the CUDA-core form: the same operands and fp32 sums, another order (per scale
// block on the MMA units, then scaled), so results differ by fp32 rounding only.
#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_rows_dot.cuh"
#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_gemv_walk.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"

#include <algorithm>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace deepinfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kUnitRows = 8;      // weight rows per unit (the MMA's n)
constexpr int kScaleBlock = 128;  // columns per scale (block_k)
constexpr int kBatchBlocks = 4;   // scale blocks per batch
constexpr int kMaxK = 8192;       // a warp's staged A row: kMaxK f16 (16 KB; 64 KB per block)



// A warp's place in its stream of work: unit, pass (A row m of the slot's rows), batch.
struct Pos {
  int32_t unit, m, b;
  int32_t r0, rows, n0;
  int32_t a_row;  // the pass's A row (through the row map)
  int64_t w_row0;
  bool valid;
};

// The register cap: the gated form at 3 blocks per SM (≤ 168 registers), the plain one uncapped
// (168 with fp32 A, 174 with bf16) — each the faster for its shapes (run s12-8,
// decode_gemm_bench: experts gate|up 17.8 µs capped vs 20.2 uncapped, down 13.6 vs 11.9).
template <bool kGlu>
constexpr int min_blocks() {
  return kGlu ? 3 : 1;
}
template <bool kAF32, bool kGlu>
__global__ void __launch_bounds__(kThreads, min_blocks<kGlu>())
    gemv_fp8_tc_kernel(GemvArgs g, int32_t n_units, int32_t units_per_slot) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  __half* a_s = reinterpret_cast<__half*>(smem) + static_cast<int64_t>(warp) * g.K;  // [K] this warp's A row
  const int64_t group = static_cast<int64_t>(blockIdx.x) * kWarps + warp, n_groups = int64_t{gridDim.x} * kWarps;
  const auto u_end = static_cast<int32_t>((group + 1) * n_units / n_groups);
  const auto n_blocks = static_cast<int32_t>(g.K / kScaleBlock), n_chunks = static_cast<int32_t>(g.K / 16);
  const int32_t n_batches = (n_blocks + kBatchBlocks - 1) / kBatchBlocks;
  constexpr int kCols = kGlu ? kUnitRows / 2 : kUnitRows;  // output columns per unit
  const int un = lane / 4, ui = lane % 4;                  // this lane's weight row (MMA column), chunk slot
  // Unit row q's weight row (offset from w_row0) and output column (offset from n0).
  auto w_off = [&](int q) -> int64_t { return kGlu ? (q < 4 ? q : g.N + (q - 4)) : q; };
  auto col = [&](int q) { return kGlu ? q % 4 : q; };
  const unsigned char* wbase = static_cast<const unsigned char*>(g.w);
  const uint64_t policy = l2_evict_first_policy();  // weights: read once per step

  auto set_row = [&](Pos& p) {
    const int32_t r = p.r0 + p.m;
    p.a_row = g.a_rows != nullptr ? g.a_rows[r] / static_cast<int32_t>(g.a_row_div) : r;
  };
  auto enter = [&](int32_t u) {
    Pos p{};
    for (; u < u_end; ++u) {
      const int32_t slot = u / units_per_slot;
      const int e = g.active != nullptr ? g.active[slot] : 0;
      if (e < 0) continue;
      p.r0 = g.active != nullptr ? g.offsets[e] : 0;
      p.rows = g.active != nullptr ? g.offsets[e + 1] - p.r0 : static_cast<int32_t>(g.rows);
      if (p.rows <= 0) continue;
      p.unit = u, p.m = 0, p.b = 0;
      p.n0 = (u % units_per_slot) * kCols;
      p.w_row0 = static_cast<int64_t>(e) * (kGlu ? 2 * g.N : g.N) + p.n0;
      p.valid = true;
      set_row(p);
      return p;
    }
    p.valid = false;
    return p;
  };
  auto advance = [&](Pos p) {
    if (p.b + 1 < n_batches) {
      ++p.b;
    } else if (p.m + 1 < p.rows) {
      ++p.m, p.b = 0;
      set_row(p);
    } else {
      p = enter(p.unit + 1);
    }
    return p;
  };
  // Batch p.b's weight chunks (lane: row un, chunks i and i + 4 of each block) and, lanes 0..3,
  // the scales of their two MMA columns.
  auto issue = [&](const Pos& p, uint4 (&w)[kBatchBlocks][2], float (&sc)[kBatchBlocks][2]) {
    const bool row_ok = p.n0 + col(un) < g.N;
    const int64_t wr = p.w_row0 + w_off(un);
#pragma unroll
    for (int bb = 0; bb < kBatchBlocks; ++bb) {
      const int32_t blk = p.b * kBatchBlocks + bb;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t c = blk * 8 + ui + 4 * h;
        w[bb][h] = row_ok && blk < n_blocks ? ld_stream(wbase + (wr * n_chunks + c) * 16, policy)
                                            : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = 2 * lane + h;  // lanes 0..3: MMA columns 2·lane, 2·lane + 1
        const bool ok = lane < 4 && blk < n_blocks && p.n0 + col(q) < g.N;
        sc[bb][h] = ok ? __ldg(g.w_scale + (p.w_row0 + w_off(q)) * n_blocks + blk) : 0.0f;
      }
    }
  };

  // The staged A row: a_s = f16(bf16(A[row]) · 2^−e); back = 2^e.
  int32_t staged = -1;
  float back = 1.0f;
  auto stage = [&](int32_t a_row) {
    if (a_row == staged) return;
    back = stage_row_f16_warp<kAF32>(static_cast<const unsigned char*>(g.a) + a_row * g.lda * (kAF32 ? 4 : 2), g.K,
                                     a_s, lane);
    staged = a_row;
  };

  float tot[2] = {0.0f, 0.0f};  // lanes 0..3: MMA columns 2·lane, 2·lane + 1
  auto store = [&](int64_t r, int64_t n, float v) {
    if (g.c2 == nullptr || n < g.n_split) g.c[r * g.ldc + n] = v;
    else g.c2[r * g.ldc2 + (n - g.n_split)] = v;
  };
  auto step = [&](const Pos& p, const uint4 (&w)[kBatchBlocks][2], const float (&sc)[kBatchBlocks][2]) {
    if (p.b == 0) stage(p.a_row);
    // The batch's blocks as independent MMA chains, interleaved (a chain is 8 MMAs long). Blocks
    // past K hold zero codes and scales: they add +0.
    float c[kBatchBlocks][4] = {};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 av[kBatchBlocks], aw[kBatchBlocks];  // A row 0: lanes 0..3 only (rows 1..15 are zero)
#pragma unroll
      for (int bb = 0; bb < kBatchBlocks; ++bb) {
        av[bb] = aw[bb] = make_uint4(0, 0, 0, 0);
        const int32_t blk = p.b * kBatchBlocks + bb;
        if (lane < 4 && blk < n_blocks) {
          const uint4* src = reinterpret_cast<const uint4*>(a_s + (blk * 8 + lane + 4 * h) * 16);
          av[bb] = src[0];
          aw[bb] = src[1];
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int bb = 0; bb < kBatchBlocks; ++bb) {
          const uint32_t a_lo = j < 2 ? (j == 0 ? av[bb].x : av[bb].z) : (j == 2 ? aw[bb].x : aw[bb].z);
          const uint32_t a_hi = j < 2 ? (j == 0 ? av[bb].y : av[bb].w) : (j == 2 ? aw[bb].y : aw[bb].w);
          const uint32_t wj = j == 0 ? w[bb][h].x : j == 1 ? w[bb][h].y : j == 2 ? w[bb][h].z : w[bb][h].w;
          const uint32_t a[4] = {a_lo, 0u, a_hi, 0u};
          mma_f16_16816(c[bb], a, e4m3x2_to_f16x2(wj & 0xffffu), e4m3x2_to_f16x2(wj >> 16));
        }
    }
#pragma unroll
    for (int bb = 0; bb < kBatchBlocks; ++bb) {
      tot[0] = fmaf(c[bb][0], sc[bb][0], tot[0]);
      tot[1] = fmaf(c[bb][1], sc[bb][1], tot[1]);
    }
    if (p.b + 1 < n_batches) return;
    // The pass's sums: lanes 0..3 hold columns 2·lane, 2·lane + 1 of the unit (gated: lanes 0, 1
    // the gate columns 0..3, lanes 2, 3 the up columns).
    const float v0 = tot[0] * back, v1 = tot[1] * back;
    const float u0 = __shfl_down_sync(0xffffffffu, v0, 2), u1 = __shfl_down_sync(0xffffffffu, v1, 2);
    const int64_t r = p.r0 + p.m;
    if (kGlu ? lane < 2 : lane < 4) {
      const int64_t n = p.n0 + 2 * lane;
      if (n < g.N) store(r, n, kGlu ? silu_times(v0, u0) : v0);
      if (n + 1 < g.N) store(r, n + 1, kGlu ? silu_times(v1, u1) : v1);
    }
    tot[0] = tot[1] = 0.0f;
  };

  struct Buf {
    uint4 w[kBatchBlocks][2];
    float sc[kBatchBlocks][2];
  };
  // As cuda_gemv.cu: dense without a row map, the first batch's weights go out before the wait.
  walk_positions<Pos, Buf>(
      g.active == nullptr && g.a_rows == nullptr, static_cast<int32_t>(group * n_units / n_groups), enter, advance,
      [&](const Pos& p, Buf& b) { issue(p, b.w, b.sc); }, [&](const Pos& p, Buf& b) { step(p, b.w, b.sc); });
}

template <bool kAF32, bool kGlu>
void launch(const GemvArgs& g, int64_t n_units, int64_t units_per_slot, cudaStream_t s) {
  auto* kernel = gemv_fp8_tc_kernel<kAF32, kGlu>;
  static const bool smem_set = [&] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kWarps * kMaxK * sizeof(__half))));
    return true;
  }();
  (void)smem_set;
  const size_t smem = kWarps * static_cast<size_t>(g.K) * sizeof(__half);
  static int per_sm[kMaxK / kScaleBlock + 1] = {};  // resident blocks by K / 128 (0: not asked yet)
  int& fit = per_sm[g.K / kScaleBlock];
  if (fit == 0) {
    DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, smem));
    fit = std::max(fit, 1);
  }
  const int64_t blocks = std::min<int64_t>((n_units + kWarps - 1) / kWarps, int64_t{fit} * sm_count());
  launch_pdl(kernel, static_cast<unsigned>(blocks), kThreads, smem, s, g, static_cast<int32_t>(n_units),
             static_cast<int32_t>(units_per_slot));
  DI_CUDA_LAUNCHED();
}

}  // namespace

bool gemv_fp8_tc(const GemvArgs& g, cudaStream_t s) {
  if (g.w_elem != Elem::kF8 || g.max_rows != 1 || g.block_k != kScaleBlock || g.K % kScaleBlock != 0 ||
      g.K > kMaxK || !sm90a_device())
    return false;
  const int64_t cols = g.glu ? kUnitRows / 2 : kUnitRows;
  const int64_t units_per_slot = (g.N + cols - 1) / cols, n_units = units_per_slot * g.n_active;
  // Enough units for every SM's warps (fewer: cuda_gemv.cu's block mode splits K instead), or
  // the caller's bound (GemvArgs::tc_min_units).
  const int64_t min_units = g.tc_min_units > 0 ? g.tc_min_units : int64_t{kWarps} * sm_count();
  if (n_units < min_units || n_units > INT32_MAX) return false;
  if (g.a_elem == Elem::kF32) {
    g.glu ? launch<true, true>(g, n_units, units_per_slot, s) : launch<true, false>(g, n_units, units_per_slot, s);
  } else {
    g.glu ? launch<false, true>(g, n_units, units_per_slot, s) : launch<false, false>(g, n_units, units_per_slot, s);
  }
  return true;
}

}  // namespace deepinfer::cuda
