// The absorbed MLA decode's multi-row tensor-core kernel (batch-invariant rule): 2 rows × 16 heads
// per block, every split of a row computed in turn and merged in registers, bitwise what the
// one-row kernel and the merge give each row; and the one-block kernel that cuts the rows into
// its tiles.
#include "backend/cuda/cuda_mla_decode.cuh"

namespace deepinfer::cuda::mla {

// Exclusive prefix of v over the block's threads in thread order; *total gets the block's sum.
// Every thread calls it; warp_total [kWarps] shared, free again on return.
__device__ int64_t block_exclusive_scan(int64_t v, int64_t* warp_total, int64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int64_t before = incl - v, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_total[w];
    sum += warp_total[w];
  }
  __syncthreads();
  *total = sum;
  return before;
}

// tiles[j] = (b, i0, row0, n): the row tiles of the multi-row kernel, selected sequences in order.
// A sequence's rows (n_keys = n0, n0 + 1, …) are first cut where mla_split_span changes — it is
// split_keys·c for n_keys in ((c−1)·period, c·period], period = split_keys·n_splits — then into
// runs of kRowsPerTile, the last one partial; i0 is the first row's selected index, row0 its row
// of q/out. Slots [count, n_bound) get n = 0 (the grid covers n_bound, a host bound).
// One block, as mla_row_map_kernel: thread t owns the sequences [t·per, (t+1)·per), counts their
// selected rows and tiles, two block scans give its first index of each, then it writes.
// Sizes from the host only, contents from the device: graph-safe.
__global__ void __launch_bounds__(kThreads) mla_row_tiles_kernel(DecodePlan pl, int64_t n_bound, int4* tiles) {
  __shared__ int64_t warp_total[kWarps];
  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x;
  const int64_t per = (a.n_seqs + kThreads - 1) / kThreads;
  const int64_t b0 = std::min<int64_t>(a.n_seqs, t * per), b1 = std::min<int64_t>(a.n_seqs, b0 + per);
  const int64_t period = a.split_keys * pl.n_splits;
  auto selected = [&](int64_t b) { return a.seq_mask == nullptr || a.seq_mask[b] != 0; };
  // fn(j, n) for each tile of sequence b: its rows j..j+n−1.
  auto for_each_tile = [&](int64_t b, auto&& fn) {
    const int64_t q_len = a.q_indptr[b + 1] - a.q_indptr[b], n0 = a.kv_len[b] - q_len + 1;
    int64_t j = 0;
    while (j < q_len) {
      const int64_t c = (n0 + j + period - 1) / period;             // span class of row j
      const int64_t j_end = std::min(q_len, c * period - n0 + 1);  // past its last row
      for (; j < j_end; j += kRowsPerTile) fn(j, std::min<int64_t>(kRowsPerTile, j_end - j));
      j = j_end;
    }
  };
  int64_t n_sel_rows = 0, n_tiles = 0;
  for (int64_t b = b0; b < b1; ++b)
    if (selected(b)) {
      n_sel_rows += a.q_indptr[b + 1] - a.q_indptr[b];
      for_each_tile(b, [&](int64_t, int64_t) { ++n_tiles; });
    }
  int64_t all_rows = 0, all_tiles = 0;
  int64_t next_row = block_exclusive_scan(n_sel_rows, warp_total, &all_rows);
  int64_t next_tile = block_exclusive_scan(n_tiles, warp_total, &all_tiles);
  for (int64_t b = b0; b < b1; ++b) {
    if (!selected(b)) continue;
    const int32_t q0 = a.q_indptr[b];
    for_each_tile(b, [&](int64_t j, int64_t n) {
      if (next_tile < n_bound)  // always (the host bound holds); never write past the map
        tiles[next_tile] = make_int4(static_cast<int>(b), static_cast<int>(next_row + j), q0 + static_cast<int>(j),
                                     static_cast<int>(n));
      ++next_tile;
    });
    next_row += a.q_indptr[b + 1] - q0;
  }
  for (int64_t e = all_tiles + t; e < n_bound; e += kThreads) tiles[e] = make_int4(0, 0, 0, 0);
}

