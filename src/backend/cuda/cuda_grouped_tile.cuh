// The row tiles of an expert-sorted grouped GEMM (.cu files only): grouped_tile for the mma.sync
// FP8 GEMM (cuda_fp8_gemm.cu), the shared-memory table for the wgmma ones (cuda_fp8_wgmma.cu,
// cuda_bf16_wgmma.cu, through cuda_sm90.cuh); their grouped grids cover a bound on the tile count.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_search.cuh"

namespace deepinfer::cuda {

// The grouped tile `tile` of expert-sorted rows: each expert's rows [offsets[e], offsets[e+1])
// are cut into ceil(count / bm) tiles, numbered expert by expert. Warp 0 computes it: lane l sums
// the tile counts of its slice of experts, a warp scan gives each slice's first tile, and the lane
// whose slice holds `tile` walks it. Writes e = −1 past the last tile. Sizes only on the host:
// the grid covers the bound ceil(M / bm) + min(E, M) (CUDA-graph safe).
__device__ __forceinline__ void grouped_tile(int64_t tile, const int32_t* offsets, int64_t E, int bm, int lane,
                                             int64_t* out /* [3] shared: e, m0, rows */) {
  const int64_t per = (E + 31) / 32;
  const int64_t e_begin = min(E, lane * per), e_end = min(E, e_begin + per);
  int64_t mine = 0;
  for (int64_t e = e_begin; e < e_end; ++e) mine += (offsets[e + 1] - offsets[e] + bm - 1) / bm;
  int64_t incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 0) out[0] = -1;
  __syncwarp();
  if (tile >= incl - mine && tile < incl) {
    int64_t first = incl - mine;
    for (int64_t e = e_begin; e < e_end; ++e) {
      const int64_t n_tiles = (offsets[e + 1] - offsets[e] + bm - 1) / bm;
      if (tile < first + n_tiles) {
        const int64_t m0 = offsets[e] + (tile - first) * bm;
        out[0] = e;
        out[1] = m0;
        out[2] = min(static_cast<int64_t>(bm), static_cast<int64_t>(offsets[e + 1]) - m0);
        break;
      }
      first += n_tiles;
    }
  }
}

// The persistent wgmma GEMMs' form of the same numbering: each block's copy of the row-tile table
// in shared memory, so resolving a tile is a binary search there instead of grouped_tile's global
// loads in every warp at every tile (two dependent L2 round trips, ~1,000 cycles of a ~15,000-cycle
// tile, with the tensor cores idle meanwhile). table [2(E + 1)] int32: [0, E] the row offsets,
// [E + 1, 2E + 1] each expert's first tile (the prefix of ceil(rows / bm)). Warp-collective (one
// warp builds it); the block synchronizes before reading it.
constexpr int64_t kMaxTableExperts = 1024;
constexpr size_t kTileTableBytes = 2 * (kMaxTableExperts + 1) * sizeof(int32_t);
__device__ __forceinline__ void build_tile_table(const int32_t* offsets, int64_t E, int bm, int lane,
                                                 int32_t* table) {
  int32_t* first = table + E + 1;
  int32_t carry = 0;
  for (int64_t e0 = 0; e0 <= E; e0 += 32) {
    const int64_t e = e0 + lane;
    const int32_t start = e <= E ? offsets[e] : 0, n = e < E ? (offsets[e + 1] - start + bm - 1) / bm : 0;
    int32_t incl = n;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int32_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (e <= E) {
      table[e] = start;
      first[e] = carry + incl - n;
    }
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
}
// Tile rt from the table: its expert e (the last with first[e] ≤ rt — never an empty one, whose
// successor has the same first tile), first row m0 and end row; false past the last tile.
__device__ __forceinline__ bool table_tile(const int32_t* table, int64_t E, int bm, int64_t rt, int64_t* e,
                                           int64_t* m0, int64_t* m_end) {
  const int32_t* first = table + E + 1;
  if (rt >= first[E]) return false;
  const int64_t lo = last_at_most(first, E, rt);
  *e = lo;
  *m0 = table[lo] + (rt - first[lo]) * bm;
  *m_end = min(*m0 + bm, static_cast<int64_t>(table[lo + 1]));
  return true;
}

}  // namespace deepinfer::cuda
