// The decode GEMV: C[r, n] = Σ_k A[r, k] · W[n, k] for a few rows r (decode steps, default mode),
// shaped to read W once at the copy rate.
//  - W: bf16, FP8 e4m3 with one fp32 scale per (row, block_k columns), or fp32 (the router).
//  - A: bf16, or fp32 rounded to bf16 as it is read (the same values a to_bf16 pass would give,
//    without its launch); fp32 as it is with fp32 weights.
//  - Dense (rows [0, M) of one matrix) or grouped (MoE: the rows of expert e are [offsets[e],
//    offsets[e+1]) of A and C, against W's rows [e·N, (e+1)·N)).
//  - Options: a row map (row r of the product reads A row a_rows[r] / a_row_div: the MoE reads
//    its tokens through the permutation instead of gathering them), a gated form (C =
//    silu(gate) · up of a gate row and its up row N rows later: SiLU·mul in the epilogue), and a
//    split output (columns past n_split to a second matrix: two row-stacked linears of one A,
//    such as q_proj and kv_a_proj, in one launch).
// Work: a unit is (an active expert slot, 4 weight rows: 4 output columns, or 2 gated ones). The
// grid is persistent (at most the blocks that fit at once) and each group takes a contiguous
// range of units of equal size (±1), so every SM streams the same number of bytes and no wave
// tail is left. A group is
//  - a warp (warp mode: more units than resident warps — the experts, the big dense matrices):
//    lane l takes the 16-byte chunks l, l + 32, … of each of the unit's rows;
//  - the block (block mode: small matrices such as the router's 64 rows or kv_a's 576, which
//    would otherwise leave most SMs idle): thread t takes chunks t, t + 128, ….
// A group walks its (unit, pass of ≤ kM A rows, batch of 2 chunks per row) positions as one
// stream, double-buffered in registers: the next position's loads (16 of 16 bytes per thread)
// are issued before this one's math, across unit boundaries too. Each thread keeps fp32 sums
// per (weight row, A row) in K order; a butterfly adds a warp's lanes, then (block mode) the 4
// warps are added in order through shared memory.
// FP8: the 16 codes of a chunk share a scale (block_k % 16 == 0): Σ code·a first, then · scale;
// the codes are widened by the hardware's e4m3x2 → f16x2 conversion (exact).
// The sum order depends on K only (not on M, the other rows or experts), but differs from the
// tiled and cuBLAS GEMMs: the batch-invariant mode does not use this kernel.
// Measured (bench/decode_gemm_bench, run s8-3, one row): 0.78–0.86 of the copy rate for bf16
// matrices of 45–115 MB, ~0.5 for 8–13 MB ones (~2 µs of latency), ~3 µs for 0.5–2.4 MB ones;
// FP8 0.37–0.49 (the widening's instructions) — so FP8 at one row per pass on matrices with
// many rows runs the tensor-core form instead (cuda_gemv_fp8_tc.cu; gemv picks it).
#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_gemv_walk.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"

#include <algorithm>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace deepinfer::cuda {
namespace {

constexpr int kWarps = 4;       // warps per block
constexpr int kUnitRows = 4;    // weight rows per unit
constexpr int kBatch = 2;       // 16-byte chunks per row per batch
constexpr int kThreads = kWarps * 32;

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// Elements of a 16-byte W chunk.
template <Elem kW>
constexpr int chunk_elems() {
  return kW == Elem::kBF16 ? 8 : kW == Elem::kF8 ? 16 : 4;
}

// The chunk's weights as floats (FP8: the codes' values, unscaled).
template <Elem kW>
__device__ __forceinline__ void widen(const uint4& raw, float* w) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (kW == Elem::kBF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = bf16_lo(u[i]);
      w[2 * i + 1] = bf16_hi(u[i]);
    }
  } else if constexpr (kW == Elem::kF8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 f = e4m3x2_to_float2(u[i] >> (16 * h));
        w[4 * i + 2 * h] = f.x;
        w[4 * i + 2 * h + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(u[i]);
  }
}

