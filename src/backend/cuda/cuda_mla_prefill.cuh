// What the two MLA prefill attention kernels share (.cu files only): the launch's argument table
// (sequences and their first row tiles, passed by value), the row tile a block computes, and the
// softmax's bf16 packing, fast 2^x and max step. The kernels: cuda_mla_prefill.cu (FlashAttention-2 on
// mma.sync, every head-dim instance and GPU) and cuda_mla_prefill_wgmma.cu (wgmma, DeepSeek's
// dims on sm_90).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_common.h"

namespace deepinfer::cuda {

// What a prefill kernel reads: the launcher's arguments plus each sequence's first row tile in
// the grid. Passed by value as a __grid_constant__ parameter (≤ 4 KB), so no device copy of the
// sequence table is needed and a launch stays graph-capturable.
struct PrefillParams {
  const float* q;     // [T, H, dn + dr] fp32 (RoPE applied, or by q_rope)
  const float* q_rope;  // MlaPrefillArgs::q_rope (the wgmma kernel's), or null
  const bf16* kv;     // [n_keys, H·(dn + dv)] bf16: per head [k_nope_h | v_h]
  const bf16* lat;    // [n_keys, ld_lat] bf16: [c_kv | k_pe] per key
  float* out;         // [T, H, dv] fp32
  uint8_t* out_q;     // MlaPrefillArgs::out_q / out_qs / out_b (the wgmma kernel's)
  float* out_qs;
  bf16* out_b;
  int32_t H, dn, dr, dv, r, ld_lat;
  float scale_log2;   // softmax_scale · log2(e): exp(scale·(s − m)) = exp2(s·scale_log2 − m·scale_log2)
  int32_t n_seqs;
  MlaPrefillSeq seqs[kMlaPrefillMaxSeqs];
  int32_t tile0[kMlaPrefillMaxSeqs];  // index of each sequence's first row tile (row_tile)
};

// The table of `a` for row tiles of `rows` query rows (sequences with q_len 0 dropped, each
// checked); returns the number of row tiles (the grid's y extent).
inline int64_t prefill_params(const MlaPrefillArgs& a, int64_t rows, PrefillParams* pp) {
  *pp = PrefillParams{};
  pp->q = a.q;
  pp->q_rope = a.q_rope;
  pp->kv = a.kv;
  pp->lat = a.lat;
  pp->out = a.out;
  pp->out_q = a.out_q;
  pp->out_qs = a.out_qs;
  pp->out_b = a.out_b;
  pp->H = static_cast<int32_t>(a.H);
  pp->dn = static_cast<int32_t>(a.dn);
  pp->dr = static_cast<int32_t>(a.dr);
  pp->dv = static_cast<int32_t>(a.dv);
  pp->r = static_cast<int32_t>(a.r);
  pp->ld_lat = static_cast<int32_t>(a.ld_lat);
  pp->scale_log2 = a.scale * 1.4426950408889634f;  // log2(e)
  int64_t n_tiles = 0;
  for (int64_t i = 0; i < a.n_seqs; ++i) {
    const MlaPrefillSeq& q = a.seqs[i];
    if (q.q_len == 0) continue;  // nothing to write
    DI_CUDA_REQUIRE(q.q_len > 0 && q.kv_len >= q.q_len && q.q_row0 >= 0 && q.key_row0 >= 0 &&
                    q.key_row0 + static_cast<int64_t>(q.kv_len) <= a.n_keys);
    pp->seqs[pp->n_seqs] = q;
    pp->tile0[pp->n_seqs] = static_cast<int32_t>(n_tiles);
    ++pp->n_seqs;
    n_tiles += (q.q_len + rows - 1) / rows;
  }
  DI_CUDA_REQUIRE_MSG(n_tiles <= 65535, "MLA prefill: more than 65535 row tiles in one launch");
  return n_tiles;
}

#if defined(__CUDACC__)
// The row tile of grid row `tile` (blockIdx.y) for tiles of `rows` rows: its sequence and first
// query row i0. Tiles are numbered per sequence from its LAST (most keys) tile first, so the
// heaviest blocks start in the first wave.
struct RowTile {
  MlaPrefillSeq seq;
  int i0;
};
__device__ __forceinline__ RowTile row_tile(const PrefillParams& p, int tile, int rows) {
  int b = p.n_seqs - 1;
  while (b > 0 && tile < p.tile0[b]) --b;
  const MlaPrefillSeq s = p.seqs[b];
  const int n_row_tiles = (s.q_len + rows - 1) / rows;
  return {s, (n_row_tiles - 1 - (tile - p.tile0[b])) * rows};
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}
// 2^x by the SFU (ex2.approx.ftz: ~2 ulp, 2^−inf = +0, subnormal results flushed to 0), what
// exp2f becomes under --use_fast_math; its error is far below the bf16 rounding of p that follows.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Two probabilities of one row, p = bf16(2^(s·sl2 − m)) for scores s0, s1 (m in the same log2
// units; s = −inf gives +0), packed as a bf16 pair; f gets their rounded values, which are added
// to sum (the row sum adds exactly what P·V adds). The softmaxes of both wgmma attention kernels.
__device__ __forceinline__ uint32_t exp2_pack(float s0, float s1, float sl2, float m, float& sum, float2& f) {
  const uint32_t p = pack_bf16x2(fast_exp2(fmaf(s0, sl2, -m)), fast_exp2(fmaf(s1, sl2, -m)));
  f = unpack_bf16x2(p);
  sum += f.x + f.y;
  return p;
}
// The online softmax's max step for the row pair (lo, hi) a thread shares with the other 3 lanes
// of its quad (lanes 4g .. 4g + 3 hold rows g and g + 8's columns): mx_* enter as the thread's
// maxima over its columns and the old maxima m_*, leave as the rows' maxima; returns the
// subtracted maxima in exp2 units (ms) and the old state's rescales (corr). A row with no
// visible key yet (max −inf, which cannot happen since key 0 is in tile 0 and every row sees
// it) subtracts 0 rather than −inf, so e^(−inf − m) = 0 and never −inf − (−inf) = NaN. The
// rescale is 0 on the first tile (m = −inf) and exactly 1 when the max is unchanged (selected,
// not left to ex2.approx), so a tile wholly past a row's limit (p = +0, adding exact zeros)
// leaves its O and l bit-identical: chunk invariance.
struct MaxStep {
  float ms_lo, ms_hi, corr_lo, corr_hi;
};
__device__ __forceinline__ MaxStep quad_max_step(float& mx_lo, float& mx_hi, float m_lo, float m_hi, float sl2) {
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {  // the 4 lanes of a row
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, x));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, x));
  }
  MaxStep r;
  r.ms_lo = mx_lo == -INFINITY ? 0.0f : mx_lo * sl2;
  r.ms_hi = mx_hi == -INFINITY ? 0.0f : mx_hi * sl2;
  r.corr_lo = mx_lo == m_lo ? 1.0f : fast_exp2(m_lo * sl2 - r.ms_lo);
  r.corr_hi = mx_hi == m_hi ? 1.0f : fast_exp2(m_hi * sl2 - r.ms_hi);
  return r;
}
#endif  // __CUDACC__

}  // namespace deepinfer::cuda
