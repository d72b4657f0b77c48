// FP8 (e4m3) block-scaled GEMM on Hopper's warpgroup MMA (sm_90a): the large-M form of the GEMM in
// cuda_fp8_gemm.cu, with the same semantics (1×128 activation groups, 128×128 weight blocks,
// per-K-block fp32 promotion) — dense and grouped (MoE). Owns: the TMA + mbarrier pipeline, the
// wgmma tile kernel, the tensor-map encoding. Does not own: dispatch by size (fp8_gemm /
// fp8_grouped_gemm pick it), split-K, block_n = 1 scales, or batch invariance (its MMA order
// differs from the mma.sync variants', so it is never used in the batch-invariant mode).
// Why wgmma: on sm_90a ptxas lowers mma.sync .e4m3 to an fp8 → fp16 unpack plus an fp16 HMMA
// (~200 TFLOP/s); wgmma .e4m3 runs at the FP8 rate (≈1,435 TFLOP/s measured on the H200).
#include <mutex>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kBM = 128;        // rows per block: two math warpgroups of 64
constexpr int kBN = 128;        // columns per block: one weight scale block
constexpr int kBK = 128;        // K per stage: one scale block (128 bytes of e4m3 per row)
constexpr int kStages = 6;      // stages in the shared-memory ring
constexpr int kMathGroups = 2;  // warpgroups issuing wgmma; one more warpgroup loads
constexpr int kThreads = 128 * (kMathGroups + 1);
constexpr int kTileBytes = kBM * kBK;  // one operand tile (A: kBM rows, W: kBN rows) of 128 bytes
static_assert(kBN * kBK == kTileBytes, "A and W tiles have the same size");
constexpr int kStageBytes = 2 * kTileBytes;
// Ring, then full/empty barriers, then each warp's grouped tile (expert, first row, rows); the base is
// aligned up to 1024 bytes at run time (the 128-byte swizzle repeats every 8 rows of 128 bytes).
constexpr int kWarps = kThreads / 32;
// Then, for per-row weight scales (block_n = 1), the stage's column scales [kStages][kBN] fp32.
constexpr size_t kSmemBytes = kStages * kStageBytes + 2 * kStages * sizeof(uint64_t) + 4 * kWarps * sizeof(int64_t) +
                              kStages * kBN * sizeof(float) + 1024;

struct WgmmaParams {
  const float* sa;  // [M, n_kb] fp32
  const float* sw;  // [E·ceil(N/128), n_kb] fp32, or per row [E·N, n_kb] (kRowScales); dense: E = 1
  int64_t M, N, n_kb;
  int64_t n_row_tiles;  // dense: ceil(M / 128); grouped: the bound ceil(M / 128) + min(E, M)
  void* c;  // [M, ldc] OutT
  int64_t ldc;
  bool c_vec;  // column pairs stored as one vector (ldc even, c 8-byte aligned)
  const int32_t* offsets;  // grouped: [E + 1]
  int64_t E;
};

