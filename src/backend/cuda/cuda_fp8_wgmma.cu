// FP8 (e4m3) block-scaled GEMM on Hopper's warpgroup MMA (sm_90a): the large-M form of the GEMM in
// cuda_fp8_gemm.cu, with the same semantics (1×128 activation groups, 128×128 weight blocks,
// per-K-block fp32 promotion) — dense and grouped (MoE). Owns: the TMA + mbarrier pipeline, the
// wgmma tile kernel, the tensor-map encoding. Does not own: dispatch by size (fp8_gemm /
// fp8_grouped_gemm pick it), split-K, block_n = 1 scales, or batch invariance (its MMA order
// differs from the mma.sync variants', so it is never used in the batch-invariant mode).
// Why wgmma: on sm_90a ptxas lowers mma.sync .e4m3 to an fp8 → fp16 unpack plus an fp16 HMMA
// (~200 TFLOP/s); wgmma .e4m3 runs at the FP8 rate (≈1,435 TFLOP/s measured on the H200).
#include <cuda.h>  // CUtensorMap and its enums (the encoder is fetched through the runtime)
#include <cudaTypedefs.h>

#include <mutex>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_grouped_tile.cuh"
#include "backend/cuda/cuda_ptx.cuh"

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
constexpr size_t kSmemBytes = kStages * kStageBytes + 2 * kStages * sizeof(uint64_t) + 4 * kWarps * sizeof(int64_t) + 1024;

struct WgmmaParams {
  const float* sa;  // [M, n_kb] fp32
  const float* sw;  // [E·ceil(N/128), n_kb] fp32 (dense: E = 1)
  int64_t M, N, n_kb;
  int64_t n_row_tiles;  // dense: ceil(M / 128); grouped: the bound ceil(M / 128) + min(E, M)
  void* c;  // [M, ldc] OutT
  int64_t ldc;
  bool c_vec;  // column pairs stored as one vector (ldc even, c 8-byte aligned)
  const int32_t* offsets;  // grouped: [E + 1]
  int64_t E;
};

