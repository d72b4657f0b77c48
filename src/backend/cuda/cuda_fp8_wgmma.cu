// FP8 (e4m3) block-scaled GEMM on Hopper's warpgroup MMA (sm_90a): the large-M form of the GEMM in
// cuda_fp8_gemm.cu, with the same semantics (1×128 activation groups, 128×128 weight blocks,
// per-K-block fp32 promotion) — dense and grouped (MoE). Owns: the TMA + mbarrier pipeline, the
// wgmma tile kernel, the tensor-map encoding. Does not own: dispatch by size (fp8_gemm /
// fp8_grouped_gemm pick it), split-K. Batch invariance: a row's arithmetic (its K blocks'
// MMAs, promoted in K order) depends on neither M nor the row's place in its tile, so the MoE's
// W8A8 form runs it at every step size in the batch-invariant mode; its MMA order differs from
// the mma.sync variants', which therefore never stand in for it there.
// Why wgmma: on sm_90a ptxas lowers mma.sync .e4m3 to an fp8 → fp16 unpack plus an fp16 HMMA
// (~200 TFLOP/s); wgmma .e4m3 runs at the FP8 rate (≈1,435 TFLOP/s measured on the H200).
#include <algorithm>
#include <mutex>

#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kBM = 128;        // rows per block: two math warpgroups of 64
constexpr int kBN = 128;        // columns per block: one weight scale block
constexpr int kBK = 128;        // K per stage: one scale block (128 bytes of e4m3 per row)
constexpr int kStages = 5;      // stages in the shared-memory ring (6 leave no room for the output staging)
constexpr int kMathGroups = 2;  // warpgroups issuing wgmma; one more warpgroup loads
// Blocks per cluster sharing each A tile by TMA multicast when Fp8GemmArgs::cluster is 0: 2 for
// dense GEMMs of at least kClusterMinRows rows whose column tiles pair up (an even count) or are
// many (kClusterMinTiles: an idle second block in the last cluster costs little), else 1.
// Measured (runs s31-7, s31-8: the dense V2-Lite and V3 shapes at 2,048 / 4,096 / 16,384 rows,
// each cluster size against torch's blockwise scaled_mm in the same run): two-block clusters
// faster at 26 of the 30 points of those shapes (e.g. V3 o_proj at 4,096 rows 0.92 → 1.00 of
// torch, V3 q_a_proj at 16,384 0.93 → 0.99, V2-Lite's layer-0 gate | up 0.86 → 0.91), while
// kv_a_proj's five column tiles (N = 576) lost at 16,384 rows (0.95 → 0.77: a sixth of the blocks
// idle) — docs/perf.md version 28.
constexpr int64_t kClusterMinRows = 2048;
constexpr int64_t kClusterMinTiles = 16;
constexpr int kThreads = 128 * (kMathGroups + 1);
// Registers per thread after the reallocation (setmaxnreg): the launch reserves 168 per thread
// (65,536 / 384, rounded down to 8); the loader warpgroup gives some back, the math warpgroups
// take them (2·128·math + 128·loader = 64,512 = 384·168). Two K blocks in flight (the
// accumulator and two blocks' sums, 192 registers) need 232 (the per-row scales' loader then
// spills 36–68 bytes; at 56 / 224 the math warps spill more) — the grouped block-scale form too:
// at 56 / 224 its math warps spilled the tile's epilogue addresses (76 bytes; 44 at 40 / 232, in
// the prologue and per tile, none in the K loop), and 40 / 232 ran the V2-Lite expert GEMMs at
// 4,096 rows 1–7 % faster (run s19-6, scripts/device/regsplit_lab.sh). The grouped form with
// per-row scales keeps one block in flight (pairs_in_flight) and gives its loader more.
template <bool kGrouped, bool kRowScales>
struct RegSplit {
  static constexpr int kLoader = !kGrouped || !kRowScales ? 40 : 104;
  static constexpr int kMath = !kGrouped || !kRowScales ? 232 : 200;
  static_assert(kMathGroups * 128 * kMath + 128 * kLoader <= kThreads * 168, "register budget");
};
constexpr int kTileBytes = kBM * kBK;  // one operand tile (A: kBM rows, W: kBN rows) of 128 bytes
static_assert(kBN * kBK == kTileBytes, "A and W tiles have the same size");
constexpr int kStageBytes = 2 * kTileBytes;
// Ring, then the output staging, then full/empty barriers, then the grouped row-tile table
// (build_tile_table); the base is aligned up to 1024 bytes at run time (the 128-byte swizzle
// repeats every 8 rows of 128 bytes).
// Each math warpgroup's output staging for the TMA store: 64 rows × 256 bytes, as two boxes of
// [64 rows][128 bytes] with the 128-byte swizzle (bf16: the 128 columns at once; fp32: 64 at a time).
constexpr int kOutBoxBytes = 64 * 128, kOutBytes = 2 * kOutBoxBytes;
// Then the stage's column scales [kStages][kBN] fp32 (per-row weight scales, block_n = 1) and
// its A rows' scales [kStages][kBM] fp32.
constexpr size_t kSmemBytes = kStages * kStageBytes + kMathGroups * kOutBytes + 2 * kStages * sizeof(uint64_t) +
                              kTileTableBytes + kStages * (kBN + kBM) * sizeof(float) + 1024;
// full[s]'s arrivals: the loader's expect_tx, then (per-row weight scales) one per loader lane
// when its scale copies land.
template <bool kRowScales>
constexpr uint32_t kFullArrivals = kRowScales ? 1 + 32 : 1;

// ---- The grouped block-scale form on 128 × 192 tiles (WgmmaParams::n192) ----------------------
// fp8_wgmma_n192_kernel: the MoE's grouped GEMM (bf16 out, block-form weight scales) with a W
// tile of 192 rows, so a K block's stage (16 KB of A, 24 KB of W) feeds 1.5× the MMAs of the
// 128 × 128 tile's 32 KB. Run s38-4 (Nsight Compute): the 128-wide grouped GEMMs move 9–10 TB/s
// through L2 (70–76 % of its throughput), and run s38-3 found their time proportional to their
// tiles — an expert's tail tile, however few its rows, costs a whole tile's loads. Each math
// warpgroup keeps one K block in flight (its m64n192 accumulator and the promoted sums are 192
// registers: no room for a second), as DeepGEMM does; the two warpgroups' MMAs interleave.
constexpr int kN192 = 192;
constexpr int kN192Stages = 4;
constexpr int kN192WBytes = kN192 * kBK;
constexpr int kN192StageBytes = kTileBytes + kN192WBytes;
constexpr int kN192OutBytes = 3 * kOutBoxBytes;  // a math warpgroup's 64 × 192 bf16 staging
// Then (the gathered-A form, kGatherA) the stages' A-row scales [kN192Stages][kBM] fp32.
constexpr size_t kN192SmemBytes = kN192Stages * kN192StageBytes + kMathGroups * kN192OutBytes +
                                  2 * kN192Stages * sizeof(uint64_t) + kTileTableBytes +
                                  kN192Stages * kBM * sizeof(float) + 1024;
static_assert(kN192SmemBytes <= 227 * 1024, "the 128 × 192 form's shared memory exceeds an SM's");