// Split-KV attention on tensor cores for up to R = 2 consecutive query rows of one sequence and
// the 16 heads of head group g, batch-invariant rule only, with the row's splits merged in the
// kernel: for each row, bitwise the o_lat (bf16) that mla_split_tc_kernel<1> (each split's
// part_acc, part_ml) followed by mla_merge_kernel or mla_apply_tc_kernel's inline merge gives it
// — the split partials never leave the registers (a prefill of 4,096 tokens wrote ~2 GB of them
// per layer) and the q tile is staged once per row tile, not once per split.
// Block x = (n_bound·n_hg − 1 − (tile·n_hg + g)) (the longest rows first), 256 threads;
// tiles[tile] = (b, i0, row0, n): selected rows i0..i0+n−1 = rows row0.. of sequence b (n = 0: a
// surplus slot of the bound; exits). Row q sees n_keys_q = n_keys_0 + q keys; the tile map keeps
// a tile's rows in one class of mla_split_span, so split y is [y·span, (y+1)·span) for every row,
// cut at each row's own key count. The block walks the 32-key tiles of [0, n_keys_{n−1}) in order
// — the splits one after the other, a span being a whole number of tiles — and row q takes part
// in tile t0 only while t0 < n_keys_q: exactly the tiles the one-row kernel runs for it, split by
// split. MMA row 16q + hh = (row q, head 16g + hh). Per tile:
//   load:    as mla_split_tc_kernel: cp.async ring (kRowsStages deep), keys ≥ n_keys_{n−1} zero;
//   scores:  warp w owns row q = w / 4 over channel half (w / 2) % 2 (288 channels) and the n-tiles
//            2(w % 2), +1: per (row, head, key) the one-row kernel's MMA chain at MT = 1 (its
//            warp half·4 + n-tile: the half's k16 MMAs in channel order from zero), the halves'
//            partials then added in order by tc_softmax_update;
//   softmax: thread t owns head hh = t / 16 and keys t % 16, +16, for each active row in turn:
//            tc_softmax_update<16, 2>, the one-row kernel's mapping and arithmetic at MT = 1;
//   o_lat:   warp w owns channels 64w..64w+63 of every active row (acc [R][8][4] fragments):
//            acc = acc·corr, then P·V in the one-row kernel's k16 order. In a row's last tile the
//            keys ≥ n_keys_q hold latents of the longer row where the one-row kernel has zeros:
//            that row's V fragments are masked to +0 there (its P is 0 there, but 0·v = −0 for
//            v < 0 could otherwise meet an exactly-zero sum with a different sign).
// At the end of split y, every row with keys in it (n_keys_q > y·span) folds the split's state
// (m, l, acc) into its running merge (o [R][8][4] fragments, (M, L) per head: merge_split's
// arithmetic, the one every invariant merge path uses), and the split state restarts from
// (−inf, 0, +0) as a new one-row block would. At the end o_lat = bf16(o / L) per row and head.
// Why the bits match: an m16n8k16 output element depends only on its own accumulator, A row and B
// column — here the one-row kernel's bf16 q row, latent key row, P row and V column — and each
// chain issues the same MMAs in the same order; the softmax is the same function of the same
// scores; the merge is the same function of the same split states, in the same order.
// Shared (dynamic): latent ring [4][32][584] bf16, q [32][584] bf16, partial scores [2][32][36]
// fp32, P [32][40] bf16, corr / α / β / L [32] fp32 each: 199,168 bytes, one block per SM.
// Preconditions: split_keys > 0, r = 512, dr = 64, cache rows 16-byte aligned, kv_len ≥ q_len.
__global__ void __launch_bounds__(kThreads, 1) mla_rows_merged_kernel(DecodePlan pl, const int4* tiles,
                                                                       bf16* o_lat) {
  constexpr int R = kRowsPerTile, kHalf = kTcWidth / 2;
  extern __shared__ __align__(16) unsigned char rows_smem[];
  bf16* slat = reinterpret_cast<bf16*>(rows_smem);                         // [kRowsStages][kTcKeys][kTcStride]
  bf16* sq = slat + kRowsStages * kTcKeys * kTcStride;                     // [kRowsMma][kTcStride]
  float* sred = reinterpret_cast<float*>(sq + kRowsMma * kTcStride);       // [2][kRowsMma][kTcRedStride]
  bf16* sp = reinterpret_cast<bf16*>(sred + 2 * kRowsMma * kTcRedStride);  // [kRowsMma][kTcPStride]
  float* scorr = reinterpret_cast<float*>(sp + kRowsMma * kTcPStride);     // [kRowsMma]
  float* salpha = scorr + kRowsMma;                                        // [kRowsMma]
  float* sbeta = salpha + kRowsMma;                                        // [kRowsMma]
  float* sl = sbeta + kRowsMma;                                            // [kRowsMma]

  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const unsigned slot = gridDim.x - 1 - blockIdx.x;
  const int4 tile = tiles[slot / static_cast<unsigned>(pl.n_hg)];
  const int n_rows = tile.w;
  if (n_rows == 0) return;
  const int64_t h0 = static_cast<int64_t>(slot % static_cast<unsigned>(pl.n_hg)) * kHeads;
  const int64_t b = tile.x, i0 = tile.y, row0 = tile.z;
  const int q0 = a.q_indptr[b];
  // Key counts and tile indices fit int32 (kv_len is int32): no 64-bit divisions in the loop.
  const int n_keys0 = a.kv_len[b] - (a.q_indptr[b + 1] - q0) + (static_cast<int>(row0) - q0) + 1;  // row 0's keys
  const int span = static_cast<int>(split_span(pl, n_keys0, 1));  // every row's (one class per tile)
  const int split_tiles = span / kTcKeys;                         // span is a multiple of split_keys, of 32
  auto row_end = [&](int q) { return q < n_rows ? n_keys0 + q : 0; };  // row q's keys
  const int k_last = row_end(n_rows - 1);
  const int n_tiles = (k_last + kTcKeys - 1) / kTcKeys;

  // The sequence's latent pages over [0, k_last): as mla_split_tc_kernel's load_tile, but each
  // lane looks up the cache row of key t0 + lane once per tile (one division, not one per copy)
  // and the tile's copies take their keys' rows from the lanes by shuffles.
  const int32_t* pages = a.block_ids + a.block_indptr[b];
  const uint32_t bs = static_cast<uint32_t>(a.block_size);
  auto load_tile = [&](int it) {
    if (it < n_tiles) {
      const uint32_t key = static_cast<uint32_t>(it * kTcKeys + lane);
      const int64_t my_row =
          key < static_cast<uint32_t>(k_last) ? static_cast<int64_t>(pages[key / bs]) * bs + key % bs : int64_t{-1};
      bf16* dst = slat + (it % kRowsStages) * kTcKeys * kTcStride;
#pragma unroll
      for (int j = 0; j < kTcChunks; ++j) {
        const int e = t + j * kThreads, k = e / (kTcWidth / 8), c8 = e % (kTcWidth / 8);
        const int64_t row = __shfl_sync(0xffffffffu, my_row, k);
        const bool valid = row >= 0;
        cp_async16(smem_u32(dst + k * kTcStride + 8 * c8), valid ? a.cache + row * kTcWidth + 8 * c8 : a.cache, valid);
      }
    }
    cp_async_commit();  // one group per slot, empty past the range: the wait counts stay uniform
  };
#pragma unroll
  for (int st = 0; st < kRowsStages - 1; ++st) load_tile(st);

  // q tile: MMA row 16q + hh = [q̃ | q_pe] of row q, head h0 + hh in bf16 (zero past n_rows or H).
  for (int e = t; e < kRowsMma * (kTcWidth / 4); e += kThreads) {
    const int m = e / (kTcWidth / 4), c = 4 * (e % (kTcWidth / 4)), q = m / kHeads;
    const int64_t h = h0 + m % kHeads;
    const float4 v = q < n_rows && h < a.H ? q_chunk(pl, i0 + q, row0 + q, h, c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    *reinterpret_cast<uint2*>(sq + m * kTcStride + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }

  // Scores: this warp's row, channel half and n-tile pair; ldmatrix row addresses per lane.
  const int s_row = warp / 4, s_half = (warp / 2) % 2, s_nt = 2 * (warp % 2), s_c0 = s_half * kHalf;
  const int s_end = row_end(s_row);
  const uint32_t q_addr = smem_u32(sq + (kHeads * s_row + lane % 16) * kTcStride + s_c0 + 8 * (lane / 16));
  const int hh = t / kHeads, hj = t % kHeads;  // softmax: head hh, keys hj and hj + 16
  // Per (row q, head hh), held by the head's 16 softmax threads: the split's (m, l) and the
  // running merge's (M, L).
  float m_run[R], l_run[R], m_all[R], l_all[R];
#pragma unroll
  for (int q = 0; q < R; ++q) {
    m_run[q] = -INFINITY;
    l_run[q] = 0.0f;
    m_all[q] = -INFINITY;
    l_all[q] = 0.0f;
  }
  float acc[R][8][4] = {};  // the split's o_lat [row q][16 heads][channels 64·warp..+63] fragments
  float o[R][8][4] = {};    // the merged splits', same layout
  int split_begin = 0, split_left = split_tiles;  // the current split's first key; its tiles left
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kRowsStages - 2>();  // this thread's copies of tile `it` have landed
    __syncthreads();                   // everyone's have; the slot refilled below was last read at it − 1
    load_tile(it + kRowsStages - 1);
    const bf16* lat = slat + (it % kRowsStages) * kTcKeys * kTcStride;
    const int t0 = it * kTcKeys;
    int n_valid[R];  // keys of the tile in row q's range, 0..32 (0: the row sits this tile out)
#pragma unroll
    for (int q = 0; q < R; ++q) n_valid[q] = max(0, min(kTcKeys, row_end(q) - t0));

    if (t0 < s_end) {  // warp-uniform
      float s[2][4] = {};
      uint32_t l_addr[2];
#pragma unroll
      for (int n = 0; n < 2; ++n)
        l_addr[n] = smem_u32(lat + (8 * (s_nt + n) + lane % 8) * kTcStride + s_c0 + 8 * (lane / 8));
#pragma unroll 3
      for (int kc = 0; kc < kHalf; kc += 32) {
        uint32_t qa[4], qb[4];
        ldmatrix_x4(qa, q_addr + 2 * kc);
        ldmatrix_x4(qb, q_addr + 2 * (kc + 16));
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          uint32_t lb[4];
          ldmatrix_x4(lb, l_addr[n] + 2 * kc);
          mma_bf16_16816(s[n], qa, lb[0], lb[1]);
          mma_bf16_16816(s[n], qb, lb[2], lb[3]);
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float* red =
            sred + (s_half * kRowsMma + kHeads * s_row + lane / 4) * kTcRedStride + 8 * (s_nt + n) + 2 * (lane % 4);
        *reinterpret_cast<float2*>(red) = make_float2(s[n][0], s[n][1]);
        *reinterpret_cast<float2*>(red + 8 * kTcRedStride) = make_float2(s[n][2], s[n][3]);
      }
    }
    __syncthreads();

#pragma unroll
    for (int q = 0; q < R; ++q) {
      if (n_valid[q] == 0) continue;  // block-uniform: whole warps shuffle
      const int m = kHeads * q + hh;
      const float corr = tc_softmax_update<kHeads, 2>(sred + m * kTcRedStride, kRowsMma * kTcRedStride, hj, n_valid[q],
                                                      a.scale, sp + m * kTcPStride, m_run[q], l_run[q]);
      if (hj == 0) scorr[m] = corr;
    }
    __syncthreads();

#pragma unroll
    for (int q = 0; q < R; ++q) {
      if (n_valid[q] == 0) continue;
      const float c_lo = scorr[kHeads * q + lane / 4], c_hi = scorr[kHeads * q + lane / 4 + 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc[q][j][0] *= c_lo;
        acc[q][j][1] *= c_lo;
        acc[q][j][2] *= c_hi;
        acc[q][j][3] *= c_hi;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kTcKeys / 16; ++ks) {
      uint32_t pa[R][4];
#pragma unroll
      for (int q = 0; q < R; ++q)
        if (n_valid[q] > 0)
          ldmatrix_x4(pa[q], smem_u32(sp + (kHeads * q + lane % 16) * kTcPStride + 16 * ks + 8 * (lane / 16)));
      const int k_lo = 16 * ks + 2 * (lane % 4);  // keys of vb[0], vb[2] (low, high half); vb[1], vb[3]: + 8
#pragma unroll
      for (int pr = 0; pr < 4; ++pr) {
        uint32_t vb[4];  // b0, b1 of channel tiles 64·warp + 16·pr and + 8
        ldmatrix_x4_trans(vb, smem_u32(lat + (16 * ks + lane % 8 + 8 * ((lane / 8) % 2)) * kTcStride + 64 * warp +
                                       16 * pr + 8 * (lane / 16)));
#pragma unroll
        for (int q = 0; q < R; ++q) {
          if (n_valid[q] == 0) continue;
          uint32_t v[4] = {vb[0], vb[1], vb[2], vb[3]};
          if (n_valid[q] < kTcKeys) {  // the row's last tile: its keys only, as the one-row kernel loads
            v[0] = keep_keys(v[0], k_lo, n_valid[q]);
            v[1] = keep_keys(v[1], k_lo + 8, n_valid[q]);
            v[2] = keep_keys(v[2], k_lo, n_valid[q]);
            v[3] = keep_keys(v[3], k_lo + 8, n_valid[q]);
          }
          mma_bf16_16816(acc[q][2 * pr], pa[q], v[0], v[1]);
          mma_bf16_16816(acc[q][2 * pr + 1], pa[q], v[2], v[3]);
        }
      }
    }

    if (--split_left == 0 || it + 1 == n_tiles) {  // the end of a split: fold it in
#pragma unroll
      for (int q = 0; q < R; ++q) {
        if (row_end(q) <= split_begin) continue;  // the row has no key in this split
        const float2 ab = merge_coefs(m_all[q], m_run[q]);
        l_all[q] = merge_step(l_run[q], ab, l_all[q]);
        m_run[q] = -INFINITY;
        l_run[q] = 0.0f;
        if (hj == 0) {
          salpha[kHeads * q + hh] = ab.x;
          sbeta[kHeads * q + hh] = ab.y;
        }
      }
      __syncthreads();
#pragma unroll
      for (int q = 0; q < R; ++q) {
        if (row_end(q) <= split_begin) continue;
        const float2 ab_lo = make_float2(salpha[kHeads * q + lane / 4], sbeta[kHeads * q + lane / 4]);
        const float2 ab_hi = make_float2(salpha[kHeads * q + lane / 4 + 8], sbeta[kHeads * q + lane / 4 + 8]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            o[q][j][e] = merge_step(acc[q][j][e], e < 2 ? ab_lo : ab_hi, o[q][j][e]);
            acc[q][j][e] = 0.0f;
          }
        }
      }
      // salpha / sbeta are next written at the next split's end, after this tile's readers have
      // passed at least one more __syncthreads.
      split_begin += span;
      split_left = split_tiles;
    }
  }

  // o_lat = bf16(o / L) of every row (each has ≥ 1 key, so L ≥ 1).
#pragma unroll
  for (int q = 0; q < R; ++q)
    if (q < n_rows && hj == 0) sl[kHeads * q + hh] = l_all[q];
  __syncthreads();
#pragma unroll
  for (int q = 0; q < R; ++q) {
    if (q >= n_rows) break;
    const int64_t h_lo = lane / 4, h_hi = h_lo + 8;
    const float l_lo = sl[kHeads * q + h_lo], l_hi = sl[kHeads * q + h_hi];
    bf16* dst = o_lat + ((i0 + q) * a.H + h0) * kTcRank;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 64 * warp + 8 * j + 2 * (lane % 4);
      if (h0 + h_lo < a.H)
        *reinterpret_cast<uint32_t*>(dst + h_lo * kTcRank + c) =
            pack_bf16(__fdiv_rn(o[q][j][0], l_lo), __fdiv_rn(o[q][j][1], l_lo));
      if (h0 + h_hi < a.H)
        *reinterpret_cast<uint32_t*>(dst + h_hi * kTcRank + c) =
            pack_bf16(__fdiv_rn(o[q][j][2], l_hi), __fdiv_rn(o[q][j][3], l_hi));
    }
  }
}

}  // namespace deepinfer::cuda::mla
