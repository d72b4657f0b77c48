// The absorbed MLA decode's split kernel on Hopper's warpgroup MMA (default split rule, H ≥ 64,
// sm_90a): 64 heads of one row per block, a TMA producer thread over a two-stage ring of 64-key
// latent tiles, two math warpgroups that each score half of a tile's keys and exchange their
// probabilities so each can apply the whole tile to its half of the 512 latent channels.
//
// Why: at V3's 128 heads a key costs 278.5 KFLOP for its 1,152 bytes (242 FLOP/B, above the
// H200's ~185 FLOP/B ridge), so the shape is bound by the matrix rate, and mla_split_tc_kernel<4>
// (mma.sync, every operand through ldmatrix) ran at 0.20–0.23 of it. wgmma reads B from shared
// memory once per 64 rows and the warps issue no operand loads: 0.60 of the bf16 GEMM rate at
// 128 rows × 16K keys (docs/perf.md, version 22, with what did not pay).
#include "backend/cuda/cuda_mla_decode.cuh"

#include "backend/cuda/cuda_mla_prefill.cuh"  // pack_bf16x2, fast_exp2, exp2_pack
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda::mla {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace {

// d[64×32] fp32 (+)= A[64×16] · B[32×16]ᵀ, bf16, both K-major in shared memory (128-byte swizzle);
// accumulate = 0 overwrites d. d[4j + v]: row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4) + v%2
// (warp w of the warpgroup, lane l), j < 4.
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                     int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
               : DI_WGMMA_ACC8(d, 0), DI_WGMMA_ACC8(d, 8)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d[64×256] fp32 += A[64×16] · B[16×256], A bf16 from registers (mma.sync m16n8k16's A fragment
// per warp, as wgmma_m64n128k16_bf16_rs takes it), B bf16 MN-major in shared memory
// (sw128_desc_mn). d[4j + v]: row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4) + v%2, j < 64.
__device__ __forceinline__ void wgmma_m64n256k16_bf16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b,
                                                         int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DI_WGMMA_REGS64 ", " DI_WGMMA_REGS64_HI "}, "
               "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
               : DI_WGMMA_ACC64(d, 0), DI_WGMMA_ACC64(d, 64)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// Named barriers (0 is __syncthreads): the 256 math threads at the q tile, at the max exchange
// and at the probability exchange; each warpgroup's 128 threads after zeroing its V rows.
constexpr int kBarQ = 1, kBarMax = 2, kBarP = 3, kBarZero = 4;  // kBarZero + warpgroup
constexpr int kMathThreads = 128 * kWgMath;

}  // namespace
#endif

// Split-KV attention over the latent pages for 64 heads (h0 = 64·g ..) of one selected row: the
// same inputs and outputs (part_acc, part_ml) as mla_split_tc_kernel<4>, FlashMLA's numerics
// (q̃, q_pe and P rounded to bf16; scores, softmax state and o_lat fp32). A split owns whole
// 64-key stages: split y of a row with n keys owns [y·span, min(n, (y+1)·span)), span =
// ceil(ceil(n / n_splits) / 64)·64 (so every stage starts on a TMA box run: block_size %
// box_rows == 0, box_rows | 64).
// Block (x = i·n_hg + g, y = split), 384 threads: math warpgroups 0 and 1 (kWgMathRegs = 240
// registers each after setmaxnreg), producer warpgroup 2 (24; the rest of it exits at once).
//   producer (thread 256): for the split's stages in order, into stage it % 2: waits until
//            both warpgroups released it (empty: one arrival per math warp), announces 73,728
//            bytes on full and TMA-loads the 64 keys × 576 channels as 9 channel blocks of
//            [64 keys][128 B] (128-byte swizzle), each from 64 / box_rows page runs (box_rows key
//            rows of the cache as a [n_blocks·block_size, 576] matrix). A run past the range
//            reloads the stage's first run (masked, and its V rows zeroed, below).
//   math warpgroup w (thread t: warp 4w + v, lane l — rows r = 16v + l/4 and r + 8 of the tile,
//            as every wgmma accumulator lays them out), per stage:
//     scores:   S_w[64 heads][32 keys] = [q̃ | q_pe] · latentᵀ of keys 32w .. 32w + 31: 36
//               m64n32k16 wgmmas (9 channel blocks × 4 k16 steps, both operands from shared
//               memory); keys past the range score −inf (a select, so garbage there is harmless);
//     softmax:  each row's max over its 32 keys (the 4 lanes of a quad) → shared memory; after
//               the exchange barrier M' = max(M, both maxima)·scale·log2 e, P = bf16(2^(s·scale·
//               log2 e − M')) as A fragments, l = l·corr + Σ P (this warpgroup's keys; the two
//               l's are added at the end), corr = 2^(M − M');
//     exchange: each thread leaves its P fragments in shared memory and, after the barrier,
//               takes the other warpgroup's thread t's: the same rows and key positions of the
//               other 32 keys (the accumulator layout does not depend on the warpgroup);
//     o_lat:    O_w[64 heads][channels 256w .. +255] = O_w·corr + P[64][64 keys] · V (4 RS
//               m64n256k16 wgmmas; V the stage's channel blocks 4w .. 4w + 3 as an MN-major B;
//               the rescale skipped by a warp none of whose rows' max moved: corr = 1 exactly).
//               In a partial last stage the warpgroup first zeroes its V rows of the keys past
//               the range (those page slots may hold anything; 0 · NaN would poison O).
//               Then each warp releases the stage.
//   end:     the two warpgroups' l added through shared memory; warpgroup w writes channels
//            256w .. +255 of part_acc, warpgroup 0 the (max, l) per head (the max in natural
//            units, scale · score, as every split kernel writes it).
// Shared (dynamic, 1024-aligned): q [9][64 heads][128 B] bf16 (written by the math threads in
// TMA's swizzle), ring [2][9][64 keys][128 B], the P exchange [2][2][128] 16-byte fragments, the
// row maxima (then the l's) [2][64] fp32, full/empty barriers: 230,944 bytes with the alignment
// slack; one block per SM.
// Deterministic (fixed key halves, exchange and reduction orders); a row's result depends on the
// launch only through n_splits. Preconditions (mla_decode): r = 512, dr = 64, dn % 4 == 0, the
// cache 16-byte aligned with n_blocks·block_size ≤ 2^31 rows, block_size % box_rows == 0 (box_rows
// 16, 32 or 64), kv_len ≥ q_len, split_keys == 0.
__global__ void __launch_bounds__(kWgThreads, 1)
    mla_split_wgmma_kernel(const __grid_constant__ CUtensorMap map, int box_rows, DecodePlan pl) {
  // Before the wait for the previous kernel: the row's key range and its first stage's pages
  // (step inputs, never written by a kernel — unless a row map, a kernel's output, is in use).
  const bool early = pl.row_map == nullptr;
  if (!early) {
    pdl_wait();
    pdl_trigger();
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char wg_smem[];
  uint8_t* sq = wg_smem + ((1024 - smem_u32(wg_smem) % 1024) % 1024);        // [9][64][128 B]
  uint8_t* ring = sq + kWgQBytes;                                            // [2][9][64][128 B]
  uint4* sx = reinterpret_cast<uint4*>(ring + kWgStages * kWgStageBytes);   // [2 wg][2 k16][128]
  float* sred = reinterpret_cast<float*>(sx + kWgMath * 2 * 128);            // [2 wg][64 rows]
  uint64_t* full = reinterpret_cast<uint64_t*>(sred + kWgMath * kWgHeads);  // [2]
  uint64_t* empty = full + kWgStages;                                        // [2]

  const MlaDecodeArgs& a = pl.a;
  // wg through a shuffle from lane 0: warp-uniform to ptxas, so the descriptors stay in the
  // uniform datapath and the role branch below is not divergent (cuda_fp8_wgmma.cu's
  // compute_tiles; docs/perf.md version 21).
  const int t = threadIdx.x, wg = __shfl_sync(0xffffffffu, t / 128, 0), warp = t / 32, lane = t % 32;
  const int64_t i = blockIdx.x / static_cast<unsigned>(pl.n_hg);
  const int64_t h0 = static_cast<int64_t>(blockIdx.x % static_cast<unsigned>(pl.n_hg)) * kWgHeads;
  const int split = blockIdx.y;
  const RowKeys rk = row_keys(pl, i, 1);
  const int64_t per = ((rk.n_keys + pl.n_splits - 1) / pl.n_splits + kWgKeys - 1) / kWgKeys * kWgKeys;
  const int64_t k_begin = split * per, k_end = std::min(rk.n_keys, k_begin + per);
  const int64_t n_stages = k_begin < k_end ? (k_end - k_begin + kWgKeys - 1) / kWgKeys : 0;
  const int32_t* pages = a.block_ids + a.block_indptr[rk.b];
  const uint32_t bs = static_cast<uint32_t>(a.block_size);  // 32-bit: keys and cache rows < 2^31
  const int n_runs = kWgKeys / box_rows;  // page runs per stage: 1, 2 or 4
  // Cache rows of stage `it`'s page runs; a run past the range repeats the first (in range).
  auto stage_rows = [&](int64_t it, int32_t (&rows)[kWgKeys / 16]) {
    const uint32_t key0 = static_cast<uint32_t>(k_begin + it * kWgKeys), end = static_cast<uint32_t>(k_end);
#pragma unroll
    for (int r = 0; r < kWgKeys / 16; ++r) {
      const uint32_t key = key0 + static_cast<uint32_t>(r * box_rows);
      rows[r] = r < n_runs && key < end ? static_cast<int32_t>(static_cast<uint32_t>(pages[key / bs]) * bs + key % bs) : -1;
    }
#pragma unroll
    for (int r = 1; r < kWgKeys / 16; ++r)
      if (rows[r] < 0) rows[r] = rows[0];
  };
  const bool producer = t == kMathThreads;
  int32_t rows[kWgKeys / 16] = {};
  if (producer && n_stages > 0) stage_rows(0, rows);
  if (early) {
    pdl_wait();
    pdl_trigger();
  }
  float2* ml_out = pl.part_ml + (static_cast<int64_t>(split) * a.n_rows + i) * a.H;
  if (n_stages == 0) {
    if (t < kWgHeads && h0 + t < a.H) ml_out[h0 + t] = make_float2(-INFINITY, 0.0f);
    return;
  }
  if (t == 0) init_ring(full, empty, kWgStages, 1, 4 * kWgMath);
  __syncthreads();

  if (wg == kWgMath) {  // the producer warpgroup: its first thread issues everything
    setmaxnreg_dec<kWgProducerRegs>();
    if (!producer) return;
    for (int64_t it = 0; it < n_stages; ++it) {
      const int s = static_cast<int>(it % kWgStages);
      mbar_wait(&empty[s], static_cast<uint32_t>((it / kWgStages) & 1) ^ 1u);
      mbar_arrive_expect_tx(&full[s], kWgStageBytes);
      uint8_t* stage = ring + s * kWgStageBytes;
#pragma unroll
      for (int r = 0; r < kWgKeys / 16; ++r) {
        if (r >= n_runs) break;
#pragma unroll
        for (int cb = 0; cb < kWgBlocks; ++cb)
          tma_load_2d(stage + cb * kWgBlockBytes + r * box_rows * 128, &map, cb * 64, rows[r], &full[s]);
      }
      if (it + 1 < n_stages) stage_rows(it + 1, rows);  // the next stage's pages, while this one loads
    }
    return;
  }

  setmaxnreg_inc<kWgMathRegs>();
  // Math warpgroups. The q tile: 64 rows × 72 chunks of 8 channels (q̃: chunks 0..63, q_pe: 64..71)
  // → bf16, chunk c of row rr at channel block c / 8, 16-byte slot (c % 8) ^ (rr % 8) (TMA's
  // 128-byte swizzle, which the wgmma descriptors read); rows of heads ≥ H are zero.
  {
    constexpr int kChunks = kWgHeads * (kTcWidth / 8), kPer = kChunks / kMathThreads, kBatch = 6;
    static_assert(kChunks % kMathThreads == 0 && kPer % kBatch == 0, "whole batches per thread");
#pragma unroll
    for (int bt = 0; bt < kPer; bt += kBatch) {
      float4 v[kBatch][2];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int e = t + (bt + j) * kMathThreads, rr = e / (kTcWidth / 8), c = e % (kTcWidth / 8);
        const int64_t h = h0 + rr;
        v[j][0] = v[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < a.H) {
          const float* src = c < kTcRank / 8 ? pl.q_lat + (i * a.H + h) * kTcRank + 8 * c
                                             : a.q + (rk.row * a.H + h) * (a.dn + a.dr) + a.dn + 8 * c - kTcRank;
          v[j][0] = *reinterpret_cast<const float4*>(src);
          v[j][1] = *reinterpret_cast<const float4*>(src + 4);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int e = t + (bt + j) * kMathThreads, rr = e / (kTcWidth / 8), c = e % (kTcWidth / 8);
        *reinterpret_cast<uint4*>(sq + (c / 8) * (kWgHeads * 128) + rr * 128 + (((c % 8) ^ (rr % 8)) * 16)) =
            make_uint4(pack_bf16x2(v[j][0].x, v[j][0].y), pack_bf16x2(v[j][0].z, v[j][0].w),
                       pack_bf16x2(v[j][1].x, v[j][1].y), pack_bf16x2(v[j][1].z, v[j][1].w));
      }
    }
  }
  fence_proxy_async();  // the generic-proxy writes, visible to wgmma's reads
  named_barrier(kBarQ, kMathThreads);

  const int tw = t % 128, qd = lane % 4;
  const int r_lo = 16 * (warp % 4) + lane / 4, r_hi = r_lo + 8;
  const float sl2 = a.scale * 1.4426950408889634f;  // scale · log2 e
  const uint64_t dq = sw128_desc(sq);
  float m_lo = -INFINITY, m_hi = -INFINITY;  // running max of rows r_lo, r_hi (log2 units)
  float l_lo = 0.0f, l_hi = 0.0f;            // this thread's share of their Σ P
  float o[128];  // O_w [64 rows][256 channels]: o[4j + v] = row r_lo + 8·(v / 2), channel 256w + 8j + 2qd + v % 2
#pragma unroll
  for (int x = 0; x < 128; ++x) o[x] = 0.0f;

  for (int64_t it = 0; it < n_stages; ++it) {
    const int s = static_cast<int>(it % kWgStages);
    mbar_wait(&full[s], static_cast<uint32_t>((it / kWgStages) & 1));
    uint8_t* stage = ring + s * kWgStageBytes;
    // Keys of the range in this stage, through a shuffle: warp-uniform to ptxas, so the partial
    // stage's branches below are not divergent (a divergent one serializes every wgmma, C7520).
    const int n_valid =
        __shfl_sync(0xffffffffu, static_cast<int>(std::min<int64_t>(kWgKeys, k_end - (k_begin + it * kWgKeys))), 0);

    float sc[16];  // S_w: sc[4j + v] = row r_lo + 8·(v / 2), key 32w + 8j + 2qd + v % 2 of the stage
    {
      const uint64_t dk = sw128_desc(stage + wg * (kWgHalfKeys * 128));
      wgmma_fence();
#pragma unroll
      for (int cb = 0; cb < kWgBlocks; ++cb)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          // q and stage channel blocks are both [64 rows][128 B]: the same step for A and B
          const uint32_t units = static_cast<uint32_t>(cb * (kWgBlockBytes / 16) + 2 * k);
          wgmma_m64n32k16_bf16(sc, desc_advance(dq, units), desc_advance(dk, units), cb + k > 0);
        }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int x = 0; x < 16; ++x) fence_operand(sc[x]);
    }
    if (n_valid < kWgKeys) {
#pragma unroll
      for (int x = 0; x < 16; ++x)
        if (kWgHalfKeys * wg + 8 * (x / 4) + 2 * qd + (x & 1) >= n_valid) sc[x] = -INFINITY;
    }

    // The rows' maxima over this warpgroup's keys, then over both warpgroups' (the stage holds a
    // key of the range, key 0 is warpgroup 0's: the new max is finite).
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      mx_lo = fmaxf(mx_lo, fmaxf(sc[4 * j], sc[4 * j + 1]));
      mx_hi = fmaxf(mx_hi, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, x));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, x));
    }
    if (qd == 0) {
      sred[wg * kWgHeads + r_lo] = mx_lo;
      sred[wg * kWgHeads + r_hi] = mx_hi;
    }
    named_barrier(kBarMax, kMathThreads);
    const float mn_lo = fmaxf(m_lo, fmaxf(mx_lo, sred[(1 - wg) * kWgHeads + r_lo]) * sl2);
    const float mn_hi = fmaxf(m_hi, fmaxf(mx_hi, sred[(1 - wg) * kWgHeads + r_hi]) * sl2);
    const float c_lo = fast_exp2(m_lo - mn_lo), c_hi = fast_exp2(m_hi - mn_hi);  // 0 on the first stage
    m_lo = mn_lo;
    m_hi = mn_hi;

    // P of this warpgroup's keys as A fragments (k16 step j: keys 16j .. 16j + 15 of its 32).
    uint32_t own[2][4];
    float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      float2 f;
      own[n / 2][2 * (n % 2)] = exp2_pack(sc[4 * n], sc[4 * n + 1], sl2, mn_lo, ps_lo, f);
      own[n / 2][2 * (n % 2) + 1] = exp2_pack(sc[4 * n + 2], sc[4 * n + 3], sl2, mn_hi, ps_hi, f);
    }
    l_lo = fmaf(l_lo, c_lo, ps_lo);
    l_hi = fmaf(l_hi, c_hi, ps_hi);