// n elements of an A row from element k, as floats: bf16 A as is; fp32 A rounded to bf16 (bf16 or
// FP8 weights) or as is (fp32 weights). 16-byte aligned (gemv_ok).
template <int kN, bool kAF32, bool kRound>
__device__ __forceinline__ void load_a(const void* row, int64_t k, float* a) {
  if constexpr (kAF32) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(row) + k);
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) {
      const float4 v = __ldg(p + i);
      if constexpr (kRound) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        const float2 flo = __bfloat1622float2(lo), fhi = __bfloat1622float2(hi);
        a[4 * i] = flo.x, a[4 * i + 1] = flo.y, a[4 * i + 2] = fhi.x, a[4 * i + 3] = fhi.y;
      } else {
        a[4 * i] = v.x, a[4 * i + 1] = v.y, a[4 * i + 2] = v.z, a[4 * i + 3] = v.w;
      }
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const bf16*>(row) + k);
#pragma unroll
    for (int i = 0; i < kN / 8; ++i) {
      const uint4 v = __ldg(p + i);
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        a[8 * i + 2 * j] = bf16_lo(u[j]);
        a[8 * i + 2 * j + 1] = bf16_hi(u[j]);
      }
    }
  }
}

// Where a group (a warp, or the whole block) is in its stream of work: unit, pass over A's rows
// (kM at a time), batch of K chunks. valid = false past the group's last unit.
// 32-bit fields where they fit (registers: two positions are live at once): units, rows,
// columns and batches stay below 2^31 (gemv checks).
template <int kM>
struct Pos {
  int32_t unit, mc, b;
  int32_t r0, rows, n0;
  int64_t w_row0;
  int32_t a_row[kM];  // the pass's A rows (through the row map), set per pass
  bool valid;
};

// kM: A rows per pass (1, 2 or 4). kBlockK: the block's 128 threads share each unit's K (few
// units: small matrices), else each warp takes whole units. See the file comment.
// Registers capped for occupancy (blocks per SM; the caps leave no spills): bf16 and fp32
// weights 4 up to two rows per pass, FP8 3 (its widening needs ~150 registers), 2 at four rows
// (run s8-5: two-row passes at 156–198 registers, 2–3 blocks, made decode B = 2 10 % slower).
template <Elem kW, int kM>
constexpr int min_blocks() {
  return kM == 4 ? 2 : kW == Elem::kF8 ? 3 : 4;
}
template <Elem kW, bool kAF32, int kM, bool kBlockK, bool kGlu>
__global__ void __launch_bounds__(kThreads, min_blocks<kW, kM>())
    gemv_kernel(GemvArgs g, int64_t n_units, int64_t units_per_slot) {
  constexpr int kEl = chunk_elems<kW>();
  constexpr size_t kAElem = kAF32 ? sizeof(float) : sizeof(bf16);
  constexpr int kSums = kUnitRows * kM;
  constexpr int kGroup = kBlockK ? kThreads : 32;  // threads sharing a unit's K
  // Block mode: the warps' sums of a pass, double-buffered (one barrier per pass).
  __shared__ float red[2][kBlockK ? kWarps : 1][kSums];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int gtid = kBlockK ? tid : lane;
  const int64_t group = kBlockK ? blockIdx.x : static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t n_groups = kBlockK ? gridDim.x : static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t u_end = (group + 1) * n_units / n_groups;
  const int64_t n_chunks = g.K / kEl;
  const int64_t n_batches = (n_chunks + kGroup * kBatch - 1) / (kGroup * kBatch);
  const int64_t n_kb = kW == Elem::kF8 ? (g.K + g.block_k - 1) / g.block_k : 0;
  const int bk = static_cast<int>(g.block_k);
  const unsigned char* wbase = static_cast<const unsigned char*>(g.w);
  const uint64_t w_policy = l2_evict_first_policy();  // read once per step
  // Output columns per unit: 4, or (glu) 2, each from a gate row and its up row N rows later.
  constexpr int kCols = kGlu ? kUnitRows / 2 : kUnitRows;
  // Unit row q: its weight row (offset from w_row0) and output column (offset from n0).
  auto w_off = [&](int q) { return kGlu ? (q % 2) + (q / 2) * g.N : static_cast<int64_t>(q); };
  auto col = [&](int q) { return kGlu ? q % 2 : q; };

  // The pass's A rows: a_rows[r] / a_row_div (32-bit: row indices < 2^31), else r.
  auto set_rows = [&](Pos<kM>& p) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int32_t r = p.r0 + p.mc + min(m, p.rows - p.mc - 1);
      p.a_row[m] = g.a_rows != nullptr ? g.a_rows[r] / static_cast<int32_t>(g.a_row_div) : static_cast<int32_t>(r);
    }
  };
  // The first position of unit u or of a later one with rows (idle slots skipped).
  auto enter = [&](int64_t u) {
    Pos<kM> p{};
    for (; u < u_end; ++u) {
      const int64_t slot = u / units_per_slot;
      const int e = g.active != nullptr ? g.active[slot] : 0;
      if (e < 0) continue;
      p.r0 = g.active != nullptr ? g.offsets[e] : 0;
      p.rows = g.active != nullptr ? g.offsets[e + 1] - p.r0 : static_cast<int32_t>(g.rows);
      if (p.rows <= 0) continue;
      p.unit = static_cast<int32_t>(u), p.mc = 0, p.b = 0;
      p.n0 = static_cast<int32_t>((u % units_per_slot) * kCols);
      p.w_row0 = e * (kGlu ? 2 * g.N : g.N) + p.n0;
      p.valid = true;
      set_rows(p);
      return p;
    }
    p.valid = false;
    return p;
  };
  auto advance = [&](Pos<kM> p) {
    if (p.b + 1 < n_batches) {
      ++p.b;
    } else if (p.mc + kM < p.rows) {
      p.mc += kM, p.b = 0;
      set_rows(p);
    } else {
      p = enter(p.unit + 1);
    }
    return p;
  };
  auto issue = [&](const Pos<kM>& p, uint4 (&w)[kUnitRows][kBatch], float (&sc)[kUnitRows][kBatch]) {
#pragma unroll
    for (int q = 0; q < kUnitRows; ++q)
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t c = (p.b * kBatch + j) * kGroup + gtid;
        const bool ok = c < n_chunks && p.n0 + col(q) < g.N;
        const int64_t wr = p.w_row0 + w_off(q);
        w[q][j] = ok ? ld_stream(wbase + (wr * n_chunks + c) * 16, w_policy) : make_uint4(0, 0, 0, 0);
        if constexpr (kW == Elem::kF8)
          sc[q][j] = ok ? __ldg(g.w_scale + wr * n_kb + static_cast<int>(c) * kEl / bk) : 0.0f;
      }
  };

  float acc[kUnitRows][kM];
