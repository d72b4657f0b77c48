// The row tiles of an expert-sorted grouped GEMM (.cu files only): shared by the FP8 GEMMs
// (cuda_fp8_gemm.cu, cuda_fp8_wgmma.cu), whose grouped grids cover a bound on the tile count.
#pragma once

#include <cstdint>

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

}  // namespace deepinfer::cuda
