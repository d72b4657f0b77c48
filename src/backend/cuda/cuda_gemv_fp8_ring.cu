// The decode GEMV's FP8 form with its weights streamed through a shared-memory ring: C[r, n] =
// Σ_b scale[n, b] · Σ_{k in block b} W[n, k] · bf16(A[r, k]) for e4m3 weights with one fp32 scale
// per (row, 128 columns), one A row per slot — the MoE experts' gate|up and down GEMVs at decode
// steps of one token (gemv tries it before cuda_gemv_fp8_tc.cu's register-buffered form when
// GemvArgs::ring is set: off by default, see "Measured").
//
// Why: the register-buffered form holds its loads in flight in registers, one batch of 4 KB
// ahead per warp, 12 warps an SM — the latency of each warp's next batch is exposed and a warp's
// share (1.3–1.8 units) leaves SMs idle at the end: 0.46 of the copy rate on V2-Lite's experts
// (perf.md, version 32), its ALU and IMAD pipes a third busy with addressing (run s36-1).
// Here each SM runs one block: a producer warp issues every unit of the block's share as bulk
// copies (the TMA engine: no registers hold bytes in flight) into a ring of up to 8 stages as the
// stages free, and the math warps (one per stage) take the units in turn.
//
// A unit is 16 weight rows (the M of an m16n8k16 MMA): plain, rows n0..n0+15 of the slot's expert
// (16 output columns); gated, its gate rows n0..n0+7 and their up rows (8 output columns,
// C = silu(gate) · up). A stage holds a unit's rows, each at a pitch of K + 64 bytes (one bulk
// copy per row, from 16 producer lanes side by side: rows g and g + 1 meet different shared
// banks), then the rows' scales [16][K / 128] (one or two copies). Block b owns units
// [b·n/G, (b+1)·n/G) of the n = slots × units-per-slot (slot-major); units of idle slots (no
// expert, or no rows) are skipped by the producer and the math warps alike, the j-th kept unit
// going to ring stage j mod S and math warp j mod S (S ≤ 8 math warps, the rest idle): a stage's
// consumer is always the same warp, taking its fills in order — a parity wait cannot tell a fill
// from the one a lap later, so a second consumer could take a stage's previous fill for its own
// (run s36-2: warp j mod 8 over 5 stages hung). A math warp stages its slot's A row in f16
// (stage_row_f16_warp) while the unit's bytes arrive, then fp8_rows_dot (cuda_fp8_rows_dot.cuh:
// the weights as A of f16 MMAs, x as column 0 of B, each 128-column block's sum times its
// scale added in block order, the sums × 2^e), then releases the stage. Rows of A beyond one per
// slot take further passes over the staged unit.
// Compared with the register-buffered form: the same operands and fp32 products, summed in
// another order (16-row MMAs instead of 8-column ones), so results differ by fp32 rounding only;
// deterministic (no splits, no atomics).
// Measured (runs s36-2, s36-3; decode_gemm_bench --m 1, V2-Lite's experts, fp32 A): gate|up 20.1 µs
// (0.54 of copy) against the register form's 19.8, down 13.1 against 13.8; in the model FP8 B = 1
// 2.14 ms against 2.09. With the dot skipped the ring streams gate|up in 13.6 µs (0.80 of copy),
// down in 9.7: the math warps' dot is the bound, not the streaming (perf.md, version 33).
#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_rows_dot.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_sm90.cuh"

#include <algorithm>

#include <cuda_fp16.h>