#pragma unroll
  for (int q = 0; q < kUnitRows; ++q)
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[q][m] = 0.0f;
  int parity = 0;
  // C[r, n], or (split output) c2[r, n − n_split] past n_split.
  auto store = [&](int64_t r, int64_t n, float v) {
    if (g.c2 == nullptr || n < g.n_split) g.c[r * g.ldc + n] = v;
    else g.c2[r * g.ldc2 + (n - g.n_split)] = v;
  };
  // Batch p.b of the pass: the chunks in buffer w into acc; at the pass's last batch, the sums
  // are reduced, stored and reset.
  auto step = [&](const Pos<kM>& p, const uint4 (&w)[kUnitRows][kBatch], const float (&sc)[kUnitRows][kBatch]) {
    const int m_here = min(kM, p.rows - p.mc);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t c = (p.b * kBatch + j) * kGroup + gtid;
      if (c >= n_chunks) continue;
      float a[kM][kEl];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m < m_here) {
          const unsigned char* arow = static_cast<const unsigned char*>(g.a) + p.a_row[m] * g.lda * kAElem;
          load_a<kEl, kAF32, kW != Elem::kF32>(arow, c * kEl, a[m]);
        } else {
#pragma unroll
          for (int v = 0; v < kEl; ++v) a[m][v] = 0.0f;
        }
      }
#pragma unroll
      for (int q = 0; q < kUnitRows; ++q) {
        float wf[kEl];
        widen<kW>(w[q][j], wf);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if constexpr (kW == Elem::kF8) {
            float part = 0.0f;
#pragma unroll
            for (int v = 0; v < kEl; ++v) part = fmaf(wf[v], a[m][v], part);
            acc[q][m] = fmaf(part, sc[q][j], acc[q][m]);
          } else {
#pragma unroll
            for (int v = 0; v < kEl; ++v) acc[q][m] = fmaf(wf[v], a[m][v], acc[q][m]);
          }
        }
      }
    }
    if (p.b + 1 < n_batches) return;
    // Lanes by a butterfly (every lane ends with every sum); block mode then adds the warps in
    // order through shared memory. Sum i = (q, m) = (i / kM, i % kM).