// ---- PTX: mbarriers, TMA, wgmma (sm_90a) ----------------------------------------------------------
// Compiled for the sm_90a target only (the sm_100a pass and the host pass skip them).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
// The arrival that also announces `bytes` of TMA traffic the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Spins until the phase with parity `parity` has completed (a fresh barrier counts its phase
// "−1", parity 1, as completed: producers start waiting on parity 1 of the empty barriers).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
// box of the 2-D tensor map at (x = K element, y = row) → dst, completing `bytes` on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int32_t x, int32_t y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y)
      : "memory");
}
// A shared-memory matrix descriptor for a K-major tile of 128-byte rows written by TMA with the
// 128-byte swizzle: start address >> 4 (bits 0–13), leading offset unused for this layout (1),
// stride between 8-row groups 1024 bytes (bits 32–45), swizzle mode 1 = 128B (bits 62–63). The
// K step inside a row is taken by adding its byte offset >> 4 to the start address.
__device__ __forceinline__ uint64_t sw128_desc(const void* tile) {
  const uint64_t addr = smem_u32(tile);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending of this warp's committed wgmma groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMA.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// d[64×64] fp32 (+)= A[64×32] e4m3 · B[64×32]ᵀ e4m3, both K-major in shared memory; accumulate = 0
// overwrites d. Fragment: thread t of the warpgroup (warp w, lane l) holds d[4j + v] = row
// 16w + l/4 + 8·(v/2), column 8j + 2·(l%4) + v%2.
__device__ __forceinline__ void wgmma_m64n64k32(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The output tile `tile` of a persistent block: row tile and column tile, rastered in groups of
// kGroupRows row tiles, column by column inside a group, so the blocks resident at once share a
// few A row tiles and a band of W column tiles in L2 (row-major order would stream all of W
// through L2 once per row tile).
constexpr int64_t kGroupRows = 8;
__device__ __forceinline__ void tile_coords(int64_t tile, int64_t n_row_tiles, int64_t n_col_tiles, int64_t* rt,
                                            int64_t* ct) {
  const int64_t group = tile / (kGroupRows * n_col_tiles), first = group * kGroupRows;
  const int64_t rows = min(kGroupRows, n_row_tiles - first), in_group = tile - first * n_col_tiles;
  *rt = first + in_group % rows;
  *ct = in_group / rows;
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
// this one. Each math warpgroup computes its 64 rows as two 64-column halves: per half and K
// block, four m64n64k32 wgmmas over the stage's 128-wide K (the first overwrites the half's
// partial sum) in one commit group, then the promotion acc = fmaf(part, sa·sw, acc) —
// DeepGEMM's, in K-block order (deterministic: a tile's result does not depend on which block
// computes it). The halves are staggered (see the loop) so the tensor cores always have queued
// MMAs while a half is promoted; a stage is released (one arrival per warp) once both halves of
// its K block are done. Scales are read from global memory one K block ahead.
// Shared memory: kStages × (A [kBM][128] | W [kBN][128]) e4m3 — rows of 128 bytes, 16-byte chunk c
// of row r at chunk c ^ (r % 8) (TMA's 128-byte swizzle, which wgmma's descriptor reads) —
// full[kStages], empty[kStages] mbarriers, per-warp tile info; ~194 KB: one block per SM.
// Rows past M (and K past K, columns past the tensor) are zero-filled by TMA; a grouped tile's
// rows past its expert belong to the next one and are computed but not stored. Only in-range
// outputs are written. Preconditions: sm_90a, K % 16 == 0, block_n = 128.
template <bool kGrouped, typename OutT>
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

  const int t = threadIdx.x, wg = t / 128, warp = t / 32, lane = t % 32;
  if (t == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);                 // the loader's arrival (+ the TMA bytes)
      mbar_init(&empty[s], kMathGroups * 4);  // one arrival per math warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wg == kMathGroups && warp != kMathGroups * 4) return;  // idle loader warps
  const int64_t n_col_tiles = (p.N + kBN - 1) / kBN, n_tiles = p.n_row_tiles * n_col_tiles, n_kb = p.n_kb;
  int64_t* my_info = info + 4 * warp;
  // This warp's view of tile `tile`: false when it is past the last grouped tile.
  auto resolve = [&](int64_t tile, int64_t* e, int64_t* m0, int64_t* m_end, int64_t* n0) {
    int64_t rt, ct;
    tile_coords(tile, p.n_row_tiles, n_col_tiles, &rt, &ct);
    *n0 = ct * kBN;
    if constexpr (kGrouped) {
      grouped_tile(rt, p.offsets, p.E, kBM, lane, my_info);
      __syncwarp();
      *e = my_info[0];
      *m0 = my_info[1];
      *m_end = *m0 + my_info[2];
      __syncwarp();  // read before the next tile's grouped_tile writes
      return *e >= 0;
    } else {
      *e = 0;
      *m0 = rt * kBM;
      *m_end = p.M;
      return true;
    }
  };

  uint32_t it = 0;  // K blocks this warp has produced or consumed
  if (wg == kMathGroups) {  // the loader warp; lane 0 issues
    for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
      int64_t e, m0, m_end, n0;
      if (!resolve(tile, &e, &m0, &m_end, &n0)) continue;
      const int32_t y_a = static_cast<int32_t>(m0), y_w = static_cast<int32_t>(e * p.N + n0);
      for (int64_t kb = 0; kb < n_kb; ++kb, ++it) {
        const int s = static_cast<int>(it % kStages);
        if (lane == 0) {
          mbar_wait(&empty[s], ((it / kStages) & 1u) ^ 1u);
          mbar_arrive_expect_tx(&full[s], kStageBytes);
          uint8_t* stage = ring + s * kStageBytes;
          const int32_t x = static_cast<int32_t>(kb * kBK);
          tma_load_2d(stage, &map_a, x, y_a, &full[s]);
          tma_load_2d(stage + kTileBytes, &map_w, x, y_w, &full[s]);
        }
      }
    }
    return;
  }

  OutT* c = static_cast<OutT*>(p.c);
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    int64_t e, m0, m_end, n0;
    if (!resolve(tile, &e, &m0, &m_end, &n0)) continue;
    // Rows r0 = m0 + 64·wg + 16·(warp % 4) + lane / 4 and r0 + 8 of this tile.
    const int64_t r0 = m0 + 64 * wg + 16 * (warp % 4) + lane / 4, r1 = r0 + 8;
    const float* sa0 = p.sa + (r0 < p.M ? r0 : 0) * n_kb;  // rows past M read row 0's scales (not stored)
    const float* sa1 = p.sa + (r1 < p.M ? r1 : 0) * n_kb;
    const float* swp = p.sw + (e * n_col_tiles + n0 / kBN) * n_kb;
    // Two 64-column halves of the tile, each with its own partial sum (pa, pb) and commit group,
    // so half 1's promotion overlaps the next K block's half-0 MMAs on the tensor cores. Order per
    // K block kb: wait for both halves, release the stage, promote half 0, issue half 0 of kb + 1,
    // promote half 1, issue half 1 of kb + 1.
    float acc[64], pa[32], pb[32];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) pa[i] = pb[i] = 0.0f;
    // Issues the four k32 MMAs of half h (B rows 64h..64h+63) of the K block in stage s.
    auto issue = [&](float (&d)[32], int s, int h) {
      const uint8_t* stage = ring + s * kStageBytes;
      const uint64_t da = sw128_desc(stage + wg * 64 * kBK), db = sw128_desc(stage + kTileBytes + h * 64 * kBK);
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_operand(d[i]);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kBK / 32; ++k) wgmma_m64n64k32(d, da + 2 * k, db + 2 * k, k);  // +32 bytes of K
      wgmma_commit();
    };
    // acc[32h + i] += part[i] · (sa·sw of the row), for half h.
    auto promote = [&](const float (&d)[32], int h, float s0, float s1) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc[32 * h + 4 * j + 0] = fmaf(d[4 * j + 0], s0, acc[32 * h + 4 * j + 0]);
        acc[32 * h + 4 * j + 1] = fmaf(d[4 * j + 1], s0, acc[32 * h + 4 * j + 1]);
        acc[32 * h + 4 * j + 2] = fmaf(d[4 * j + 2], s1, acc[32 * h + 4 * j + 2]);
        acc[32 * h + 4 * j + 3] = fmaf(d[4 * j + 3], s1, acc[32 * h + 4 * j + 3]);
      }
    };
    float s0 = sa0[0] * swp[0], s1 = sa1[0] * swp[0];  // this K block's row scales (sa·sw)
    mbar_wait(&full[it % kStages], (it / kStages) & 1u);
    issue(pa, static_cast<int>(it % kStages), 0);
    issue(pb, static_cast<int>(it % kStages), 1);
    // K blocks 0 .. n_kb − 2: each issues the next block's halves behind its own.
    for (int64_t kb = 0; kb + 1 < n_kb; ++kb, ++it) {
      const int s = static_cast<int>(it % kStages), s_next = static_cast<int>((it + 1) % kStages);
      const float next0 = sa0[kb + 1] * swp[kb + 1], next1 = sa1[kb + 1] * swp[kb + 1];  // loads issued early
      // Both halves of kb done. (Waiting for half 0 only — one group left pending — would let
      // half 0's promotion overlap too, but ptxas then serializes every wgmma: it cannot tell
      // which group a wait retires across the loop's back edge.)
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_operand(pa[i]), fence_operand(pb[i]);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);  // both halves of kb have read the stage
      promote(pa, 0, s0, s1);
      mbar_wait(&full[s_next], ((it + 1) / kStages) & 1u);
      issue(pa, s_next, 0);
      promote(pb, 1, s0, s1);  // overlaps half 0 of kb + 1 on the tensor cores
      issue(pb, s_next, 1);
      s0 = next0;
      s1 = next1;
    }
    {  // the last K block
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) fence_operand(pa[i]), fence_operand(pb[i]);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[it % kStages]);
      promote(pa, 0, s0, s1);
      promote(pb, 1, s0, s1);
      ++it;
    }

