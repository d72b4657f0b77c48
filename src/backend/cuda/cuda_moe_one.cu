// A MoE block's experts at one token as one persistent kernel (sm_90a): the routed experts'
// and the shared slices' gate | up GEMV with SiLU·mul, then their down GEMV and the combine —
// what the one-block sort, the grouped gate|up GEMV and the grouped down GEMV with its combine
// compute for a decode step of one token, in one launch and one stream of weight bytes; bf16
// weights, or FP8 (e4m3 codes with per-row fp32 scales over block_k columns).
//
// Why: at batch 1 those launches read V2-Lite's 138 MB of expert weights a layer at 0.74–0.83 of
// the copy rate, and each waits for the one before (perf.md, version 9). Here one block per SM
// (grid = the SM count, all resident) streams its share of the weights through a six-stage
// shared-memory ring of 32 KB stages: a producer warp issues each stage's rows by TMA as soon
// as the stage is free (few, large copies from lanes side by side: one lane issuing a stage's
// eight 4 KB rows one after another, each behind a load of its expert's id, held the kernel at
// 0.62 of the copy rate — run s26-2), eight math warps consume them. The producer runs ahead
// across the block's whole work list, so the down projection's rows are in flight while the
// gate | up phase ends and while the grid barrier between the two phases waits; and the shared
// slices' rows, whose experts are known before the router runs, are issued before the PDL wait.
// FP8: a stage also holds its rows' scales (1 KB after the codes), copied by the producer's
// lanes with 16-byte cp.async (a 4-byte copy each made the producer the kernel's bound: 42.1 →
// 34.9 µs, run s29-5), whose completion the stage's mbarrier counts (cp.async.mbarrier.arrive).
//
//   Phase A (gate | up): unit u = one h value, h[s][i] = silu(W_gate[e_s][i] · x) · (W_up[e_s][i] · x)
//              for slot s (routed slots 0..k−1: ids[s]; shared slots k..k+S−1: experts E..E+S−1)
//              and i < I; x rounded to bf16 as the GEMV rounds it. Block b owns units
//              [b·S·I/G, (b+1)·S·I/G) of the shared slots, then [b·k·I/G, (b+1)·k·I/G) of the
//              routed ones; a stage holds U units (bf16 4, FP8 8) — their gate rows, then their
//              up rows, each run of consecutive rows of one expert in one copy (a slot's rows i,
//              i+1, ... are contiguous: usually two 16 KB copies a stage) — and (bf16) warp w
//              takes rows w, w + 8, ... of every stage, or (FP8, the chain form) warp w < 6 takes
//              every row of every stage in ring slot w.
//   Barrier:   a grid barrier among the math warps (cuda_grid_barrier.cuh; a launch adds G).
//   Phase B (down + combine): block b owns output rows [b·D/G, (b+1)·D/G); a stage holds up to
//              R of those rows (bf16 8, FP8 16) of one slot's W_down — contiguous, one copy
//              (per-row copies of every slot, 2.8 KB each, ran at ~0.7 of the copy rate: run
//              s26-3) — slot after slot, its rows shared by the warps as in phase A, against
//              bf16(h[s]) into y[s][row]; at the end out[j] = Σ_{s<k} w_s·y_s[j] in slot order, then + y_s[j] of
//              each shared slot in order — the grouped kernel's combine order.
// A row's dot: bf16, Σ w·x in two fp32 chains per lane, then the warp's butterfly (a warp per
// row). FP8, on the tensor cores (a CUDA-core dot — e4m3x2 → f16x2 → f32 per pair, FMAs —
// was instruction-bound at 0.38 of the copy rate: run s26-5): a stage's 16 rows are the A
// operand of m16n8k16 f16 MMAs against x in f16 (bf16(x)·2^−e, exact in the range the decode
// GEMV's tensor-core form keeps), each scale block's MMA sum times the row's scale, added in
// block order (fp8_rows_dot) — the stage's warp alone (the 8 warps splitting a stage's K, their
// parts added after a block barrier, ran at 0.41 of the copy rate: run s27-1). The chain form
// (MoeOneArgs::chain, the batch-invariant mode): chain_dot8 (cuda_chain_dot.cuh), all of K in one
// chain.
//
// Shapes: U·2·D and R·I codes ≤ 32 KB (D, I ≤ 2048), k + S ≤ 32, D % 16 == I % 16 == 0; FP8
// block_k % 64 == 0 dividing D and I, D / block_k, I / block_k ≤ 16; the chain form D % 64 ==
// I % 64 == 0; the whole layout within 227 KB (moe_one_fits). Deterministic: every sum in a fixed order, no splits.
#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_chain_dot.cuh"
#include "backend/cuda/cuda_fp8_rows_dot.cuh"
#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_grid_barrier.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_moe_one.cuh"
#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_sm90.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace deepinfer::cuda {