#pragma unroll
    for (int q = 0; q < kUnitRows; ++q)
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        float v = acc[q][m];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[q][m] = v;
      }
    if constexpr (kBlockK) {
#pragma unroll
      for (int q = 0; q < kUnitRows; ++q)
#pragma unroll
        for (int m = 0; m < kM; ++m)
          if (lane == 0) red[parity][warp][q * kM + m] = acc[q][m];
      __syncthreads();
      if (tid < kCols * kM) {
        const int q = tid / kM, m = tid % kM;
        auto total = [&](int i) {
          float v = red[parity][0][i];
#pragma unroll
          for (int w = 1; w < kWarps; ++w) v += red[parity][w][i];
          return v;
        };
        float v;
        if constexpr (kGlu) v = silu_times(total(tid), total(tid + 2 * kM));
        else v = total(tid);
        if (m < m_here && p.n0 + q < g.N) store(p.r0 + p.mc + m, p.n0 + q, v);
      }
      parity ^= 1;
    } else {
      // Lane q·kM + m stores column q of pass row m: it selects its sum(s) first, so that the
      // gated form costs one SiLU per lane.
      float v = 0.0f, u = 0.0f;
#pragma unroll
      for (int q = 0; q < kUnitRows; ++q)
#pragma unroll
        for (int m = 0; m < kM; ++m)
          if (lane == q * kM + m) {
            v = acc[q][m];
            if (q + 2 < kUnitRows) u = acc[q + 2][m];
          }
      const int q = lane / kM, m = lane % kM;
      if (lane < kCols * kM && m < m_here && p.n0 + q < g.N)
        store(p.r0 + p.mc + m, p.n0 + q, kGlu ? silu_times(v, u) : v);
    }
#pragma unroll
    for (int q = 0; q < kUnitRows; ++q)
#pragma unroll
      for (int m = 0; m < kM; ++m) acc[q][m] = 0.0f;
  };

  // The stream (walk_positions). Dense without a row map, the first position's weight loads go
  // out before the wait for the previous kernel (weights are never written by a kernel, and
  // `enter` reads only sizes), so their latency overlaps that kernel's tail; the grouped form's
  // units come from the previous kernel's output (offsets, active experts, row map).
  struct Buf {
    uint4 w[kUnitRows][kBatch];
    float sc[kUnitRows][kBatch];
  };
  walk_positions<Pos<kM>, Buf>(
      g.active == nullptr && g.a_rows == nullptr, group * n_units / n_groups, enter, advance,
      [&](const Pos<kM>& p, Buf& b) { issue(p, b.w, b.sc); }, [&](const Pos<kM>& p, Buf& b) { step(p, b.w, b.sc); });
}

template <Elem kW, bool kAF32, int kM, bool kBlockK, bool kGlu>
int blocks_per_sm() {
  static const int n = [] {
    int v = 0;
    DI_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, gemv_kernel<kW, kAF32, kM, kBlockK, kGlu>, kThreads, 0));
    return std::max(v, 1);
  }();
  return n;
}

// Warp mode when the units outnumber the warps that fit at once (each warp then streams several
// units back to back); block mode otherwise, so that a small matrix still has every SM's
// threads reading it.
template <Elem kW, bool kAF32, int kM, bool kGlu>
void launch(const GemvArgs& g, cudaStream_t s) {
  constexpr int64_t kCols = kGlu ? kUnitRows / 2 : kUnitRows;  // output columns per unit
  const int64_t units_per_slot = (g.N + kCols - 1) / kCols;
  const int64_t n_units = units_per_slot * g.n_active;
  DI_CUDA_REQUIRE(n_units <= INT32_MAX);
  const int64_t warp_slots = int64_t{blocks_per_sm<kW, kAF32, kM, false, kGlu>()} * sm_count() * kWarps;
  if (n_units >= warp_slots) {
    const int64_t blocks = std::min<int64_t>((n_units + kWarps - 1) / kWarps, warp_slots / kWarps);
    launch_pdl(gemv_kernel<kW, kAF32, kM, false, kGlu>, static_cast<unsigned>(blocks), kThreads, 0, s, g, n_units,
               units_per_slot);
  } else {
    const int64_t blocks =
        std::min<int64_t>(n_units, int64_t{blocks_per_sm<kW, kAF32, kM, true, kGlu>()} * sm_count());
    launch_pdl(gemv_kernel<kW, kAF32, kM, true, kGlu>, static_cast<unsigned>(blocks), kThreads, 0, s, g, n_units,
               units_per_slot);
  }
  DI_CUDA_LAUNCHED();
}

