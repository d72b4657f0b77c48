// A MoE block's experts at one token as one persistent kernel (sm_90a): the routed experts'
// and the shared slices' gate | up GEMV with SiLU·mul, then their down GEMV and the combine —
// what the one-block sort, the grouped gate|up GEMV and the grouped down GEMV with its combine
// compute for a decode step of one token, in one launch and one stream of weight bytes.
//
// Why: at batch 1 those launches read V2-Lite's 138 MB of expert weights a layer at 0.74–0.83 of
// the copy rate, and each waits for the one before (perf.md, version 9). Here one block per SM
// (grid = the SM count, all resident) streams its share of the weights through a six-stage
// shared-memory ring of 32 KB stages: a producer warp issues each stage's rows by TMA as soon
// as the stage is free (few, large copies from lanes side by side: one lane issuing a stage's
// eight 4 KB rows one after another, each behind a load of its expert's id, held the kernel at
// 0.62 of the copy rate — run s26-2), eight math warps consume them. The producer runs ahead across the
// block's whole work list, so the down projection's rows are in flight while the gate | up
// phase ends and while the grid barrier between the two phases waits; and the shared slices'
// rows, whose experts are known before the router runs, are issued before the PDL wait.
//
//   Phase A (gate | up): unit u = one h value, h[s][i] = silu(W_gate[e_s][i] · x) · (W_up[e_s][i] · x)
//              for slot s (routed slots 0..k−1: ids[s]; shared slots k..k+S−1: experts E..E+S−1)
//              and i < I; x rounded to bf16 as the GEMV rounds it. Block b owns units
//              [b·S·I/G, (b+1)·S·I/G) of the shared slots, then [b·k·I/G, (b+1)·k·I/G) of the
//              routed ones; a stage holds 4 units — their gate rows, then their up rows, each
//              run of consecutive rows of one expert in one copy (a slot's rows i, i+1, ... are
//              contiguous: usually two 16 KB copies a stage) — and warp w takes row w.
//   Barrier:   a grid barrier among the math warps (cuda_grid_barrier.cuh; a launch adds G).
//   Phase B (down + combine): block b owns output rows [b·D/G, (b+1)·D/G); a stage holds up to
//              8 of those rows of one slot's W_down — contiguous, one copy (per-row copies of
//              every slot, 2.8 KB each, ran at ~0.65 of the copy rate: run s26-3) — slot after
//              slot, warp w takes row w against bf16(h[s]) into y[s][row]; at the end
//              out[j] = Σ_{s<k} w_s·y_s[j] in slot order, then + y_s[j] of each shared slot in
//              order — the grouped kernel's combine order.
//
// Shapes: bf16 weights, 4·2·D·2 ≤ 32 KB (D ≤ 2048), 8·I·2 ≤ 32 KB, k + S ≤ 32, D % 8 ==
// I % 8 == 0, the whole layout within 227 KB, G ≥ 1 (moe_one_fits). Deterministic: every sum in a
// fixed order; the result depends on the launch only through nothing at all (no splits).
#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_grid_barrier.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {

namespace {

constexpr int kMath = 8;                     // math warps
constexpr int kThreads = 32 * (kMath + 1);   // + the producer warp
constexpr int kStages = 6;
constexpr uint32_t kStageBytes = 32 * 1024;
constexpr int kUnitsPerStage = 4;            // phase A: h values per stage (2 rows each)
constexpr int kRowsB = kMath;                // phase B: output rows per stage (a warp each)
constexpr int kMaxSlots = 32;                // the producer: a lane holds each slot's expert
static_assert(kMath == 2 * kUnitsPerStage, "phase A: a warp per row of a stage");
constexpr int kOptinSmem = 227 * 1024;

struct Layout {
  uint32_t ring, x, h, red, y, bars, total;
};
__host__ __device__ inline uint32_t align16(uint64_t v) { return static_cast<uint32_t>((v + 15) / 16 * 16); }
// G: the grid (a block's output rows: at most ⌈D / G⌉, their y[slot][row] in shared memory).
__host__ __device__ inline Layout layout(int64_t D, int64_t I, int64_t slots, int64_t G) {
  Layout l;
  l.ring = 0;
  l.x = kStages * kStageBytes;
  l.h = l.x + align16(uint64_t{2} * D);
  l.red = l.h + align16(uint64_t{2} * slots * I);
  l.y = l.red + 2 * kMath * 4;
  l.bars = l.y + align16(uint64_t{4} * slots * ((D + G - 1) / G));
  l.total = l.bars + 2 * kStages * 8;
  return l;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// acc + Σ_{i<8} w[i]·x[i], 8 bf16 of a weight row against 8 bf16 activations (two chains).
__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
  using mla::bf16_hi;
  using mla::bf16_lo;
  float a0 = 0.0f;
  a0 = fmaf(bf16_lo(w.x), bf16_lo(x.x), a0);
  acc = fmaf(bf16_hi(w.x), bf16_hi(x.x), acc);
  a0 = fmaf(bf16_lo(w.y), bf16_lo(x.y), a0);
  acc = fmaf(bf16_hi(w.y), bf16_hi(x.y), acc);
  a0 = fmaf(bf16_lo(w.z), bf16_lo(x.z), a0);
  acc = fmaf(bf16_hi(w.z), bf16_hi(x.z), acc);
  a0 = fmaf(bf16_lo(w.w), bf16_lo(x.w), a0);
  acc = fmaf(bf16_hi(w.w), bf16_hi(x.w), acc);
  return acc + a0;
}
// A warp's dot product of n8·8 bf16 in shared memory (row) against x (shared, bf16): lane sums,
// then the butterfly.
__device__ __forceinline__ float warp_dot(const bf16* row, const bf16* x, int n8, int lane) {
  const uint4* w = reinterpret_cast<const uint4*>(row);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc = 0.0f;
#pragma unroll 4
  for (int c = lane; c < n8; c += 32) acc = dot8(w[c], xv[c], acc);
  return mla::warp_sum(acc);
}
// n fp32 values (L2: another block's or the previous kernel's) rounded to bf16 into shared
// memory by the math warps (t: the thread's index among them); n % 8 == 0. Four vectors' loads
// in flight per thread before their stores.
__device__ __forceinline__ void stage_bf16(const float* src, int64_t n, bf16* dst, int t) {
  constexpr int kBatch = 4, kStride = 32 * kMath;
  const float4* s4 = reinterpret_cast<const float4*>(src);
  for (int64_t c0 = t; c0 < n / 8; c0 += kBatch * kStride) {
    float4 v[kBatch][2];
#pragma unroll
    for (int x = 0; x < kBatch; ++x)
      if (c0 + x * kStride < n / 8) {
        v[x][0] = __ldcg(s4 + 2 * (c0 + x * kStride));
        v[x][1] = __ldcg(s4 + 2 * (c0 + x * kStride) + 1);
      }
#pragma unroll
    for (int x = 0; x < kBatch; ++x)
      if (c0 + x * kStride < n / 8)
        reinterpret_cast<uint4*>(dst)[c0 + x * kStride] =
            make_uint4(mla::pack_bf16(v[x][0].x, v[x][0].y), mla::pack_bf16(v[x][0].z, v[x][0].w),
                       mla::pack_bf16(v[x][1].x, v[x][1].y), mla::pack_bf16(v[x][1].z, v[x][1].w));
  }
}
// The math warps' barrier (named barrier 1: the producer warp never joins).
__device__ __forceinline__ void math_sync() { named_barrier(1, 32 * kMath); }
#endif

}  // namespace