#pragma unroll
    for (int j = 0; j < 2; ++j) sx[(wg * 2 + j) * 128 + tw] = make_uint4(own[j][0], own[j][1], own[j][2], own[j][3]);
    named_barrier(kBarP, kMathThreads);
    uint32_t p[4][4];  // P's four k16 steps over the stage's 64 keys: warpgroup 0's two, then 1's
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint4 x = sx[((1 - wg) * 2 + j) * 128 + tw];
      const uint32_t oth[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[j][e] = wg == 0 ? own[j][e] : oth[e];
        p[2 + j][e] = wg == 0 ? oth[e] : own[j][e];
      }
    }
    // P's registers settled before the first wgmma reads them: a register an RS wgmma reads that
    // is written after wgmma.fence makes ptxas inject a warpgroup.arrive before that wgmma (C7519).
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p[k][e])::"memory");

    if (n_valid < kWgKeys) {  // V rows of keys ≥ n_valid in this warpgroup's channel blocks → +0
      const int n_zero = (kWgKeys - n_valid) * 4 * 8;  // 16-byte slots: rows × 4 blocks × 8
#pragma unroll
      for (int x = 0; x < kWgKeys * 4 * 8 / 128; ++x) {  // predicated stores, no divergent loop
        const int e = tw + 128 * x, k = n_valid + e / 32, cb = 4 * wg + (e % 32) / 8;
        if (e < n_zero)
          *reinterpret_cast<uint4*>(stage + cb * kWgBlockBytes + k * 128 + (e % 8) * 16) = make_uint4(0u, 0u, 0u, 0u);
      }
      fence_proxy_async();
      named_barrier(kBarZero + wg, 128);
    }

    if (__any_sync(0xffffffffu, c_lo != 1.0f || c_hi != 1.0f)) {
#pragma unroll
      for (int x = 0; x < 128; ++x) o[x] *= (x & 2) ? c_hi : c_lo;
    }
    {
      const uint64_t dv = sw128_desc_mn(stage + 4 * wg * kWgBlockBytes, kWgBlockBytes);
#pragma unroll
      for (int x = 0; x < 128; ++x) fence_operand(o[x]);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) wgmma_m64n256k16_bf16_rs(o, p[k], desc_advance(dv, static_cast<uint32_t>(k * 128)), 1);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int x = 0; x < 128; ++x) fence_operand(o[x]);
    }
    __syncwarp();  // every lane's wgmmas on the stage are done
    if (lane == 0) mbar_arrive(&empty[s]);
  }

  // l: the quad's 4 lanes, then both warpgroups (sred's maxima were last read before the last
  // kBarP, which both warpgroups have passed).
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, x);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, x);
  }
  if (qd == 0) {
    sred[wg * kWgHeads + r_lo] = l_lo;
    sred[wg * kWgHeads + r_hi] = l_hi;
  }
  named_barrier(kBarMax, kMathThreads);
  float* acc_out = pl.part_acc + (static_cast<int64_t>(split) * a.n_rows + i) * a.H * kTcRank;
  const int64_t h_lo = h0 + r_lo, h_hi = h0 + r_hi;
