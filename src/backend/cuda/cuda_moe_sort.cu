// The MoE's stable counting sort of a step's (token, slot) entries by expert, for steps beyond
// the one-block sort (cuda_moe.cu's small_sort_kernel, ≤ 512 entries). Expert ids are small
// (E ≤ 512 with the shared experts), so three launches of one pass each replace cub's radix sort
// (iota, histogram, scan, onesweep) plus the offsets' binary searches and the inverse: ~32 µs a
// V2-Lite layer at 4,096 tokens (24,576 entries, run s20-6) in seven kernels, the offsets kernel
// alone 11 µs (one block, 15 dependent loads per expert, then a serial loop).
//  1. moe_count_kernel: a block per 1,024-entry chunk counts its entries per expert.
//  2. moe_scan_kernel (one block): each chunk's base for each expert (the expert's start plus its
//     entries in earlier chunks), the offsets, the tile offsets and the active-expert list.
//  3. moe_scatter_kernel: a block per chunk ranks each entry among its chunk's earlier entries of
//     its expert (warp match + per-warp counts) → perm and inv.
// Integer counts only: the result is the stable order itself, whatever the scheduling.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_moe_slots.cuh"

#include <cub/cub.cuh>

namespace deepinfer::cuda {
namespace {

constexpr int kChunk = 1024;  // entries per count / scatter block: one per thread
constexpr int kWarps = kChunk / 32;

// counts[c·E + e] = entries of chunk c (entries [c·1024, +1024) ∩ [0, R)) with expert e.
// Shared: the chunk's histogram [E] int32.
__global__ void __launch_bounds__(kChunk) moe_count_kernel(const int32_t* __restrict__ ids, int64_t k, int64_t kt,
                                                           int64_t e_routed, int64_t R, int64_t E,
                                                           int32_t* __restrict__ counts) {
  pdl_wait();
  pdl_trigger();
  __shared__ int32_t s_hist[kMoeSortMaxExperts];
  const int t = static_cast<int>(threadIdx.x);
  const int64_t c = blockIdx.x, i = c * kChunk + t;
  for (int e = t; e < E; e += kChunk) s_hist[e] = 0;
  __syncthreads();
  if (i < R) atomicAdd(&s_hist[slot_expert(ids, i, k, kt, e_routed)], 1);
  __syncthreads();
  for (int e = t; e < E; e += kChunk) counts[c * E + e] = s_hist[e];
}

// One block of 1,024 threads. counts [n_chunks, E] in place → bases: base[c][e] = start(e) +
// Σ_{c' < c} counts[c'][e], with start(e) = Σ_{e' < e} total(e'). Warp w scans experts w, w + 32,
// … over the chunks (lane l: chunks l, l + 32, …, a shuffle scan per 32 chunks); thread e then
// holds total(e) for the block scans of the starts, the ⌈total / tile_rows⌉ tile counts and the
// active flags. Writes offsets [E + 1], tiles [E + 1], active [n_active] (−1 past the last).
__global__ void __launch_bounds__(1024) moe_scan_kernel(int32_t* __restrict__ counts, int64_t n_chunks, int64_t E,
                                                        int64_t tile_rows, int32_t* __restrict__ offsets,
                                                        int32_t* __restrict__ tiles, int32_t* __restrict__ active,
                                                        int64_t n_active) {
  pdl_wait();
  pdl_trigger();
  using Scan = cub::BlockScan<int32_t, 1024>;
  __shared__ typename Scan::TempStorage s_scan;
  __shared__ int32_t s_total[kMoeSortMaxExperts];
  __shared__ int32_t s_start[kMoeSortMaxExperts];
  __shared__ int32_t s_n_active;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32, warp = t / 32;
  for (int64_t e = warp; e < E; e += 32) {
    int32_t run = 0;  // entries of expert e in the chunks before c0
    for (int64_t c0 = 0; c0 < n_chunks; c0 += 32) {
      const int64_t c = c0 + lane;
      const int32_t v = c < n_chunks ? counts[c * E + e] : 0;
      int32_t x = v;  // inclusive prefix over the 32 chunks
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const int32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      if (c < n_chunks) counts[c * E + e] = run + x - v;
      run += __shfl_sync(0xffffffffu, x, 31);
    }
    if (lane == 0) s_total[e] = run;
  }
  __syncthreads();
  const int32_t n = t < E ? s_total[t] : 0;
  const int32_t n_tiles = static_cast<int32_t>((n + tile_rows - 1) / tile_rows);
  int32_t start = 0, tile = 0, slot = 0;
  Scan(s_scan).ExclusiveSum(n, start);
  __syncthreads();
  Scan(s_scan).ExclusiveSum(n_tiles, tile);
  __syncthreads();
  Scan(s_scan).ExclusiveSum(n > 0 ? 1 : 0, slot);
  if (t < E) {
    s_start[t] = start;
    offsets[t] = start;
    tiles[t] = tile;
    if (n > 0 && slot < n_active) active[slot] = t;
  }
  if (t == E - 1) {
    offsets[E] = start + n;
    tiles[E] = tile + n_tiles;
    s_n_active = slot + (n > 0 ? 1 : 0);
  }
  __syncthreads();
  for (int64_t j = s_n_active + t; j < n_active; j += 1024) active[j] = -1;
  for (int64_t e = warp; e < E; e += 32)
    for (int64_t c = lane; c < n_chunks; c += 32) counts[c * E + e] += s_start[e];
}

// perm[base[c][e] + rank] = i and inv[i] = that position, for entry i of chunk c with expert e,
// rank = the chunk's earlier entries of e: those in earlier warps (per-warp counts, shared
// [32][E] uint16) plus the lower lanes of this warp with the same expert (__match_any_sync).
__global__ void __launch_bounds__(kChunk) moe_scatter_kernel(const int32_t* __restrict__ ids, int64_t k, int64_t kt,
                                                             int64_t e_routed, int64_t R, int64_t E,
                                                             const int32_t* __restrict__ bases,
                                                             int32_t* __restrict__ perm, int32_t* __restrict__ inv) {
  pdl_wait();
  pdl_trigger();
  __shared__ uint16_t s_cnt[kWarps * kMoeSortMaxExperts];  // [warp][E], 32 KB at E = 512
  const int t = static_cast<int>(threadIdx.x), lane = t % 32, warp = t / 32;
  const int64_t c = blockIdx.x, i = c * kChunk + t;
  for (int64_t j = t; j < kWarps * E; j += kChunk) s_cnt[j] = 0;
  __syncthreads();
  const bool valid = i < R;
  const int32_t e = valid ? slot_expert(ids, i, k, kt, e_routed) : -1;
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const int32_t rank_in_warp = __popc(peers & ((1u << lane) - 1u));
  if (valid && rank_in_warp == 0) s_cnt[warp * E + e] = static_cast<uint16_t>(__popc(peers));
  __syncthreads();
  if (!valid) return;
  int32_t rank = rank_in_warp;
  for (int w = 0; w < warp; ++w) rank += s_cnt[w * E + e];
  const int32_t pos = bases[c * E + e] + rank;
  perm[pos] = static_cast<int32_t>(i);
  inv[i] = pos;
}

int64_t chunks_for(int64_t R) { return (R + kChunk - 1) / kChunk; }

}  // namespace

size_t moe_sort_scratch_bytes(int64_t R, int64_t E) { return sizeof(int32_t) * static_cast<size_t>(chunks_for(R) * E); }

void moe_sort(const int32_t* ids, int64_t k, int64_t kt, int64_t e_routed, int64_t R, int64_t tile_rows,
              int32_t* perm, int32_t* inv, int32_t* offsets, int32_t* tiles, int32_t* active, int64_t n_active,
              void* scratch, cudaStream_t s) {
  const int64_t E = e_routed + (kt - k);  // routed, then shared experts
  DI_CUDA_REQUIRE(k >= 1 && kt >= k && e_routed > 0 && E <= kMoeSortMaxExperts);
  DI_CUDA_REQUIRE(tile_rows > 0 && n_active >= 0 && n_active <= E && R >= 0 && R < (int64_t{1} << 31));
  if (R == 0) return;
  const int64_t n_chunks = chunks_for(R);
  DI_CUDA_REQUIRE(n_chunks < (int64_t{1} << 31));
  auto* counts = static_cast<int32_t*>(scratch);  // [n_chunks, E]: counts, then bases
  launch_pdl(moe_count_kernel, static_cast<unsigned>(n_chunks), kChunk, 0, s, ids, k, kt, e_routed, R, E, counts);
  DI_CUDA_LAUNCHED();
  launch_pdl(moe_scan_kernel, 1, 1024, 0, s, counts, n_chunks, E, tile_rows, offsets, tiles, active, n_active);
  DI_CUDA_LAUNCHED();
  launch_pdl(moe_scatter_kernel, static_cast<unsigned>(n_chunks), kChunk, 0, s, ids, k, kt, e_routed, R, E,
             static_cast<const int32_t*>(counts), perm, inv);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