// ---- the e4m3 wgmma (sm_90a; cuda_sm90.cuh has the pipeline helpers) ----------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d[64×128] fp32 (+)= A[64×32] e4m3 · B[128×32]ᵀ e4m3, both K-major in shared memory;
// accumulate = 0 overwrites d. Fragment: thread t of the warpgroup (warp w, lane l) holds
// d[4j + v] = row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4) + v%2.
__device__ __forceinline__ void wgmma_m64n128k32(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" DI_WGMMA_REGS64 "}, "
               "%64, %65, p, 1, 1;\n}\n"
               : DI_WGMMA_ACC64(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// C[m, n] = Σ_kb (Σ_{k ∈ kb} a[m, k]·w[n, k]) · sa[m, kb] · sw[n / 128, kb], 128×128 output tiles.
// Persistent: block b takes tiles b, b + gridDim.x, … (tile_coords; grouped row tiles through
// cuda_grouped_tile.cuh, tiles past the last expert skipped). Warpgroups 0 and 1 compute rows
// 64·wg.. of each tile; warp 8 (warpgroup 2) is the loader, the rest of warpgroup 2 exits.
// Per K block (the it-th of this block, over all its tiles: stage s = it % kStages): the loader
// waits until the math warps have released s (empty[s]), then TMA-loads the A tile (kBM rows ×
// 128 bytes at (kb·128, m0)) and the W tile (kBN rows at (kb·128, w_row0)) into s, completing
// full[s]; it runs up to kStages K blocks ahead, into the next tile while the math warps store
// this one. Each math warpgroup waits on full[s], issues four m64n128k32 wgmmas over the stage's
// 128-wide K (the first overwrites `part`), waits for them, releases s (one arrival per warp)
// and promotes: acc = fmaf(part, sa·sw, acc) — DeepGEMM's promotion, in K-block order
// (deterministic: a tile's result does not depend on which block computes it); the two
// warpgroups' MMAs and promotions interleave on the SM. Scales are read from global memory one
// K block ahead. (Tried and dropped, docs/perf.md version 3: each warpgroup's 128 columns as two
// staggered 64-column halves, so a half's promotion overlaps MMAs — no gain; 2-CTA clusters
// multicasting A — half the rate, branch wip/fp8-wgmma-cluster.)
// Shared memory: kStages × (A [kBM][128] | W [kBN][128]) e4m3 — rows of 128 bytes, 16-byte chunk c
// of row r at chunk c ^ (r % 8) (TMA's 128-byte swizzle, which wgmma's descriptor reads) —
// full[kStages], empty[kStages] mbarriers, per-warp tile info; ~194 KB: one block per SM.
// Rows past M (and K past K, columns past the tensor) are zero-filled by TMA; a grouped tile's
// rows past its expert belong to the next one and are computed but not stored. Only in-range
// outputs are written. Preconditions: sm_90a, K % 16 == 0.
// kRowScales (block_n = 1: one weight scale per output row and K block, as CudaBackend places FP8
// weights): the loader warp also copies the tile's 128 column scales of each K block into the
// stage's slot of `ssw` (one more arrival on full[s]), and the promotion uses sa(row)·sw(column)
// per element; the stage is released after the promotion, which reads them.
template <bool kGrouped, typename OutT, bool kRowScales>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                     const WgmmaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t wg_smem_raw[];
  uint8_t* smem = wg_smem_raw + ((1024 - smem_u32(wg_smem_raw) % 1024) % 1024);
  uint8_t* ring = smem;                                                     // [kStages][A | W]
  auto* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);  // [kStages]
  uint64_t* empty = full + kStages;                                         // [kStages]
  auto* info = reinterpret_cast<int64_t*>(empty + kStages);                // [kWarps][4]: e, m0, rows
  float* ssw = reinterpret_cast<float*>(info + 4 * kWarps);                 // [kStages][kBN] (kRowScales)

  const int t = threadIdx.x, wg = t / 128, warp = t / 32, lane = t % 32;
  if (t == 0) init_ring(full, empty, kStages, kRowScales ? 2 : 1, kMathGroups * 4);  // one release per math warp
  __syncthreads();
  if (wg == kMathGroups && warp != kMathGroups * 4) return;  // idle loader warps
  const int64_t n_col_tiles = (p.N + kBN - 1) / kBN, n_tiles = p.n_row_tiles * n_col_tiles, n_kb = p.n_kb;
  const int32_t* offsets = kGrouped ? p.offsets : nullptr;
  int64_t* my_info = info + 4 * warp;
  if (wg == kMathGroups) {  // the loader warp
    auto column_scales = [&](int s, const TileView& v, int64_t kb) {
      if constexpr (kRowScales) {
        for (int c = lane; c < kBN; c += 32)
          ssw[s * kBN + c] = v.n0 + c < p.N ? p.sw[(v.e * p.N + v.n0 + c) * n_kb + kb] : 0.0f;
        __syncwarp();
        if (lane == 0) mbar_arrive(&full[s]);  // release: the math warps' wait acquires the stores
      }
    };
    load_tiles<kBM, kBN, kBK>(&map_a, &map_w, ring, full, empty, kStages, kStageBytes, kTileBytes, p.n_row_tiles,
                              p.N, n_kb, offsets, p.E, p.M, lane, my_info, column_scales);
    return;
  }

  uint32_t it = 0;  // K blocks this warp has consumed
  OutT* c = static_cast<OutT*>(p.c);
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    TileView v;
    if (!resolve_tile<kBM, kBN>(tile, p.n_row_tiles, n_col_tiles, offsets, p.E, p.M, lane, my_info, &v)) continue;
    const int64_t e = v.e, m0 = v.m0, m_end = v.m_end, n0 = v.n0;
    // Rows r0 = m0 + 64·wg + 16·(warp % 4) + lane / 4 and r0 + 8 of this tile.
    const int64_t r0 = m0 + 64 * wg + 16 * (warp % 4) + lane / 4, r1 = r0 + 8;
    const float* sa0 = p.sa + (r0 < p.M ? r0 : 0) * n_kb;  // rows past M read row 0's scales (not stored)
    const float* sa1 = p.sa + (r1 < p.M ? r1 : 0) * n_kb;
    const float* swp = kRowScales ? nullptr : p.sw + (e * n_col_tiles + n0 / kBN) * n_kb;
    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = part[i] = 0.0f;
    float next_a0 = sa0[0], next_a1 = sa1[0], next_w = kRowScales ? 1.0f : swp[0];
    for (int64_t kb = 0; kb < n_kb; ++kb, ++it) {
      const int s = static_cast<int>(it % kStages);
      const float a0 = next_a0, a1 = next_a1, s0 = next_a0 * next_w, s1 = next_a1 * next_w;
      if (kb + 1 < n_kb) {  // the next K block's scales, loaded a block ahead
        next_a0 = sa0[kb + 1];
        next_a1 = sa1[kb + 1];
        if constexpr (!kRowScales) next_w = swp[kb + 1];
      }
      mbar_wait(&full[s], (it / kStages) & 1u);
      const uint8_t* stage = ring + s * kStageBytes;
      const uint64_t da = sw128_desc(stage + wg * 64 * kBK), db = sw128_desc(stage + kTileBytes);
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(part[i]);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kBK / 32; ++k) wgmma_m64n128k32(part, da + 2 * k, db + 2 * k, k);  // +32 bytes of K
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(part[i]);
      if constexpr (kRowScales) {
        const float* cs = ssw + s * kBN + 2 * (lane % 4);  // columns 8j + 2·(lane % 4), +1
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float2 w2 = *reinterpret_cast<const float2*>(cs + 8 * j);
          acc[4 * j + 0] = fmaf(part[4 * j + 0], a0 * w2.x, acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(part[4 * j + 1], a0 * w2.y, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(part[4 * j + 2], a1 * w2.x, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(part[4 * j + 3], a1 * w2.y, acc[4 * j + 3]);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);  // MMAs and column scales read: the loader may refill
      } else {
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);  // the stage is read: the loader may refill it
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          acc[4 * j + 0] = fmaf(part[4 * j + 0], s0, acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(part[4 * j + 1], s0, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(part[4 * j + 2], s1, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[4 * j + 3]);
        }
      }
    }

    for_each_acc_pair(16, n0, p.N, r0, m_end, lane, [&](int64_t row, int64_t col, int i) {
      store_acc_pair(c + row * p.ldc + col, acc[i], acc[i + 1], p.c_vec && col + 1 < p.N, col + 1 < p.N);
    });
  }