#pragma unroll
  for (int j = 0; j < 64; ++j) {
    const int c = 256 * wg + 8 * j + 2 * qd;
    if (h_lo < a.H) *reinterpret_cast<float2*>(acc_out + h_lo * kTcRank + c) = make_float2(o[4 * j], o[4 * j + 1]);
    if (h_hi < a.H) *reinterpret_cast<float2*>(acc_out + h_hi * kTcRank + c) = make_float2(o[4 * j + 2], o[4 * j + 3]);
  }
  if (wg == 0 && qd == 0) {
    constexpr float kLn2 = 0.6931471805599453f;  // the max back to natural units: M · ln 2
    if (h_lo < a.H) ml_out[h_lo] = make_float2(m_lo * kLn2, sred[r_lo] + sred[kWgHeads + r_lo]);
    if (h_hi < a.H) ml_out[h_hi] = make_float2(m_hi * kLn2, sred[r_hi] + sred[kWgHeads + r_hi]);
  }
#else
  __trap();  // built for another architecture: mla_decode picks this kernel only on sm_90a
#endif
}

void launch_split_wgmma(const DecodePlan& pl, const CUtensorMap& map, int box_rows, cudaStream_t s) {
  launch_pdl(mla_split_wgmma_kernel, dim3(static_cast<unsigned>(pl.a.n_rows * pl.n_hg), static_cast<unsigned>(pl.n_splits)),
             kWgThreads, kWgSmemBytes, s, map, box_rows, pl);
}

void set_split_wgmma_smem() {
  DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(kWgSmemBytes)));
}

}  // namespace deepinfer::cuda::mla