struct WgmmaParams {
  const float* sa;  // [M, n_kb] fp32
  const float* sw;  // [E·ceil(N/128), n_kb] fp32, or per row [E·N, n_kb] (kRowScales); dense: E = 1
  int64_t sw_step;  // scale rows per 128-row block: 1, or 128 (per-row scales uniform within blocks)
  int64_t M, N, n_kb;
  int64_t n_row_tiles;  // dense: ceil(M / 128); grouped: the bound ceil(M / 128) + min(E, M)
  void* c;  // [M, ldc] OutT: columns [0, n_split)
  int64_t ldc;
  // Dense: columns [n_split, N) into c2 [M, ldc2] (column j at j − n_split; Fp8GemmArgs::c2);
  // n_split = N when there is no second output. n_split % 128 == 0: a tile never straddles.
  void* c2;
  int64_t ldc2, n_split;
  bool c_vec;  // column pairs stored as one vector (ldc even, c 8-byte aligned)
  bool c_tma;  // whole warpgroup tiles stored by TMA from shared memory (map_c, map_c2; c, ldc, c2, ldc2 16-byte aligned)
  bool w_early;  // dense, cluster 1, W never written by a kernel: the first tile's W before the PDL wait
  bool idle_skip;  // grouped: a warpgroup with none of a tile's rows issues no MMAs (Fp8GemmArgs::idle_skip)
  bool stagger;    // grouped: warpgroup 1 takes each tile's first K block alone (Fp8GemmArgs::stagger)
  bool narrow;     // grouped, block scales: tiles of ≤ 64 rows split by columns (Fp8GemmArgs::narrow_tails)
  const int32_t* offsets;  // grouped: [E + 1]
  int64_t E;
  // The gathered-A forms (kGatherA; Fp8GemmArgs::a_rows): row i of A is row a_rows[i] / a_row_div
  // of a [·, K] (its scales that row of sa); the loader warpgroup copies the tiles' rows.
  const uint8_t* a;
  const int32_t* a_rows;
  int32_t a_row_div;
  int64_t K;
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


// The loader warp (see fp8_wgmma_kernel): load_tiles over this block's tiles, plus, under
// kRowScales, each stage's scales by cp.async (so the warp never waits for them): the tile's 128
// A rows' scales of the K block into ssa[s] and its 128 columns' into ssw[s] (zeros past M and
// N); each lane's copies complete one arrival on full[s]. (Staging the A scales for the other
// forms too made the dense GEMM 15 % slower, run s13-14: their math warps load them.)
template <bool kGrouped, bool kRowScales, int kCluster>
__device__ __forceinline__ void load_stages(const CUtensorMap& map_a, const CUtensorMap& map_w, const WgmmaParams& p,
                                            uint8_t* ring, uint64_t* full, uint64_t* empty, float* ssw, float* ssa,
                                            const int32_t* table, int w_ready, int lane) {
  const int64_t n_kb = p.n_kb;
  auto stage_scales = [&](int s, const TileView& v, int64_t kb) {
    if constexpr (kRowScales) {
      const float* src = p.sa + (v.m0 + lane) * n_kb + kb;  // row m0 + r, r = lane + 32·i
      uint32_t dst = smem_u32(ssa + s * kBM + lane);
      for (int64_t row = v.m0 + lane; row < v.m0 + kBM; row += 32, src += 32 * n_kb, dst += 32 * 4)
        cp_async4(dst, row < p.M ? src : p.sa, row < p.M);
      const float* wsrc = p.sw + (v.e * p.N + v.n0 + lane) * n_kb + kb;  // column n0 + c, c = lane + 32·i
      dst = smem_u32(ssw + s * kBN + lane);
      for (int64_t col = v.n0 + lane; col < v.n0 + kBN; col += 32, wsrc += 32 * n_kb, dst += 32 * 4)
        cp_async4(dst, col < p.N ? wsrc : p.sw, col < p.N);
      cp_async_mbar_arrive(&full[s]);
    }
  };
  load_tiles<kBM, kBN, kBK, false, kCluster>(&map_a, &map_w, ring, full, empty, kStages, kStageBytes, kTileBytes,
                                             p.n_row_tiles, p.N, n_kb, kGrouped ? table : nullptr, p.E, p.M, w_ready,
                                             lane, stage_scales);
}

// The gathered-A loader (kGatherA; Fp8GemmArgs::a_rows), the whole loader warpgroup (thread tl
// of 128) per stage: thread 0 the W tile by TMA (kWRows rows; its bytes announced on full[s]),
// every thread 8 of the A tile's 1,024 16-byte chunks by cp.async — chunk c = tl % 8 of rows
// tl / 8 + 16·i, i < 8 (8 threads a 128-byte row: whole L2 sectors), each where TMA's 128-byte
// swizzle would put it (chunk c of row r at c ^ (r % 8); r % 8 = (tl / 8) % 8 for all 8 rows) —
// and the scale of tile row tl's K block into ssa[s] (4 bytes); then one .noinc arrival per
// thread on full[s] once its copies land (init_ring counts 1 + 128). The math warps read the A
// scales from ssa (the stage's, as the per-row-scale forms do). Rows past the tile's expert (the
// next one's, or past M) and K past K read zeros: computed, never stored, as with TMA. (quack's
// sm90 GEMM with gather_A feeds wgmma the same way: cp.async for A, TMA for B, the cp.async
// arrivals on the stage's mbarrier.)
template <int kWRows, int kRing, int kRingStageBytes>
__device__ __forceinline__ void load_stages_gathered(const CUtensorMap& map_w, const WgmmaParams& p, uint8_t* ring,
                                                     uint64_t* full, uint64_t* empty, float* ssa,
                                                     const int32_t* table, int tl) {
  const int64_t n_col_tiles = (p.N + kWRows - 1) / kWRows;
  const int64_t n_tiles = p.n_row_tiles * n_col_tiles;
  const int n_kb = static_cast<int>(p.n_kb), K = static_cast<int>(p.K);
  const int lane = tl % 32, c = tl % 8, rb = tl / 8;
  const auto dst0 = static_cast<uint32_t>(rb * 128 + ((c ^ (rb % 8)) * 16));  // chunk c of row rb
  uint32_t it = 0;
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    TileView v;
    if (!resolve_tile<kBM, kWRows>(tile, p.n_row_tiles, n_col_tiles, table, p.E, p.M, &v)) continue;
    // 32-bit offsets (fp8_wgmma_gather_ok: a_src_rows · K < 2^31) of this thread's A rows rb +
    // 16·i and of its scale row, −1 for zeros: 9 registers of the loader's 40.
    int32_t off[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t m = v.m0 + rb + 16 * i;
      off[i] = m < v.m_end ? p.a_rows[m] / p.a_row_div * K : -1;
    }
    const int64_t ms = v.m0 + tl;
    const int32_t s_off = ms < v.m_end ? p.a_rows[ms] / p.a_row_div * n_kb : -1;
    const auto y_w = static_cast<int32_t>(v.e * p.N + v.n0);
    for (int kb = 0; kb < n_kb; ++kb, ++it) {
      const int s = static_cast<int>(it % kRing);
      if (lane == 0) mbar_wait(&empty[s], ((it / kRing) & 1u) ^ 1u);
      __syncwarp();  // the stage is free for every lane
      uint8_t* stage = ring + s * kRingStageBytes;
      if (tl == 0) {
        mbar_arrive_expect_tx(&full[s], kWRows * kBK);
        tma_load_2d(stage + kTileBytes, &map_w, kb * kBK, y_w, &full[s]);
      }
      const int k = kb * kBK + 16 * c;
      const uint32_t dst = smem_u32(stage) + dst0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const bool ok = off[i] >= 0 && k < K;
        cp_async16(dst + i * 16 * 128, p.a + (ok ? off[i] + k : 0), ok);
      }
      cp_async4(smem_u32(ssa + s * kBM + tl), p.sa + (s_off >= 0 ? s_off + kb : 0), s_off >= 0);
      cp_async_mbar_arrive(&full[s]);
    }
  }
}

// A stage consumed: one arrival per math warp on empty[s] of every block of the cluster.
template <int kCluster>
__device__ __forceinline__ void release_stage(uint64_t* empty_s, int lane) {
  __syncwarp();
  if (lane == 0) {
    if constexpr (kCluster == 1) {
      mbar_arrive(empty_s);
    } else {
      const auto rank = static_cast<uint32_t>(blockIdx.x % kCluster);
      mbar_arrive(empty_s);
#pragma unroll
      for (uint32_t r = 1; r < kCluster; ++r) mbar_arrive_cluster(empty_s, (rank + r) % kCluster);
    }
  }
}

// A math warpgroup with none of a tile's rows: waits for each of the tile's n stages and releases
// it — its releases keep the ring's phases — issuing no MMAs (s, phase: the ring's next stage of
// kRing).
template <int kCluster, int kRing = kStages>
__device__ __forceinline__ void pass_stages(int64_t n, uint64_t* full, uint64_t* empty, int& s, uint32_t& phase,
                                            int lane) {
  for (int64_t i = 0; i < n; ++i) {
    mbar_wait(&full[s], phase);
    release_stage<kCluster>(&empty[s], lane);
    if (++s == kRing) {
      s = 0;
      phase ^= 1u;
    }
  }
}

// A math warp's share of a finished tile (acc: rows r0 and r0 + 8, the m64n128 fragment — or,
// kGroups = 8, m64n64's: columns n0 .. n0 + 63) into C by direct stores — where store_tile_tma
// cannot: C that TMA cannot address, a grouped tile's rows past its expert. Where both rows and
// all 8·kGroups columns are in range and pairs are aligned, the values are converted first, then stored at fixed offsets from two row pointers: a store
// keeps its source and address registers until it issues, so converting and addressing each
// pair into the same few registers serialized the stores on their latency (~22 % of the math
// warps' time in the ncu samples of run s13-7, when every tile was stored this way).
template <typename OutT, int kGroups = 16>
__device__ __forceinline__ void store_tile(OutT* c, int64_t ldc, int64_t N, int64_t n0, int64_t r0, int64_t m_end,
                                           bool c_vec, int lane, const float (&acc)[4 * kGroups]) {
  if (c_vec && n0 + 8 * kGroups <= N && r0 + 8 < m_end) {
    OutT* row0 = c + r0 * ldc + n0 + 2 * (lane % 4);
    OutT* row1 = row0 + 8 * ldc;
    if constexpr (sizeof(OutT) == 4) {
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        *reinterpret_cast<float2*>(row0 + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
        *reinterpret_cast<float2*>(row1 + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
      }
    } else {
      __nv_bfloat162 packed[2 * kGroups];
#pragma unroll
      for (int i = 0; i < 2 * kGroups; ++i) packed[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(row0 + 8 * j) = packed[2 * j];
        *reinterpret_cast<__nv_bfloat162*>(row1 + 8 * j) = packed[2 * j + 1];
      }
    }
    return;
  }
  for_each_acc_pair(kGroups, n0, N, r0, m_end, lane, [&](int64_t row, int64_t col, int i) {
    store_acc_pair(c + row * ldc + col, acc[i], acc[i + 1], c_vec && col + 1 < N, col + 1 < N);
  });
}

// Whether the math warps keep two K blocks in flight (compute_tiles): not in the grouped form
// with per-row weight scales, whose registers do not hold them (ptxas spills ~300 bytes).
template <bool kGrouped, bool kRowScales>
constexpr bool pairs_in_flight() {
  return !(kGrouped && kRowScales);
}

// A math warpgroup's 64 rows × 128 columns (acc: this thread's m64n128 fragment; kGroups = 24, bf16
// only: 192 columns, m64n192's) into C at (row y0, column n0) through shared memory `out` and TMA
// stores, which run on while the warpgroup moves on to its next tile: bf16 in one pass (two boxes
// of 64 columns; three at 192), fp32 in two (columns 0–63, 64–127, two boxes of 32 each). Per pass the warpgroup's leader first waits until
// its previous stores have read `out`; each thread writes its pairs swizzled (16-byte chunk c of
// box row r at chunk c ^ (r % 8): the 8 rows a warp writes at once fall in different banks).
// Warpgroup-collective (named barrier 1 + warpgroup).
template <typename OutT, int kGroups = 16>
__device__ __forceinline__ void store_tile_tma(const CUtensorMap& map_c, uint8_t* out, int64_t n0, int64_t y0,
                                               int warp, int lane, const float (&acc)[4 * kGroups]) {
  static_assert(kGroups == 16 || sizeof(OutT) == 2, "192-column tiles are stored in bf16");
  constexpr int kPasses = sizeof(OutT) == 2 ? 1 : 2, kGroupsPerPass = kGroups / kPasses;  // 8-column groups
  constexpr int kBoxCols = 128 / static_cast<int>(sizeof(OutT));
  constexpr int kBoxesPerPass = kGroupsPerPass * 8 / kBoxCols;
  const int bar = 1 + warp / 4, q = lane % 4;
  const bool leader = warp % 4 == 0 && lane == 0;
  const int r0 = 16 * (warp % 4) + lane / 4;  // this thread's rows r0, r0 + 8 of the 64
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    if (leader) bulk_wait_all<true>();
    named_barrier(bar, 128);
#pragma unroll
    for (int g = 0; g < kGroupsPerPass; ++g) {
      const int j = pass * kGroupsPerPass + g;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
        if constexpr (sizeof(OutT) == 2) {  // byte 16g + 4q of the 256-byte row: box g / 8, chunk g % 8
          uint8_t* box = out + (g / 8) * kOutBoxBytes + r * 128;
          *reinterpret_cast<__nv_bfloat162*>(box + (((g % 8) ^ (r % 8)) * 16) + 4 * q) = __floats2bfloat162_rn(v0, v1);
        } else {  // byte 32g + 8q of the pass's 256-byte row: box g / 4, chunk 2·(g % 4) + q / 2
          uint8_t* box = out + (g / 4) * kOutBoxBytes + r * 128;
          const int chunk = (2 * (g % 4) + q / 2) ^ (r % 8);
          *reinterpret_cast<float2*>(box + chunk * 16 + 8 * (q % 2)) = make_float2(v0, v1);
        }
      }
    }
    fence_proxy_async();
    named_barrier(bar, 128);
    if (leader) {
      for (int b = 0; b < kBoxesPerPass; ++b)
        tma_store_2d(&map_c, out + b * kOutBoxBytes, static_cast<int32_t>(n0 + (kBoxesPerPass * pass + b) * kBoxCols),
                     static_cast<int32_t>(y0));
      bulk_commit();
    }
  }
}