#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int64_t col = n0 + 8 * j + 2 * (lane % 4);
      if (col >= p.N) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = h == 0 ? r0 : r1;
        if (row >= m_end) continue;
        const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
        OutT* dst = c + row * p.ldc + col;
        if (p.c_vec && col + 1 < p.N) {
          if constexpr (sizeof(OutT) == 4) *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          else *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
        } else {
          dst[0] = static_cast<OutT>(v0);
          if (col + 1 < p.N) dst[1] = static_cast<OutT>(v1);
        }
      }
    }
  }
#else
  __trap();  // built for another architecture: fp8_wgmma_available() is false there
#endif
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    DI_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    DI_CUDA_REQUIRE_MSG(q == cudaDriverEntryPointSuccess && f != nullptr,
                        "fp8 wgmma GEMM: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A [rows, K] e4m3 row-major matrix as a TMA map of 128 × 128-byte boxes, 128-byte swizzle;
// out-of-range boxes read zeros.
CUtensorMap e4m3_map(const uint8_t* base, int64_t rows, int64_t K) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K)};  // bytes between rows
  const cuuint32_t box[2] = {kBK, kBM};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(base), dims,
                                          strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DI_CUDA_REQUIRE_MSG(r == CUDA_SUCCESS, "fp8 wgmma GEMM: cuTensorMapEncodeTiled rejected the operand");
  return map;
}

template <bool kGrouped, typename OutT>
void launch(const CUtensorMap& ma, const CUtensorMap& mw, const WgmmaParams& p, dim3 grid, cudaStream_t s) {
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fp8_wgmma_kernel<kGrouped, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmemBytes)));
  });
  fp8_wgmma_kernel<kGrouped, OutT><<<grid, kThreads, kSmemBytes, s>>>(ma, mw, p);
  DI_CUDA_LAUNCHED();
}

}  // namespace

bool fp8_wgmma_available() {
  static const bool ok = [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
    return prop.major == 9 && prop.minor == 0;  // sm_90a code is in the binary (CMakeLists.txt)
  }();
  return ok;
}

void fp8_wgmma_gemm(const Fp8GemmArgs& a, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(fp8_wgmma_available(), "fp8 wgmma GEMM: needs an sm_90 GPU");
  DI_CUDA_REQUIRE_MSG(a.block_n == 128, "fp8 wgmma GEMM: needs 128×128 weight scale blocks");
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
  const bool f32 = a.c_elem == Elem::kF32;
  if (grouped) {
    if (f32) launch<true, float>(ma, mw, p, grid, s);
    else launch<true, bf16>(ma, mw, p, grid, s);
  } else {
    if (f32) launch<false, float>(ma, mw, p, grid, s);
    else launch<false, bf16>(ma, mw, p, grid, s);
  }
}

}  // namespace deepinfer::cuda
