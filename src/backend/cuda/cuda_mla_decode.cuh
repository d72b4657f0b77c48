// The absorbed MLA decode's kernels and what they share: launch constants, the plan every kernel
// reads (DecodePlan), the device helpers of several kernel families, and the kernels' declarations.
// One family per file: cuda_mla_split.cu (fp32 CUDA cores), cuda_mla_split_tc.cu (mma.sync),
// cuda_mla_split_ws.cu (warp-specialized, sm_90a), cuda_mla_split_wgmma.cu (wgmma, H ≥ 64,
// sm_90a), cuda_mla_rows.cu (multi-row, batch-invariant rule), cuda_mla_tc_gemms.cu (absorb /
// merge / W_UV); cuda_mla.cu picks and launches them.
// Internal to those files (namespace mla); the interface is cuda_common.h's mla_decode.
#pragma once

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_search.cuh"

#include <cuda.h>  // CUtensorMap

namespace deepinfer::cuda::mla {

// ---- Absorbed decode ----------------------------------------------------------------------------

constexpr int kThreads = 256;  // every decode kernel: 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kHeads = 16;     // heads per split block (a head group)
constexpr int kKeys = 32;      // keys per latent tile
constexpr int kMaxRank = 512;  // r: the split kernel's o_lat maps 128 channel quads
constexpr int kMaxWidth = 576;  // r + dr (DeepSeek: 512 + 64)
constexpr int kMaxSplits = static_cast<int>(kMlaMaxSplits);
constexpr int kRedStride = kKeys + 8;  // a head's partial scores: +8 floats keeps the stores conflict-free
// 16-byte latent chunks per thread per tile (9 at r + dr = 576).
constexpr int kTileChunks = (kKeys * kMaxWidth / 8 + kThreads - 1) / kThreads;
constexpr int kGemmRows = 16;     // rows per block of absorb_q and apply_uv
constexpr int kAbsorbCols = 64;   // q̃ channels per absorb_q block (2 per lane)
constexpr int kMaxDn = 512;

// Shared-memory row stride of the split kernel's q and latent tiles: ≥ r + dr rounded to 4, and
// 4 × an odd number, so float4 reads of 4 (or 8) consecutive rows at one column hit disjoint banks.
inline int tile_stride(int64_t width) {
  int64_t quads = (width + 3) / 4;
  if (quads % 2 == 0) ++quads;
  return static_cast<int>(4 * quads);
}

inline size_t split_smem_bytes(int wq) {
  return sizeof(float) *
         (static_cast<size_t>(kHeads + kKeys) * wq + kWarps * kHeads * kRedStride + kKeys * kHeads + kHeads);
}

// What every decode kernel reads: the caller's arguments and the scratch laid out by mla_decode.
struct DecodePlan {
  MlaDecodeArgs a;
  const int2* row_map;  // [n_rows] (sequence, row) of each selected row; null: all T rows, in order
  float* q_lat;         // [n_rows, H, r] q̃
  float* part_acc;      // [n_splits, n_rows, H, r] Σ_s e^{score_s − m} c_kv[s] per split (unnormalized)
  float2* part_ml;      // [n_splits, n_rows, H] (m, l): running max and Σ e^{score − m}; (−inf, 0) if empty
  int n_splits, n_hg;   // key ranges per row; head groups (ceil(H / 16); tensor-core kernel: of its block's heads)
  int wq;               // tile_stride(r + dr)
  int cluster;          // tensor-core kernel: CTAs (one cluster) sharing each split's keys, 1 or 2
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sequence owning query row `row`: the largest b with q_indptr[b] ≤ row (sequences with no
// rows are skipped, since the next one starts at the same index).
__device__ __forceinline__ int64_t seq_of_row(const int32_t* q_indptr, int64_t n_seqs, int64_t row) {
  return last_at_most(q_indptr, n_seqs, row);
}

// Row of q/out of selected row i.
__device__ __forceinline__ int64_t selected_row(const DecodePlan& pl, int64_t i) {
  return pl.row_map != nullptr ? pl.row_map[i].y : i;
}

// Keys per split piece of a row with n_keys keys — the one split rule of every split kernel:
// piece p owns [p·span, min(n_keys, (p+1)·span)). Batch-invariant rule (split_keys > 0):
// mla_split_span, a function of n_keys alone (`parts` must be 1). Default rule: the launch's
// n_splits·parts pieces (parts: CTAs of a cluster sharing one split) of equal whole 32-key tiles,
// ceil(ceil(n_keys / (n_splits·parts)) / 32)·32.
__device__ __forceinline__ int64_t split_span(const DecodePlan& pl, int64_t n_keys, int64_t parts) {
  if (pl.a.split_keys > 0) return mla_split_span(n_keys, pl.a.split_keys, pl.n_splits);
  const int64_t n_pieces = pl.n_splits * parts;
  return ((n_keys + n_pieces - 1) / n_pieces + kKeys - 1) / kKeys * kKeys;
}

// What the split kernels need of selected row i: its sequence b, its row of q/out, the keys it
// attends to (the sequence's q_len rows end at kv_len, so row q0 + j sees kv_len − q_len + j + 1
// keys) and its split span (split_span with `parts` pieces per split).
struct RowKeys {
  int64_t b, row, n_keys, span;
};
__device__ __forceinline__ RowKeys row_keys(const DecodePlan& pl, int64_t i, int64_t parts) {
  const MlaDecodeArgs& a = pl.a;
  RowKeys rk;
  rk.row = selected_row(pl, i);
  rk.b = pl.row_map != nullptr ? pl.row_map[i].x : seq_of_row(a.q_indptr, a.n_seqs, rk.row);
  const int64_t q0 = a.q_indptr[rk.b], q_len = a.q_indptr[rk.b + 1] - q0;
  rk.n_keys = a.kv_len[rk.b] - q_len + (rk.row - q0) + 1;
  rk.span = split_span(pl, rk.n_keys, parts);
  return rk;
}

// Two bf16 → fp32 (the low half first).
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// acc + Σ_{i<8} w[i]·x[i] for 8 bf16 of a weight row and 8 bf16 of x, in two chains (even and
// odd elements) added at the end — the one-token persistent kernels' GEMV step
// (cuda_mla_sublayer.cu, cuda_moe_one.cu).
__device__ __forceinline__ float dot8_bf16(uint4 w, uint4 x, float acc) {
  float a0 = 0.0f;
  a0 = fmaf(bf16_lo(w.x), bf16_lo(x.x), a0);
  acc = fmaf(bf16_hi(w.x), bf16_hi(x.x), acc);
  a0 = fmaf(bf16_lo(w.y), bf16_lo(x.y), a0);
  acc = fmaf(bf16_hi(w.y), bf16_hi(x.y), acc);
  a0 = fmaf(bf16_lo(w.z), bf16_lo(x.z), a0);
  acc = fmaf(bf16_hi(w.z), bf16_hi(x.z), acc);
  a0 = fmaf(bf16_lo(w.w), bf16_lo(x.w), a0);
  acc = fmaf(bf16_hi(w.w), bf16_hi(x.w), acc);
  return acc + a0;
}

// ---- Tensor-core split kernel (FlashMLA's numerics on mma.sync) ---------------------------------

constexpr int kTcKeys = 32;                // keys per latent tile
constexpr int kTcRank = 512;               // r the kernel supports
constexpr int kTcWidth = 576;              // r + dr it supports (dr = 64)
// bf16 row stride of the q and latent tiles: 1168 bytes = 73 16-byte units (odd), so the 8 rows
// of an ldmatrix 8×8 read fall in 8 distinct bank groups.
constexpr int kTcStride = kTcWidth + 8;
constexpr int kTcRedStride = kTcKeys + 4;  // fp32 partial scores: conflict-free float2 fragment stores
constexpr int kTcPStride = kTcKeys + 8;    // bf16 probabilities: 80-byte rows, conflict-free ldmatrix
constexpr int kTcXStride = kTcRank + 8;    // fp32 o_lat rows exchanged by a cluster's CTAs
constexpr int kTcChunks = kTcKeys * kTcWidth / 8 / kThreads;  // 16-byte copies per thread per tile (9)
constexpr int kTcMaxCluster = 2;
static_assert(kTcKeys * kTcWidth / 8 % kThreads == 0, "a tile is a whole number of copies per thread");

// Per m-tile count MT (heads per block = 16·MT): pipeline depth, score work split.
template <int MT>
struct TcShape {
  static constexpr int kHeads = 16 * MT;
  static constexpr int kStages = MT == 1 ? 4 : 3;  // latent tiles in shared memory (3 or 2 in flight)
  static constexpr int kTilesN = MT == 1 ? 1 : 2;  // n8 key tiles of the scores per warp
  static constexpr int kSplitK = MT == 1 ? 2 : 1;  // channel halves of the scores (partials added)
  static constexpr int kTph = kThreads / kHeads;   // softmax threads per head
  static constexpr size_t kSmemBytes = sizeof(bf16) * (static_cast<size_t>(kStages) * kTcKeys + kHeads) * kTcStride +
                                       sizeof(float) * kSplitK * kHeads * kTcRedStride +
                                       sizeof(bf16) * kHeads * kTcPStride + sizeof(float) * kHeads +
                                       sizeof(float2) * kHeads;
  static_assert(MT == 1 || MT == 4, "one m-tile (16 heads) or four (64 heads) per block");
  static_assert(kSplitK * (16 * MT / 16) * (4 / kTilesN) == kWarps, "warps tile the scores exactly");
  static_assert(sizeof(bf16) * kStages * kTcKeys * kTcStride >= sizeof(float) * kHeads * kTcXStride || MT != 1,
                "the cluster exchange fits in the latent stages");
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// n fp32 values from global memory (written by other blocks of this launch or by the previous
// kernel: read through L2) rounded to bf16 into shared memory by kThreads threads (t: the
// calling thread's index among them), four 8-value vectors' loads in flight per thread before
// their stores; n % 8 == 0. The one-token persistent kernels' activation staging.
template <int kThreads>
__device__ __forceinline__ void stage_bf16(const float* src, int64_t n, bf16* dst, int t) {
  constexpr int kBatch = 4;
  const float4* s4 = reinterpret_cast<const float4*>(src);
  for (int64_t c0 = t; c0 < n / 8; c0 += kBatch * kThreads) {
    float4 v[kBatch][2];
#pragma unroll
    for (int x = 0; x < kBatch; ++x)
      if (c0 + x * kThreads < n / 8) {
        v[x][0] = __ldcg(s4 + 2 * (c0 + x * kThreads));
        v[x][1] = __ldcg(s4 + 2 * (c0 + x * kThreads) + 1);
      }
#pragma unroll
    for (int x = 0; x < kBatch; ++x)
      if (c0 + x * kThreads < n / 8)
        reinterpret_cast<uint4*>(dst)[c0 + x * kThreads] =
            make_uint4(pack_bf16(v[x][0].x, v[x][0].y), pack_bf16(v[x][0].z, v[x][0].w), pack_bf16(v[x][1].x, v[x][1].y),
                       pack_bf16(v[x][1].z, v[x][1].w));
  }
}

// Channels c .. c + 3 of [q̃ | q_pe] (r = 512, dr = 64) of head h for selected row i, whose row of
// q is `row`: q̃ from the absorb step's scratch, q_pe from q.
__device__ __forceinline__ float4 q_chunk(const DecodePlan& pl, int64_t i, int64_t row, int64_t h, int c) {
  const MlaDecodeArgs& a = pl.a;
  if (c < kTcRank) return *reinterpret_cast<const float4*>(pl.q_lat + (i * a.H + h) * kTcRank + c);
  const float* qp = a.q + (row * a.H + h) * (a.dn + a.dr) + a.dn + (c - kTcRank);
  return make_float4(qp[0], qp[1], qp[2], qp[3]);
}

// The one-row split kernels' q tile: sq [kNHeads][kTcStride] bf16, row qh = [q̃ | q_pe] of head
// h0 + qh (zero for heads ≥ H: their scores are 0 and unused), by threads t = 0 .. kNThreads − 1.
// Each thread issues a batch of its loads before it converts and stores any, so the tile costs
// one round trip to L2 per batch, not one per load (the tile is read right after the wait).
template <int kNHeads, int kNThreads>
__device__ __forceinline__ void stage_q_tile(const DecodePlan& pl, int64_t i, int64_t row, int64_t h0, bf16* sq,
                                             int t) {
  constexpr int kPer = kNHeads * (kTcWidth / 4) / kNThreads;  // float4 chunks per thread
  constexpr int kLoadBatch = kPer < 9 ? kPer : 9;
  static_assert(kNHeads * (kTcWidth / 4) % kNThreads == 0 && kPer % kLoadBatch == 0, "whole batches per thread");
#pragma unroll
  for (int b = 0; b < kPer; b += kLoadBatch) {
    float4 v[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int e = t + (b + j) * kNThreads, qh = e / (kTcWidth / 4), c = 4 * (e % (kTcWidth / 4));
      v[j] = h0 + qh < pl.a.H ? q_chunk(pl, i, row, h0 + qh, c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int e = t + (b + j) * kNThreads, qh = e / (kTcWidth / 4), c = 4 * (e % (kTcWidth / 4));
      *reinterpret_cast<uint2*>(sq + qh * kTcStride + c) =
          make_uint2(pack_bf16(v[j].x, v[j].y), pack_bf16(v[j].z, v[j].w));
    }
  }
}

// One (row, head)'s online-softmax step over a 32-key tile, by the kTph consecutive lanes that own
// it (hj = its lane % kTph; thread hj takes keys hj + kTph·x). Key k's score is its kSplitK
// partials red[kh·red_split + k] added in kh order from 0, times scale; keys k ≥ n_valid score
// −inf (P = 0). Updates (m_run, l_run) (l adds the bf16-rounded P: exactly what P·V adds), writes
// P [32] bf16 to p_row and returns corr = e^{m_old − m_new} (0 on the first tile: m_old = −inf).
// Precondition: n_valid ≥ 1 (m_new finite: no e^{−inf − (−inf)}). Every operation is an explicit
// _rn intrinsic, never contracted into an FMA by the compiler: both tensor-core kernels call this,
// and the multi-row kernel's bitwise equality with the one-row kernel rests on it.
template <int kTph, int kSplitK>
__device__ __forceinline__ float tc_softmax_update(const float* red, int red_split, int hj, int64_t n_valid,
                                                   float scale, bf16* p_row, float& m_run, float& l_run) {
  constexpr int kKpt = kTcKeys / kTph;
  float sc[kKpt];
  float mx = -INFINITY;
#pragma unroll
  for (int x = 0; x < kKpt; ++x) {
    const int k = hj + kTph * x;
    float v = 0.0f;
#pragma unroll
    for (int kh = 0; kh < kSplitK; ++kh) v = __fadd_rn(v, red[kh * red_split + k]);
    sc[x] = k < n_valid ? __fmul_rn(v, scale) : -INFINITY;
    mx = fmaxf(mx, sc[x]);
  }
#pragma unroll
  for (int o = kTph / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float m_new = fmaxf(m_run, mx);
  const float corr = __expf(__fsub_rn(m_run, m_new));
  float ps = 0.0f;
#pragma unroll
  for (int x = 0; x < kKpt; ++x) {
    const bf16 p = __float2bfloat16_rn(__expf(__fsub_rn(sc[x], m_new)));
    p_row[hj + kTph * x] = p;
    ps = __fadd_rn(ps, __bfloat162float(p));
  }
#pragma unroll
  for (int o = kTph / 2; o > 0; o >>= 1) ps = __fadd_rn(ps, __shfl_xor_sync(0xffffffffu, ps, o));
  l_run = __fmaf_rn(l_run, corr, ps);
  m_run = m_new;
  return corr;
}

// The batch-invariant rule's merge of a row's splits (for one head), shared by every tensor-core
// path that merges them — mla_rows_merged_kernel in registers, mla_merge_kernel and
// mla_apply_tc_kernel's inline merge from the partials — so a row's o_lat has the same bits
// whichever ran: over the non-empty splits s (l_s > 0) in split order, from M = −inf, L = 0,
// O = +0: (α, β) = merge_coefs(M, m_s), L = merge_step(l_s, (α, β), L), O = merge_step(acc_s,
// (α, β), O) per channel; then o_lat = bf16(O / L). One pass, so the kernel that computes the
// splits in sequence needs no partials (the default rule's merge, merge_weights, needs every
// split's max first). Explicit _rn intrinsics: never contracted differently in two kernels.
// merge_coefs: M' = max(M, m_s), α = e^{M − M'} (0 while M = −inf), β = e^{m_s − M'}; M ← M'.
__device__ __forceinline__ float2 merge_coefs(float& m_all, float m_s) {
  const float m_new = fmaxf(m_all, m_s);
  const float2 ab = make_float2(__expf(__fsub_rn(m_all, m_new)), __expf(__fsub_rn(m_s, m_new)));
  m_all = m_new;
  return ab;
}
// x·β + y·α, one rounding for the product of x and the sum.
__device__ __forceinline__ float merge_step(float x, float2 ab, float y) {
  return __fmaf_rn(x, ab.y, __fmul_rn(y, ab.x));
}

// ---- Multi-row tensor-core kernel, splits merged in registers (batch-invariant rule) -----------

constexpr int kRowsPerTile = 2;                  // R: consecutive query rows of one sequence per block
constexpr int kRowsMma = kHeads * kRowsPerTile;  // MMA rows: (row q, head hh) at 16q + hh (32)
constexpr int kRowsStages = 4;                   // latent ring depth (3 tiles in flight)
constexpr size_t kRowsSmemBytes =
    sizeof(bf16) * (static_cast<size_t>(kRowsStages) * kTcKeys + kRowsMma) * kTcStride +
    sizeof(float) * 2 * kRowsMma * kTcRedStride + sizeof(bf16) * kRowsMma * kTcPStride + sizeof(float) * 4 * kRowsMma;
static_assert(kRowsSmemBytes <= 227 * 1024, "one block per SM within sm_90's shared-memory opt-in limit");
static_assert(kKeys == kTcKeys, "split_span's default rule cuts whole tiles of both kernel families");

// v holds the bf16 latents of keys k (low half) and k + 1 (high half) of one channel; keys
// ≥ n_valid become +0, the value the one-row kernel's zero-filled tile slots hold.
__device__ __forceinline__ uint32_t keep_keys(uint32_t v, int k, int n_valid) {
  return v & ((k < n_valid ? 0x0000ffffu : 0u) | (k + 1 < n_valid ? 0xffff0000u : 0u));
}

// ---- Warp-specialized tensor-core split kernel (default split rule, H < 64, sm_90a) -------------

constexpr int kWsGroups = 2;                               // consumer warp groups (alternate tiles)
constexpr int kWsGroupWarps = 4;                           // warps per consumer group
constexpr int kWsGroupThreads = 32 * kWsGroupWarps;        // 128
constexpr int kWsConsumers = kWsGroups * kWsGroupThreads;  // 256
constexpr int kWsThreads = kWsConsumers + 32;              // + the producer warp
constexpr int kWsStages = 5;                               // latent tiles in the ring
constexpr int kWsBoxCols = 64;                             // channels per TMA box (128-byte rows)
constexpr int kWsBoxes = kTcWidth / kWsBoxCols;            // boxes across a key row (9)
constexpr int kWsSubBytes = kTcKeys * kWsBoxCols * 2;      // one 32-key × 64-channel swizzled sub-tile
constexpr int kWsStageBytes = kWsBoxes * kWsSubBytes;      // a 32-key tile: 36,864 bytes
// One consumer group's exchange area: partial scores, probabilities, rescale factors, final state.
struct WsGroupSmem {
  float red[kHeads][kTcRedStride];  // scores [head][key] fp32
  bf16 p[kHeads][kTcPStride];       // probabilities [head][key] bf16
  float corr[kHeads];
  float2 ml[kHeads];                // (m, l) after the group's last tile
};
constexpr size_t kWsRingBytes = static_cast<size_t>(kWsStages) * kWsStageBytes;
constexpr size_t kWsSmemBytes = 1024 /* alignment slack */ + kWsRingBytes + sizeof(bf16) * kHeads * kTcStride +
                                kWsGroups * sizeof(WsGroupSmem) + 2 * kWsStages * sizeof(uint64_t);
static_assert(kWsSmemBytes <= 227 * 1024, "one block per SM within sm_90's shared-memory opt-in limit");
static_assert(kWsRingBytes >= sizeof(float) * kHeads * kTcXStride, "group 1's o_lat fits in the drained ring");
static_assert(sizeof(WsGroupSmem) % 16 == 0 && kWsStageBytes % 1024 == 0, "aligned shared-memory pieces");
static_assert(kTcWidth % kWsBoxCols == 0 && kTcKeys == 32, "whole boxes per tile");

// ---- wgmma split kernel (default split rule, H ≥ 64, sm_90a; cuda_mla_split_wgmma.cu) ---------

constexpr int kWgHeads = 64;                           // MMA rows: the heads of one block
constexpr int kWgKeys = 64;                            // keys per ring stage
constexpr int kWgHalfKeys = kWgKeys / 2;               // keys each math warpgroup scores
constexpr int kWgStages = 2;                           // ring stages
constexpr int kWgMath = 2;                             // math warpgroups
constexpr int kWgThreads = 128 * (kWgMath + 1);        // + the producer warpgroup (one thread issues)
// Registers after setmaxnreg: the launch reserves 168 per thread (65,536 / 384, rounded down to 8).
constexpr int kWgProducerRegs = 24, kWgMathRegs = 240;
static_assert(kWgMath * 128 * kWgMathRegs + 128 * kWgProducerRegs <= kWgThreads * 168, "register budget");
constexpr int kWgBlocks = kTcWidth / 64;               // 64-channel blocks across a key row (9)
constexpr int kWgBlockBytes = kWgKeys * 128;           // a stage's channel block: [64 keys][128 B]
constexpr int kWgStageBytes = kWgBlocks * kWgBlockBytes;  // 73,728
constexpr int kWgQBytes = kWgBlocks * kWgHeads * 128;  // the q tile: [9][64 heads][128 B]
constexpr size_t kWgSmemBytes = 1024 /* alignment slack */ + kWgQBytes + static_cast<size_t>(kWgStages) * kWgStageBytes +
                                16 * kWgMath * 2 * 128 /* P fragments */ + sizeof(float) * kWgMath * kWgHeads +
                                2 * kWgStages * sizeof(uint64_t);
static_assert(kWgSmemBytes <= 227 * 1024, "one block per SM within sm_90's shared-memory opt-in limit");
static_assert(kWgHeads * 128 == kWgBlockBytes, "q and stage channel blocks share their descriptor steps");

// The weights w_s = e^{m_s − M} / Σ_s' e^{m_s' − M} l_s' of (selected row i, head h)'s splits into
// w[0..n_splits) (M = max m_s over non-empty splits; empty ones weigh 0), by one warp: lane l
// takes splits l + 32x, Σ as the lane's terms in split order then a butterfly — the one weight
// rule of every merge (mla_apply_uv_kernel, mla_merge_kernel, mla_apply_tc_kernel), so a row's
// weights do not depend on the launch beyond n_splits (and not on it at all when the extra
// splits are empty: they add exact zeros).
__device__ __forceinline__ void merge_weights(const DecodePlan& pl, int64_t i, int64_t h, int lane, float* w) {
  constexpr int kSplitsPerLane = kMaxSplits / 32;
  const int n_splits = pl.n_splits;
  float2 st[kSplitsPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int x = 0; x < kSplitsPerLane; ++x) {
    const int s = lane + 32 * x;
    st[x] = s < n_splits ? pl.part_ml[(static_cast<int64_t>(s) * pl.a.n_rows + i) * pl.a.H + h]
                         : make_float2(-INFINITY, 0.0f);
    if (st[x].y > 0.0f) m = fmaxf(m, st[x].x);
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float e[kSplitsPerLane], l = 0.0f;
#pragma unroll
  for (int x = 0; x < kSplitsPerLane; ++x) {
    e[x] = st[x].y > 0.0f ? __expf(st[x].x - m) : 0.0f;
    l = fmaf(e[x], st[x].y, l);
  }
  l = warp_sum(l);
#pragma unroll
  for (int x = 0; x < kSplitsPerLane; ++x)
    if (lane + 32 * x < n_splits) w[lane + 32 * x] = e[x] / l;
}

// mla_apply_uv_kernel's output-channel tiles (see the kernel).
constexpr int kUvTileSmall = 32, kUvTileLarge = 128;

// ---- Tensor-core absorb / merge / W_UV (cuda_mla_tc_gemms.cu) ------------------------------------

constexpr int kGemmThreads = 128;  // absorb / apply blocks: 4 warps × 16 rows
constexpr int kGemmTileM = 64;     // selected rows per block
constexpr int kAbsorbTileN = 128;  // q̃ channels per absorb block
constexpr int kApplyTileN = 32;    // output channels per apply block
constexpr int kMergeLanes = 16;    // split lanes of the merge (split s is lane s % 16)
constexpr int kMergeInline = 4;    // at most this many splits: apply merges while loading its tile
constexpr int kApplyStride = kTcRank + 8;  // bf16 row stride of the apply tiles (1,040 bytes: 65 units)
constexpr int kAbsorbTcMaxDn = 192;

inline size_t absorb_tc_smem_bytes(int64_t dn) {
  return sizeof(bf16) * (static_cast<size_t>(kGemmTileM) * (dn + 8) + static_cast<size_t>(dn) * (kAbsorbTileN + 8));
}
constexpr size_t kApplyTcSmemBytes = sizeof(bf16) * (kGemmTileM + kApplyTileN) * kApplyStride;
// mla_merge_running_kernel's block: a thread per 4 channels.
constexpr int kMergeRunThreads = kTcRank / 4;

// ---- The kernels (each file's comment says what a kernel computes) ------------------------------

// cuda_mla_split.cu: the fp32 CUDA-core family and the row map.
__global__ void __launch_bounds__(kThreads) mla_row_map_kernel(const int32_t* q_indptr, const uint8_t* seq_mask,
                                                              int64_t n_seqs, int2* row_map);
__global__ void __launch_bounds__(kThreads) mla_absorb_q_kernel(DecodePlan pl);
__global__ void __launch_bounds__(kThreads, 1) mla_split_kernel(DecodePlan pl);
__global__ void __launch_bounds__(kThreads) mla_apply_uv_kernel(DecodePlan pl, int n_tile);
// cuda_mla_split_tc.cu: the one-row mma.sync kernel (a template, so launched there).
void launch_split_tc(const DecodePlan& pl, int mt, cudaStream_t s);  // mt = 1 or 4 m-tiles per block
void set_split_tc_smem();  // its dynamic shared-memory limits (eager, before any capture)
// cuda_mla_rows.cu: the multi-row kernel and its row tiles.
__global__ void __launch_bounds__(kThreads) mla_row_tiles_kernel(DecodePlan pl, int64_t n_bound, int4* tiles);
__global__ void __launch_bounds__(kThreads, 1) mla_rows_merged_kernel(DecodePlan pl, const int4* tiles,
                                                                      bf16* o_lat);
// cuda_mla_split_ws.cu: the warp-specialized kernel.
__global__ void __launch_bounds__(kWsThreads, 1)
    mla_split_ws_kernel(const __grid_constant__ CUtensorMap map, int box_rows, DecodePlan pl);
// cuda_mla_split_wgmma.cu: the wgmma kernel (64 heads per block, H ≥ 64) over the cache's TMA map
// of [box_rows × 64] boxes, and its dynamic shared-memory limit (eager, before any capture).
void launch_split_wgmma(const DecodePlan& pl, const CUtensorMap& map, int box_rows, cudaStream_t s);
void set_split_wgmma_smem();
// cuda_mla_tc_gemms.cu: absorb, merges and W_UV on mma.sync.
__global__ void __launch_bounds__(kGemmThreads) mla_absorb_tc_kernel(DecodePlan pl);
__global__ void __launch_bounds__(kThreads) mla_merge_kernel(DecodePlan pl, bf16* o_lat);
__global__ void __launch_bounds__(kMergeRunThreads) mla_merge_running_kernel(DecodePlan pl, bf16* o_lat);
__global__ void __launch_bounds__(kGemmThreads) mla_apply_tc_kernel(DecodePlan pl, const bf16* o_lat);

}  // namespace deepinfer::cuda::mla