// The descriptors of warpgroup wg's A rows and of the W tile in stage 0 (ring_descs); stage s's
// are s·kStageBytes further (desc_advance: the start-address field holds the ring's < 256 KB).
struct RingDescs {
  uint64_t a, w;
};
__device__ __forceinline__ RingDescs ring_descs(const uint8_t* ring, int wg) {
  return {sw128_desc(ring + wg * 64 * kBK), sw128_desc(ring + kTileBytes)};
}

// d[64×192] fp32 (+)= A[64×32] e4m3 · B[192×32]ᵀ e4m3, both K-major in shared memory (128-byte
// swizzle); accumulate = 0 overwrites d. d[4j + v]: row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4)
// + v%2 (warp w of the warpgroup, lane l), j < 24.
__device__ __forceinline__ void wgmma_m64n192k32(float (&d)[96], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1;\n}\n"
               : DI_WGMMA_ACC64(d, 0), DI_WGMMA_ACC8(d, 64), DI_WGMMA_ACC8(d, 72), DI_WGMMA_ACC8(d, 80),
                 DI_WGMMA_ACC8(d, 88)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// A math warpgroup's MMAs of the K block in stage s into `part` (the first overwriting it), once
// full[s] has completed (parity `phase`); then s and phase move on to the next stage. kN: the
// MMAs' width — 128 (m64n128k32, a warpgroup's rows of the tile), 64 (m64n64k32, a narrow tile's
// half: d0.w then points at the W tile's 64 rows of this warpgroup's columns) or 192 (m64n192k32,
// the 128 × 192 form, whose ring has kRing stages of kRingStageBytes).
template <int kN, int kRing = kStages, int kRingStageBytes = kStageBytes>
__device__ __forceinline__ void issue_k_block(float (&part)[kN / 2], const RingDescs& d0, uint64_t* full, int& s,
                                              uint32_t& phase) {
  mbar_wait(&full[s], phase);
  const auto off = static_cast<uint32_t>(s * (kRingStageBytes >> 4));
  const uint64_t da = desc_advance(d0.a, off), db = desc_advance(d0.w, off);
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) fence_operand(part[i]);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kBK / 32; ++k) {  // +32 bytes of K (the stage is 1024-byte aligned: no carry)
    if constexpr (kN == 128) wgmma_m64n128k32(part, desc_advance(da, 2 * k), desc_advance(db, 2 * k), k);
    else if constexpr (kN == 192) wgmma_m64n192k32(part, desc_advance(da, 2 * k), desc_advance(db, 2 * k), k);
    else wgmma_m64n64k32_e4m3(part, desc_advance(da, 2 * k), desc_advance(db, 2 * k), k);
  }
  wgmma_commit();
  if (++s == kRing) {
    s = 0;
    phase ^= 1u;
  }
}

