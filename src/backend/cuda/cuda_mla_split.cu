// The absorbed MLA decode's fp32 CUDA-core kernels (shapes the tensor-core kernels do not take, and
// MlaDecodeArgs::kernel = 0): absorb_q, the split kernel, the merge + W_UV kernel; and the
// one-block row map of mixed steps. See cuda_mla.cu for the pipeline.
#include "backend/cuda/cuda_mla_decode.cuh"

namespace deepinfer::cuda::mla {

// row_map[j] = (b, row) of the selected rows in order. One block: thread t owns the contiguous
// run of sequences [t·per, (t+1)·per), counts their selected rows, a block scan (warp shuffles,
// then the 8 warp totals in shared memory) gives its first index, then it writes its rows.
// Only launched when some sequence with rows is not selected (mixed steps, never graphed).
__global__ void __launch_bounds__(kThreads) mla_row_map_kernel(const int32_t* q_indptr, const uint8_t* seq_mask,
                                                               int64_t n_seqs, int2* row_map) {
  __shared__ int64_t warp_total[kWarps];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t per = (n_seqs + kThreads - 1) / kThreads;
  const int64_t b0 = std::min<int64_t>(n_seqs, t * per), b1 = std::min<int64_t>(n_seqs, b0 + per);
  auto selected = [&](int64_t b) { return seq_mask == nullptr || seq_mask[b] != 0; };
  int64_t count = 0;
  for (int64_t b = b0; b < b1; ++b)
    if (selected(b)) count += q_indptr[b + 1] - q_indptr[b];
  int64_t incl = count;
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int64_t next = incl - count;
  for (int w = 0; w < warp; ++w) next += warp_total[w];
  for (int64_t b = b0; b < b1; ++b)
    if (selected(b))
      for (int32_t row = q_indptr[b]; row < q_indptr[b + 1]; ++row)
        row_map[next++] = make_int2(static_cast<int>(b), row);
}

// q̃[i, h, c] = Σ_j q_nope[row(i), h, j] · W_UK_h[j, c] (fp32 q and sums, bf16 W widened exactly).
// Block (64-channel tile, head h, 16-row tile), 256 threads. Warp w takes j in [w·jc, (w+1)·jc)
// (jc = ceil(dn / 8) rounded up to 4); lane l the channels c0 + 2l and c0 + 2l + 1 for all 16 rows
// (acc [16][2]; one 4-byte W_UK load per j, 128 contiguous bytes per warp; q_nope read as float4
// broadcasts). The 8 warps' partial sums are then added in warp order through shared memory.
// Shared: the q_nope tile [16][dn rounded to 4] fp32, then, reused, the partials [8][16][64] fp32
// (32 KB); row ids [16]. Preconditions: dn ≤ 512.
__global__ void __launch_bounds__(kThreads) mla_absorb_q_kernel(DecodePlan pl) {
  const MlaDecodeArgs& a = pl.a;
  __shared__ __align__(16) float sm[kWarps * kGemmRows * kAbsorbCols];
  __shared__ int64_t srow[kGemmRows];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kAbsorbCols, h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(blockIdx.z) * kGemmRows;
  const int64_t dn4 = (a.dn + 3) / 4 * 4, dqk = a.dn + a.dr;
  if (t < kGemmRows) srow[t] = i0 + t < a.n_rows ? selected_row(pl, i0 + t) : -1;
  __syncthreads();
  for (int64_t e = t; e < kGemmRows * dn4; e += kThreads) {
    const int64_t ii = e / dn4, j = e % dn4;
    sm[e] = srow[ii] >= 0 && j < a.dn ? a.q[(srow[ii] * a.H + h) * dqk + j] : 0.0f;
  }
  __syncthreads();

  const int64_t jc = ((a.dn + kWarps - 1) / kWarps + 3) / 4 * 4;
  const int64_t j_begin = warp * jc, j_end = std::min<int64_t>(a.dn, j_begin + jc);
  const int64_t c = c0 + 2 * lane;
  const bool pair = a.r % 2 == 0 && c + 1 < a.r;  // one aligned bf16x2 load
  const bf16* w_uk = a.kv_b + h * (a.dn + a.dv) * a.r;  // [dn, r]
  float acc[kGemmRows][2] = {};
#pragma unroll 2
  for (int64_t j = j_begin; j < j_end; j += 4) {
    float2 wv[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      wv[x] = make_float2(0.0f, 0.0f);
      if (j + x >= j_end) continue;
      const bf16* wr = w_uk + (j + x) * a.r;
      if (pair) {
        const uint32_t u = *reinterpret_cast<const uint32_t*>(wr + c);
        wv[x] = make_float2(bf16_lo(u), bf16_hi(u));
      } else {
        if (c < a.r) wv[x].x = __bfloat162float(wr[c]);
        if (c + 1 < a.r) wv[x].y = __bfloat162float(wr[c + 1]);
      }
    }
#pragma unroll
    for (int ii = 0; ii < kGemmRows; ++ii) {
      const float4 q4 = *reinterpret_cast<const float4*>(sm + ii * dn4 + j);
      acc[ii][0] = fmaf(q4.x, wv[0].x, acc[ii][0]);
      acc[ii][0] = fmaf(q4.y, wv[1].x, acc[ii][0]);
      acc[ii][0] = fmaf(q4.z, wv[2].x, acc[ii][0]);
      acc[ii][0] = fmaf(q4.w, wv[3].x, acc[ii][0]);
      acc[ii][1] = fmaf(q4.x, wv[0].y, acc[ii][1]);
      acc[ii][1] = fmaf(q4.y, wv[1].y, acc[ii][1]);
      acc[ii][1] = fmaf(q4.z, wv[2].y, acc[ii][1]);
      acc[ii][1] = fmaf(q4.w, wv[3].y, acc[ii][1]);
    }
  }
  __syncthreads();  // the q_nope tile is dead: reuse it for the partials
#pragma unroll
  for (int ii = 0; ii < kGemmRows; ++ii)
    *reinterpret_cast<float2*>(sm + (warp * kGemmRows + ii) * kAbsorbCols + 2 * lane) =
        make_float2(acc[ii][0], acc[ii][1]);
  __syncthreads();
  for (int e = t; e < kGemmRows * kAbsorbCols; e += kThreads) {
    const int ii = e / kAbsorbCols, cc = e % kAbsorbCols;
    if (srow[ii] < 0 || c0 + cc >= a.r) continue;
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += sm[(w * kGemmRows + ii) * kAbsorbCols + cc];
    pl.q_lat[((i0 + ii) * a.H + h) * a.r + c0 + cc] = v;
  }
}

// Split-KV attention over the latent pages for 16 heads of one selected row.
// Block (x = i·n_hg + g for row i and head group g, so a row's head groups run side by side and
// share its latents in L2; y = split), 256 threads. The row attends to n_keys = pos + 1 keys;
// split y owns [y·per, min(n_keys, (y+1)·per)), per = split_span (a multiple of 32); an empty
// range writes (−inf, 0) and nothing else.
// Per 32-key tile:
//   load:     the tile's latent rows, 16-byte chunks of the bf16 pages (issued one tile ahead
//             into registers), widened to fp32 into lat [32][wq]; rows past the range are zero.
//   scores:   warp w takes the channel quads w, w+8, …; lane (hs = lane/8, ks = lane%8) forms the
//             4×4 dot products of heads hs+4j with keys ks+8j over them (float4 reads, disjoint
//             banks); partials [8 warps][16][40] are summed in warp order.
//   softmax:  thread t = 16·h + j owns head h, keys j and j+16: running (m, l) of head h in
//             registers (all 16 threads of the head hold it), probabilities p [32][16] and the
//             rescale factor corr [16] to shared memory. Keys past the range score −inf.
//   o_lat:    thread t owns channels 4·(t%128)..+3 and heads 8·(t/128)..+7 (acc [8][4]):
//             acc = acc·corr[h] + Σ_k p[k][h] · lat[k][c] (zero rows add exactly zero).
// Shared (dynamic): q [16][wq] ([q̃ | q_pe] per head, zero past r + dr and for heads ≥ H),
// lat [32][wq], partials [8][16][40], p [32][16], corr [16], fp32: 133,952 bytes at r + dr = 576
// (one block per SM). Preconditions: r ≤ 512, r + dr ≤ 576, kv_len ≥ q_len for every sequence.
__global__ void __launch_bounds__(kThreads, 1) mla_split_kernel(DecodePlan pl) {
  extern __shared__ __align__(16) float smem[];
  const MlaDecodeArgs& a = pl.a;
  const int wq = pl.wq;
  float* sq = smem;                                 // [kHeads][wq]
  float* slat = sq + kHeads * wq;                   // [kKeys][wq]
  float* sred = slat + kKeys * wq;                  // [kWarps][kHeads][kRedStride]
  float* sp = sred + kWarps * kHeads * kRedStride;  // [kKeys][kHeads]
  float* scorr = sp + kKeys * kHeads;               // [kHeads]

  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t i = blockIdx.x / pl.n_hg, h0 = static_cast<int64_t>(blockIdx.x % pl.n_hg) * kHeads;
  const int split = blockIdx.y;
  const auto [b, row, n_keys, per] = row_keys(pl, i, 1);
  const int64_t k_begin = split * per, k_end = std::min(n_keys, k_begin + per);
  float2* ml_out = pl.part_ml + (static_cast<int64_t>(split) * a.n_rows + i) * a.H;
  if (k_begin >= k_end) {
    if (t < kHeads && h0 + t < a.H) ml_out[h0 + t] = make_float2(-INFINITY, 0.0f);
    return;
  }

  const int64_t width = a.r + a.dr, dqk = a.dn + a.dr;
  for (int e = t; e < kHeads * wq; e += kThreads) {
    const int hh = e / wq, c = e % wq;
    const int64_t h = h0 + hh;
    float v = 0.0f;
    if (h < a.H) {
      if (c < a.r) v = pl.q_lat[(i * a.H + h) * a.r + c];
      else if (c < width) v = a.q[(row * a.H + h) * dqk + a.dn + (c - a.r)];
    }
    sq[e] = v;
  }

  // Tile loads: chunk e = t + 256·j is key e / w8, channels 8·(e % w8)..+7.
  const int32_t* pages = a.block_ids + a.block_indptr[b];
  const int w8 = static_cast<int>((width + 7) / 8), bs = static_cast<int>(a.block_size);
  const int wr4 = static_cast<int>((width + 3) / 4 * 4);  // channels the scores read
  const bool vec = width % 8 == 0;                          // rows are 16-byte aligned
  uint4 pre[kTileChunks];
  auto load_tile = [&](int64_t t0) {
#pragma unroll
    for (int j = 0; j < kTileChunks; ++j) {
      const int e = t + j * kThreads, k = e / w8, c8 = e % w8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (k < kKeys && t0 + k < k_end) {
        const int64_t key = t0 + k;
        const bf16* src = a.cache + (static_cast<int64_t>(pages[key / bs]) * bs + key % bs) * width + 8 * c8;
        if (vec) {
          v = *reinterpret_cast<const uint4*>(src);
        } else {
          uint16_t u[8];
          for (int x = 0; x < 8; ++x) u[x] = 8 * c8 + x < width ? __bfloat16_as_ushort(src[x]) : uint16_t{0};
          v = make_uint4(u[0] | uint32_t{u[1]} << 16, u[2] | uint32_t{u[3]} << 16, u[4] | uint32_t{u[5]} << 16,
                         u[6] | uint32_t{u[7]} << 16);
        }
      }
      pre[j] = v;
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int j = 0; j < kTileChunks; ++j) {
      const int e = t + j * kThreads, k = e / w8, c8 = e % w8;
      if (k >= kKeys) continue;
      float* dst = slat + k * wq + 8 * c8;
      *reinterpret_cast<float4*>(dst) = make_float4(bf16_lo(pre[j].x), bf16_hi(pre[j].x), bf16_lo(pre[j].y),
                                                    bf16_hi(pre[j].y));
      if (8 * c8 + 4 < wr4)
        *reinterpret_cast<float4*>(dst + 4) = make_float4(bf16_lo(pre[j].z), bf16_hi(pre[j].z),
                                                          bf16_lo(pre[j].w), bf16_hi(pre[j].w));
    }
  };

  const int hs = lane / 8, ks = lane % 8;           // scores: heads hs + 4j, keys ks + 8j
  const int fh = t / 16, fj = t % 16;               // softmax: head fh, keys fj and fj + 16
  const int cq = t % 128, hq = 8 * (t / 128);       // o_lat: channels 4cq..+3, heads hq..hq+7
  const bool has_channels = 4 * cq < a.r;
  const int nq = wr4 / 4;
  float m_run = -INFINITY, l_run = 0.0f;  // head fh
  float acc[8][4] = {};
  load_tile(k_begin);
  for (int64_t t0 = k_begin; t0 < k_end; t0 += kKeys) {
    __syncthreads();  // the previous tile's o_lat pass is done with lat (first tile: q is written)
    store_tile();
    __syncthreads();
    if (t0 + kKeys < k_end) load_tile(t0 + kKeys);  // in flight during this tile's math

    float s[4][4] = {};
#pragma unroll 2
    for (int qd = warp; qd < nq; qd += kWarps) {
      float4 qv[4], lv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) qv[j] = *reinterpret_cast<const float4*>(sq + (hs + 4 * j) * wq + 4 * qd);
#pragma unroll
      for (int j = 0; j < 4; ++j) lv[j] = *reinterpret_cast<const float4*>(slat + (ks + 8 * j) * wq + 4 * qd);
#pragma unroll
      for (int jh = 0; jh < 4; ++jh)
#pragma unroll
        for (int jk = 0; jk < 4; ++jk) {
          float v = s[jh][jk];
          v = fmaf(qv[jh].x, lv[jk].x, v);
          v = fmaf(qv[jh].y, lv[jk].y, v);
          v = fmaf(qv[jh].z, lv[jk].z, v);
          s[jh][jk] = fmaf(qv[jh].w, lv[jk].w, v);
        }
    }
#pragma unroll
    for (int jh = 0; jh < 4; ++jh)
#pragma unroll
      for (int jk = 0; jk < 4; ++jk) sred[(warp * kHeads + hs + 4 * jh) * kRedStride + ks + 8 * jk] = s[jh][jk];
    __syncthreads();

    float sc[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int k = fj + 16 * x;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += sred[(w * kHeads + fh) * kRedStride + k];
      sc[x] = t0 + k < k_end ? v * a.scale : -INFINITY;
    }
    float mx = fmaxf(sc[0], sc[1]);
    for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));  // within 16 lanes
    const float m_new = fmaxf(m_run, mx);  // finite: the tile holds at least one key of the range
    const float corr = __expf(m_run - m_new);  // 0 on the first tile (m_run = −inf)
    const float p0 = __expf(sc[0] - m_new), p1 = __expf(sc[1] - m_new);
    float ps = p0 + p1;
    for (int o = 8; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    l_run = l_run * corr + ps;
    m_run = m_new;
    sp[fj * kHeads + fh] = p0;
    sp[(fj + 16) * kHeads + fh] = p1;
    if (fj == 0) scorr[fh] = corr;
    __syncthreads();

    if (has_channels) {
#pragma unroll
      for (int jh = 0; jh < 8; ++jh) {
        const float cr = scorr[hq + jh];
#pragma unroll
        for (int x = 0; x < 4; ++x) acc[jh][x] *= cr;
      }
#pragma unroll 4
      for (int k = 0; k < kKeys; ++k) {
        const float4 lv = *reinterpret_cast<const float4*>(slat + k * wq + 4 * cq);
        const float4 pa = *reinterpret_cast<const float4*>(sp + k * kHeads + hq);
        const float4 pb = *reinterpret_cast<const float4*>(sp + k * kHeads + hq + 4);
        const float pv[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int jh = 0; jh < 8; ++jh) {
          acc[jh][0] = fmaf(pv[jh], lv.x, acc[jh][0]);
          acc[jh][1] = fmaf(pv[jh], lv.y, acc[jh][1]);
          acc[jh][2] = fmaf(pv[jh], lv.z, acc[jh][2]);
          acc[jh][3] = fmaf(pv[jh], lv.w, acc[jh][3]);
        }
      }
    }
  }

  float* acc_out = pl.part_acc + (static_cast<int64_t>(split) * a.n_rows + i) * a.H * a.r;
  if (has_channels)
