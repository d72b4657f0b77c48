// bf16 grouped (MoE) GEMM on Hopper's warpgroup MMA (sm_90a): C[r, n] = Σ_k A[r, k] · W_e[n, k]
// for the expert-sorted rows r of each expert e, fp32 accumulation and output — the prefill-sized
// form of the MoE GEMMs (MoeArgs::form 4), sync-free (offsets stay on the device). Owns: the
// kernel, its launch, and its batch-invariant form: each K split of kInvariantSplitK (cuda_common.h)
// folded from zero and the splits added in order — the arithmetic of the tiled kernels and
// small_m_gemm, bit for bit, because a wgmma k16 step computes what the mma.sync m16n8k16 step of
// the same operands and accumulator computes (measured on the H200, session 10:
// CudaTiledGemmV3.WgmmaBitwiseEqualToMmaSync). Also the MoE's gate|up GEMM with SiLU·mul in its
// epilogue (bf16_wgmma_grouped_glu). Does not own: FP8 weights (cuda_fp8_wgmma.cu with quantized
// activations; the invariant mode widens them to bf16 first), or few rows per expert (128-row
// tiles: the tiled kernel's 64-row tiles, small_m_gemm or the GEMV serve those).
#include <algorithm>
#include <mutex>

#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {
namespace {

// Tile shape per form. Default: 128×256 (one m64n256 wgmma per warpgroup and K step, 128
// accumulators per thread). Batch-invariant: 128×128 (m64n128) — a split's accumulators and the
// running total (64 + 64 per thread) fit the 168 registers that 384 threads may each have.
template <bool kInvariant>
struct Shape {
  static constexpr int kBM = 128;   // rows per tile: two math warpgroups of 64
  static constexpr int kBN = kInvariant ? 128 : 256;
  static constexpr int kBK = 64;    // K per stage: 128 bytes of bf16 per row (one swizzle row)
  static constexpr int kStages = kInvariant ? 6 : 4;
  static constexpr int kAcc = kBN / 2;  // fp32 accumulators per thread (64 rows × kBN / 128 threads)
  static constexpr int kABytes = kBM * kBK * 2, kWBytes = kBN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kWBytes;
};
constexpr int kMathGroups = 2;  // warpgroups issuing wgmma; one more warpgroup loads
constexpr int kThreads = 128 * (kMathGroups + 1);
constexpr int kSplitKb = static_cast<int>(kInvariantSplitK) / 64;  // K blocks per invariant split
static_assert(kInvariantSplitK % 64 == 0, "an invariant split is whole K blocks");
// Ring, then full/empty barriers, then the grouped row-tile table (build_tile_table); the base is
// aligned up to 1024 bytes at run time (the 128-byte swizzle repeats every 8 rows of 128 bytes).
template <bool kInvariant>
constexpr size_t smem_bytes() {
  using S = Shape<kInvariant>;
  return S::kStages * S::kStageBytes + 2 * S::kStages * sizeof(uint64_t) + kTileTableBytes + 1024;
}

struct Params {
  int64_t M, N, n_kb;   // N: output columns (GLU: of act, from W's 2N rows per expert)
  int64_t n_row_tiles;  // the grouped bound ceil(M / 128) + min(E, M)
  float* c;             // [M, ldc]
  bf16* act;            // GLU: [M, ldc] bf16(silu(gate) · up)
  int64_t ldc;
  bool c_vec;  // ldc even and c (act: 4-byte) aligned: column pairs stored as one
  const int32_t* offsets;  // [E + 1]; null: dense rows [0, M) (one "expert")
  int64_t E;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d[64×256] fp32 += A[64×16] bf16 · B[256×16]ᵀ bf16, both K-major in shared memory (no transpose);
// accumulate = 0 overwrites d. Fragment: thread t of the warpgroup (warp w, lane l) holds
// d[4j + v] = row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4) + v%2, j < 64.
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DI_WGMMA_REGS64 ", " DI_WGMMA_REGS64_HI "}, "
               "%128, %129, p, 1, 1, 0, 0;\n}\n"
               : DI_WGMMA_ACC64(d, 0), DI_WGMMA_ACC64(d, 64)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The tile's K step: four k16 wgmmas (+32 bytes of K each) of the form's width.
template <int kAcc>
__device__ __forceinline__ void wgmma_k64(float (&d)[kAcc], uint64_t da, uint64_t db) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (kAcc == 128) wgmma_m64n256k16_bf16(d, da + 2 * k, db + 2 * k, 1);
    else wgmma_m64n128k16_bf16(d, da + 2 * k, db + 2 * k, 1);
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Persistent blocks over kBM×kBN output tiles of the grouped rows (tile_coords raster, grouped
// row tiles from cuda_grouped_tile.cuh; tiles past the last expert skipped). Warpgroups 0 and 1
// compute rows 64·wg.. of a tile; warp 8 is the loader (the rest of warpgroup 2 exits). Per
// 64-wide K block (the it-th of this block: stage s = it % kStages): the loader waits for
// empty[s], then TMA-loads the A tile (128 rows × 128 bytes at (kb·64, m0)) and the W tile (kBN
// rows at (kb·64, e·N + n0)) into s, completing full[s]. Each math warpgroup waits on full[s],
// issues four k16 wgmmas (one commit group) accumulating into acc, and waits until at most that
// group is pending — the previous K block's group is then done and its stage is released (one
// arrival per warp). acc is never read inside the loop, so consecutive groups chain on the
// tensor cores — except, batch-invariant, at each split's end (every kSplitKb K blocks): all
// groups drained, total = acc (split 0) or total + acc, acc = +0 (close_k_split's arithmetic);
// the last split is added after the loop.
// Shared memory: kStages × (A [128][128 B] | W [kBN][128 B]) bf16 — 16-byte chunk c of row r at
// chunk c ^ (r % 8) (TMA's 128-byte swizzle, which the wgmma descriptors read) — full/empty
// mbarriers, the grouped row-tile table: ~201 KB, one block per SM. Rows past M, K past K and W rows past
// the tensor are zero-filled by TMA; a tile's rows past its expert belong to the next one and are
// computed but not stored. Preconditions: sm_90a, K % 8 == 0 (16-byte row pitch); batch-invariant:
// K % 64 == 0 (no zero-filled K chunk, which could turn a −0 sum into +0 where the tiled kernels
// issue no MMA).
// kGlu (the MoE's gate|up GEMM with SiLU·mul in the epilogue): a tile's W rows are kBN / 2 gate
// rows and the matching kBN / 2 up rows (load_tiles<..., true>), so each thread holds gate column
// c (fragment j) and up column c (fragment j + kBN / 16) of its rows and stores
// act = bf16(silu_times(gate, up)) — the values sum_silu_mul_kernel computes from the fp32 C of the
// plain GEMM, without C's round trip through memory (a 4,096-token V2-Lite layer: 277 MB written
// and read back).
template <bool kInvariant, bool kGlu>
__global__ void __launch_bounds__(kThreads, 1)
    bf16_wgmma_grouped_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                              const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Shape<kInvariant>;
  constexpr int kBM = S::kBM, kBN = S::kBN, kBK = S::kBK, kStages = S::kStages, kAcc = S::kAcc;
  constexpr int kOutN = kGlu ? kBN / 2 : kBN;  // output columns per tile
  extern __shared__ uint8_t bw_smem_raw[];
  uint8_t* smem = bw_smem_raw + ((1024 - smem_u32(bw_smem_raw) % 1024) % 1024);
  uint8_t* ring = smem;                                                        // [kStages][A | W]
  auto* full = reinterpret_cast<uint64_t*>(smem + kStages * S::kStageBytes);  // [kStages]
  uint64_t* empty = full + kStages;                                            // [kStages]
  auto* table = reinterpret_cast<int32_t*>(empty + kStages);                  // grouped: build_tile_table

  // wg through a shuffle from lane 0: warp-uniform to ptxas, so the stage descriptors stay in the
  // uniform datapath (cuda_fp8_wgmma.cu's compute_tiles; docs/perf.md version 21).
  const int t = threadIdx.x, wg = __shfl_sync(0xffffffffu, t / 128, 0), warp = t / 32, lane = t % 32;
  if (t == 0) init_ring(full, empty, kStages, 1, kMathGroups * 4);  // one release per math warp
  if (p.offsets != nullptr && warp == 0) build_tile_table(p.offsets, p.E, kBM, lane, table);
  __syncthreads();
  const int32_t* tiles = p.offsets != nullptr ? table : nullptr;
  if (wg == kMathGroups && warp != kMathGroups * 4) return;  // idle loader warps
  const int64_t n_col_tiles = (p.N + kOutN - 1) / kOutN, n_tiles = p.n_row_tiles * n_col_tiles, n_kb = p.n_kb;
  if (wg == kMathGroups) {  // the loader warp
    load_tiles<kBM, kBN, kBK, kGlu>(&map_a, &map_w, ring, full, empty, kStages, S::kStageBytes, S::kABytes,
                                    p.n_row_tiles, p.N, n_kb, tiles, p.E, p.M, 0, lane,
                                    [](int, const TileView&, int64_t) {});
    return;
  }

  uint32_t it = 0;  // K blocks this warp has consumed
  const uint64_t da0 = sw128_desc(ring + wg * 64 * 128), db0 = sw128_desc(ring + S::kABytes);  // stage 0's
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    TileView v;
    if (!resolve_tile<kBM, kOutN>(tile, p.n_row_tiles, n_col_tiles, tiles, p.E, p.M, &v)) continue;
    const int64_t m0 = v.m0, m_end = v.m_end, n0 = v.n0;
    float acc[kAcc];
    float total[kInvariant ? kAcc : 1];  // batch-invariant: the closed splits' sum
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    for (int64_t kb = 0; kb < n_kb; ++kb, ++it) {
      const int s = static_cast<int>(it % kStages);
      if constexpr (kInvariant) {
        if (kb > 0 && kb % kSplitKb == 0) {  // the end of a split: drain, add, restart from +0
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < kAcc; ++i) {
            fence_operand(acc[i]);
            total[i] = kb == kSplitKb ? acc[i] : __fadd_rn(total[i], acc[i]);
            acc[i] = 0.0f;
          }
        }
      }
      mbar_wait(&full[s], (it / kStages) & 1u);
      const auto off = static_cast<uint32_t>(s * (S::kStageBytes >> 4));  // the ring lies below 256 KB
      const uint64_t da = desc_advance(da0, off), db = desc_advance(db0, off);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) fence_operand(acc[i]);
      wgmma_fence();
      wgmma_k64<kAcc>(acc, da, db);
      wgmma_commit();
      wgmma_wait<1>();  // the previous K block's MMAs are done: release its stage
#pragma unroll
      for (int i = 0; i < kAcc; ++i) fence_operand(acc[i]);
      __syncwarp();
      if (kb > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) fence_operand(acc[i]);
    __syncwarp();
    if (n_kb > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
    if constexpr (kInvariant) {
      if (n_kb > kSplitKb)  // the last split joins the total
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = __fadd_rn(total[i], acc[i]);
    }

    const int64_t r0 = m0 + 64 * wg + 16 * (warp % 4) + lane / 4;
    if constexpr (kGlu) {  // gate column c at fragment i, up column c at i + 4·(kOutN / 8)
      for_each_acc_pair(kOutN / 8, n0, p.N, r0, m_end, lane, [&](int64_t row, int64_t col, int i) {
        const float a0 = silu_times(acc[i], acc[i + kOutN / 2]), a1 = silu_times(acc[i + 1], acc[i + 1 + kOutN / 2]);
        store_acc_pair(p.act + row * p.ldc + col, a0, a1, p.c_vec && col + 1 < p.N, col + 1 < p.N);
      });
    } else {
      for_each_acc_pair(kBN / 8, n0, p.N, r0, m_end, lane, [&](int64_t row, int64_t col, int i) {
        store_acc_pair(p.c + row * p.ldc + col, acc[i], acc[i + 1], p.c_vec && col + 1 < p.N, col + 1 < p.N);
      });
    }
  }
#else
  (void)Shape<kInvariant>::kAcc;
  (void)p;
  (void)kSplitKb;
  __trap();  // built for another architecture: bf16_wgmma_grouped_ok() is false there
#endif
}

// C (fp32) or, kGlu, act (bf16, N = I output columns from W's 2I rows per expert).
template <bool kInvariant, bool kGlu>
void launch(const bf16* A, int64_t R, int64_t K, const bf16* W, int64_t N, const int32_t* offsets, int64_t E, float* C,
            bf16* act, int64_t ldc, cudaStream_t s) {
  using S = Shape<kInvariant>;
  constexpr int kOutN = kGlu ? S::kBN / 2 : S::kBN;
  Params p{};
  p.M = R;
  p.N = N;
  p.n_kb = (K + S::kBK - 1) / S::kBK;
  // Grouped: the bound ceil(R / 128) + min(E, R); dense (offsets null, resolve_tile's dense rows):
  // exactly ceil(R / 128).
  p.n_row_tiles = (R + S::kBM - 1) / S::kBM + (offsets != nullptr ? std::min(E, R) : 0);
  p.c = C;
  p.act = act;
  p.ldc = ldc;
  p.c_vec = ldc % 2 == 0 && (kGlu ? reinterpret_cast<uintptr_t>(act) % 4 : reinterpret_cast<uintptr_t>(C) % 8) == 0;
  p.offsets = offsets;
  p.E = E;
  const CUtensorMap ma = tensor_map_2d(A, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, R, K, S::kBK, S::kBM);
  const int64_t w_rows = E * N * (kGlu ? 2 : 1);
  const CUtensorMap mw = tensor_map_2d(W, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w_rows, K, S::kBK, kOutN);
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(bf16_wgmma_grouped_kernel<kInvariant, kGlu>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_bytes<kInvariant>())));
  });
  const int64_t n_tiles = p.n_row_tiles * ((N + kOutN - 1) / kOutN);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(n_tiles, sm_count())));  // persistent
  bf16_wgmma_grouped_kernel<kInvariant, kGlu><<<grid, kThreads, smem_bytes<kInvariant>(), s>>>(ma, mw, p);
  DI_CUDA_LAUNCHED();
}

}  // namespace