// DeepGEMM's promotion of a finished K block (part: its MMA sums, the m64n(8·kGroups) fragment)
// into acc: acc[4j + v] = fmaf(part[4j + v], v < 2 ? at(j).x : at(j).y, acc[4j + v]) — at(j) the
// scale products a·w of the thread's rows r0 (x) and r0 + 8 (y) for 8-column group j.
template <int kGroups, typename At>
__device__ __forceinline__ void promote_groups(float (&acc)[4 * kGroups], const float (&part)[4 * kGroups], At&& at) {
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    const float2 sj = at(j);
    acc[4 * j + 0] = fmaf(part[4 * j + 0], sj.x, acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(part[4 * j + 1], sj.x, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(part[4 * j + 2], sj.y, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(part[4 * j + 3], sj.y, acc[4 * j + 3]);
  }
}

// K blocks kb … kbs − 1 of a tile in pairs, as compute_tiles runs them: block kb + 1's MMAs
// issued before block kb is promoted, nothing in flight across the loop's back edge (ptxas
// serializes every wgmma when an accumulator may be), an odd count's last block alone.
// issue(part, kb, sc) waits for block kb's stage, loads its scales into sc and issues its MMAs
// into part (moving s on); promote(part, stage, sc) runs once they are waited for.
template <typename Sc, typename Part, typename Issue, typename Promote>
__device__ __forceinline__ void k_blocks_in_pairs(int kb, int kbs, const int& s, Part& part0, Part& part1,
                                                  Issue&& issue, Promote&& promote) {
  Sc sc0{}, sc1{};
  for (; kb + 1 < kbs; kb += 2) {
    const int s0 = s;
    issue(part0, kb, sc0);
    const int s1 = s;
    issue(part1, kb + 1, sc1);
    wgmma_wait<1>();
    promote(part0, s0, sc0);
    wgmma_wait<0>();
    promote(part1, s1, sc1);
  }
  for (; kb < kbs; ++kb) {
    const int s0 = s;
    issue(part0, kb, sc0);
    wgmma_wait<0>();
    promote(part0, s0, sc0);
  }
}

// A grouped tile of at most 64 rows (an expert's last rows; every tile of a decode-sized step)
// in the block-scale form, when WgmmaParams::narrow: both math warpgroups on its 64 rows,
// warpgroup wg on columns n0 + 64·wg .. + 63 — m64n64k32 MMAs of A's first 64 rows and the W
// tile's rows 64·wg .. (nd: stage 0's descriptors of those) — where the wide path has warpgroup 0
// alone on all 128 columns while warpgroup 1 only passes over the stages. Each element's
// arithmetic is the wide tile's (its K blocks' 32-wide MMA steps, promoted in K order by the
// same sa·sw products): the same bits (CudaFp8Gemm.GroupedMatchesReferenceWithEmptyExperts).
// K blocks in pairs as compute_tiles; the result by direct stores (the rows past the expert are
// the next one's). swp: the tile's weight scales [n_kb] (block form); s, phase: the ring's
// position, moved past the tile's n_kb stages.
// kGatherA: the A rows' scales from the stage's ssa slots.
template <typename OutT, int kCluster, bool kGatherA>
__device__ __forceinline__ void narrow_tile(const WgmmaParams& p, const RingDescs& nd, uint64_t* full, uint64_t* empty,
                                            int& s, uint32_t& phase, int64_t m0, int64_t m_end, int64_t n0,
                                            const float* swp, const float* ssa, int wg, int warp, int lane) {
  const int rn = 16 * (warp % 4) + lane / 4;  // this thread's rows rn, rn + 8 of the tile
  const int64_t r0 = m0 + rn, r1 = r0 + 8;
  const float* sa0 = p.sa + (r0 < p.M ? r0 : 0) * p.n_kb;  // rows past M read row 0's scales (not stored)
  const float* sa1 = p.sa + (r1 < p.M ? r1 : 0) * p.n_kb;
  float acc[32], part0[32], part1[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = part0[i] = part1[i] = 0.0f;
  struct Scales {
    float a0, a1, w;
  };
  auto issue = [&](float (&part)[32], int kb, Scales& sc) {
    sc.w = swp[kb];
    if constexpr (kGatherA) {
      const int sr = s;
      issue_k_block<64>(part, nd, full, s, phase);
      sc.a0 = ssa[sr * kBM + rn];
      sc.a1 = ssa[sr * kBM + rn + 8];
    } else {
      sc.a0 = sa0[kb];
      sc.a1 = sa1[kb];
      issue_k_block<64>(part, nd, full, s, phase);
    }
  };
  auto promote = [&](float (&part)[32], int sr, const Scales& sc) {  // as compute_tiles' block form
#pragma unroll
    for (int i = 0; i < 32; ++i) fence_operand(part[i]);
    release_stage<kCluster>(&empty[sr], lane);
    const float2 sr01 = make_float2(sc.a0 * sc.w, sc.a1 * sc.w);
    promote_groups<8>(acc, part, [&](int) { return sr01; });
  };
  k_blocks_in_pairs<Scales>(0, static_cast<int>(p.n_kb), s, part0, part1, issue, promote);
  store_tile<OutT, 8>(static_cast<OutT*>(p.c), p.ldc, p.n_split, n0 + 64 * wg, r0, m_end, p.c_vec, lane, acc);
}

// A math warp (warpgroup wg, see fp8_wgmma_kernel): its 16 rows of each of this block's tiles.
// kGatherA (grouped, block-form scales): the A rows' scales from the stage's ssa slots, read once
// the stage is full (the gathered loader stages them).
template <bool kGrouped, typename OutT, bool kRowScales, int kCluster, bool kGatherA>
__device__ __forceinline__ void compute_tiles(const WgmmaParams& p, const CUtensorMap& map_c, const CUtensorMap& map_c2,
                                              const uint8_t* ring,
                                              uint8_t* out, uint64_t* full, uint64_t* empty, const float* ssw,
                                              const float* ssa, const int32_t* table, int wg, int warp, int lane) {
  const int64_t n_col_tiles = (p.N + kBN - 1) / kBN, n_kb = p.n_kb;
  const int64_t n_tiles = p.n_row_tiles * ((n_col_tiles + kCluster - 1) / kCluster);
  const int32_t* tiles = kGrouped ? table : nullptr;
  const int rank = static_cast<int>(blockIdx.x % kCluster);
  int s = 0;           // the stage of the next K block (the it-th this warp consumes: s = it % kStages)
  uint32_t phase = 0;  // full[s]'s parity for it: (it / kStages) & 1
  const RingDescs descs = ring_descs(ring, wg);
  // narrow_tile's: A's first 64 rows, the W tile's 64 rows of this warpgroup's columns.
  const RingDescs narrow_descs{ring_descs(ring, 0).a, desc_advance(descs.w, static_cast<uint32_t>(wg * (64 * kBK >> 4)))};
  OutT* c = static_cast<OutT*>(p.c);
  float acc[64], part0[64], part1[64];  // part: a K block's MMA sums (its first MMA overwrites)
  // Dense forms: a tile's TMA store waits (pend) until the next tile's first pair of K blocks is
  // issued and runs under their MMAs, so the tensor cores are not idle while both warpgroups
  // write a tile out (V2-Lite q_proj at 4,096 rows 49.9 → 48.4 µs, run s23-4). The same bits.
  // Block-form scales only, and not the grouped forms: there ptxas then spilled (and, grouped,
  // lost the uniform descriptors: the MoE's gate|up GEMM slower, same run). pend: the store's
  // first row (−1: none), its column (in c, or c2 with pend_second).
  constexpr bool kDefer = !kGrouped && !kRowScales;
  int32_t pend = -1, pend_col = 0;
  bool pend_second = false;
  auto flush = [&]() {  // pend's store from acc, then acc = 0
    if (!kDefer || pend < 0) return;
    store_tile_tma<OutT>(pend_second ? map_c2 : map_c, out, pend_col, pend, warp, lane, acc);
    pend = -1;
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  };
  for (int64_t tile = blockIdx.x / kCluster; tile < n_tiles; tile += gridDim.x / kCluster) {
    TileView v;
    if (!resolve_tile<kBM, kBN, kCluster>(tile, p.n_row_tiles, n_col_tiles, tiles, p.E, p.M, &v, rank)) continue;
    const int64_t e = v.e, m0 = v.m0, m_end = v.m_end, n0 = v.n0;
    // A grouped tile's last rows may not reach this warpgroup's 64 (every tile of a decode step,
    // a prefill's expert tails): it then only passes over the tile's stages — waiting for each,
    // so its releases keep the ring's phases — and issues no MMAs, leaving the tensor cores to
    // the other warpgroup. (The branch is taken before any of the tile's wgmmas with none in
    // flight: ptxas keeps them asynchronous. Skipping them inside issue_k_block, under a branch
    // between fence and commit, made it serialize every wgmma of the kernel, C7520.)
    if constexpr (kGrouped && !kRowScales) {
      if (p.narrow && m_end - m0 <= 64) {
        const float* swn = p.sw + (e * n_col_tiles + min(n0 / kBN, n_col_tiles - 1)) * p.sw_step * n_kb;
        narrow_tile<OutT, kCluster, kGatherA>(p, narrow_descs, full, empty, s, phase, m0, m_end, n0, swn, ssa, wg, warp,
                                              lane);
        continue;
      }
    }
    const bool idle = kGrouped && m0 + 64 * wg >= m_end;
    if (kGrouped && p.idle_skip && idle) {
      flush();
      pass_stages<kCluster>(n_kb, full, empty, s, phase, lane);
      continue;
    }
    // Rows r0 = m0 + rl and r0 + 8 of this tile, rl = 64·wg + 16·(warp % 4) + lane / 4.
    const int rl = 64 * wg + 16 * (warp % 4) + lane / 4;
    const int64_t r0 = m0 + rl, r1 = r0 + 8;
    const float* sa0 = p.sa + (r0 < p.M ? r0 : 0) * n_kb;  // rows past M read row 0's scales (not stored)
    const float* sa1 = p.sa + (r1 < p.M ? r1 : 0) * n_kb;
    // A cluster's last column tile may lie past N (nothing stored): it reads the last tile's scales.
    const int64_t ct = min(n0 / kBN, n_col_tiles - 1);
    const float* swp = kRowScales ? nullptr : p.sw + (e * n_col_tiles + ct) * p.sw_step * n_kb;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      part0[i] = part1[i] = 0.0f;
      if (pend < 0) acc[i] = 0.0f;  // else flush zeroes it
    }
    // K block kb's MMAs into `part` from stage s (waiting until it is full), and its scales (per-row
    // weight scales: none, the stage's ssa and ssw hold them).
    struct Scales {
      float a0, a1, w;
    };
    auto issue = [&](float (&part)[64], int kb, Scales& sc) {
      if constexpr (kGatherA) {
        sc.w = swp[kb];
        const int sr = s;
        issue_k_block<128>(part, descs, full, s, phase);
        sc.a0 = ssa[sr * kBM + rl];
        sc.a1 = ssa[sr * kBM + rl + 8];
        return;
      }
      if constexpr (!kRowScales) {
        sc.a0 = sa0[kb];
        sc.a1 = sa1[kb];
        sc.w = swp[kb];
      }
      issue_k_block<128>(part, descs, full, s, phase);
    };
    // The finished K block in `part` (its MMAs waited for) from stage sr: released, then promoted.
    auto promote = [&](float (&part)[64], int sr, const Scales& sc) {
#pragma unroll
      for (int i = 0; i < 64; ++i) fence_operand(part[i]);
      if (idle) {
        release_stage<kCluster>(&empty[sr], lane);
      } else if constexpr (kRowScales) {
        const float a0 = ssa[sr * kBM + rl], a1 = ssa[sr * kBM + rl + 8];
        const float* cs = ssw + sr * kBN + 2 * (lane % 4);  // columns 8j + 2·(lane % 4), +1
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float2 w2 = *reinterpret_cast<const float2*>(cs + 8 * j);
          acc[4 * j + 0] = fmaf(part[4 * j + 0], a0 * w2.x, acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(part[4 * j + 1], a0 * w2.y, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(part[4 * j + 2], a1 * w2.x, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(part[4 * j + 3], a1 * w2.y, acc[4 * j + 3]);
        }
        release_stage<kCluster>(&empty[sr], lane);  // MMAs and column scales read: the loader may refill
      } else {
        release_stage<kCluster>(&empty[sr], lane);  // the stage is read: the loader may refill it
        const float s0 = sc.a0 * sc.w, s1 = sc.a1 * sc.w;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          acc[4 * j + 0] = fmaf(part[4 * j + 0], s0, acc[4 * j + 0]);
          acc[4 * j + 1] = fmaf(part[4 * j + 1], s0, acc[4 * j + 1]);
          acc[4 * j + 2] = fmaf(part[4 * j + 2], s1, acc[4 * j + 2]);
          acc[4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[4 * j + 3]);
        }
      }
    };
    // K blocks in pairs: block kb + 1's MMAs run while block kb is promoted; nothing is in flight
    // across the loop's back edge (ptxas serializes every wgmma when an accumulator may be).
    // Both warpgroups wait on the same stages, so they reach a pair's second promotion — with
    // none of their MMAs in flight — together (run s19-5: the tensor pipe busy 46 % of the
    // time). p.stagger (grouped forms): warpgroup 1 takes the tile's first block alone, so its pairs are one
    // block behind warpgroup 0's and each one's MMAs can run while the other promotes. The
    // blocks are promoted in K order either way: the same bits.
    constexpr bool kPairs = pairs_in_flight<kGrouped, kRowScales>();
    const int kbs = static_cast<int>(n_kb);
    Scales sc0{}, sc1{};
    int kb = 0;
    if (kGrouped && kPairs && p.stagger && wg == 1 && kbs > 2) {
      flush();
      const int s0 = s;
      issue(part0, 0, sc0);
      wgmma_wait<0>();
      promote(part0, s0, sc0);
      kb = 1;
    }
    if (kDefer && kPairs && kb + 1 < kbs && pend >= 0) {  // the first pair, the previous tile's store under it
      const int s0 = s;
      issue(part0, kb, sc0);
      const int s1 = s;
      issue(part1, kb + 1, sc1);
      flush();
      wgmma_wait<1>();
      promote(part0, s0, sc0);
      wgmma_wait<0>();
      promote(part1, s1, sc1);
      kb += 2;
    }
    flush();  // not stored under MMAs: a single K block, or no pairs (kRowScales grouped)
    if constexpr (kPairs) {
      k_blocks_in_pairs<Scales>(kb, kbs, s, part0, part1, issue, promote);
    } else {
      for (; kb < kbs; ++kb) {  // every block alone
        const int s0 = s;
        issue(part0, kb, sc0);
        wgmma_wait<0>();
        promote(part0, s0, sc0);
      }
    }

    if (idle) continue;  // none of the tile's rows are this warpgroup's
    // The tile's output: c, or (dense with a second output, columns past n_split) c2. (Without
    // one, a cluster's column tile past N stays c's, where the stores clip it.)
    const bool second = !kGrouped && p.n_split < p.N && n0 >= p.n_split;
    OutT* cc = second ? static_cast<OutT*>(p.c2) : c;
    const int64_t ldc = second ? p.ldc2 : p.ldc, nc = second ? n0 - p.n_split : n0, Nc = second ? p.N - p.n_split : p.n_split;
    // TMA for the warpgroup's 64 rows when they all belong to this tile (a grouped tile's rows
    // past its expert are the next expert's: never written), deferred to the next tile's first
    // MMAs (pend); the stores clip at M and N.
    if (kDefer && p.c_tma && (!kGrouped || m0 + 64 * (wg + 1) <= m_end)) {
      pend = static_cast<int32_t>(m0 + 64 * wg);  // < M < 2^31 (fp8_wgmma_gemm checks)
      pend_col = static_cast<int32_t>(nc);
      pend_second = second;
    } else if (p.c_tma && (!kGrouped || m0 + 64 * (wg + 1) <= m_end)) {
      store_tile_tma<OutT>(second ? map_c2 : map_c, out, nc, m0 + 64 * wg, warp, lane, acc);
    } else {
      store_tile(cc, ldc, Nc, nc, r0, m_end, p.c_vec, lane, acc);
    }
  }
  flush();
  if (p.c_tma && warp % 4 == 0 && lane == 0) bulk_wait_all<false>();  // the last stores complete before exit
}

// ---- The MoE's gate|up GEMM with SiLU·mul and the down GEMM's quantizer in its epilogue ----
// (fp8_wgmma_glu_quantize). A tile: kBM rows × 128 activation columns n0.. of one expert (one
// 1×128 quantization group per row), computed as two halves h = 0, 1 of 64 columns in turn, each
// a full K loop whose W stage is 64 gate rows e·2I + n0 + 64h.. then the matching 64 up rows
// e·2I + I + n0 + 64h.. (two 64-row boxes, as the bf16 GLU form loads them): thread t's m64n128
// fragment then holds gate column 8j + 2·(l%4) + v%2 at d[4j + v] and its up column at
// d[4(j + 8) + v], j < 8. Their values are the plain GEMM's bit for bit (an element's MMAs and
// promotion do not depend on the columns beside it; the promotion's scale is the gate or up
// row block's, as the plain GEMM's 128-row tiles read them), so the epilogue reproduces
// fp8_grouped_gemm (bf16 out) + silu_mul_quantize_fp8 exactly: g, u rounded to bf16, act =
// bf16(silu_times(g, u)), the row's group scale over its 128 act values, the codes
// (cuda_fp8_quant.cuh). Each half's act values wait in shared memory (`stash`: 32 bf16 pairs
// per thread, word i of thread t at i·128 + t, no bank conflicts) until the row's |act| maximum
// is known — a 4-lane reduction (a row's 128 columns lie in one quad).

// The loader warp: per tile, per half, per K block — the it-th overall, stage it % kStages.
__device__ __forceinline__ void load_glu_stages(const CUtensorMap& map_a, const CUtensorMap& map_w,
                                                const WgmmaParams& p, uint8_t* ring, uint64_t* full, uint64_t* empty,
                                                const int32_t* table, int lane) {
  const int64_t I = p.N / 2, n_col_tiles = I / kBN, n_kb = p.n_kb;
  const int64_t n_tiles = p.n_row_tiles * n_col_tiles;
  uint32_t it = 0;
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    TileView v;
    if (!resolve_tile<kBM, kBN>(tile, p.n_row_tiles, n_col_tiles, p.offsets != nullptr ? table : nullptr, p.E, p.M,
                                &v))
      continue;
    for (int h = 0; h < 2; ++h) {
      const auto y_gate = static_cast<int32_t>(v.e * p.N + v.n0 + 64 * h), y_up = y_gate + static_cast<int32_t>(I);
      for (int64_t kb = 0; kb < n_kb; ++kb, ++it) {
        const int s = static_cast<int>(it % kStages);
        if (lane == 0) mbar_wait(&empty[s], ((it / kStages) & 1u) ^ 1u);
        __syncwarp();
        if (lane == 0) {
          mbar_arrive_expect_tx(&full[s], kStageBytes);
          uint8_t* stage = ring + s * kStageBytes;
          const auto x = static_cast<int32_t>(kb * kBK);
          tma_load_2d(stage, &map_a, x, static_cast<int32_t>(v.m0), &full[s]);
          tma_load_2d(stage + kTileBytes, &map_w, x, y_gate, &full[s]);
          tma_load_2d(stage + kTileBytes + 64 * kBK, &map_w, x, y_up, &full[s]);
        }
      }
    }
  }
}

// A math warp (warpgroup wg): its 16 rows of each of this block's tiles, both halves, then the
// codes of its rows' 128 columns into q [M, I] and their scales into q_scale [M, I / 128].
__device__ __forceinline__ void compute_glu_tiles(const WgmmaParams& p, uint8_t* q, float* q_scale, const uint8_t* ring,
                                                  uint32_t* stash, uint64_t* full, uint64_t* empty,
                                                  const int32_t* table, int wg, int warp, int lane) {
  const int64_t I = p.N / 2, n_col_tiles = I / kBN, n_kb = p.n_kb, w_blocks = p.N / kBN;
  const int64_t n_tiles = p.n_row_tiles * n_col_tiles;
  const int tw = threadIdx.x % 128;  // this thread in its warpgroup
  int s = 0;           // the stage of the next K block (as compute_tiles)
  uint32_t phase = 0;  // full[s]'s parity
  const RingDescs descs = ring_descs(ring, wg);
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    TileView v;
    if (!resolve_tile<kBM, kBN>(tile, p.n_row_tiles, n_col_tiles, p.offsets != nullptr ? table : nullptr, p.E, p.M,
                                &v))
      continue;
    const int64_t e = v.e, m0 = v.m0, m_end = v.m_end, n0 = v.n0;
    // As compute_tiles: MMAs issued, nothing promoted or stored (a grouped tile's rows past its
    // expert, a dense tile's past M).
    const bool idle = m0 + 64 * wg >= m_end;
    if (p.idle_skip && idle) {  // as compute_tiles: both halves' stages passed over, no MMAs
      pass_stages<1>(2 * n_kb, full, empty, s, phase, lane);
      continue;
    }
    const int rl = 64 * wg + 16 * (warp % 4) + lane / 4;
    const int64_t r0 = m0 + rl, r1 = r0 + 8;
    const float* sa0 = p.sa + (r0 < p.M ? r0 : 0) * n_kb;
    const float* sa1 = p.sa + (r1 < p.M ? r1 : 0) * n_kb;
    // The scale rows of the gate block (n0 / 128) and, up_step further, of the up block
    // ((I + n0) / 128).
    const float* swg = p.sw + (e * w_blocks + n0 / kBN) * p.sw_step * n_kb;
    const auto up_step = static_cast<int32_t>(n_col_tiles * p.sw_step * n_kb);
    float amax0 = 0.0f, amax1 = 0.0f;  // |act| maxima of rows r0, r1 over this thread's columns
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      float acc[64], part0[64], part1[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = part0[i] = part1[i] = 0.0f;
      struct Scales {
        float a0, a1, g, u;
      };
      auto issue = [&](float (&part)[64], int kb, Scales& sc) {
        sc.a0 = sa0[kb];
        sc.a1 = sa1[kb];
        sc.g = swg[kb];
        sc.u = swg[up_step + kb];
        issue_k_block<128>(part, descs, full, s, phase);
      };
      // compute_tiles' block-form promotion, with the gate scale for fragments j < 8 and the up
      // scale for j ≥ 8 (the products a·w as the plain GEMM forms them).
      auto promote = [&](float (&part)[64], int sr, const Scales& sc) {
#pragma unroll
        for (int i = 0; i < 64; ++i) fence_operand(part[i]);
        release_stage<1>(&empty[sr], lane);
        if (idle) return;
        const float2 sg = make_float2(sc.a0 * sc.g, sc.a1 * sc.g), su = make_float2(sc.a0 * sc.u, sc.a1 * sc.u);
        promote_groups<16>(acc, part, [&](int j) { return j < 8 ? sg : su; });
      };
      k_blocks_in_pairs<Scales>(0, static_cast<int>(n_kb), s, part0, part1, issue, promote);
      if (idle) continue;
      // act = bf16(silu_times(bf16(gate), bf16(up))) for this half's 32 values, into the stash —
      // for the rows it stores only (a decode step's tiles hold a few rows per expert: the rest
      // of the epilogue's expf and divisions would be spent on the next expert's rows).
      const bool live0 = r0 < m_end, live1 = r1 < m_end;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float a2[2] = {0.0f, 0.0f};
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int i = 4 * j + 2 * hr + c;
            if (!(hr == 0 ? live0 : live1)) continue;
            const float g = __bfloat162float(__float2bfloat16(acc[i]));
            const float u = __bfloat162float(__float2bfloat16(acc[i + 32]));
            a2[c] = __bfloat162float(__float2bfloat16(silu_times(g, u)));
          }
          float& amax = hr == 0 ? amax0 : amax1;
          amax = fmaxf(amax, fmaxf(fabsf(a2[0]), fabsf(a2[1])));
          const __nv_bfloat162 packed = __floats2bfloat162_rn(a2[0], a2[1]);
          stash[(16 * h + 2 * j + hr) * 128 + tw] = *reinterpret_cast<const uint32_t*>(&packed);
        }
    }
    if (idle) continue;
    // The rows' group scales (a row's 128 columns lie in the 4 lanes of one quad), then the codes
    // of both halves and the scales.
    amax0 = fmaxf(amax0, __shfl_xor_sync(0xffffffffu, amax0, 1));
    amax0 = fmaxf(amax0, __shfl_xor_sync(0xffffffffu, amax0, 2));
    amax1 = fmaxf(amax1, __shfl_xor_sync(0xffffffffu, amax1, 1));
    amax1 = fmaxf(amax1, __shfl_xor_sync(0xffffffffu, amax1, 2));
    const float sq0 = fp8_group_scale(amax0), sq1 = fp8_group_scale(amax1);
    const float iq0 = fp8_scale_inverse(sq0), iq1 = fp8_scale_inverse(sq1);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int64_t row = hr == 0 ? r0 : r1;
          const uint32_t word = stash[(16 * h + 2 * j + hr) * 128 + tw];
          if (row >= m_end) continue;
          const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&word);
          const __nv_fp8x2_storage_t codes =
              fp8_codes2(__low2float(pair), __high2float(pair), hr == 0 ? sq0 : sq1, hr == 0 ? iq0 : iq1);
          *reinterpret_cast<__nv_fp8x2_storage_t*>(q + row * I + n0 + 64 * h + 8 * j + 2 * (lane % 4)) = codes;
        }
    if (lane % 4 == 0) {
      if (r0 < m_end) q_scale[r0 * n_col_tiles + n0 / kBN] = sq0;
      if (r1 < m_end) q_scale[r1 * n_col_tiles + n0 / kBN] = sq1;
    }
  }
}