#else
  __trap();  // built for another architecture: fp8_wgmma_available() is false there
#endif
}

// A [rows, K] e4m3 row-major matrix as a TMA map of 128 × 128-byte boxes, 128-byte swizzle;
// out-of-range boxes read zeros.
CUtensorMap e4m3_map(const uint8_t* base, int64_t rows, int64_t K) {
  return tensor_map_2d(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, K, kBK, kBM);
}

template <bool kGrouped, typename OutT, bool kRowScales>
void launch(const CUtensorMap& ma, const CUtensorMap& mw, const WgmmaParams& p, dim3 grid, cudaStream_t s) {
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fp8_wgmma_kernel<kGrouped, OutT, kRowScales>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
  });
  fp8_wgmma_kernel<kGrouped, OutT, kRowScales><<<grid, kThreads, kSmemBytes, s>>>(ma, mw, p);
  DI_CUDA_LAUNCHED();
}
template <bool kGrouped, typename OutT>
void launch_scales(bool row_scales, const CUtensorMap& ma, const CUtensorMap& mw, const WgmmaParams& p, dim3 grid,
                   cudaStream_t s) {
  if (row_scales) launch<kGrouped, OutT, true>(ma, mw, p, grid, s);
  else launch<kGrouped, OutT, false>(ma, mw, p, grid, s);
}

}  // namespace

bool fp8_wgmma_available() { return sm90a_device(); }

void fp8_wgmma_gemm(const Fp8GemmArgs& a, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(fp8_wgmma_available(), "fp8 wgmma GEMM: needs an sm_90 GPU");
  DI_CUDA_REQUIRE_MSG(a.block_n == 128 || a.block_n == 1, "fp8 wgmma GEMM: block_n must be 128 or 1");
  DI_CUDA_REQUIRE(a.K % 16 == 0 && a.ldc >= a.N);
  const bool grouped = a.offsets != nullptr;
  if (a.M == 0 || a.N == 0 || a.K == 0) return;
  WgmmaParams p{};
  p.sa = a.a_scale;
  p.sw = a.w_scale;
  p.M = a.M;
  p.N = a.N;
  p.n_kb = (a.K + kBK - 1) / kBK;
  p.c = a.c;
  p.ldc = a.ldc;
  const size_t pair_bytes = a.c_elem == Elem::kF32 ? 8 : 4;
  p.c_vec = a.ldc % 2 == 0 && reinterpret_cast<uintptr_t>(a.c) % pair_bytes == 0;
  p.offsets = a.offsets;
  p.E = grouped ? a.E : 1;
  const int64_t w_rows = p.E * a.N;
  DI_CUDA_REQUIRE_MSG(a.M < (int64_t{1} << 31) && w_rows < (int64_t{1} << 31), "fp8 wgmma GEMM: too many rows");
  const CUtensorMap ma = e4m3_map(a.a, a.M, a.K), mw = e4m3_map(a.w, w_rows, a.K);
  p.n_row_tiles = grouped ? (a.M + kBM - 1) / kBM + std::min(a.E, a.M) : (a.M + kBM - 1) / kBM;
  const int64_t n_tiles = p.n_row_tiles * ((a.N + kBN - 1) / kBN);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(n_tiles, sm_count())), 1, 1);  // persistent
  const bool f32 = a.c_elem == Elem::kF32, rows = a.block_n == 1;
  if (grouped) {
    if (f32) launch_scales<true, float>(rows, ma, mw, p, grid, s);
    else launch_scales<true, bf16>(rows, ma, mw, p, grid, s);
  } else {
    if (f32) launch_scales<false, float>(rows, ma, mw, p, grid, s);
    else launch_scales<false, bf16>(rows, ma, mw, p, grid, s);
  }
}

}  // namespace deepinfer::cuda