bool bf16_wgmma_grouped_ok(int64_t K) { return K % 8 == 0 && K > 0 && fp8_wgmma_available(); }
bool bf16_wgmma_invariant_ok(int64_t K) { return K % 64 == 0 && bf16_wgmma_grouped_ok(K); }

namespace {
// The entry points' preconditions (w_rows: W's rows, E·N or E·2I; grouped: offsets given);
// false: nothing to compute.
bool check_args(int64_t R, int64_t K, int64_t N, int64_t w_rows, bool grouped, const int32_t* offsets, int64_t E,
                int64_t ld, bool invariant) {
  DI_CUDA_REQUIRE_MSG(bf16_wgmma_grouped_ok(K), "bf16 wgmma GEMM: needs an sm_90 GPU and K % 8 == 0");
  DI_CUDA_REQUIRE_MSG(!invariant || bf16_wgmma_invariant_ok(K),
                      "bf16 wgmma GEMM: the invariant form needs K % 64 == 0");
  DI_CUDA_REQUIRE((!grouped || offsets != nullptr) && E >= 1 && ld >= N);
  DI_CUDA_REQUIRE_MSG(!grouped || E <= kMaxTableExperts, "bf16 wgmma GEMM: too many experts");
  DI_CUDA_REQUIRE_MSG(R + 128 < (int64_t{1} << 31) && w_rows < (int64_t{1} << 31), "bf16 wgmma GEMM: too many rows");
  return R > 0 && N > 0;
}
}  // namespace