// A math warp (warpgroup wg) of fp8_wgmma_n192_kernel: its 16 rows of each of this block's
// 128 × 192 tiles. Per K block: the scales loaded, the stage's four m64n192k32 MMAs issued (the
// first overwriting `part`), waited for, the stage released, then promoted — acc += part ·
// sa(row) · sw(column block), DeepGEMM's promotion in K order, the 128-wide kernel's arithmetic
// per element (the same bits). A tile's 192 columns span two 128-column weight-scale blocks: its
// 8-column groups j < jb take the first's scale, the others the second's (n0 = 192·ct: jb = 16
// when ct is even, 8 when odd). A warpgroup none of whose 64 rows are the tile's expert's passes
// over the stages (as idle_skip).
// kGatherA: the A rows' scales from the stage's ssa slots (the gathered loader's).
template <typename OutT, bool kGatherA>
__device__ __forceinline__ void compute_tiles_n192(const WgmmaParams& p, const CUtensorMap& map_c, const uint8_t* ring,
                                                   uint8_t* out, uint64_t* full, uint64_t* empty, const int32_t* table,
                                                   const float* ssa, int wg, int warp, int lane) {
  const int64_t n_col_tiles = (p.N + kN192 - 1) / kN192, n_kb = p.n_kb, n_scale_blocks = (p.N + kBN - 1) / kBN;
  const int64_t n_tiles = p.n_row_tiles * n_col_tiles;
  int s = 0;
  uint32_t phase = 0;
  const RingDescs descs = ring_descs(ring, wg);  // the same A | W offsets in a 40 KB stage
  OutT* c = static_cast<OutT*>(p.c);
  float acc[96], part[96];
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    TileView v;
    if (!resolve_tile<kBM, kN192>(tile, p.n_row_tiles, n_col_tiles, table, p.E, p.M, &v)) continue;
    const int64_t e = v.e, m0 = v.m0, m_end = v.m_end, n0 = v.n0;
    if (m0 + 64 * wg >= m_end) {  // none of the tile's rows are this warpgroup's
      pass_stages<1, kN192Stages>(n_kb, full, empty, s, phase, lane);
      continue;
    }
    const int rl = 64 * wg + 16 * (warp % 4) + lane / 4;
    const int64_t r0 = m0 + rl, r1 = r0 + 8;
    const float* sa0 = p.sa + (r0 < p.M ? r0 : 0) * n_kb;  // rows past M read row 0's scales (not stored)
    const float* sa1 = p.sa + (r1 < p.M ? r1 : 0) * n_kb;
    const int64_t b_lo = n0 / kBN, b_hi = min(b_lo + 1, n_scale_blocks - 1);  // past N: not stored
    const float* sw_lo = p.sw + (e * n_scale_blocks + b_lo) * p.sw_step * n_kb;
    const float* sw_hi = p.sw + (e * n_scale_blocks + b_hi) * p.sw_step * n_kb;
    const int jb = n0 % kBN == 0 ? 16 : 8;
#pragma unroll
    for (int i = 0; i < 96; ++i) acc[i] = part[i] = 0.0f;
    for (int64_t kb = 0; kb < n_kb; ++kb) {
      const float w_lo = sw_lo[kb], w_hi = sw_hi[kb];
      float a0 = 0.0f, a1 = 0.0f;
      if constexpr (!kGatherA) a0 = sa0[kb], a1 = sa1[kb];
      const int sr = s;
      issue_k_block<192, kN192Stages, kN192StageBytes>(part, descs, full, s, phase);
      if constexpr (kGatherA) a0 = ssa[sr * kBM + rl], a1 = ssa[sr * kBM + rl + 8];
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 96; ++i) fence_operand(part[i]);
      release_stage<1>(&empty[sr], lane);
      const float2 lo = make_float2(a0 * w_lo, a1 * w_lo), hi = make_float2(a0 * w_hi, a1 * w_hi);
      promote_groups<24>(acc, part, [&](int j) { return j < jb ? lo : hi; });
    }
    if (p.c_tma && m0 + 64 * (wg + 1) <= m_end) store_tile_tma<OutT, 24>(map_c, out, n0, m0 + 64 * wg, warp, lane, acc);
    else store_tile<OutT, 24>(c, p.ldc, p.N, n0, r0, m_end, p.c_vec, lane, acc);
  }
  if (p.c_tma && warp % 4 == 0 && lane == 0) bulk_wait_all<false>();  // the last stores complete before exit
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// C[m, n] = Σ_kb (Σ_{k ∈ kb} a[m, k]·w[n, k]) · sa[m, kb] · sw[n / 128, kb], 128×128 output tiles.
// Persistent: block b takes tiles b, b + gridDim.x, … (tile_coords; grouped row tiles through
// cuda_grouped_tile.cuh, tiles past the last expert skipped). Warpgroups 0 and 1 compute rows
// 64·wg.. of each tile; warp 8 (warpgroup 2) is the loader, the rest of warpgroup 2 idles. The
// loader warpgroup hands registers to the math warpgroups (setmaxnreg, RegSplit).
// Per K block (the it-th of this block, over all its tiles: stage s = it % kStages): the loader
// waits until the math warps have released s (empty[s]), then TMA-loads the A tile (kBM rows ×
// 128 bytes at (kb·128, m0)) and the W tile (kBN rows at (kb·128, w_row0)) into s, completing
// full[s]; it runs up to kStages K blocks ahead, into the next tile while the math warps store
// this one. Each math warpgroup takes its K blocks in pairs (compute_tiles): it issues the four
// m64n128k32 wgmmas of block kb (into part0, the first overwriting) and of block kb + 1 (part1),
// waits for kb's, releases its stage (one arrival per warp) and promotes while kb + 1's run —
// acc = fmaf(part, sa·sw, acc), DeepGEMM's promotion, in K-block order (deterministic: a tile's
// result does not depend on which block computes it) — then the same for kb + 1. The tile's
// result leaves through shared memory and TMA stores (store_tile_tma) that complete while the
// warpgroup starts its next tile. (docs/perf.md version 11: the pairs and the TMA stores took
// V2-Lite q_proj at 4,096 rows from 750 to 1,036 TFLOP/s. Tried and dropped, version 3: each
// warpgroup's 128 columns as two staggered 64-column halves; version 11: the two warpgroups'
// issues forced to alternate by named barriers — no gain either.)
// kCluster = 2: the blocks of a cluster take adjacent column tiles of one row tile and each
// loads half of its A tile, multicast to both (load_tiles); a stage's release is one arrival
// per math warp of both blocks. Half the A traffic from L2, the same bits; not faster on the
// H200 at the model's shapes in version 11, faster at V3's dense ones from 4,096 rows in run
// s31-7 (kClusterMinRows: where the default takes it).
// Shared memory: kStages × (A [kBM][128] | W [kBN][128]) e4m3 — rows of 128 bytes, 16-byte chunk c
// of row r at chunk c ^ (r % 8) (TMA's 128-byte swizzle, which wgmma's descriptor reads) — the
// math warpgroups' output staging (2 × 16 KB), full[kStages], empty[kStages] mbarriers, the
// grouped row-tile table (8 KB), the per-row scales' stage slots; ~206 KB: one block per SM.
// Rows past M (and K past K, columns past the tensor) are zero-filled by TMA; a grouped tile's
// rows past its expert belong to the next one and are computed but not stored. Only in-range
// outputs are written. Preconditions: sm_90a, K % 16 == 0.
// kRowScales (block_n = 1: one weight scale per output row and K block, as CudaBackend places FP8
// weights): the loader warp also copies, by cp.async, the tile's 128 column scales and 128 A-row
// scales of each K block into the stage's slots of `ssw` and `ssa` (each loader lane's copies one
// more arrival on full[s]), and the promotion uses sa(row)·sw(column) per element; the stage is
// released after the promotion, which reads them. Grouped with kRowScales, one K block at a time
// (pairs_in_flight). Per-row scales that are uniform within 128-row blocks (w_scale_uniform) take
// the block form instead, reading scale row 128·b for block b (sw_step): 1.8× the rate at
// V2-Lite's dense shapes (run s14-2), the same bits.
// kGatherA (grouped, block-form scales, cluster 1; Fp8GemmArgs::a_rows): the whole loader
// warpgroup gathers each stage's A rows and their scales (load_stages_gathered), its thread 0
// the W tile; full[s] counts its 128 threads' cp.async arrivals too.
template <bool kGrouped, typename OutT, bool kRowScales, int kCluster, bool kGatherA = false>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                     const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_c2,
                     const WgmmaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t wg_smem_raw[];
  uint8_t* smem = wg_smem_raw + ((1024 - smem_u32(wg_smem_raw) % 1024) % 1024);
  uint8_t* ring = smem;                                                     // [kStages][A | W]
  uint8_t* out = ring + kStages * kStageBytes;                              // [kMathGroups][kOutBytes]
  auto* full = reinterpret_cast<uint64_t*>(out + kMathGroups * kOutBytes);  // [kStages]
  uint64_t* empty = full + kStages;                                         // [kStages]
  auto* table = reinterpret_cast<int32_t*>(empty + kStages);               // grouped: build_tile_table
  float* ssw = reinterpret_cast<float*>(table + kTileTableBytes / 4);       // [kStages][kBN] (kRowScales)
  float* ssa = ssw + kStages * kBN;                                         // [kStages][kBM]

  const int t = threadIdx.x, wg = t / 128, warp = t / 32, lane = t % 32;
  // One release per math warp of every block of the cluster (a stage's A rows come from all of them).
  static_assert(!kGatherA || (kGrouped && !kRowScales && kCluster == 1), "the gathered-A form's scope");
  if (t == 0) init_ring(full, empty, kStages, kGatherA ? 1 + 128 : kFullArrivals<kRowScales>, kMathGroups * 4 * kCluster);
  // Weights only before the PDL wait (Fp8GemmArgs::w_stable): the first tile's W stages stream in
  // under the previous kernel's tail.
  int w_ready = 0;
  if constexpr (!kGrouped && kCluster == 1) {
    if (p.w_early) {
      __syncthreads();  // the ring's barriers initialized before the loader's TMA
      if (warp == kMathGroups * 4)
        w_ready = prefetch_first_w<kBM, kBN, kBK>(&map_w, ring, full, kStages, kStageBytes, kTileBytes, p.n_row_tiles,
                                                  p.N, p.n_kb, p.M, lane);
    }
  }
  pdl_wait();  // launched with PDL: A, its scales and the offsets are the previous kernels' outputs
  if (kGrouped && warp == 0) build_tile_table(p.offsets, p.E, kBM, lane, table);
  if constexpr (kCluster > 1) cluster_sync();
  else __syncthreads();
  if (wg == kMathGroups) {
    setmaxnreg_dec<RegSplit<kGrouped, kRowScales>::kLoader>();
    if constexpr (kGatherA)
      load_stages_gathered<kBN, kStages, kStageBytes>(map_w, p, ring, full, empty, ssa, table, t - 128 * kMathGroups);
    else if (warp == kMathGroups * 4)
      load_stages<kGrouped, kRowScales, kCluster>(map_a, map_w, p, ring, full, empty, ssw, ssa, table, w_ready, lane);
  } else {
    setmaxnreg_inc<RegSplit<kGrouped, kRowScales>::kMath>();
    // Block-form scales: wg through a shuffle from lane 0, which ptxas treats as warp-uniform, so
    // the stage addresses, descriptors and barrier addresses (functions of the ring's base, the
    // stage index and wg) stay in the uniform datapath instead of vector registers moved into
    // uniform ones before every wgmma (ptxas -v: the MoE's grouped form spilled 52 bytes, now
    // none; measured in docs/perf.md version 21). The per-row-scale forms spill more with it.
    const int wgu = kRowScales ? wg : __shfl_sync(0xffffffffu, wg, 0);
    compute_tiles<kGrouped, OutT, kRowScales, kCluster, kGatherA>(p, map_c, map_c2, ring, out + wgu * kOutBytes, full,
                                                                  empty, ssw, ssa, table, wgu, warp, lane);
  }
  if constexpr (kCluster > 1) cluster_sync();  // no block leaves while a peer may still signal or fill it