#pragma unroll
    for (int jh = 0; jh < 8; ++jh) {
      const int64_t h = h0 + hq + jh;
      if (h >= a.H) break;
#pragma unroll
      for (int x = 0; x < 4; ++x)
        if (4 * cq + x < a.r) acc_out[h * a.r + 4 * cq + x] = acc[jh][x];
    }
  if (fj == 0 && h0 + fh < a.H) ml_out[h0 + fh] = make_float2(m_run, l_run);
}


// out[row(i), h, n] = Σ_c o_lat[i, h, c] · W_UV_h[n, c], with o_lat the merge of the splits:
// o_lat = Σ_s w_s · acc_s, w_s = e^{m_s − M} / Σ_s' e^{m_s' − M} l_s' (M = max m_s over non-empty
// splits; empty ones weigh 0 and are not read), summed in split order.
// Block (tile of n_tile output channels, head h, 16-row tile), 256 threads; n_tile is 32 or 128
// (kUvTileSmall / kUvTileLarge: few blocks at decode sizes spread W_UV over more SMs; many
// rows merge each (row tile, head) once). Only the tile's valid rows (rows = min(16, n_rows − i0))
// do any work:
//   weights: warp w takes rows w and w + 8, lane l the splits l, l + 32, l + 64 and l + 96 (read
//            straight from part_ml): M by a warp max, Σ e^{m_s − M} l_s as the lane's four terms
//            in split order then a butterfly;
//   merge:   the o_lat tile [16][r] into shared memory, each element's splits in split order
//            (eight splits' loads issued together);
//   W_UV:    per pass of 32 channels, warp w / lane group q = l / 8 owns channel n = 4w + q; lane
//            sub = l % 8 sums o_lat[ii][c]·W_UV[n][c] over its 4-channel chunks sub, sub + 8, …
//            (c in increasing order, all valid rows at once), and the 8 lanes are added by a
//            butterfly (xor 4, 2, 1). An output's arithmetic depends only on r — not on n_tile or
//            the rows around it — so a row's result is the same in every batch.
// Shared: o_lat tile [16][r rounded to 4] fp32 (≤ 32 KB), weights [16][128], row ids [16].
// Preconditions: r ≤ 512.
__global__ void __launch_bounds__(kThreads) mla_apply_uv_kernel(DecodePlan pl, int n_tile) {
  const MlaDecodeArgs& a = pl.a;
  __shared__ __align__(16) float sm[kGemmRows * kMaxRank];
  __shared__ float swt[kGemmRows][kMaxSplits];
  __shared__ int64_t srow[kGemmRows];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * n_tile, h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(blockIdx.z) * kGemmRows;
  const int rows = static_cast<int>(std::min<int64_t>(kGemmRows, a.n_rows - i0));
  const int64_t r4 = (a.r + 3) / 4 * 4;
  const int n_splits = pl.n_splits;
  if (t < kGemmRows) srow[t] = t < rows ? selected_row(pl, i0 + t) : -1;
  for (int ii = warp; ii < rows; ii += kWarps) merge_weights(pl, i0 + ii, h, lane, swt[ii]);
  __syncthreads();
  for (int64_t e = t; e < rows * r4; e += kThreads) {
    const int64_t ii = e / r4, c = e % r4;
    float v = 0.0f;
    if (c < a.r) {
      const float* src = pl.part_acc + ((i0 + ii) * a.H + h) * a.r + c;  // split s at + s · n_rows · H · r
      const int64_t stride = a.n_rows * a.H * a.r;
      // Eight splits' loads issued together, then summed in split order (the latency of one L2
      // round trip per 8 splits instead of per split; empty splits read nothing and add 0).
      for (int s0 = 0; s0 < n_splits; s0 += 8) {
        float x[8], w[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int s = s0 + j;
          w[j] = s < n_splits ? swt[ii][s] : 0.0f;
          x[j] = w[j] != 0.0f ? src[s * stride] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (w[j] != 0.0f) v = fmaf(w[j], x[j], v);
      }
    }
    sm[e] = v;
  }
  __syncthreads();

  const bf16* w_uv = a.kv_b + (h * (a.dn + a.dv) + a.dn) * a.r;  // [dv, r]
  const bool quad = a.r % 4 == 0;  // 8-byte aligned loads of 4 channels
  const int q = lane / 8, sub = lane % 8;
  const int64_t n_chunks = r4 / 4;
  for (int pass = 0; pass < n_tile / 32; ++pass) {
    const int64_t n = n0 + 32 * pass + 4 * warp + q;
    const bool n_ok = n < a.dv;
    float acc[kGemmRows] = {};
    for (int64_t k = sub; k < n_chunks; k += 8) {
      const int64_t c = 4 * k;
      float w[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const bf16* src = w_uv + (n_ok ? n : 0) * a.r + c;
      if (n_ok && quad) {
        const uint2 u = *reinterpret_cast<const uint2*>(src);
        w[0] = bf16_lo(u.x), w[1] = bf16_hi(u.x), w[2] = bf16_lo(u.y), w[3] = bf16_hi(u.y);
      } else if (n_ok) {
#pragma unroll
        for (int x = 0; x < 4; ++x) w[x] = c + x < a.r ? __bfloat162float(src[x]) : 0.0f;
      }
#pragma unroll
      for (int ii = 0; ii < kGemmRows; ++ii) {
        if (ii >= rows) break;
        const float4 o = *reinterpret_cast<const float4*>(sm + ii * r4 + c);
        acc[ii] = fmaf(o.x, w[0], acc[ii]);
        acc[ii] = fmaf(o.y, w[1], acc[ii]);
        acc[ii] = fmaf(o.z, w[2], acc[ii]);
        acc[ii] = fmaf(o.w, w[3], acc[ii]);
      }
    }
#pragma unroll
    for (int ii = 0; ii < kGemmRows; ++ii) {
      if (ii >= rows) break;
      float v = acc[ii];
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      if (sub == 0 && n_ok) a.out[(srow[ii] * a.H + h) * a.dv + n] = v;
    }
  }
}

}  // namespace deepinfer::cuda::mla
