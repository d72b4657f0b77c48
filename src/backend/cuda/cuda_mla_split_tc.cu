// The absorbed MLA decode's one-row tensor-core split kernel (mma.sync, 16 or 64 heads per block,
// optional 2-CTA clusters), and its launch: a kernel template, so only this file can launch it.
#include "backend/cuda/cuda_mla_decode.cuh"

#include <cooperative_groups.h>

namespace deepinfer::cuda::mla {

// Split-KV attention over the latent pages on tensor cores, for 16·MT heads of one selected row
// (MT = 1: 16 heads; MT = 4: 64 heads, so H = 128 reads a row's latents twice, not eight times).
// Same inputs, key ranges and outputs (part_acc, part_ml) as mla_split_kernel; FlashMLA's
// numerics: q̃, q_pe and the probabilities rounded to bf16, scores, softmax state and o_lat fp32.
// Block (x = (i·n_hg + g)·cluster + rank, y = split), 256 threads (8 warps). The split's key range
// (split_span, as the fp32 kernel) is cut into `cluster` parts of whole tiles, one per CTA of a thread-block
// cluster (cluster > 1 only for MT = 1, when a launch has too few splits to fill the SMs); part
// `rank` is virtual split split·cluster + rank of n_splits·cluster. Per 32-key tile:
//   load:    cp.async 16-byte copies of the tile's cache rows into a kStages-deep ring (issued
//            kStages − 1 tiles ahead; keys past the range are zero-filled, never read);
//   scores:  S[heads, keys] = [q̃ | q_pe] · latentᵀ with m16n8k16 MMAs: MT = 1: warp w owns key
//            tile w % 4 over channel half w / 4 (the two halves' partials are added in order);
//            MT = 4: warp w owns m-tile w / 2 and key tiles 2(w % 2), +1 over all 576 channels.
//            A (q) and B (latent rows: key-major, channel-contiguous = "col") by ldmatrix;
//   softmax: thread t owns head t / kTph and keys t % kTph + kTph·j: the online (m, l) of its
//            head, P = bf16(e^{s − m}) to shared memory, l adds the rounded P (exactly what P·V
//            adds); the rescale factor corr per head. Keys past the range score −inf (P = 0);
//   o_lat:   warp w owns channels 64w..64w+63 for all heads (acc [MT][8][4] fragments):
//            acc = acc·corr + P · V, V = the tile's first 512 channels by ldmatrix.trans.
// Shared (dynamic): latent ring [kStages][32][584] bf16, q [16·MT][584] bf16, partial scores
// [kSplitK][16·MT][36] fp32, P [16·MT][40] bf16, corr [16·MT], (m, l) [16·MT]: 174,272 bytes
// (MT = 1, 4 stages) / 201,984 bytes (MT = 4, 3 stages); one block per SM.
// Cluster merge (cluster > 1): every CTA publishes (m, l) per head, ranks > 0 their o_lat
// [16][520] fp32 (in the drained latent ring); rank 0 merges the ranks in rank order through
// distributed shared memory and writes the split. Deterministic for a given (n_splits, cluster).
// Preconditions: r = 512, dr = 64, cache rows 16-byte aligned, kv_len ≥ q_len.
template <int MT>
__global__ void __launch_bounds__(kThreads, 1) mla_split_tc_kernel(DecodePlan pl) {
  using S = TcShape<MT>;
  constexpr int HB = S::kHeads, kStages = S::kStages, kTilesN = S::kTilesN, kSplitK = S::kSplitK;
  constexpr int kTph = S::kTph, kChannels = kTcWidth / kSplitK;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  bf16* slat = reinterpret_cast<bf16*>(tc_smem);                           // [kStages][kTcKeys][kTcStride]
  bf16* sq = slat + kStages * kTcKeys * kTcStride;                         // [HB][kTcStride]
  float* sred = reinterpret_cast<float*>(sq + HB * kTcStride);             // [kSplitK][HB][kTcRedStride]
  bf16* sp = reinterpret_cast<bf16*>(sred + kSplitK * HB * kTcRedStride);  // [HB][kTcPStride]
  float* scorr = reinterpret_cast<float*>(sp + HB * kTcPStride);           // [HB]
  float2* sml = reinterpret_cast<float2*>(scorr + HB);                     // [HB]

  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int n_cta = pl.cluster, rank = static_cast<int>(blockIdx.x % static_cast<unsigned>(n_cta));
  const int64_t grp = blockIdx.x / static_cast<unsigned>(n_cta);
  const int64_t i = grp / pl.n_hg, h0 = (grp % pl.n_hg) * HB;
  const int split = blockIdx.y;
  const auto [b, row, n_keys, per] = row_keys(pl, i, n_cta);
  const int64_t k_begin = (split * static_cast<int64_t>(n_cta) + rank) * per, k_end = std::min(n_keys, k_begin + per);
  const int64_t n_tiles = k_begin < k_end ? (k_end - k_begin + kTcKeys - 1) / kTcKeys : 0;
  const int hh = t / kTph, hj = t % kTph;  // softmax: head hh, keys hj + kTph·x
  float2* ml_out = pl.part_ml + (static_cast<int64_t>(split) * a.n_rows + i) * a.H;
  if (n_cta == 1 && n_tiles == 0) {
    if (hj == 0 && h0 + hh < a.H) ml_out[h0 + hh] = make_float2(-INFINITY, 0.0f);
    return;
  }

  // The row's latent pages, one 16-byte copy per (key, 8 channels); tile `tile` counts from k_begin.
  // Lane l looks up the cache row of the tile's key l (one division per tile, not one per copy);
  // the copies take their keys' rows from the lanes by shuffles.
  const int32_t* pages = a.block_ids + a.block_indptr[b];
  const uint32_t bs = static_cast<uint32_t>(a.block_size);
  auto load_tile = [&](int64_t tile) {
    if (tile < n_tiles) {
      const uint32_t key = static_cast<uint32_t>(k_begin + tile * kTcKeys) + lane;
      const int64_t my_row =
          key < static_cast<uint32_t>(k_end) ? static_cast<int64_t>(pages[key / bs]) * bs + key % bs : int64_t{-1};
      bf16* dst = slat + (tile % kStages) * kTcKeys * kTcStride;
#pragma unroll
      for (int j = 0; j < kTcChunks; ++j) {
        const int e = t + j * kThreads, k = e / (kTcWidth / 8), c8 = e % (kTcWidth / 8);
        const int64_t row = __shfl_sync(0xffffffffu, my_row, k);
        const bool valid = row >= 0;
        cp_async16(smem_u32(dst + k * kTcStride + 8 * c8), valid ? a.cache + row * kTcWidth + 8 * c8 : a.cache, valid);
      }
    }
    cp_async_commit();  // one group per tile slot, empty past the range: the wait counts stay uniform
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) load_tile(st);

  stage_q_tile<HB, kThreads>(pl, i, row, h0, sq, t);

  // Scores: this warp's m-tile, key tiles and channel range; ldmatrix row addresses per lane.
  const int s_mt = MT == 1 ? 0 : warp / 2, s_nt = MT == 1 ? warp % 4 : 2 * (warp % 2);
  const int s_kh = MT == 1 ? warp / 4 : 0, s_c0 = s_kh * kChannels;
  const uint32_t q_addr = smem_u32(sq + (16 * s_mt + lane % 16) * kTcStride + s_c0 + 8 * (lane / 16));
  float m_run = -INFINITY, l_run = 0.0f;  // head hh (every thread of the head holds it)
  float acc[MT][8][4] = {};               // o_lat [16·MT heads][channels 64·warp..+63] fragments
  for (int64_t it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile `it` have landed
    __syncthreads();               // everyone's have; the slot refilled below was last read at it − 1
    load_tile(it + kStages - 1);
    const bf16* lat = slat + (it % kStages) * kTcKeys * kTcStride;
    const int64_t t0 = k_begin + it * kTcKeys;

    {
      float s[kTilesN][4] = {};
      uint32_t l_addr[kTilesN];
#pragma unroll
      for (int n = 0; n < kTilesN; ++n)
        l_addr[n] = smem_u32(lat + (8 * (s_nt + n) + lane % 8) * kTcStride + s_c0 + 8 * (lane / 8));
#pragma unroll 3
      for (int kc = 0; kc < kChannels; kc += 32) {
        uint32_t qa[4], qb[4];
        ldmatrix_x4(qa, q_addr + 2 * kc);
        ldmatrix_x4(qb, q_addr + 2 * (kc + 16));
#pragma unroll
        for (int n = 0; n < kTilesN; ++n) {
          uint32_t lb[4];
          ldmatrix_x4(lb, l_addr[n] + 2 * kc);
          mma_bf16_16816(s[n], qa, lb[0], lb[1]);
          mma_bf16_16816(s[n], qb, lb[2], lb[3]);
        }
      }
#pragma unroll
      for (int n = 0; n < kTilesN; ++n) {
        float* red = sred + (s_kh * HB + 16 * s_mt + lane / 4) * kTcRedStride + 8 * (s_nt + n) + 2 * (lane % 4);
        *reinterpret_cast<float2*>(red) = make_float2(s[n][0], s[n][1]);
        *reinterpret_cast<float2*>(red + 8 * kTcRedStride) = make_float2(s[n][2], s[n][3]);
      }
    }
    __syncthreads();

    {
      // The tile holds a key of the range, so m_new is finite.
      const float corr = tc_softmax_update<kTph, kSplitK>(sred + hh * kTcRedStride, HB * kTcRedStride, hj,
                                                          k_end - t0, a.scale, sp + hh * kTcPStride, m_run, l_run);
      if (hj == 0) scorr[hh] = corr;
    }
    __syncthreads();

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float c_lo = scorr[16 * mt + lane / 4], c_hi = scorr[16 * mt + lane / 4 + 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc[mt][j][0] *= c_lo;
        acc[mt][j][1] *= c_lo;
        acc[mt][j][2] *= c_hi;
        acc[mt][j][3] *= c_hi;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kTcKeys / 16; ++ks) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(pa[mt], smem_u32(sp + (16 * mt + lane % 16) * kTcPStride + 16 * ks + 8 * (lane / 16)));
#pragma unroll
      for (int pr = 0; pr < 4; ++pr) {
        uint32_t vb[4];  // b0, b1 of channel tiles 64·warp + 16·pr and + 8
        ldmatrix_x4_trans(vb, smem_u32(lat + (16 * ks + lane % 8 + 8 * ((lane / 8) % 2)) * kTcStride + 64 * warp +
                                   16 * pr + 8 * (lane / 16)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(acc[mt][2 * pr], pa[mt], vb[0], vb[1]);
          mma_bf16_16816(acc[mt][2 * pr + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

  if constexpr (MT == 1) {
    if (n_cta > 1) {
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      cp_async_wait<0>();
      __syncthreads();  // the latent ring is drained and no warp reads it any more
      float* xacc = reinterpret_cast<float*>(slat);  // [16][kTcXStride] o_lat of this CTA
      if (rank > 0)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float* x = xacc + (lane / 4) * kTcXStride + 64 * warp + 8 * j + 2 * (lane % 4);
          *reinterpret_cast<float2*>(x) = make_float2(acc[0][j][0], acc[0][j][1]);
          *reinterpret_cast<float2*>(x + 8 * kTcXStride) = make_float2(acc[0][j][2], acc[0][j][3]);
        }
      if (hj == 0) sml[hh] = make_float2(m_run, l_run);
      cluster.sync();  // publishes every CTA's (m, l) and o_lat to the cluster
      if (rank == 0) {
        // Weights w_c = e^{m_c − M} (0 for an empty part) of head `h`'s parts, M their max.
        auto weights = [&](int h, float (&w)[kTcMaxCluster]) {
          float2 ml[kTcMaxCluster];
          float m = -INFINITY;
#pragma unroll
          for (int c = 0; c < kTcMaxCluster; ++c) {
            ml[c] = c == 0 ? sml[h] : c < n_cta ? cluster.map_shared_rank(sml, c)[h] : make_float2(-INFINITY, 0.0f);
            if (ml[c].y > 0.0f) m = fmaxf(m, ml[c].x);
          }
#pragma unroll
          for (int c = 0; c < kTcMaxCluster; ++c) w[c] = ml[c].y > 0.0f ? __expf(ml[c].x - m) : 0.0f;
          return m;
        };
        float w_lo[kTcMaxCluster], w_hi[kTcMaxCluster], w_me[kTcMaxCluster];
        weights(lane / 4, w_lo);
        weights(lane / 4 + 8, w_hi);
        const float m_all = weights(hh, w_me);
        float l_all = w_me[0] * sml[hh].y;
#pragma unroll
        for (int c = 1; c < kTcMaxCluster; ++c)
          if (c < n_cta) l_all += w_me[c] * cluster.map_shared_rank(sml, c)[hh].y;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[0][j][0] *= w_lo[0];
          acc[0][j][1] *= w_lo[0];
          acc[0][j][2] *= w_hi[0];
          acc[0][j][3] *= w_hi[0];
        }
#pragma unroll
        for (int c = 1; c < kTcMaxCluster; ++c) {
          if (c >= n_cta) break;
          const float* rx = cluster.map_shared_rank(xacc, c);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float* x = rx + (lane / 4) * kTcXStride + 64 * warp + 8 * j + 2 * (lane % 4);
            const float2 lo = *reinterpret_cast<const float2*>(x), hi = *reinterpret_cast<const float2*>(x + 8 * kTcXStride);
            acc[0][j][0] = fmaf(w_lo[c], lo.x, acc[0][j][0]);
            acc[0][j][1] = fmaf(w_lo[c], lo.y, acc[0][j][1]);
            acc[0][j][2] = fmaf(w_hi[c], hi.x, acc[0][j][2]);
            acc[0][j][3] = fmaf(w_hi[c], hi.y, acc[0][j][3]);
          }
        }
        m_run = m_all;  // (−inf, 0) when every part is empty: the empty-split marker
        l_run = l_all;
      }
      cluster.sync();  // rank 0 has read the other CTAs' shared memory: they may exit
      if (rank > 0) return;
    }
  }

  float* acc_out = pl.part_acc + (static_cast<int64_t>(split) * a.n_rows + i) * a.H * kTcRank;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int64_t h_lo = h0 + 16 * mt + lane / 4, h_hi = h_lo + 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 64 * warp + 8 * j + 2 * (lane % 4);
      if (h_lo < a.H) *reinterpret_cast<float2*>(acc_out + h_lo * kTcRank + c) = make_float2(acc[mt][j][0], acc[mt][j][1]);
      if (h_hi < a.H) *reinterpret_cast<float2*>(acc_out + h_hi * kTcRank + c) = make_float2(acc[mt][j][2], acc[mt][j][3]);
    }
  }
  if (hj == 0 && h0 + hh < a.H) ml_out[h0 + hh] = make_float2(m_run, l_run);
}

template <int MT>
void launch_split_tc_mt(const DecodePlan& pl, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(pl.a.n_rows * pl.n_hg * pl.cluster), static_cast<unsigned>(pl.n_splits));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = TcShape<MT>::kSmemBytes;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(pl.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, mla_split_tc_kernel<MT>, pl));
}

void launch_split_tc(const DecodePlan& pl, int mt, cudaStream_t s) {
  DI_CUDA_REQUIRE(mt == 1 || mt == 4);
  if (mt == 1) launch_split_tc_mt<1>(pl, s);
  else launch_split_tc_mt<4>(pl, s);
}

void set_split_tc_smem() {
  DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_tc_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(TcShape<1>::kSmemBytes)));
  DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_tc_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(TcShape<4>::kSmemBytes)));
}

}  // namespace deepinfer::cuda::mla