#else
  __trap();  // built for another architecture: fp8_wgmma_available() is false there
#endif
}

// The GLU-quantize form of fp8_wgmma_kernel (grouped — or dense: offsets null, one "expert" of
// rows [0, M) —, block-form weight scales, cluster 1): the same warp roles, compute_glu_tiles /
// load_glu_stages instead of compute_tiles / load_stages, each math warpgroup's act stash
// (16 KB) where the output staging was. q [M, I] e4m3 and q_scale [M, I / 128] are the down
// GEMM's input.
constexpr int kStashBytes = 32 * 128 * 4;
// Registers: the dense forms' split (the loader walks no scales; the math warps hold the two
// blocks in flight, 4 scales each, the stash indexing): 16 bytes of spills (ptxas -v), against
// 216 at the grouped forms' 56 / 224.
constexpr int kGluLoaderRegs = 40, kGluMathRegs = 232;
static_assert(kMathGroups * 128 * kGluMathRegs + 128 * kGluLoaderRegs <= kThreads * 168, "register budget");
constexpr size_t kGluSmemBytes =
    kStages * kStageBytes + kMathGroups * kStashBytes + 2 * kStages * sizeof(uint64_t) + kTileTableBytes + 1024;
__global__ void __launch_bounds__(kThreads, 1)
    fp8_wgmma_glu_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                         const WgmmaParams p, uint8_t* q, float* q_scale) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t wg_smem_raw[];
  uint8_t* smem = wg_smem_raw + ((1024 - smem_u32(wg_smem_raw) % 1024) % 1024);
  uint8_t* ring = smem;                                                         // [kStages][A | W]
  auto* stash = reinterpret_cast<uint32_t*>(ring + kStages * kStageBytes);      // [kMathGroups][32][128]
  auto* full = reinterpret_cast<uint64_t*>(ring + kStages * kStageBytes + kMathGroups * kStashBytes);
  uint64_t* empty = full + kStages;                                             // [kStages]
  auto* table = reinterpret_cast<int32_t*>(empty + kStages);                   // build_tile_table
  const int t = threadIdx.x, wg = t / 128, warp = t / 32, lane = t % 32;
  if (t == 0) init_ring(full, empty, kStages, 1, kMathGroups * 4);
  pdl_wait();  // as fp8_wgmma_kernel
  if (p.offsets != nullptr && warp == 0) build_tile_table(p.offsets, p.E, kBM, lane, table);
  __syncthreads();
  if (wg == kMathGroups) {
    setmaxnreg_dec<kGluLoaderRegs>();
    if (warp == kMathGroups * 4) load_glu_stages(map_a, map_w, p, ring, full, empty, table, lane);
  } else {
    setmaxnreg_inc<kGluMathRegs>();
    const int wgu = __shfl_sync(0xffffffffu, wg, 0);  // warp-uniform, as fp8_wgmma_kernel's
    compute_glu_tiles(p, q, q_scale, ring, stash + wgu * (kStashBytes / 4), full, empty, table, wgu, warp, lane);
  }