namespace deepinfer::cuda {
namespace {

constexpr int kMath = 8;                    // math warps (one per ring stage; those past the depth idle)
constexpr int kThreads = 32 * (kMath + 1);  // + the producer warp
constexpr int kRows = 16;                   // weight rows per unit (the MMA's M)
constexpr int kScaleBlock = 128;            // columns per scale (block_k)
constexpr int kRowPad = 64;                 // bytes after each staged row (banks: fp8_rows_dot)
constexpr int kMaxStages = 8, kMinStages = 3;
constexpr int kOptinSmem = 227 * 1024;

// The dynamic shared memory: the ring's stages, each math warp's A row (K f16), the barriers.
struct Layout {
  int64_t pitch = 0;        // a staged row's bytes
  uint32_t stage = 0;       // a stage's bytes: 16 rows, then their scales (128-byte multiple)
  int32_t stages = 0;       // ring depth (0: K too long for kMinStages)
  uint32_t xs = 0, bars = 0, total = 0;  // offsets / size in bytes
};
Layout layout(int64_t K) {
  Layout L;
  L.pitch = K + kRowPad;
  const int64_t stage = kRows * L.pitch + kRows * (K / kScaleBlock) * 4;
  L.stage = static_cast<uint32_t>((stage + 127) / 128 * 128);
  const int64_t xs = int64_t{kMath} * K * 2, bars = 2 * kMaxStages * 8;
  const int64_t fit = (kOptinSmem - xs - bars) / L.stage;
  L.stages = fit < kMinStages ? 0 : static_cast<int32_t>(std::min<int64_t>(fit, kMaxStages));
  L.xs = static_cast<uint32_t>(L.stages) * L.stage;
  L.bars = L.xs + static_cast<uint32_t>(xs);
  L.total = L.bars + static_cast<uint32_t>(bars);
  return L;
}

template <bool kAF32, bool kGlu>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_fp8_ring_kernel(GemvArgs g, int32_t n_units, int32_t units_per_slot, Layout L) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* empty = full + kMaxStages;
  const int64_t K = g.K;
  const int nb = static_cast<int>(K / kScaleBlock);
  constexpr int kCols = kGlu ? kRows / 2 : kRows;  // output columns per unit
  const auto u0 = static_cast<int32_t>(int64_t{blockIdx.x} * n_units / gridDim.x);
  const auto u1 = static_cast<int32_t>(int64_t{blockIdx.x + 1} * n_units / gridDim.x);
  // Unit u's expert e and its slot's A rows [r0, r0 + rows); false: an idle slot.
  auto resolve = [&](int32_t u, int32_t& e, int32_t& r0, int32_t& rows) {
    const int32_t slot = u / units_per_slot;
    e = g.active != nullptr ? g.active[slot] : 0;
    if (e < 0) return false;
    r0 = g.active != nullptr ? g.offsets[e] : 0;
    rows = g.active != nullptr ? g.offsets[e + 1] - r0 : static_cast<int32_t>(g.rows);
    return rows > 0;
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < L.stages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp == kMath) {
    // ---- The producer: the block's units in order, each into the next stage once it is free.
    // Dense: the weights are known from the sizes alone, so they go out before the PDL wait.
    if (g.active != nullptr) pdl_wait();
    const unsigned char* wbase = static_cast<const unsigned char*>(g.w);
    int32_t j = 0;
    for (int32_t u = u0; u < u1; ++u) {
      int32_t e = 0, r0 = 0, rows = 0;
      if (!resolve(u, e, r0, rows)) continue;
      const int st = j % L.stages;
      const auto phase = static_cast<uint32_t>((j / L.stages) & 1);
      if (lane == 0) {
        mbar_wait(&empty[st], phase ^ 1u);
        mbar_arrive_expect_tx(&full[st], static_cast<uint32_t>(kRows * (K + nb * 4)));
      }
      __syncwarp();
      unsigned char* dst = smem + static_cast<int64_t>(st) * L.stage;
      const int64_t n0 = int64_t{u % units_per_slot} * kCols;
      const int64_t w_row0 = int64_t{e} * (kGlu ? 2 * g.N : g.N) + n0;
      if (lane < kRows) {
        const int64_t wr = w_row0 + (kGlu && lane >= kCols ? g.N + (lane - kCols) : lane);
        bulk_load(dst + lane * L.pitch, wbase + wr * K, static_cast<uint32_t>(K), &full[st]);
      } else if (lane < kRows + kRows / kCols) {  // the scales: one copy (plain), gate's and up's (gated)
        const int h = lane - kRows;
        bulk_load(dst + kRows * L.pitch + int64_t{h} * kCols * nb * 4, g.w_scale + (w_row0 + h * g.N) * nb,
                  static_cast<uint32_t>(kCols * nb * 4), &full[st]);
      }
      ++j;
    }
    return;  // the math warps trigger the dependents
  }

