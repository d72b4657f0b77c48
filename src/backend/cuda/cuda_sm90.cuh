// Hopper (sm_90a) building blocks of the TMA + wgmma kernels (.cu files only): mbarriers, 2-D TMA
// loads, shared-memory matrix descriptors for the 128-byte swizzle, wgmma fences and waits, the
// persistent tile raster and loader, and the host-side tensor-map encoding. The device helpers exist only
// in the sm_90a pass (the sm_100a and host passes skip them: their kernels trap there).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (the encoder is fetched through the runtime)
#include <cudaTypedefs.h>

#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_grouped_tile.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace deepinfer::cuda {

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
// `bytes` (a multiple of 16; src and dst 16-byte aligned) global → shared by the TMA unit as one
// bulk copy, completing `bytes` of transaction count on bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// ---- 2-CTA clusters (the FP8 wgmma GEMM's A-tile multicast) ----
// A 1-D grid launched with cluster dimension (n, 1, 1) groups blocks n·c .. n·c + n − 1 into
// cluster c; a block's rank in its cluster is blockIdx.x % n.
// Every thread of every block of the cluster arrives and waits (release / acquire at cluster
// scope): the cluster's barriers initialized before any peer signals them, and no block exits
// while a peer may still write its shared memory.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// An arrival on the mbarrier at bar's offset in the shared memory of cluster block `rank`, with
// the arrive's default (CTA-scope) release, as CUTLASS's ClusterBarrier::arrive does: a stage
// release orders only this block's reads of its own stage before the peer's multicast refills it
// (a cluster-scope release costs a fence per arrival: run s13-3 measured the GEMM at half rate).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}
// An arrival on bar once every cp.async this thread has issued so far has landed (.noinc: the
// arrival is one of those the barrier was initialized to expect).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (whole warps).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// box of the 2-D tensor map at (x = K element, y = row) → dst, completing `bytes` on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int32_t x, int32_t y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y)
      : "memory");
}
// tma_load_2d into the same shared-memory offset of every cluster block in cta_mask, each
// completing the box's bytes on its own mbarrier at bar's offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int32_t x, int32_t y,
                                                      uint64_t* bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(x), "r"(y), "h"(cta_mask)
      : "memory");
}
// The box of the 2-D tensor map at (x = column, y = row) ← src (the box as TMA lays it out in
// shared memory, swizzle included), as one bulk group of this thread; boxes past the tensor's
// bounds are not written. Before the store, every thread that wrote src must have run
// fence_proxy_async() and synchronized with this one.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int32_t x, int32_t y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(x), "r"(y)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until this thread's bulk groups have finished reading shared memory (the source may be
// overwritten) — kRead — or have completed.
template <bool kRead>
__device__ __forceinline__ void bulk_wait_all() {
  if constexpr (kRead) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (TMA).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// A shared-memory matrix descriptor for a K-major tile of 128-byte rows written by TMA with the
// 128-byte swizzle: start address >> 4 (bits 0–13), leading offset unused for this layout (1),
// stride between 8-row groups 1024 bytes (bits 32–45), swizzle mode 1 = 128B (bits 62–63). The
// K step inside a row is taken by adding its byte offset >> 4 to the start address.
__device__ __forceinline__ uint64_t sw128_desc(const void* tile) {
  const uint64_t addr = smem_u32(tile);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
// desc with `units` (16-byte units) added to its start address in 32-bit arithmetic: where the
// field cannot carry out of its low word (a tile 1024-byte aligned, steps inside its 128-byte
// rows), the same bits as desc + units without the 64-bit add and its carry (two dependent
// instructions ahead of each wgmma's descriptor moves into uniform registers).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t units) {
  return (desc & 0xffffffff00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + units);
}
// A descriptor for an MN-major operand (B of K × N, N contiguous: 128-byte rows of 64 bf16 along
// N, one row per k) written by TMA with the 128-byte swizzle as column blocks of 64 N-elements:
// the k rows of a block 128 bytes apart in 1024-byte groups of 8 (stride offset), the blocks
// `block_bytes` apart (leading offset). A k16 step is 2048 bytes further.
__device__ __forceinline__ uint64_t sw128_desc_mn(const void* tile, uint32_t block_bytes) {
  const uint64_t addr = smem_u32(tile);
  return ((addr & 0x3ffff) >> 4) | (uint64_t{(block_bytes >> 4) & 0x3fff} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
// The wgmma wrappers' inline-asm pieces (cuda_bf16_wgmma.cu, cuda_fp8_wgmma.cu): the placeholders
// of the first 64 (and the next 64) accumulator registers, and the "+f" operand list of 8 or 64
// consecutive fp32 accumulators d[o] ...
#define DI_WGMMA_REGS64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, " \
  "%8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define DI_WGMMA_REGS64_HI \
  "%64, %65, %66, %67, %68, %69, %70, %71, " \
  "%72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, " \
  "%88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, " \
  "%104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, " \
  "%120, %121, %122, %123, %124, %125, %126, %127"
#define DI_WGMMA_ACC8(d, o)                                                                                \
  "+f"(d[(o)]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), "+f"(d[(o) + 5]), \
      "+f"(d[(o) + 6]), "+f"(d[(o) + 7])
#define DI_WGMMA_ACC64(d, o)                                                                                   \
  DI_WGMMA_ACC8(d, (o)), DI_WGMMA_ACC8(d, (o) + 8), DI_WGMMA_ACC8(d, (o) + 16), DI_WGMMA_ACC8(d, (o) + 24),       \
      DI_WGMMA_ACC8(d, (o) + 32), DI_WGMMA_ACC8(d, (o) + 40), DI_WGMMA_ACC8(d, (o) + 48), DI_WGMMA_ACC8(d, (o) + 56)

// d[64×64] fp32 (+)= A[64×32] e4m3 · B[64×32]ᵀ e4m3, both K-major in shared memory (128-byte
// swizzle); accumulate = 0 overwrites d. d[4j + v]: row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4)
// + v%2 (warp w of the warpgroup, lane l), j < 8. (cuda_moe_one_w8a8.cu; cuda_fp8_wgmma.cu's
// narrow tiles.)
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
               : DI_WGMMA_ACC8(d, 0), DI_WGMMA_ACC8(d, 8), DI_WGMMA_ACC8(d, 16), DI_WGMMA_ACC8(d, 24)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// d[64×128] fp32 += A[64×16] bf16 · B[128×16]ᵀ bf16, both K-major in shared memory (no
// transpose); accumulate = 0 overwrites d. Fragment: thread t of the warpgroup (warp w, lane l)
// holds d[4j + v] = row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4) + v%2, j < 32.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                      int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" DI_WGMMA_REGS64 "}, "
               "%64, %65, p, 1, 1, 0, 0;\n}\n"
               : DI_WGMMA_ACC64(d, 0)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// d[64×128] fp32 += A[64×16] · B[16×128], A bf16 from registers, B bf16 MN-major in shared memory
// (sw128_desc_mn; the transpose bit set). A's fragment is mma.sync m16n8k16's per warp: warp w,
// lane l holds a[0] = row 16w + l/4, columns 2·(l%4), +1; a[1] the same 8 rows further; a[2] and
// a[3] those of columns 8 + 2·(l%4), +1. d as wgmma_m64n128k16_bf16.
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                         int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" DI_WGMMA_REGS64 "}, "
               "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
               : DI_WGMMA_ACC64(d, 0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// Warpgroup-collective register reallocation (every thread of the warpgroup executes it): the
// loader warpgroup gives registers back (dec), the math warpgroups take them (inc), so math code
// may hold more than the launch's per-thread share (65,536 / threads). kRegs: a multiple of 8 in
// [24, 256]; the block's total must stay within the registers the launch reserved.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
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

// The stores of a math warpgroup's wgmma accumulators (d[4j + v]: row r0 + 8·(v / 2), column
// n0 + 8j + 2·(lane % 4) + v % 2): for each of the n_groups 8-column groups j and h = 0, 1, the
// thread's column pair (col, col + 1) of row r0 + 8h calls fn(row, col, i) — d[i], d[i + 1] its
// two values — skipping col ≥ N and row ≥ m_end.
template <typename Fn>
__device__ __forceinline__ void for_each_acc_pair(int n_groups, int64_t n0, int64_t N, int64_t r0, int64_t m_end,
                                                  int lane, Fn&& fn) {
#pragma unroll
  for (int j = 0; j < n_groups; ++j) {
    const int64_t col = n0 + 8 * j + 2 * (lane % 4);
    if (col >= N) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = h == 0 ? r0 : r0 + 8;
      if (row >= m_end) continue;
      fn(row, col, 4 * j + 2 * h);
    }
  }
}
// dst[0..1] = (v0, v1) as OutT (fp32 or bf16): one paired store when `pair` (both columns valid
// and dst aligned for it), else dst[0] and, when has_second, dst[1].
template <typename OutT>
__device__ __forceinline__ void store_acc_pair(OutT* dst, float v0, float v1, bool pair, bool has_second) {
  if (pair) {
    if constexpr (sizeof(OutT) == 4) *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    else *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
  } else {
    dst[0] = static_cast<OutT>(v0);
    if (has_second) dst[1] = static_cast<OutT>(v1);
  }
}

// The ring's barriers: full[s] completes when the loader's n_loads arrivals and its TMA bytes are
// in, empty[s] when each of the n_consumers math warps has released the stage. Thread 0
// initializes; every thread of the block must then pass a __syncthreads before using them.
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, int stages, uint32_t n_loads,
                                          uint32_t n_consumers) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(&full[s], n_loads);
    mbar_init(&empty[s], n_consumers);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One output tile of a persistent GEMM as a warp sees it: expert e, rows [m0, m_end) (a grouped
// tile's rows stop at its expert's end; dense: at M), columns from n0.
struct TileView {
  int64_t e, m0, m_end, n0;
};
// Tile `tile` of kBM-row, kBN-column tiles (tile_coords raster): dense (table null) row tile rt
// of [0, M), or the rt-th grouped tile (table: the block's build_tile_table copy in shared
// memory, cuda_grouped_tile.cuh). False past the last grouped tile.
// kClusterN > 1: `tile` counts cluster tiles of one row tile × kClusterN column tiles (the raster
// over ceil(n_col_tiles / kClusterN) column groups); cluster block `rank` takes column tile
// kClusterN·group + rank, which may lie past the last column tile (n0 ≥ N: nothing to store).
template <int kBM, int kBN, int kClusterN = 1>
__device__ __forceinline__ bool resolve_tile(int64_t tile, int64_t n_row_tiles, int64_t n_col_tiles,
                                             const int32_t* table, int64_t E, int64_t M, TileView* v, int rank = 0) {
  int64_t rt, ct;
  tile_coords(tile, n_row_tiles, (n_col_tiles + kClusterN - 1) / kClusterN, &rt, &ct);
  v->n0 = (ct * kClusterN + rank) * kBN;
  if (table == nullptr) {
    v->e = 0;
    v->m0 = rt * kBM;
    v->m_end = M;
    return true;
  }
  return table_tile(table, E, kBM, rt, &v->e, &v->m0, &v->m_end);
}

// The loader warp of a persistent GEMM: for each of this block's tiles (as resolve_tile sees
// them) and each kBK-wide K block — the it-th overall, stage it % stages — lane 0 waits until
// the stage is free, announces stage_bytes on full[s] and TMA-loads the A box at (kb·kBK, m0) and
// the W box at (kb·kBK, e·N + n0) (w_offset bytes into the stage). kGlu: N output columns per
// expert from W's 2N rows (gate rows, then up rows), tiles of kBN / 2 output columns, and the W
// stage as two kBN / 2-row boxes — gate rows e·2N + n0.., then up rows e·2N + N + n0.. Then the
// whole warp runs extra(s, tile, kb) — more per-stage data, which must end with one more arrival
// on full[s] when init_ring counted one — or nothing. The whole warp walks the tiles (grouped:
// `table` as resolve_tile takes it).
// kClusterN > 1 (a 1-D grid of clusters of kClusterN blocks that share each A tile): the blocks
// of cluster c take cluster tiles c, c + gridDim.x / kClusterN, … (resolve_tile's cluster raster:
// the same row tile, so the same K blocks in the same stages), and block `rank` loads only A rows
// rank·kBM / kClusterN .. of the tile, multicast into every block of the cluster (map_a's box is
// kBM / kClusterN rows of 128 bytes); each block's full[s] still receives stage_bytes. empty[s]
// must count the releases of every block's math warps (a load overwrites the peers' stage too).
// w_ready: the first w_ready K blocks (it < w_ready, all of the block's first tile) were
// announced and their W boxes issued already (prefetch_first_w, before the PDL wait); only their
// A boxes (and extra) remain.
template <int kBM, int kBN, int kBK, bool kGlu = false, int kClusterN = 1, typename Extra>
__device__ __forceinline__ void load_tiles(const CUtensorMap* map_a, const CUtensorMap* map_w, uint8_t* ring,
                                           uint64_t* full, uint64_t* empty, int stages, int stage_bytes, int w_offset,
                                           int64_t n_row_tiles, int64_t N, int64_t n_kb, const int32_t* table,
                                           int64_t E, int64_t M, int w_ready, int lane, Extra&& extra) {
  constexpr int kOutN = kGlu ? kBN / 2 : kBN;
  constexpr int kShareRows = kBM / kClusterN;  // A rows this block loads for the cluster
  const int rank = static_cast<int>(blockIdx.x % kClusterN);
  const int64_t n_col_tiles = (N + kOutN - 1) / kOutN;
  const int64_t n_tiles = n_row_tiles * ((n_col_tiles + kClusterN - 1) / kClusterN);
  uint32_t it = 0;
  for (int64_t tile = blockIdx.x / kClusterN; tile < n_tiles; tile += gridDim.x / kClusterN) {
    TileView v;
    if (!resolve_tile<kBM, kOutN, kClusterN>(tile, n_row_tiles, n_col_tiles, table, E, M, &v, rank)) continue;
    const int32_t y_a = static_cast<int32_t>(v.m0);
    const int32_t y_w = static_cast<int32_t>(v.e * (kGlu ? 2 * N : N) + v.n0);
    for (int64_t kb = 0; kb < n_kb; ++kb, ++it) {
      const int s = static_cast<int>(it % stages);
      if (lane == 0) mbar_wait(&empty[s], ((it / stages) & 1u) ^ 1u);
      __syncwarp();  // the stage is free for every lane
      if (lane == 0) {
        const bool w_done = it < static_cast<uint32_t>(w_ready);
        if (!w_done) mbar_arrive_expect_tx(&full[s], stage_bytes);
        uint8_t* stage = ring + s * stage_bytes;
        const int32_t x = static_cast<int32_t>(kb * kBK);
        if constexpr (kClusterN == 1) {
          tma_load_2d(stage, map_a, x, y_a, &full[s]);
        } else {
          tma_load_2d_multicast(stage + rank * kShareRows * 128, map_a, x, y_a + rank * kShareRows, &full[s],
                                static_cast<uint16_t>((1u << kClusterN) - 1));
        }
        if (!w_done) tma_load_2d(stage + w_offset, map_w, x, y_w, &full[s]);
        if constexpr (kGlu)
          tma_load_2d(stage + w_offset + kOutN * 128, map_w, x, y_w + static_cast<int32_t>(N), &full[s]);  // 128-B rows
      }
      extra(s, v, kb);
    }
  }
}

// The weights of a dense (table null), one-block-cluster, non-GLU load_tiles' first tile, fetched
// ahead: lane 0 announces stage_bytes on full[s] and issues the W box of K block s for s <
// min(stages, n_kb) — W only, so this may run before the PDL wait when W is never written by a
// kernel (cuda_launch.cuh). Returns the count for load_tiles' w_ready (0: the block has no tile).
// The ring's barriers must be initialized and visible first.
template <int kBM, int kBN, int kBK>
__device__ __forceinline__ int prefetch_first_w(const CUtensorMap* map_w, uint8_t* ring, uint64_t* full, int stages,
                                                int stage_bytes, int w_offset, int64_t n_row_tiles, int64_t N,
                                                int64_t n_kb, int64_t M, int lane) {
  const int64_t n_col_tiles = (N + kBN - 1) / kBN;
  if (static_cast<int64_t>(blockIdx.x) >= n_row_tiles * n_col_tiles) return 0;
  TileView v;
  resolve_tile<kBM, kBN, 1>(blockIdx.x, n_row_tiles, n_col_tiles, nullptr, 1, M, &v);
  const int n = static_cast<int>(n_kb < stages ? n_kb : stages);
  if (lane == 0) {
    for (int s = 0; s < n; ++s) {
      mbar_arrive_expect_tx(&full[s], stage_bytes);
      tma_load_2d(ring + s * stage_bytes + w_offset, map_w, s * kBK, static_cast<int32_t>(v.n0), &full[s]);
    }
  }
  return n;
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    DI_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    DI_CUDA_REQUIRE_MSG(q == cudaDriverEntryPointSuccess && f != nullptr,
                        "wgmma GEMM: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A row-major [rows, cols] matrix of elem_bytes-wide elements as a TMA map of box_rows ×
// box_cols boxes with the 128-byte swizzle (box_cols · elem_bytes must be 128); out-of-range
// boxes read zeros. Preconditions (checked by the encoder): base 16-byte aligned, row pitch a
// multiple of 16 bytes.
// tensor_map_2d_strided: the same for a [rows, cols] view of a matrix whose rows lie `pitch`
// elements apart (pitch · elem_bytes a multiple of 16).
inline CUtensorMap tensor_map_2d_strided(const void* base, CUtensorMapDataType type, int64_t elem_bytes, int64_t rows,
                                         int64_t cols, int64_t pitch, int box_cols, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(pitch * elem_bytes)};  // bytes between rows
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DI_CUDA_REQUIRE_MSG(r == CUDA_SUCCESS, "wgmma GEMM: cuTensorMapEncodeTiled rejected the operand");
  return map;
}
// A row-major [rows, K] e4m3 matrix (K % 128 == 0) as a 3-D TMA map whose box is box_rows rows of
// box_kb 128-wide K blocks, landing in shared memory as [box_kb][box_rows][128] with the 128-byte
// swizzle — each K block's tile of wgmma's B operand, box_kb of them in one copy (K blocks past
// the matrix read zeros): dims {128, rows, K / 128}, strides {K, 128} bytes (the K blocks'
// stride under the rows'). False where the driver rejects the view (then: a 2-D map, a box per
// K block). box_rows, box_kb ≤ 256.
inline bool tensor_map_kblocks(CUtensorMap* map, const void* base, int64_t rows, int64_t K, int box_rows, int box_kb) {
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(K / 128)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(K), 128};
  const cuuint32_t box[3] = {128, static_cast<cuuint32_t>(box_rows), static_cast<cuuint32_t>(box_kb)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return tensor_map_encoder()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
inline CUtensorMap tensor_map_2d(const void* base, CUtensorMapDataType type, int64_t elem_bytes, int64_t rows,
                                 int64_t cols, int box_cols, int box_rows) {
  return tensor_map_2d_strided(base, type, elem_bytes, rows, cols, cols, box_cols, box_rows);
}


}  // namespace deepinfer::cuda