#else
  __trap();  // built for another architecture: fp8_wgmma_available() is false there
#endif
}

// The grouped block-scale GEMM on 128 × 192 tiles (compute_tiles_n192): fp8_wgmma_kernel's warp
// roles (a loader warp: load_tiles with 192-row W boxes; two math warpgroups) and register split,
// four 40 KB stages, each math warpgroup's 64 × 192 bf16 output staging (24 KB). Grouped only
// (offsets non-null), bf16 out, cluster 1. kGatherA: the gathered loader (as fp8_wgmma_kernel's).
template <bool kGatherA>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_wgmma_n192_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                          const __grid_constant__ CUtensorMap map_c, const WgmmaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t wg_smem_raw[];
  uint8_t* smem = wg_smem_raw + ((1024 - smem_u32(wg_smem_raw) % 1024) % 1024);
  uint8_t* ring = smem;                                                           // [kN192Stages][A | W]
  uint8_t* out = ring + kN192Stages * kN192StageBytes;                            // [kMathGroups][kN192OutBytes]
  auto* full = reinterpret_cast<uint64_t*>(out + kMathGroups * kN192OutBytes);  // [kN192Stages]
  uint64_t* empty = full + kN192Stages;                                          // [kN192Stages]
  auto* table = reinterpret_cast<int32_t*>(empty + kN192Stages);                // build_tile_table
  float* ssa = reinterpret_cast<float*>(table + kTileTableBytes / 4);            // [kN192Stages][kBM] (kGatherA)
  const int t = threadIdx.x, wg = t / 128, warp = t / 32, lane = t % 32;
  if (t == 0) init_ring(full, empty, kN192Stages, kGatherA ? 1 + 128 : 1, kMathGroups * 4);
  pdl_wait();  // as fp8_wgmma_kernel
  if (warp == 0) build_tile_table(p.offsets, p.E, kBM, lane, table);
  __syncthreads();
  if (wg == kMathGroups) {
    setmaxnreg_dec<RegSplit<true, false>::kLoader>();
    if constexpr (kGatherA)
      load_stages_gathered<kN192, kN192Stages, kN192StageBytes>(map_w, p, ring, full, empty, ssa, table,
                                                                t - 128 * kMathGroups);
    else if (warp == kMathGroups * 4)
      load_tiles<kBM, kN192, kBK>(&map_a, &map_w, ring, full, empty, kN192Stages, kN192StageBytes, kTileBytes,
                                  p.n_row_tiles, p.N, p.n_kb, table, p.E, p.M, 0, lane,
                                  [](int, const TileView&, int64_t) {});
  } else {
    setmaxnreg_inc<RegSplit<true, false>::kMath>();
    const int wgu = __shfl_sync(0xffffffffu, wg, 0);  // warp-uniform, as fp8_wgmma_kernel's
    compute_tiles_n192<bf16, kGatherA>(p, map_c, ring, out + wgu * kN192OutBytes, full, empty, table, ssa, wgu, warp,
                                       lane);
  }
#else
  __trap();  // built for another architecture: fp8_wgmma_available() is false there
#endif
}

// A [rows, K] e4m3 row-major matrix as a TMA map of box_rows × 128-byte boxes, 128-byte swizzle;
// out-of-range boxes read zeros.
CUtensorMap e4m3_map(const uint8_t* base, int64_t rows, int64_t K, int box_rows) {
  return tensor_map_2d(base, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, K, kBK, box_rows);
}

// Launches fp8_wgmma_kernel on `tiles` cluster tiles: persistent, as many blocks (whole
// clusters) as can be resident at once — a cluster's blocks must share a GPC, so at kCluster = 2
// that can be fewer than the SM count (cudaOccupancyMaxActiveClusters), and a grid of more
// clusters than fit would run its last ones as a second wave.
template <bool kGrouped, typename OutT, bool kRowScales, int kCluster, bool kGatherA = false>
void launch(const CUtensorMap& ma, const CUtensorMap& mw, const CUtensorMap& mc, const CUtensorMap& mc2,
            const WgmmaParams& p, int64_t tiles,
            cudaStream_t s) {
  auto* kernel = fp8_wgmma_kernel<kGrouped, OutT, kRowScales, kCluster, kGatherA>;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  // Programmatic dependent launch (cuda_launch.cuh): the prologue (barriers, the launch itself)
  // overlaps the previous kernel's tail; no early trigger (the dependents would wait beside the
  // last tiles, as small_m_gemm's would).
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;  // the occupancy query below takes the cluster attribute only
  static int max_clusters = 0;
  static std::once_flag once;
  std::call_once(once, [&] {
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
    cudaLaunchConfig_t q = cfg;
    q.gridDim = dim3(static_cast<unsigned>(sm_count() / kCluster * kCluster), 1, 1);
    DI_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&max_clusters, kernel, &q));
    DI_CUDA_REQUIRE_MSG(max_clusters >= 1, "fp8 wgmma GEMM: no cluster of its blocks fits on this GPU");
  });
  cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(tiles, max_clusters) * kCluster), 1, 1);
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ma, mw, mc, mc2, p));
  DI_CUDA_LAUNCHED();
}
template <bool kGrouped, typename OutT, int kCluster>
void launch_scales(bool row_scales, const CUtensorMap& ma, const CUtensorMap& mw, const CUtensorMap& mc,
                   const CUtensorMap& mc2,
                   const WgmmaParams& p, int64_t tiles, cudaStream_t s) {
  if (row_scales) launch<kGrouped, OutT, true, kCluster>(ma, mw, mc, mc2, p, tiles, s);
  else launch<kGrouped, OutT, false, kCluster>(ma, mw, mc, mc2, p, tiles, s);
}
template <int kCluster>
void launch_cluster(bool grouped, bool f32, bool row_scales, const CUtensorMap& ma, const CUtensorMap& mw,
                    const CUtensorMap& mc, const CUtensorMap& mc2, const WgmmaParams& p, int64_t tiles,
                    cudaStream_t s) {
  if (grouped) {
    if (f32) launch_scales<true, float, kCluster>(row_scales, ma, mw, mc, mc2, p, tiles, s);
    else launch_scales<true, bf16, kCluster>(row_scales, ma, mw, mc, mc2, p, tiles, s);
  } else {
    if (f32) launch_scales<false, float, kCluster>(row_scales, ma, mw, mc, mc2, p, tiles, s);
    else launch_scales<false, bf16, kCluster>(row_scales, ma, mw, mc, mc2, p, tiles, s);
  }
}