  // ---- The math warps ----
  pdl_wait();  // A (and the routing) come from the previous kernels
  __half* xs = reinterpret_cast<__half*>(smem + L.xs) + int64_t{warp} * K;  // [K] this warp's A row
  int32_t staged = -1;
  float back = 1.0f;  // the staged row's 2^e
  auto store = [&](int64_t r, int64_t n, float v) {
    if (g.c2 == nullptr || n < g.n_split) g.c[r * g.ldc + n] = v;
    else g.c2[r * g.ldc2 + (n - g.n_split)] = v;
  };
  int32_t j = 0;
  for (int32_t u = u0; u < u1; ++u) {
    int32_t e = 0, r0 = 0, rows = 0;
    if (!resolve(u, e, r0, rows)) continue;
    if (j % L.stages == warp) {
      const int st = j % L.stages;
      const unsigned char* sw = smem + static_cast<int64_t>(st) * L.stage;
      const int64_t n0 = int64_t{u % units_per_slot} * kCols;
      for (int32_t m = 0; m < rows; ++m) {
        const int32_t r = r0 + m;
        const int32_t a_row = g.a_rows != nullptr ? g.a_rows[r] / static_cast<int32_t>(g.a_row_div) : r;
        if (a_row != staged) {
          back = stage_row_f16_warp<kAF32>(static_cast<const unsigned char*>(g.a) + a_row * g.lda * (kAF32 ? 4 : 2), K,
                                           xs, lane);
          staged = a_row;
        }
        if (m == 0) mbar_wait(&full[st], static_cast<uint32_t>((j / L.stages) & 1));
        float y0 = 0.0f, y8 = 0.0f;  // lanes 4g: rows g and g + 8 of the unit
        fp8_rows_dot(sw, L.pitch, reinterpret_cast<const float*>(sw + kRows * L.pitch), nb, kScaleBlock / kMmaGroup,
                     xs, lane, y0, y8);
        if (lane % 4 == 0) {
          const int64_t n = n0 + lane / 4;
          if constexpr (kGlu) {
            store(r, n, silu_times(y0 * back, y8 * back));
          } else {
            store(r, n, y0 * back);
            store(r, n + 8, y8 * back);
          }
        }
      }
      __syncwarp();  // every lane's reads of the stage are done
      if (lane == 0) mbar_arrive(&empty[st]);
    }
    ++j;
  }
  pdl_trigger();
#else
  __trap();  // sm_90a only (gemv_fp8_ring checks)
#endif
}

template <bool kAF32, bool kGlu>
void launch(const GemvArgs& g, int64_t n_units, int64_t units_per_slot, const Layout& L, cudaStream_t s) {
  auto* kernel = gemv_fp8_ring_kernel<kAF32, kGlu>;
  static const bool smem_set = [&] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    return true;
  }();
  (void)smem_set;
  const int64_t blocks = std::min<int64_t>(n_units, sm_count());
  launch_pdl(kernel, static_cast<unsigned>(blocks), kThreads, L.total, s, g, static_cast<int32_t>(n_units),
             static_cast<int32_t>(units_per_slot), L);
  DI_CUDA_LAUNCHED();
}

}  // namespace

bool gemv_fp8_ring(const GemvArgs& g, cudaStream_t s) {
  if (!g.ring || g.w_elem != Elem::kF8 || g.max_rows != 1 || g.block_k != kScaleBlock ||
      g.K % kScaleBlock != 0 || !sm90a_device())
    return false;
  const int64_t cols = g.glu ? kRows / 2 : kRows;
  if (g.N % cols != 0 || reinterpret_cast<uintptr_t>(g.w_scale) % 16 != 0) return false;
  const Layout L = layout(g.K);
  if (L.stages == 0) return false;
  const int64_t units_per_slot = g.N / cols, n_units = units_per_slot * g.n_active;
  // Every SM a unit at least (fewer: the other forms split the work finer).
  if (n_units < sm_count() || n_units > INT32_MAX) return false;
  if (g.a_elem == Elem::kF32) {
    g.glu ? launch<true, true>(g, n_units, units_per_slot, L, s)
          : launch<true, false>(g, n_units, units_per_slot, L, s);
  } else {
    g.glu ? launch<false, true>(g, n_units, units_per_slot, L, s)
          : launch<false, false>(g, n_units, units_per_slot, L, s);
  }
  return true;
}

}  // namespace deepinfer::cuda