namespace {

constexpr int kMath = 8;                     // math warps
constexpr int kThreads = 32 * (kMath + 1);   // + the producer warp
constexpr int kStages = 6;
constexpr uint32_t kStageBytes = 32 * 1024;  // a stage's weight codes
constexpr int kMaxSlots = 32;                // the producer: a lane holds each slot's expert
constexpr int kMaxBlocksK = 16;              // FP8: scale blocks per row
constexpr int kOptinSmem = 227 * 1024;
constexpr int kMmaRows = 16;                 // FP8: a stage's rows, the M of one m16n8k16 MMA

constexpr uint32_t kChainPad = 16;           // chain form: bytes after each staged row (ldmatrix banks)
constexpr int kChainK = 64;                  // chain form: K a multiple of this (small_m_gemm's K step)

// The form's stage shapes: bf16 (kFp8 false), FP8, or the batch-invariant chain form (bf16, kChain).
template <bool kFp8, bool kChain = false>
struct Cfg {
  static_assert(!(kFp8 && kChain), "the chain form is bf16");
  static constexpr int64_t kEsz = kFp8 ? 1 : 2;      // bytes per weight
  static constexpr int kUnits = kFp8 ? 8 : 4;        // phase A: units per stage (2 rows each)
  static constexpr int kRowsB = kFp8 ? 16 : 8;       // phase B: output rows per stage
  static constexpr uint32_t kScaleBytes = kFp8 ? 4 * 2 * kUnits * kMaxBlocksK : 0;  // ≥ R · 16 · 4 too
  static constexpr uint32_t kPad = kChain ? kChainPad : 0;  // each staged row's pitch: its bytes + kPad
  static constexpr uint32_t kStride = kStageBytes + kScaleBytes + 2 * kUnits * kPad;
  static_assert(2 * kUnits % kMath == 0 && kRowsB % kMath == 0, "a warp's rows: w, w + 8, ...");
  static_assert(!kFp8 || (2 * kUnits == kMmaRows && kRowsB == kMmaRows), "FP8: a stage is one MMA's 16 rows");
  static_assert(!kChain || (2 * kUnits == 8 && kRowsB == 8), "chain form: a stage is one MMA's 8 columns");
};

// Whether a phase A stage (U units' gate and up rows) and a phase B stage (R rows of I) fit.
template <bool kFp8, bool kChain = false>
bool stages_fit(int64_t D, int64_t I) {
  using C = Cfg<kFp8, kChain>;
  return int64_t{C::kUnits} * 2 * D * C::kEsz <= kStageBytes && int64_t{C::kRowsB} * I * C::kEsz <= kStageBytes;
}

struct Layout {
  uint32_t ring, x, h, red, y, bars, total;
};
__host__ __device__ inline uint32_t align16(uint64_t v) { return static_cast<uint32_t>((v + 15) / 16 * 16); }
// G: the grid (a block's output rows: at most ⌈D / G⌉, their y[slot][row] in shared memory).
template <bool kFp8, bool kChain = false>
__host__ __device__ inline Layout layout(int64_t D, int64_t I, int64_t slots, int64_t G) {
  Layout l;
  l.ring = 0;
  l.x = kStages * Cfg<kFp8, kChain>::kStride;
  l.h = l.x + align16(uint64_t{2} * D);
  l.red = l.h + align16(uint64_t{2} * slots * I);
  l.y = l.red + 2 * 2 * Cfg<kFp8>::kUnits * 4;
  l.bars = l.y + align16(uint64_t{4} * slots * ((D + G - 1) / G));
  l.total = l.bars + 2 * kStages * 8;
  return l;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A warp's dot product of a bf16 weight row in shared memory against x (n bf16 in shared
// memory): lane sums, then the butterfly.
__device__ __forceinline__ float warp_dot(const unsigned char* row, const bf16* x, int n, int lane) {
  const uint4* w = reinterpret_cast<const uint4*>(row);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc = 0.0f;
#pragma unroll 4
  for (int c = lane; c < n / 8; c += 32) acc = mla::dot8_bf16(w[c], xv[c], acc);
  return mla::warp_sum(acc);
}
// The math warps' barrier (named barrier 1: the producer warp never joins).
__device__ __forceinline__ void math_sync() { named_barrier(1, 32 * kMath); }
// FP8's activations for the MMAs: n fp32 values (L2) rounded to bf16 (as the GEMVs round them),
// times 2^−e, in f16 into shared memory, where e ≥ 0 is the least keeping every magnitude below
// 2^14 (e = 0 unless one passes 16,384) — exact for every magnitude in [2^(e−14), 2^(e+14)), as
// the decode GEMV's tensor-core form stages them. Returns 2^e (to scale the sums back). By the
// math warps (t: the thread's index among them; red8: 8 floats of shared scratch); n % 4 == 0;
// ends with their barrier. Up to kStageRegs float4 a thread (V2-Lite's h: 11, x: 2) are read from
// L2 once, all loads in flight together, and kept in registers across the maximum's barrier (two
// passes over L2, four loads at a time, took ~2 µs more of phase B's critical path: perf.md,
// version 31); larger n reads the values twice.
constexpr int kStageRegs = 12;
__device__ __forceinline__ float stage_f16_scaled(const float* src, int64_t n, __half* dst, int t, float* red8) {
  constexpr int kT = 32 * kMath;
  const float4* s4 = reinterpret_cast<const float4*>(src);
  auto rounded = [](float v) { return __bfloat162float(__float2bfloat16(v)); };
  auto vmax = [&](float4 v) {
    return fmaxf(fmaxf(fabsf(rounded(v.x)), fabsf(rounded(v.y))), fmaxf(fabsf(rounded(v.z)), fabsf(rounded(v.w))));
  };
  const bool in_regs = n / 4 <= int64_t{kStageRegs} * kT;
  float4 v[kStageRegs];
  float mx = 0.0f;
  if (in_regs) {
#pragma unroll
    for (int j = 0; j < kStageRegs; ++j) {
      const int64_t c = t + int64_t{j} * kT;
      v[j] = c < n / 4 ? __ldcg(s4 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kStageRegs; ++j) mx = fmaxf(mx, vmax(v[j]));
  } else {
#pragma unroll 4
    for (int64_t c = t; c < n / 4; c += kT) mx = fmaxf(mx, vmax(__ldcg(s4 + c)));
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (t % 32 == 0) red8[t / 32] = mx;
  math_sync();
  mx = 0.0f;
#pragma unroll
  for (int w = 0; w < kMath; ++w) mx = fmaxf(mx, red8[w]);
  int p = 0;
  frexpf(mx, &p);  // mx < 2^p
  const int e = max(0, p - 14);
  const float down = ldexpf(1.0f, -e);
  auto put = [&](int64_t c, float4 x) {
    __half2* d = reinterpret_cast<__half2*>(dst + 4 * c);
    d[0] = __floats2half2_rn(rounded(x.x) * down, rounded(x.y) * down);
    d[1] = __floats2half2_rn(rounded(x.z) * down, rounded(x.w) * down);
  };
  if (in_regs) {
#pragma unroll
    for (int j = 0; j < kStageRegs; ++j) {
      const int64_t c = t + int64_t{j} * kT;
      if (c < n / 4) put(c, v[j]);
    }
  } else {
#pragma unroll 4
    for (int64_t c = t; c < n / 4; c += kT) put(c, __ldcg(s4 + c));
  }
  math_sync();  // red8 read by every thread and dst written before anyone goes on
  return ldexpf(1.0f, e);
}
#endif

}  // namespace

template <bool kFp8, bool kChain>
__global__ void __launch_bounds__(kThreads, 1) moe_one_kernel(MoeOneArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<kFp8, kChain>;
  constexpr int U = C::kUnits, R = C::kRowsB;
  constexpr bool kOwned = kFp8 || kChain;  // a warp per stage (below)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int G = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t D = a.D, I = a.I, k = a.k, S = a.n_shared, slots = k + S;
  const Layout L = layout<kFp8, kChain>(D, I, slots, G);
  // A staged row's bytes, and its pitch in a stage (the chain form pads each row).
  const uint32_t row_a = static_cast<uint32_t>(D * C::kEsz), row_b = static_cast<uint32_t>(I * C::kEsz);
  const uint32_t pitch_a = row_a + C::kPad, pitch_b = row_b + C::kPad;
  unsigned char* ring = smem + L.ring;
  bf16* sx = reinterpret_cast<bf16*>(smem + L.x);
  bf16* sh = reinterpret_cast<bf16*>(smem + L.h);
  float* red = reinterpret_cast<float*>(smem + L.red);  // [2][2U]
  float* ys = reinterpret_cast<float*>(smem + L.y);     // [slots][rows_max]: phase B's dots
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* empty = full + kStages;
  const unsigned char* w13 = static_cast<const unsigned char*>(a.w13);
  const unsigned char* w2 = static_cast<const unsigned char*>(a.w2);
  // FP8: scale blocks per row of w13 (over D) and of w2 (over I); chunks of 16 per block.
  const int nk_a = kFp8 ? static_cast<int>((D + a.block_k - 1) / a.block_k) : 0;
  const int nk_b = kFp8 ? static_cast<int>((I + a.block_k - 1) / a.block_k) : 0;
  const int gpb = kFp8 ? static_cast<int>(a.block_k / kMmaGroup) : 1;  // FP8: 64-column groups per scale block
  __half* sxh = reinterpret_cast<__half*>(smem + L.x);  // FP8: x, then h, in f16 (stage_f16_scaled)
  __half* shh = reinterpret_cast<__half*>(smem + L.h);
  // The phase timeline (MoeOneArgs::trace): the global timer at mark m, by thread 0 (math) or
  // the producer's lane 0 (marks 1–4).
  auto mark = [&](int m) {
    if (a.trace != nullptr) a.trace[b * kMoeOneMarks + m] = global_ns();
  };
  if (t == 0) mark(0);

  // The block's work: shared units [s0, s1) (over S·I), routed units [r0, r1) (over k·I), rows
  // [j0, j1) of the output.
  const int64_t s0 = int64_t{b} * S * I / G, s1 = int64_t{b + 1} * S * I / G;
  const int64_t r0 = int64_t{b} * k * I / G, r1 = int64_t{b + 1} * k * I / G;
  const int64_t j0 = int64_t{b} * D / G, j1 = int64_t{b + 1} * D / G;
  const int64_t n_units = (s1 - s0) + (r1 - r0);
  const int64_t rows = j1 - j0, rows_max = (D + G - 1) / G, chunks = (rows + R - 1) / R;
  const int64_t n_a = (n_units + U - 1) / U, n_b = slots * chunks;
  // Unit q of the block's list → (slot, i): shared ones first.
  auto unit = [&](int64_t q, int64_t& slot, int64_t& i) {
    const int64_t g = q < s1 - s0 ? s0 + q : r0 + (q - (s1 - s0));
    const int64_t base = q < s1 - s0 ? k * I : 0;  // shared units count after the routed slots
    slot = (base + g) / I;
    i = (base + g) % I;
  };

  if (t == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], kFp8 ? 1 + 32 : 1);  // FP8: + the producer lanes' cp.async arrivals
      mbar_init(&empty[s], kOwned ? 1 : kMath);  // warp-owned stages: stage s is warp s's alone
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == kMath) {
    // ---- The producer: every stage of the list, in order, as the ring frees them. Its lanes
    // issue a stage's copies side by side, each from the expert of its slot, held in a
    // register: lane s < k + S keeps slot s's expert (the shared ones from the start, the
    // routed ones once the wait has returned), passed around by shuffles — no load between a
    // stage's copies.
    const int64_t n_shared_stages = (s1 - s0) / U;  // stages of shared units only
    int64_t my_e = lane >= k && lane < slots ? a.E + (lane - k) : 0;
    bool waited = false;
    for (int64_t q = 0; q < n_a + n_b; ++q) {
      const int st = moe_one_producer_turn<kStages>(q, empty, n_shared_stages, a.ids, k, lane, my_e, waited, mark);
      if (q == n_a - 1 && lane == 0) mark(3);
      unsigned char* dst = ring + st * C::kStride;
      float* dsc = reinterpret_cast<float*>(dst + kStageBytes);  // FP8: the stage's rows' scales
      if (q < n_a) {
        const int64_t u0 = q * U, nu = std::min<int64_t>(U, n_units - u0);
        if (lane == 0) mbar_arrive_expect_tx(&full[st], static_cast<uint32_t>(nu) * 2 * row_a);
        // Lane v < nu: unit v; a run of units (same slot, consecutive i) starts at lane v when
        // unit v − 1 is not its predecessor. The run's first lane copies its gate rows to rows
        // v.. and its up rows to rows U + v.. of the stage.
        int64_t slot = -1, i = 0;
        if (lane < nu) unit(u0 + lane, slot, i);
        const int64_t e = __shfl_sync(0xffffffffu, my_e, static_cast<int>(std::max<int64_t>(slot, 0)));
        const int64_t prev_slot = __shfl_up_sync(0xffffffffu, slot, 1), prev_i = __shfl_up_sync(0xffffffffu, i, 1);
        const bool start = lane < nu && (lane == 0 || prev_slot != slot || prev_i + 1 != i);
        const unsigned starts = __ballot_sync(0xffffffffu, start);
        __syncwarp();
        if constexpr (kChain) {  // a row per copy, each at its padded place: lane v copies unit v's rows
          if (lane < nu) {
            const unsigned char* gate = w13 + (e * 2 * I + i) * row_a;
            bulk_load(dst + lane * pitch_a, gate, row_a, &full[st]);
            bulk_load(dst + (U + lane) * pitch_a, gate + I * row_a, row_a, &full[st]);
          }
        } else if (start) {
          const unsigned later = starts & ~((2u << lane) - 1u);
          const int64_t n = (later != 0 ? __ffs(static_cast<int>(later)) - 1 : nu) - lane;
          const unsigned char* gate = w13 + (e * 2 * I + i) * row_a;
          bulk_load(dst + lane * row_a, gate, static_cast<uint32_t>(n) * row_a, &full[st]);
          bulk_load(dst + (U + lane) * row_a, gate + I * row_a, static_cast<uint32_t>(n) * row_a, &full[st]);
        }
        if constexpr (kFp8) {  // stage row ρ (unit ρ % U, gate or up): its nk_a scales
          if (nk_a % 4 == 0) {  // 16 bytes a copy (run s27-3: 4-byte copies made the producer the bound)
            const int cpr = nk_a / 4;
            for (int p0 = 0; p0 < 2 * U * cpr; p0 += 32) {
              const int p = p0 + lane, rho = p / cpr, v = rho % U;
              const int64_t ev = __shfl_sync(0xffffffffu, e, v % 32), iv = __shfl_sync(0xffffffffu, i, v % 32);
              if (p < 2 * U * cpr && v < nu)
                cp_async16(smem_u32(dsc + 4 * p),
                           a.w13_scale + (ev * 2 * I + (rho / U) * I + iv) * nk_a + 4 * (p % cpr), true);
            }
          } else {
            for (int p0 = 0; p0 < 2 * U * nk_a; p0 += 32) {
              const int p = p0 + lane, rho = p / nk_a, v = rho % U;
              const int64_t ev = __shfl_sync(0xffffffffu, e, v % 32), iv = __shfl_sync(0xffffffffu, i, v % 32);
              if (p < 2 * U * nk_a && v < nu)
                cp_async4(smem_u32(dsc + p), a.w13_scale + (ev * 2 * I + (rho / U) * I + iv) * nk_a + p % nk_a, true);
            }
          }
          cp_async_arrive(&full[st]);
        }
      } else {  // slot sb's rows [rb, rb + nr)
        const int64_t sb = (q - n_a) / chunks, rb = j0 + (q - n_a) % chunks * R;
        const int64_t nr = std::min<int64_t>(R, j1 - rb);
        const int64_t e = __shfl_sync(0xffffffffu, my_e, static_cast<int>(sb));
        if constexpr (kChain) {  // lane r copies row rb + r to its padded place
          if (lane == 0) mbar_arrive_expect_tx(&full[st], static_cast<uint32_t>(nr) * row_b);
          __syncwarp();
          if (lane < nr) bulk_load(dst + lane * pitch_b, w2 + (e * D + rb + lane) * row_b, row_b, &full[st]);
        } else if (lane == 0) {
          mbar_arrive_expect_tx(&full[st], static_cast<uint32_t>(nr) * row_b);
          bulk_load(dst, w2 + (e * D + rb) * row_b, static_cast<uint32_t>(nr) * row_b, &full[st]);
        }
        if constexpr (kFp8) {
          // The rows' nr·nk_b scales are contiguous: copied in 16-byte chunks from the aligned
          // address at or before the first (off < 4 floats before it; the consumer skips them),
          // the last chunk cut at the run's end — off + R·nk_b floats within kScaleBytes
          // (moe_one_fits).
          const int64_t f0 = (e * D + rb) * nk_b, off = f0 % 4, n = off + nr * nk_b;
          const float* src0 = a.w2_scale + (f0 - off);
          for (int64_t c = lane; 4 * c < n; c += 32)
            cp_async16_n(smem_u32(dsc + 4 * c), src0 + 4 * c,
                         static_cast<uint32_t>(std::min<int64_t>(4, n - 4 * c) * 4));
          cp_async_arrive(&full[st]);
        }
      }
    }
    if (!waited) pdl_wait();
    if (lane == 0) mark(4);
    return;  // the producer warp takes no part in the math warps' barriers
  }

  // ---- The math warps ----
  pdl_wait();
  pdl_trigger();
  const unsigned long long base = t == 0 ? grid_base(a.counter, static_cast<unsigned long long>(G)) : 0;
  float x_up = 1.0f, h_up = 1.0f;  // FP8: the activations' 2^e
  if constexpr (kFp8) {
    x_up = stage_f16_scaled(a.x, D, sxh, t, red);
  } else {
    mla::stage_bf16<32 * kMath>(a.x, D, sx, t);  // x rounded to bf16
    math_sync();
  }
  if (t == 0) mark(5);

  // Warp-owned stages (the chain form and FP8): warp w < kStages takes every stage of ring slot w
  // (q ≡ w mod kStages, so it meets each of the slot's phases in order) and all of its rows, with
  // no block barrier per stage (FP8 with the warps splitting each stage's K and adding their
  // parts after a barrier ran at ~1.9 µs a stage, half the bf16 form's rate: run s27-1). bf16:
  // warp w takes rows w, w + 8, ... of every stage.
  if constexpr (kOwned) {
    if (warp < kStages) {
      for (int64_t q = warp; q < n_a; q += kStages) {
        mbar_wait(&full[warp], static_cast<uint32_t>((q / kStages) & 1));
        if (q == 0 && lane == 0) mark(6);
        const unsigned char* sw = ring + warp * C::kStride;
        const int64_t u0 = q * U, nu = std::min<int64_t>(U, n_units - u0);
        int64_t slot, i;
        if constexpr (kChain) {  // lanes 0, 1: the gate sums of units 2l, 2l + 1; lanes 2, 3: their up sums
          float y0, y1;
          chain_dot8(smem_u32(sw) + static_cast<uint32_t>(lane % 8) * pitch_a, static_cast<int>(D), sx, lane, y0, y1);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[warp]);
          const float u0v = __shfl_sync(0xffffffffu, y0, (lane + 2) % 32), u1v = __shfl_sync(0xffffffffu, y1, (lane + 2) % 32);
          for (int j = 0; j < 2; ++j) {
            if (lane < 2 && 2 * lane + j < nu) {
              unit(u0 + 2 * lane + j, slot, i);
              a.h[slot * I + i] = silu_times(j == 0 ? y0 : y1, j == 0 ? u0v : u1v);
            }
          }
        } else {  // lane 4v: unit v's gate (row v) and up (row U + v) sums
          float y0, y8;
          fp8_rows_dot(sw, D, reinterpret_cast<const float*>(sw + kStageBytes), nk_a, gpb, sxh, lane, y0, y8);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[warp]);
          if (lane % 4 == 0 && lane / 4 < nu) {
            unit(u0 + lane / 4, slot, i);
            a.h[slot * I + i] = silu_times(y0 * x_up, y8 * x_up);
          }
        }
      }
    }
  } else {
    for (int64_t q = 0; q < n_a; ++q) {
      const int st = static_cast<int>(q % kStages);
      mbar_wait(&full[st], static_cast<uint32_t>((q / kStages) & 1));
      if (q == 0 && t == 0) mark(6);
      const int64_t u0 = q * U, nu = std::min<int64_t>(U, n_units - u0);
      const unsigned char* sw = ring + st * C::kStride;
      float* r = red + (q & 1) * 2 * U;  // the stage's row sums
#pragma unroll
      for (int rho = warp; rho < 2 * U; rho += kMath) {
        if (rho % U < nu) {
          const float y = warp_dot(sw + rho * D * C::kEsz, sx, static_cast<int>(D), lane);
          if (lane == 0) r[rho] = y;
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[st]);
      math_sync();
      if (t < nu) {  // unit t: its gate and up sums
        int64_t slot, i;
        unit(u0 + t, slot, i);
        a.h[slot * I + i] = silu_times(r[t], r[U + t]);
      }
    }
  }

  // The grid barrier: every block's h written.
  if (t == 0) mark(7);
  grid_sync(a.counter, base + static_cast<unsigned long long>(G), t == 0, [] { math_sync(); });
  if (t == 0) mark(8);
  if constexpr (kFp8) {
    h_up = stage_f16_scaled(a.h, slots * I, shh, t, red);
  } else {
    mla::stage_bf16<32 * kMath>(a.h, slots * I, sh, t);  // h rounded to bf16, as the down GEMV rounds it
    math_sync();
  }

  // Phase B (slot sb's rows c0 ..), stages owned as in phase A, then the combine.
  if constexpr (kOwned) {
    if (warp < kStages) {
      for (int64_t q = n_a + ((warp - n_a) % kStages + kStages) % kStages; q < n_a + n_b; q += kStages) {
        mbar_wait(&full[warp], static_cast<uint32_t>((q / kStages) & 1));
        const int64_t sb = (q - n_a) / chunks, c0 = (q - n_a) % chunks * R;
        const unsigned char* sw = ring + warp * C::kStride;
        float* y = ys + sb * rows_max + c0;
        if constexpr (kChain) {  // lane l < 4: rows 2l, 2l + 1
          float y0, y1;
          chain_dot8(smem_u32(sw) + static_cast<uint32_t>(lane % 8) * pitch_b, static_cast<int>(I), sh + sb * I, lane,
                     y0, y1);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[warp]);
          if (lane < 4 && c0 + 2 * lane < rows) y[2 * lane] = y0;
          if (lane < 4 && c0 + 2 * lane + 1 < rows) y[2 * lane + 1] = y1;
        } else {  // lane 4g: rows g, g + 8
          float y0, y8;
          // The stage's scales start (rb · nk_b) mod 4 floats in (the producer's aligned copy; D % 4 == 0).
          const float* sc = reinterpret_cast<const float*>(sw + kStageBytes) + (j0 + c0) * nk_b % 4;
          fp8_rows_dot(sw, I, sc, nk_b, gpb, shh + sb * I, lane, y0, y8);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[warp]);
          if (lane % 4 == 0 && c0 + lane / 4 < rows) y[lane / 4] = y0 * h_up;
          if (lane % 4 == 0 && c0 + lane / 4 + 8 < rows) y[lane / 4 + 8] = y8 * h_up;
        }
      }
    }
  } else {
    for (int64_t q = n_a; q < n_a + n_b; ++q) {  // warp w: rows w, w + 8, ... of the stage
      const int st = static_cast<int>(q % kStages);
      mbar_wait(&full[st], static_cast<uint32_t>((q / kStages) & 1));
      const int64_t sb = (q - n_a) / chunks, c0 = (q - n_a) % chunks * R;
      const unsigned char* sw = ring + st * C::kStride;
#pragma unroll
      for (int rho = warp; rho < R; rho += kMath) {
        if (c0 + rho < rows) {
          const float y = warp_dot(sw + rho * I * C::kEsz, sh + sb * I, static_cast<int>(I), lane);
          if (lane == 0) ys[sb * rows_max + c0 + rho] = y;
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[st]);
    }
  }
  math_sync();
  moe_one_combine(ys, rows, rows_max, k, slots, a.weights, a.out + j0, t, 32 * kMath);
  if (t == 0) mark(9);
#else
  __trap();  // sm_90a only (moe_one_fits)
#endif
}