void bf16_wgmma_grouped_gemm(const bf16* A, int64_t R, int64_t K, const bf16* W, int64_t N, const int32_t* offsets,
                             int64_t E, float* C, int64_t ldc, cudaStream_t s, bool invariant) {
  if (!check_args(R, K, N, E * N, true, offsets, E, ldc, invariant)) return;
  if (invariant) launch<true, false>(A, R, K, W, N, offsets, E, C, nullptr, ldc, s);
  else launch<false, false>(A, R, K, W, N, offsets, E, C, nullptr, ldc, s);
}

void bf16_wgmma_grouped_glu(const bf16* A, int64_t R, int64_t K, const bf16* W13, int64_t I, const int32_t* offsets,
                            int64_t E, bf16* act, int64_t ld_act, cudaStream_t s, bool invariant) {
  if (!check_args(R, K, I, 2 * E * I, true, offsets, E, ld_act, invariant)) return;
  if (invariant) launch<true, true>(A, R, K, W13, I, offsets, E, nullptr, act, ld_act, s);
  else launch<false, true>(A, R, K, W13, I, offsets, E, nullptr, act, ld_act, s);
}

void bf16_wgmma_dense_gemm(const bf16* A, int64_t M, int64_t K, const bf16* W, int64_t N, float* C, int64_t ldc,
                           cudaStream_t s, bool invariant) {
  if (!check_args(M, K, N, N, false, nullptr, 1, ldc, invariant)) return;
  if (invariant) launch<true, false>(A, M, K, W, N, nullptr, 1, C, nullptr, ldc, s);
  else launch<false, false>(A, M, K, W, N, nullptr, 1, C, nullptr, ldc, s);
}

}  // namespace deepinfer::cuda