__global__ void __launch_bounds__(kThreads, 1) moe_one_kernel(MoeOneArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int G = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t D = a.D, I = a.I, k = a.k, S = a.n_shared, slots = k + S;
  const Layout L = layout(D, I, slots, G);
  unsigned char* ring = smem + L.ring;
  bf16* sx = reinterpret_cast<bf16*>(smem + L.x);
  bf16* sh = reinterpret_cast<bf16*>(smem + L.h);
  float* red = reinterpret_cast<float*>(smem + L.red);  // [2][kMath]
  float* ys = reinterpret_cast<float*>(smem + L.y);     // [slots][rows_max]: phase B's dots
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* empty = full + kStages;
  // The phase timeline (MoeOneArgs::trace): the global timer at mark m, by thread 0 (math) or
  // the producer's lane 0 (marks 1–3).
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
  const int64_t rows = j1 - j0, rows_max = (D + G - 1) / G, chunks = (rows + kRowsB - 1) / kRowsB;
  const int64_t n_a = (n_units + kUnitsPerStage - 1) / kUnitsPerStage, n_b = slots * chunks;
  // Unit q of the block's list → (slot, i): shared ones first.
  auto unit = [&](int64_t q, int64_t& slot, int64_t& i) {
    const int64_t g = q < s1 - s0 ? s0 + q : r0 + (q - (s1 - s0));
    const int64_t base = q < s1 - s0 ? k * I : 0;  // shared units count after the routed slots
    slot = (base + g) / I;
    i = (base + g) % I;
  };

  if (t == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kMath);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == kMath) {
    // ---- The producer: every stage of the list, in order, as the ring frees them. Its lanes
    // issue a stage's row copies side by side (lane r: row r), each from the expert of its
    // slot, held in a register: lane s < k + S keeps slot s's expert (the shared ones from the
    // start, the routed ones once the wait has returned), passed around by shuffles — no load
    // between a stage's copies.
    const uint32_t row_a = static_cast<uint32_t>(D * 2), row_b = static_cast<uint32_t>(I * 2);
    const int64_t n_shared_stages = (s1 - s0) / kUnitsPerStage;  // stages of shared units only
    int64_t my_e = lane >= k && lane < slots ? a.E + (lane - k) : 0;
    bool waited = false;
    for (int64_t q = 0; q < n_a + n_b; ++q) {
      const int st = static_cast<int>(q % kStages);
      mbar_wait(&empty[st], static_cast<uint32_t>(((q / kStages) & 1) ^ 1));
      if (!waited && q >= n_shared_stages) {  // the routed experts come from the previous kernel
        if (lane == 0) mark(1);
        pdl_wait();
        if (lane < k) my_e = a.ids[lane];
        if (lane == 0) mark(2);
        waited = true;
      }
      if (q == n_a - 1 && lane == 0) mark(3);
      unsigned char* dst = ring + st * kStageBytes;
      if (q < n_a) {
        const int64_t u0 = q * kUnitsPerStage, nu = std::min<int64_t>(kUnitsPerStage, n_units - u0);
        if (lane == 0) mbar_arrive_expect_tx(&full[st], static_cast<uint32_t>(nu) * 2 * row_a);
        // Lane v < nu: unit v; a run of units (same slot, consecutive i) starts at lane v when
        // unit v − 1 is not its predecessor. The run's first lane copies its gate rows to rows
        // v.. and its up rows to rows 4 + v.. of the stage.
        int64_t slot = -1, i = 0;
        if (lane < nu) unit(u0 + lane, slot, i);
        const int64_t e = __shfl_sync(0xffffffffu, my_e, static_cast<int>(std::max<int64_t>(slot, 0)));
        const int64_t prev_slot = __shfl_up_sync(0xffffffffu, slot, 1), prev_i = __shfl_up_sync(0xffffffffu, i, 1);
        const bool start = lane < nu && (lane == 0 || prev_slot != slot || prev_i + 1 != i);
        const unsigned starts = __ballot_sync(0xffffffffu, start);
        __syncwarp();
        if (start) {
          const unsigned later = starts & ~((2u << lane) - 1u);
          const int64_t n = (later != 0 ? __ffs(static_cast<int>(later)) - 1 : nu) - lane;
          const bf16* gate = a.w13 + (e * 2 * I + i) * D;
          bulk_load(dst + lane * row_a, gate, static_cast<uint32_t>(n) * row_a, &full[st]);
          bulk_load(dst + (kUnitsPerStage + lane) * row_a, gate + I * D, static_cast<uint32_t>(n) * row_a, &full[st]);
        }
      } else {  // slot sb's rows [r0, r0 + nr)
        const int64_t sb = (q - n_a) / chunks, r0 = j0 + (q - n_a) % chunks * kRowsB;
        const int64_t nr = std::min<int64_t>(kRowsB, j1 - r0);
        const int64_t e = __shfl_sync(0xffffffffu, my_e, static_cast<int>(sb));
        if (lane == 0) {
          mbar_arrive_expect_tx(&full[st], static_cast<uint32_t>(nr) * row_b);
          bulk_load(dst, a.w2 + (e * D + r0) * I, static_cast<uint32_t>(nr) * row_b, &full[st]);
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
  stage_bf16(a.x, D, sx, t);  // x rounded to bf16
  math_sync();
  if (t == 0) mark(5);

  // Phase A: warp w takes row w of the stage (unit w % 4's gate row, or its up row).
  for (int64_t q = 0; q < n_a; ++q) {
    const int st = static_cast<int>(q % kStages);
    mbar_wait(&full[st], static_cast<uint32_t>((q / kStages) & 1));
    if (q == 0 && t == 0) mark(6);
    const int64_t u0 = q * kUnitsPerStage, nu = std::min<int64_t>(kUnitsPerStage, n_units - u0);
    float* r = red + (q & 1) * kMath;
    if (warp % kUnitsPerStage < nu) {
      const float y = warp_dot(reinterpret_cast<const bf16*>(ring + st * kStageBytes) + warp * D, sx,
                               static_cast<int>(D / 8), lane);
      if (lane == 0) r[warp] = y;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[st]);
    math_sync();
    if (t < nu) {
      int64_t slot, i;
      unit(u0 + t, slot, i);
      a.h[slot * I + i] = silu_times(r[t], r[kUnitsPerStage + t]);
    }
  }

  // The grid barrier: every block's h written.
  if (t == 0) mark(7);
  grid_sync(a.counter, base + static_cast<unsigned long long>(G), t == 0, [] { math_sync(); });
  if (t == 0) mark(8);
  stage_bf16(a.h, slots * I, sh, t);  // h rounded to bf16, as the down GEMV rounds it
  math_sync();

  // Phase B: warp w takes row w of the stage (slot sb's rows r0 ..), then the combine.
  for (int64_t q = n_a; q < n_a + n_b; ++q) {
    const int st = static_cast<int>(q % kStages);
    mbar_wait(&full[st], static_cast<uint32_t>((q / kStages) & 1));
    const int64_t sb = (q - n_a) / chunks, c0 = (q - n_a) % chunks * kRowsB;
    if (c0 + warp < rows) {
      const float y = warp_dot(reinterpret_cast<const bf16*>(ring + st * kStageBytes) + warp * I, sh + sb * I,
                               static_cast<int>(I / 8), lane);
      if (lane == 0) ys[sb * rows_max + c0 + warp] = y;
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[st]);
  }
  math_sync();
  for (int64_t r = t; r < rows; r += 32 * kMath) {
    float o = 0.0f;
    for (int64_t s = 0; s < k; ++s) o = fmaf(__ldcg(a.weights + s), ys[s * rows_max + r], o);
    for (int64_t s = k; s < slots; ++s) o += ys[s * rows_max + r];
    a.out[j0 + r] = o;
  }
  if (t == 0) mark(9);
#else
  __trap();  // sm_90a only (moe_one_fits)
#endif
}

bool moe_one_fits(int64_t D, int64_t I, int64_t k, int64_t n_shared) {
  const int64_t slots = k + n_shared;
  if (D <= 0 || I <= 0 || k <= 0 || D % 8 != 0 || I % 8 != 0 || slots > kMaxSlots) return false;
  if (int64_t{kUnitsPerStage} * 2 * D * 2 > kStageBytes || int64_t{kRowsB} * I * 2 > kStageBytes || !sm90a_device())
    return false;
  return layout(D, I, slots, sm_count()).total <= static_cast<uint32_t>(kOptinSmem);
}

void moe_one(const MoeOneArgs& a, cudaStream_t s) {
  const Layout l = layout(a.D, a.I, a.k + a.n_shared, sm_count());
  DI_CUDA_REQUIRE(l.total <= static_cast<uint32_t>(kOptinSmem));
  static const bool attr = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(moe_one_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    return true;
  }();
  (void)attr;
  launch_pdl(moe_one_kernel, dim3(static_cast<unsigned>(sm_count())), dim3(kThreads), l.total, s, a);
}

}  // namespace deepinfer::cuda