bool moe_one_fits(int64_t D, int64_t I, int64_t k, int64_t n_shared, bool fp8, int64_t block_k, bool chain) {
  const int64_t slots = k + n_shared;
  if (D <= 0 || I <= 0 || k <= 0 || D % 16 != 0 || I % 16 != 0 || slots > kMaxSlots || !sm90a_device()) return false;
  if (chain) {  // K in whole small_m_gemm steps: the same chunks, no zero padding to match
    return !fp8 && D % kChainK == 0 && I % kChainK == 0 && stages_fit<false, true>(D, I) &&
           layout<false, true>(D, I, slots, sm_count()).total <= static_cast<uint32_t>(kOptinSmem);
  }
  if (fp8) {
    if (block_k <= 0 || block_k % kMmaGroup != 0 || D % block_k != 0 || I % block_k != 0 ||
        (D + block_k - 1) / block_k > kMaxBlocksK || (I + block_k - 1) / block_k > kMaxBlocksK)
      return false;
    // A phase-B stage's scale copy: up to 3 floats before its R rows' scales (the 16-byte aligned
    // start), all within the stage's scale space.
    if (3 + Cfg<true>::kRowsB * (I / block_k) > static_cast<int64_t>(Cfg<true>::kScaleBytes / 4)) return false;
    return stages_fit<true>(D, I) && layout<true>(D, I, slots, sm_count()).total <= static_cast<uint32_t>(kOptinSmem);
  }
  return stages_fit<false>(D, I) && layout<false>(D, I, slots, sm_count()).total <= static_cast<uint32_t>(kOptinSmem);
}

void moe_one(const MoeOneArgs& a, cudaStream_t s) {
  const int64_t slots = a.k + a.n_shared;
  DI_CUDA_REQUIRE(!(a.fp8 && a.chain));
  const uint32_t bytes = a.fp8     ? layout<true>(a.D, a.I, slots, sm_count()).total
                         : a.chain ? layout<false, true>(a.D, a.I, slots, sm_count()).total
                                   : layout<false>(a.D, a.I, slots, sm_count()).total;
  DI_CUDA_REQUIRE(bytes <= static_cast<uint32_t>(kOptinSmem));
  static const bool attr = [] {
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(moe_one_kernel<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(moe_one_kernel<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(moe_one_kernel<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>(sm_count()));
  if (a.fp8) launch_pdl(moe_one_kernel<true, false>, grid, dim3(kThreads), bytes, s, a);
  else if (a.chain) launch_pdl(moe_one_kernel<false, true>, grid, dim3(kThreads), bytes, s, a);
  else launch_pdl(moe_one_kernel<false, false>, grid, dim3(kThreads), bytes, s, a);
}

}  // namespace deepinfer::cuda