// fp8_wgmma_n192_kernel<kGatherA> on `grid` blocks.
template <bool kGatherA>
void launch_n192(unsigned grid, const CUtensorMap& ma, const CUtensorMap& mw, const CUtensorMap& mc,
                 const WgmmaParams& p, cudaStream_t s) {
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fp8_wgmma_n192_kernel<kGatherA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kN192SmemBytes)));
  });
  launch_pdl(fp8_wgmma_n192_kernel<kGatherA>, grid, kThreads, kN192SmemBytes, s, ma, mw, mc, p);
  DI_CUDA_LAUNCHED();
}

}  // namespace

bool fp8_wgmma_available() { return sm90a_device(); }

bool fp8_wgmma_gather_ok(const Fp8GemmArgs& a) {
  const bool block_scales = a.block_n == 128 || (a.block_n == 1 && a.w_scale_uniform);
  const int64_t n_kb = (a.K + kBK - 1) / kBK;
  return fp8_wgmma_available() && a.offsets != nullptr && a.c_elem == Elem::kBF16 && block_scales &&
         a.cluster <= 1 && a.a_row_div >= 1 && a.a_src_rows >= 1 && a.a_src_rows * std::max(a.K, n_kb) < INT32_MAX;
}

void fp8_wgmma_gemm(const Fp8GemmArgs& a, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(fp8_wgmma_available(), "fp8 wgmma GEMM: needs an sm_90 GPU");
  DI_CUDA_REQUIRE_MSG(a.block_n == 128 || a.block_n == 1, "fp8 wgmma GEMM: block_n must be 128 or 1");
  const bool grouped = a.offsets != nullptr, two = a.c2 != nullptr;
  const int64_t n_split = two ? a.n_split : a.N;
  DI_CUDA_REQUIRE_MSG(!two || (!grouped && a.n_split > 0 && a.n_split < a.N && a.n_split % kBN == 0 &&
                               a.ldc2 >= a.N - a.n_split),
                      "fp8 wgmma GEMM: a second output needs the dense form, 0 < n_split < N, n_split % 128 == 0");
  DI_CUDA_REQUIRE(a.K % 16 == 0 && a.ldc >= n_split);
  DI_CUDA_REQUIRE_MSG(!grouped || a.E <= kMaxTableExperts, "fp8 wgmma GEMM: too many experts");
  const bool gather = a.a_rows != nullptr;
  DI_CUDA_REQUIRE_MSG(!gather || fp8_wgmma_gather_ok(a),
                      "fp8 wgmma GEMM: gathered A rows need the grouped form, bf16 out, block-form weight scales, "
                      "one-block clusters and 1 ≤ a_src_rows, a_src_rows · K < 2^31");
  if (a.M == 0 || a.N == 0 || a.K == 0) return;
  WgmmaParams p{};
  p.sa = a.a_scale;
  p.a = a.a;
  p.a_rows = a.a_rows;
  p.a_row_div = a.a_row_div;
  p.K = a.K;
  p.sw = a.w_scale;
  // Uniform per-row scales: block b of expert e starts at scale row e·N + 128·b = 128·(e·⌈N/128⌉ + b).
  DI_CUDA_REQUIRE_MSG(!a.w_scale_uniform || (a.block_n == 1 && (!grouped || a.N % kBN == 0)),
                      "fp8 wgmma GEMM: uniform scale blocks need block_n 1 (grouped: N % 128 == 0)");
  p.sw_step = a.w_scale_uniform ? kBN : 1;
  p.M = a.M;
  p.N = a.N;
  p.n_kb = (a.K + kBK - 1) / kBK;
  p.c = a.c;
  p.ldc = a.ldc;
  p.c2 = two ? a.c2 : a.c;
  p.ldc2 = two ? a.ldc2 : a.ldc;
  p.n_split = n_split;
  const size_t pair_bytes = a.c_elem == Elem::kF32 ? 8 : 4;
  auto vec_ok = [&](const void* c, int64_t ldc) {
    return ldc % 2 == 0 && reinterpret_cast<uintptr_t>(c) % pair_bytes == 0;
  };
  p.c_vec = vec_ok(p.c, p.ldc) && vec_ok(p.c2, p.ldc2);
  p.offsets = a.offsets;
  p.E = grouped ? a.E : 1;
  const int64_t col_tiles = (a.N + kBN - 1) / kBN;
  const bool pairs = !grouped && a.M >= kClusterMinRows && (col_tiles % 2 == 0 || col_tiles >= kClusterMinTiles);
  const int cluster = a.cluster > 0 ? a.cluster : pairs ? 2 : 1;  // the default: kClusterMinRows' comment
  p.w_early = a.w_stable && !grouped && cluster == 1;
  p.idle_skip = a.idle_skip;
  p.stagger = a.stagger;
  p.narrow = a.narrow_tails;
  const int64_t w_rows = p.E * a.N;
  DI_CUDA_REQUIRE_MSG(a.M < (int64_t{1} << 31) && w_rows < (int64_t{1} << 31), "fp8 wgmma GEMM: too many rows");
  DI_CUDA_REQUIRE_MSG(cluster == 1 || cluster == 2, "fp8 wgmma GEMM: cluster must be 0, 1 or 2");
  // (Gathered A: the map is never read — the loader copies the rows by cp.async.)
  const CUtensorMap ma = e4m3_map(a.a, gather ? a.a_src_rows : a.M, a.K, kBM / cluster),
                    mw = e4m3_map(a.w, w_rows, a.K, kBN);
  p.n_row_tiles = grouped ? (a.M + kBM - 1) / kBM + std::min(a.E, a.M) : (a.M + kBM - 1) / kBM;
  const int64_t col_groups = (col_tiles + cluster - 1) / cluster;
  const int64_t tiles = p.n_row_tiles * col_groups;  // cluster tiles
  const bool f32 = a.c_elem == Elem::kF32, rows = a.block_n == 1 && !a.w_scale_uniform;
  // C as a TMA map of [64 rows][128 bytes] boxes (rows clip at M, columns at N), where TMA can
  // address it: 16-byte aligned base and row pitch.
  const int64_t elem = f32 ? 4 : 2;
  auto tma_ok = [&](const void* c, int64_t ldc) {
    return reinterpret_cast<uintptr_t>(c) % 16 == 0 && (ldc * elem) % 16 == 0;
  };
  p.c_tma = tma_ok(p.c, p.ldc) && tma_ok(p.c2, p.ldc2);
  CUtensorMap mc{}, mc2{};
  if (p.c_tma) {
    const auto type = f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    mc = tensor_map_2d_strided(a.c, type, elem, a.M, n_split, a.ldc, static_cast<int>(128 / elem), 64);
    mc2 = two ? tensor_map_2d_strided(a.c2, type, elem, a.M, a.N - n_split, a.ldc2, static_cast<int>(128 / elem), 64)
              : mc;
  }
  if (grouped && a.n192 && !f32 && !rows && cluster == 1) {  // 128 × 192 tiles (fp8_wgmma_n192_kernel)
    const CUtensorMap mw192 = e4m3_map(a.w, w_rows, a.K, kN192);
    const int64_t tiles192 = p.n_row_tiles * ((a.N + kN192 - 1) / kN192);
    const auto grid = static_cast<unsigned>(std::min<int64_t>(tiles192, sm_count()));
    if (gather) launch_n192<true>(grid, ma, mw192, mc, p, s);
    else launch_n192<false>(grid, ma, mw192, mc, p, s);
    return;
  }
  if (gather) {  // fp8_wgmma_gather_ok: grouped, bf16, block-form scales, cluster 1
    launch<true, bf16, false, 1, true>(ma, mw, mc, mc2, p, tiles, s);
    return;
  }
  if (cluster == 2) launch_cluster<2>(grouped, f32, rows, ma, mw, mc, mc2, p, tiles, s);
  else launch_cluster<1>(grouped, f32, rows, ma, mw, mc, mc2, p, tiles, s);
}

bool fp8_wgmma_glu_ok(int64_t I, bool w_scale_uniform) {
  return fp8_wgmma_available() && I > 0 && I % kBN == 0 && w_scale_uniform;
}

void fp8_wgmma_glu_quantize(const Fp8GemmArgs& a, uint8_t* q, float* q_scale, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(fp8_wgmma_available(), "fp8 wgmma GLU: needs an sm_90 GPU");
  const bool grouped = a.offsets != nullptr;
  DI_CUDA_REQUIRE(!grouped || a.E >= 1);
  DI_CUDA_REQUIRE_MSG(!grouped || a.E <= kMaxTableExperts, "fp8 wgmma GLU: too many experts");
  DI_CUDA_REQUIRE_MSG(a.block_n == 1 && fp8_wgmma_glu_ok(a.N / 2, a.w_scale_uniform) && a.N % 2 == 0,
                      "fp8 wgmma GLU: needs N = 2I with I % 128 == 0 and uniform 128-row scale blocks");
  DI_CUDA_REQUIRE(a.K % 16 == 0 && q != nullptr && q_scale != nullptr);
  if (a.M == 0 || a.K == 0) return;
  WgmmaParams p{};
  p.sa = a.a_scale;
  p.sw = a.w_scale;
  p.sw_step = kBN;
  p.M = a.M;
  p.N = a.N;
  p.n_kb = (a.K + kBK - 1) / kBK;
  p.offsets = a.offsets;
  p.E = grouped ? a.E : 1;
  p.idle_skip = a.idle_skip;
  DI_CUDA_REQUIRE_MSG(a.M < (int64_t{1} << 31) && p.E * a.N < (int64_t{1} << 31), "fp8 wgmma GLU: too many rows");
  p.n_row_tiles = grouped ? (a.M + kBM - 1) / kBM + std::min(a.E, a.M) : (a.M + kBM - 1) / kBM;
  const CUtensorMap ma = e4m3_map(a.a, a.M, a.K, kBM), mw = e4m3_map(a.w, p.E * a.N, a.K, 64);
  const int64_t tiles = p.n_row_tiles * (a.N / 2 / kBN);
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fp8_wgmma_glu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kGluSmemBytes)));
  });
  const auto grid = static_cast<unsigned>(std::min<int64_t>(tiles, sm_count()));
  launch_pdl(fp8_wgmma_glu_kernel, grid, kThreads, kGluSmemBytes, s, ma, mw, p, q, q_scale);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
