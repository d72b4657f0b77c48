// The absorbed MLA decode's warp-specialized split kernel (default split rule, H < 64, sm_90a): a
// TMA producer warp and two consumer warp groups over a ring of swizzled 32-key latent tiles.
#include "backend/cuda/cuda_mla_decode.cuh"

#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda::mla {

// Byte offset in a ring stage of (key k, channels c..c+7), c a multiple of 8: sub-tile c / 64,
// row k of 128 bytes, 16-byte chunk (c % 64) / 8 XOR k % 8 — TMA's 128-byte swizzle (stage and
// sub-tiles 1024-byte aligned), so the 8 rows of an ldmatrix 8×8 read hit 8 distinct bank groups.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t ws_offset(int k, int c) {
  return static_cast<uint32_t>((c / kWsBoxCols) * kWsSubBytes + k * 128 + ((((c % kWsBoxCols) / 8) ^ (k % 8)) * 16));
}
#endif

// Split-KV attention over the latent pages for the 16 heads of one (row, head group): the same
// inputs, key ranges (split_span, default rule, one part per split) and outputs (part_acc,
// part_ml) as mla_split_tc_kernel<1>, FlashMLA's numerics (q̃, q_pe and P in bf16; scores, softmax
// state and o_lat fp32), shaped for bandwidth: the threads that compute never wait for memory they
// just asked for, the copies are few and large, and two tiles are in computation at once.
// Block (x = i·n_hg + g, y = split), 288 threads = 2 consumer groups of 4 warps + 1 producer warp.
//   producer (warp 8, lane 0): for the block's 32-key tiles in order, into a kWsStages-deep ring:
//            waits until the slot is free (empty[s]: the 4 warps of the group that read it),
//            announces the tile's bytes on full[s] and issues 9 TMA loads of [box_rows keys ×
//            64 channels] boxes of the cache (as a [n_blocks·block_size, 576] bf16 matrix, `map`)
//            per box_rows keys — a tile is one page run (block_size % box_rows == 0, box_rows 32
//            or 16). Page ids are read a tile ahead. Boxes entirely past the range are skipped.
//   consumer group c (warps 4c..4c+3) takes tiles c, c + 2, … with its own online softmax (m, l)
//            and o_lat; per tile, between two named barriers of its 128 threads:
//     scores:  warp w owns keys 8w..8w+7 over all 576 channels: 36 m16n8k16 MMAs in four
//              interleaved chains (channel blocks of 16, taken cyclically), added in fixed order;
//     softmax: thread j of the group owns head j / 8 and keys j % 8 + 8x (tc_softmax_update);
//              keys past the range score −inf (P = 0);
//     o_lat:   warp w owns channels 128w..128w+127 of all 16 heads (acc [16][4] fragments):
//              acc = acc·corr + P·V (V = the tile's first 512 channels by ldmatrix.trans; in a
//              partial last tile the V fragments of keys past the range are masked to +0: those
//              rows hold whatever the page holds there); then the warp releases the slot.
//   merge:   group 1 leaves its (m, l) and o_lat [16][520] fp32 in the drained ring; group 0 merges
//            the two (weights e^{m_c − M}, an empty group weighs 0) and writes the split.
// Deterministic (fixed tile-to-group assignment and merge order); a row's result depends on the
// launch only through n_splits. Shared (dynamic): ring [5][9][32][64] bf16 (swizzled), q [16][584]
// bf16, two WsGroupSmem, the full/empty barriers, 1 KB alignment slack: 211,664 bytes.
// Preconditions: r = 512, dr = 64, cache 16-byte aligned, block_size % box_rows == 0,
// kv_len ≥ q_len, split_keys == 0.
__global__ void __launch_bounds__(kWsThreads, 1)
    mla_split_ws_kernel(const __grid_constant__ CUtensorMap map, int box_rows, DecodePlan pl) {
  // Before the wait for the previous kernel: the row's key range and its first tile's page (step
  // inputs, never written by a kernel — unless a row map, a kernel's output, is in use).
  const bool early = pl.row_map == nullptr;
  if (!early) {
    pdl_wait();
    pdl_trigger();
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kWsTph = kWsGroupThreads / kHeads;      // softmax threads per head (8)
  constexpr int kWsChannels = kTcRank / kWsGroupWarps;  // o_lat channels per consumer warp (128)
  constexpr int kWsBarAll = 1;                          // named barriers: the 256 consumers,
  constexpr int kWsBarGroup = 2;                        // group g's 128 threads (id 2 + g)
  extern __shared__ __align__(16) unsigned char ws_smem[];
  unsigned char* ring = ws_smem + ((1024 - smem_u32(ws_smem) % 1024) % 1024);  // [kWsStages][kWsStageBytes]
  bf16* sq = reinterpret_cast<bf16*>(ring + kWsRingBytes);                     // [kHeads][kTcStride]
  WsGroupSmem* gsm = reinterpret_cast<WsGroupSmem*>(sq + kHeads * kTcStride);   // [kWsGroups]
  uint64_t* full = reinterpret_cast<uint64_t*>(gsm + kWsGroups);               // [kWsStages]
  uint64_t* empty = full + kWsStages;                                          // [kWsStages]

  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t i = blockIdx.x / static_cast<unsigned>(pl.n_hg);
  const int64_t h0 = static_cast<int64_t>(blockIdx.x % static_cast<unsigned>(pl.n_hg)) * kHeads;
  const int split = blockIdx.y;
  const auto [b, row, n_keys, per] = row_keys(pl, i, 1);
  const int64_t k_begin = split * per, k_end = std::min(n_keys, k_begin + per);
  const int64_t n_tiles = k_begin < k_end ? (k_end - k_begin + kTcKeys - 1) / kTcKeys : 0;
  const int32_t* pages = a.block_ids + a.block_indptr[b];
  const int64_t bs = a.block_size;
  // Cache row of the first key of box run `r` of tile `it` (−1: past the range).
  auto first_row = [&](int64_t it, int r) -> int64_t {
    const int64_t key = k_begin + it * kTcKeys + r * box_rows;
    return it < n_tiles && key < k_end ? static_cast<int64_t>(pages[key / bs]) * bs + key % bs : -1;
  };
  const int n_box = kTcKeys / box_rows;  // box rows per tile: 1 or 2
  const bool producer = warp == kWsConsumers / 32 && lane == 0;
  int64_t row0 = producer ? first_row(0, 0) : -1, row1 = producer && n_box > 1 ? first_row(0, 1) : -1;
  if (early) {
    pdl_wait();
    pdl_trigger();
  }
  float2* ml_out = pl.part_ml + (static_cast<int64_t>(split) * a.n_rows + i) * a.H;
  if (n_tiles == 0) {
    if (t < kHeads && h0 + t < a.H) ml_out[h0 + t] = make_float2(-INFINITY, 0.0f);
    return;
  }
  if (t == 0) init_ring(full, empty, kWsStages, 1, kWsGroupWarps);
  __syncthreads();

  if (warp == kWsConsumers / 32) {  // the producer warp: lane 0 issues everything
    if (lane != 0) return;
    const uint32_t box_bytes = static_cast<uint32_t>(box_rows) * kWsBoxCols * 2;
    for (int64_t it = 0; it < n_tiles; ++it) {
      // The next tile's page ids, in flight while this tile's slot frees up.
      const int64_t next0 = first_row(it + 1, 0), next1 = n_box > 1 ? first_row(it + 1, 1) : -1;
      const int s = static_cast<int>(it % kWsStages);
      mbar_wait(&empty[s], static_cast<uint32_t>((it / kWsStages) & 1) ^ 1u);
      mbar_arrive_expect_tx(&full[s], (row1 >= 0 ? 2u : 1u) * kWsBoxes * box_bytes);
      unsigned char* stage = ring + s * kWsStageBytes;
#pragma unroll
      for (int x = 0; x < kWsBoxes; ++x) {
        tma_load_2d(stage + x * kWsSubBytes, &map, x * kWsBoxCols, static_cast<int32_t>(row0), &full[s]);
        if (row1 >= 0)
          tma_load_2d(stage + x * kWsSubBytes + box_bytes, &map, x * kWsBoxCols, static_cast<int32_t>(row1), &full[s]);
      }
      row0 = next0;
      row1 = next1;
    }
    return;
  }

  // Consumers: the q tile, then the tiles.
  stage_q_tile<kHeads, kWsConsumers>(pl, i, row, h0, sq, t);
  named_barrier(kWsBarAll, kWsConsumers);

  const int grp = warp / kWsGroupWarps, wg = warp % kWsGroupWarps, tg = t % kWsGroupThreads;
  WsGroupSmem& my = gsm[grp];
  const int hh = tg / kWsTph, hj = tg % kWsTph;  // softmax: head hh, keys hj + 8x
  const uint32_t q_addr = smem_u32(sq + (lane % 16) * kTcStride + 8 * (lane / 16));
  float m_run = -INFINITY, l_run = 0.0f;  // head hh (all 8 of its threads hold it)
  float acc[kWsChannels / 8][4] = {};     // o_lat [16 heads][channels 128·wg..+127]
  for (int64_t it = grp; it < n_tiles; it += kWsGroups) {
    const int s = static_cast<int>(it % kWsStages);
    mbar_wait(&full[s], static_cast<uint32_t>((it / kWsStages) & 1));
    const uint32_t lat = smem_u32(ring + s * kWsStageBytes);
    const int64_t t0 = k_begin + it * kTcKeys;
    const int n_valid = static_cast<int>(std::min<int64_t>(kTcKeys, k_end - t0));

    {
      float sc[4][4] = {};
      const int k = 8 * wg + lane % 8;  // this lane's ldmatrix row: key k, channels kc + 8·(lane / 8)
#pragma unroll
      for (int kc = 0; kc < kTcWidth; kc += 32) {
        uint32_t qa[4], qb[4], lb[4];
        ldmatrix_x4(qa, q_addr + 2 * kc);
        ldmatrix_x4(qb, q_addr + 2 * (kc + 16));
        ldmatrix_x4(lb, lat + ws_offset(k, kc + 8 * (lane / 8)));
        const int x = 2 * ((kc / 32) % 2);
        mma_bf16_16816(sc[x], qa, lb[0], lb[1]);
        mma_bf16_16816(sc[x + 1], qb, lb[2], lb[3]);
      }
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = (sc[0][j] + sc[1][j]) + (sc[2][j] + sc[3][j]);
      float* red = &my.red[lane / 4][8 * wg + 2 * (lane % 4)];
      *reinterpret_cast<float2*>(red) = make_float2(v[0], v[1]);
      *reinterpret_cast<float2*>(red + 8 * kTcRedStride) = make_float2(v[2], v[3]);
    }
    named_barrier(kWsBarGroup + grp, kWsGroupThreads);

    {
      // The tile holds a key of the range, so m_new is finite.
      const float corr = tc_softmax_update<kWsTph, 1>(my.red[hh], 0, hj, n_valid, a.scale, my.p[hh], m_run, l_run);
      if (hj == 0) my.corr[hh] = corr;
    }
    named_barrier(kWsBarGroup + grp, kWsGroupThreads);

    const float c_lo = my.corr[lane / 4], c_hi = my.corr[lane / 4 + 8];
#pragma unroll
    for (int j = 0; j < kWsChannels / 8; ++j) {
      acc[j][0] *= c_lo;
      acc[j][1] *= c_lo;
      acc[j][2] *= c_hi;
      acc[j][3] *= c_hi;
    }
    const bool partial = n_valid < kTcKeys;
#pragma unroll
    for (int ks = 0; ks < kTcKeys / 16; ++ks) {
      uint32_t pa[4];
      ldmatrix_x4(pa, smem_u32(&my.p[lane % 16][16 * ks + 8 * (lane / 16)]));
      const int k = 16 * ks + lane % 8 + 8 * ((lane / 8) % 2);  // this lane's ldmatrix row
      const int k0 = 16 * ks + 2 * (lane % 4);                  // keys of fragment b0 (b1: + 8)
#pragma unroll
      for (int pr = 0; pr < kWsChannels / 16; ++pr) {
        uint32_t vb[4];  // b0, b1 of channel tiles 128·wg + 16·pr and + 8
        ldmatrix_x4_trans(vb, lat + ws_offset(k, kWsChannels * wg + 16 * pr + 8 * (lane / 16)));
        if (partial) {
          vb[0] = keep_keys(vb[0], k0, n_valid);
          vb[1] = keep_keys(vb[1], k0 + 8, n_valid);
          vb[2] = keep_keys(vb[2], k0, n_valid);
          vb[3] = keep_keys(vb[3], k0 + 8, n_valid);
        }
        mma_bf16_16816(acc[2 * pr], pa, vb[0], vb[1]);
        mma_bf16_16816(acc[2 * pr + 1], pa, vb[2], vb[3]);
      }
    }
    __syncwarp();  // every lane's reads of the slot are done
    if (lane == 0) mbar_arrive(&empty[s]);
  }

  // Merge the two groups: group 1's state and o_lat through the drained ring (every tile was
  // waited for and read by now, so no copy is in flight and no warp reads the ring).
  if (hj == 0) my.ml[hh] = make_float2(m_run, l_run);
  named_barrier(kWsBarAll, kWsConsumers);
  float* xacc = reinterpret_cast<float*>(ring);  // [kHeads][kTcXStride]
  if (grp == 1)
#pragma unroll
    for (int j = 0; j < kWsChannels / 8; ++j) {
      float* x = xacc + (lane / 4) * kTcXStride + kWsChannels * wg + 8 * j + 2 * (lane % 4);
      *reinterpret_cast<float2*>(x) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(x + 8 * kTcXStride) = make_float2(acc[j][2], acc[j][3]);
    }
  named_barrier(kWsBarAll, kWsConsumers);
  if (grp == 1) return;
  // Weights e^{m_c − M} of head h's two groups (0 for an empty one), M their max; returns M.
  auto weights = [&](int h, float& w0, float& w1) {
    const float2 s0 = gsm[0].ml[h], s1 = gsm[1].ml[h];
    float m = -INFINITY;
    if (s0.y > 0.0f) m = s0.x;
    if (s1.y > 0.0f) m = fmaxf(m, s1.x);
    w0 = s0.y > 0.0f ? __expf(s0.x - m) : 0.0f;
    w1 = s1.y > 0.0f ? __expf(s1.x - m) : 0.0f;
    return m;
  };
  float w0_lo, w1_lo, w0_hi, w1_hi;
  weights(lane / 4, w0_lo, w1_lo);
  weights(lane / 4 + 8, w0_hi, w1_hi);
  float* acc_out = pl.part_acc + (static_cast<int64_t>(split) * a.n_rows + i) * a.H * kTcRank;
  const int64_t h_lo = h0 + lane / 4, h_hi = h_lo + 8;
#pragma unroll
  for (int j = 0; j < kWsChannels / 8; ++j) {
    const int c = kWsChannels * wg + 8 * j + 2 * (lane % 4);
    const float* x = xacc + (lane / 4) * kTcXStride + c;
    const float2 lo = *reinterpret_cast<const float2*>(x), hi = *reinterpret_cast<const float2*>(x + 8 * kTcXStride);
    if (h_lo < a.H)
      *reinterpret_cast<float2*>(acc_out + h_lo * kTcRank + c) =
          make_float2(fmaf(w1_lo, lo.x, acc[j][0] * w0_lo), fmaf(w1_lo, lo.y, acc[j][1] * w0_lo));
    if (h_hi < a.H)
      *reinterpret_cast<float2*>(acc_out + h_hi * kTcRank + c) =
          make_float2(fmaf(w1_hi, hi.x, acc[j][2] * w0_hi), fmaf(w1_hi, hi.y, acc[j][3] * w0_hi));
  }
  if (hj == 0 && h0 + hh < a.H) {
    float w0, w1;
    const float m = weights(hh, w0, w1);  // group 0 always has a tile (n_tiles ≥ 1): m is finite
    ml_out[h0 + hh] = make_float2(m, fmaf(w1, gsm[1].ml[hh].y, w0 * gsm[0].ml[hh].y));
  }
#else
  __trap();  // built for another architecture: mla_decode picks this kernel only on sm_90a
#endif
}

}  // namespace deepinfer::cuda::mla