// The gated form is instantiated for its one use: fp32 A, one row per pass (the MoE path at one
// token).
template <Elem kW, bool kAF32>
void launch_m(const GemvArgs& g, cudaStream_t s) {
  if constexpr (kAF32 && kW != Elem::kF32) {
    if (g.glu) {
      DI_CUDA_REQUIRE_MSG(g.max_rows == 1, "the gated GEMV takes one row per pass");
      launch<kW, kAF32, 1, true>(g, s);
      return;
    }
  }
  DI_CUDA_REQUIRE_MSG(!g.glu, "the gated GEMV takes fp32 A and bf16 or FP8 weights");
  if (g.max_rows <= 1) launch<kW, kAF32, 1, false>(g, s);
  else if (g.max_rows == 2) launch<kW, kAF32, 2, false>(g, s);
  else launch<kW, kAF32, 4, false>(g, s);
}

}  // namespace

bool gemv_ok(Elem a_elem, const void* a, int64_t lda, Elem w_elem, int64_t K, int64_t block_k) {
  const int64_t el = w_elem == Elem::kBF16 ? 8 : w_elem == Elem::kF8 ? 16 : 4;
  const size_t a_bytes = a_elem == Elem::kF32 ? 4 : 2;
  if (a_elem == Elem::kF8 || (w_elem == Elem::kF32 && a_elem != Elem::kF32)) return false;
  if (K <= 0 || K % el != 0 || K > INT32_MAX) return false;
  if (w_elem == Elem::kF8 && (block_k <= 0 || block_k % 16 != 0 || block_k > INT32_MAX)) return false;
  return reinterpret_cast<uintptr_t>(a) % 16 == 0 && (lda * static_cast<int64_t>(a_bytes)) % 16 == 0;
}

void gemv(const GemvArgs& g, cudaStream_t s) {
  DI_CUDA_REQUIRE(gemv_ok(g.a_elem, g.a, g.lda, g.w_elem, g.K, g.block_k));
  DI_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(g.w) % 16 == 0);
  DI_CUDA_REQUIRE(g.n_active >= 1 && (g.active != nullptr || g.n_active == 1));
  DI_CUDA_REQUIRE(g.a_row_div >= 1 && g.a_row_div <= INT32_MAX);
  // 32-bit positions (Pos): columns, A rows and units below 2^31.
  DI_CUDA_REQUIRE(g.N <= INT32_MAX && g.rows <= INT32_MAX && g.n_active <= 65535);
  DI_CUDA_REQUIRE_MSG(g.c2 == nullptr || (!g.glu && g.active == nullptr && g.n_split >= 0 && g.n_split <= g.N),
                      "gemv: a split output takes the dense, ungated form and 0 <= n_split <= N");
  if (g.N == 0 || (g.active == nullptr && g.rows == 0)) return;
  if (gemv_fp8_ring(g, s)) return;  // FP8 at one row per pass: the ring-fed tensor-core form
  if (gemv_fp8_tc(g, s)) return;    // or the register-buffered one
  const bool af32 = g.a_elem == Elem::kF32;
  switch (g.w_elem) {
    case Elem::kBF16:
      af32 ? launch_m<Elem::kBF16, true>(g, s) : launch_m<Elem::kBF16, false>(g, s);
      break;
    case Elem::kF8:
      af32 ? launch_m<Elem::kF8, true>(g, s) : launch_m<Elem::kF8, false>(g, s);
      break;
    case Elem::kF32:
      launch_m<Elem::kF32, true>(g, s);
      break;
  }
}

}  // namespace deepinfer::cuda
