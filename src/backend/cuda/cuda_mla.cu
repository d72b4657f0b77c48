// MLA attention kernels of the CUDA backend.
//  - mla_decode: the absorbed form over the paged latent cache; generic shapes in fp32 on CUDA
//    cores (only the cache and kv_b are bf16; q̃, scores, probabilities and o_lat stay fp32). Three
//    kernels over the n_rows selected query rows (plus a one-block row map when some rows are not
//    selected):
//      absorb_q:  q̃ = W_UKᵀ q_nope for every selected row and head → scratch [n_rows, H, r];
//      split:     split-KV attention. A block owns one row, 16 heads and one of n_splits key
//                 ranges; each 32-key latent tile is widened to fp32 in shared memory once and
//                 used by all 16 heads, so a row's latents are read once per head group (once
//                 for H ≤ 16), not once per head. Writes per split the unnormalized o_lat and
//                 the softmax state (max, sum);
//      apply_uv:  merges the splits in split order (exact online-softmax merge) and writes
//                 out = W_UV · o_lat to the selected rows only.
//    For r = 512, dr = 64 (DeepSeek) the split step is by default a tensor-core kernel instead:
//    the same outputs from bf16 mma.sync tiles (bf16 q̃, q_pe and P; fp32 scores, state and
//    o_lat) — mla_split_ws_kernel (default split rule, H < 64, sm_90a: a TMA producer warp and
//    two consumer warp groups over a 5-deep ring of swizzled 32-key tiles) or
//    mla_split_tc_kernel (16 or 64 heads per block, a cp.async latent pipeline); with them,
//    absorb and W_UV are per-head bf16 mma.sync GEMMs (mla_absorb_tc_kernel, mla_apply_tc_kernel)
//    and more than 4 splits are merged by mla_merge_kernel first (MlaDecodeArgs::kernel forces
//    a family).
//    Graph-safe: grids, n_splits and scratch sizes depend only on (n_rows, H, r, dn, dv, SM
//    count), fixed per batch size of decode-only steps; each split's key range is computed on the
//    device from kv_len. Deterministic: no atomics, every reduction in a fixed order; a row's
//    result depends on the rest of the batch only through n_splits.
//  - batch-invariant rule (split_keys > 0): split boundaries at multiples of mla_split_span(n_keys),
//    shared by consecutive rows of a sequence, and the splits merged in split order in one pass
//    (merge_coefs / merge_step: mla_merge_running_kernel, or apply's inline merge). Steps with a
//    multi-row sequence (prefill chunks, MTP verification; H < 64) run mla_rows_merged_kernel
//    instead of the one-row TC kernel and the merge: 2 rows × 16 heads per block, each latent
//    tile loaded once for the 2 rows, the row's splits computed one after the other and merged in
//    registers, each row's o_lat bitwise what the one-row kernel and the merge give it (same MMA
//    chains, same softmax function, same merge; see the kernel). A one-block kernel maps the rows
//    to 2-row tiles.
//  - the naive (prefill) form: gather_latent here, attention in cuda_mla_prefill.cu (flash
//    kernel); causal_softmax serves its TF32 cuBLAS fallback for other head dims.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_sm90.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <map>
#include <tuple>

namespace deepinfer::cuda {
namespace {

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
int tile_stride(int64_t width) {
  int64_t quads = (width + 3) / 4;
  if (quads % 2 == 0) ++quads;
  return static_cast<int>(4 * quads);
}

size_t split_smem_bytes(int wq) {
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
  int64_t lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (q_indptr[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
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

// Channels c .. c + 3 of [q̃ | q_pe] (r = 512, dr = 64) of head h for selected row i, whose row of
// q is `row`: q̃ from the absorb step's scratch, q_pe from q.
__device__ __forceinline__ float4 q_chunk(const DecodePlan& pl, int64_t i, int64_t row, int64_t h, int c) {
  const MlaDecodeArgs& a = pl.a;
  if (c < kTcRank) return *reinterpret_cast<const float4*>(pl.q_lat + (i * a.H + h) * kTcRank + c);
  const float* qp = a.q + (row * a.H + h) * (a.dn + a.dr) + a.dn + (c - kTcRank);
  return make_float4(qp[0], qp[1], qp[2], qp[3]);
}

// The one-row split kernels' q tile: sq [n_heads][kTcStride] bf16, row qh = [q̃ | q_pe] of head
// h0 + qh (zero for heads ≥ H: their scores are 0 and unused), by threads t = 0 .. n_threads − 1.
__device__ __forceinline__ void stage_q_tile(const DecodePlan& pl, int64_t i, int64_t row, int64_t h0, int n_heads,
                                             bf16* sq, int t, int n_threads) {
  for (int e = t; e < n_heads * (kTcWidth / 4); e += n_threads) {
    const int qh = e / (kTcWidth / 4), c = 4 * (e % (kTcWidth / 4));
    const int64_t h = h0 + qh;
    const float4 v = h < pl.a.H ? q_chunk(pl, i, row, h, c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    *reinterpret_cast<uint2*>(sq + qh * kTcStride + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
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

  stage_q_tile(pl, i, row, h0, HB, sq, t, kThreads);

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
  stage_q_tile(pl, i, row, h0, kHeads, sq, t, kWsConsumers);
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
constexpr int kUvTileSmall = 32, kUvTileLarge = 128;
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

// ---- Tensor-core absorb / merge / W_UV (the tensor-core split kernels' companions) ------------
// The split kernels round q̃ to bf16 and FlashMLA's recipe keeps o_lat in bf16 before W_UV, so
// these two small per-head GEMMs run on bf16 mma.sync with fp32 accumulation (each output's chain
// in channel order: a row's result does not depend on the rows around it). The fp32 CUDA-core
// versions above stay for the fp32 split kernel (kernel 0) and other shapes.

constexpr int kGemmThreads = 128;  // absorb / apply blocks: 4 warps × 16 rows
constexpr int kGemmTileM = 64;     // selected rows per block
constexpr int kAbsorbTileN = 128;  // q̃ channels per absorb block
constexpr int kApplyTileN = 32;    // output channels per apply block
constexpr int kMergeLanes = 16;    // split lanes of the merge (split s is lane s % 16)
constexpr int kMergeInline = 4;    // at most this many splits: apply merges while loading its tile
constexpr int kApplyStride = kTcRank + 8;  // bf16 row stride of the apply tiles (1,040 bytes: 65 units)
constexpr int kAbsorbTcMaxDn = 192;

size_t absorb_tc_smem_bytes(int64_t dn) {
  return sizeof(bf16) * (static_cast<size_t>(kGemmTileM) * (dn + 8) + static_cast<size_t>(dn) * (kAbsorbTileN + 8));
}
constexpr size_t kApplyTcSmemBytes = sizeof(bf16) * (kGemmTileM + kApplyTileN) * kApplyStride;

// q̃[i, h, n0..n0+127] = Σ_j bf16(q_nope[row(i), h, j]) · W_UK_h[j, n] for the 64 selected rows of
// the block's tile. Block (128-channel tile, head h, 64-row tile), 128 threads. Shared: q_nope tile
// [64][dn + 8] bf16 (zero past the rows), W_UK_h[:, n0..n0+127] [dn][136] bf16 by cp.async; warp w
// owns rows 16w..16w+15 (skipped when past the tile's rows): acc [16 n8 tiles][4], per k16 step
// an ldmatrix A fragment and ldmatrix.trans B pairs. Preconditions: r = 512, dn % 16 == 0,
// dn ≤ 192, (dn + dr) % 4 == 0.
__global__ void __launch_bounds__(kGemmThreads) mla_absorb_tc_kernel(DecodePlan pl) {
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  const MlaDecodeArgs& a = pl.a;
  const int dn = static_cast<int>(a.dn), sa = dn + 8, sb = kAbsorbTileN + 8;
  bf16* s_a = reinterpret_cast<bf16*>(gemm_smem);  // [kGemmTileM][sa]
  bf16* s_b = s_a + kGemmTileM * sa;                // [dn][sb]
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kAbsorbTileN, h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(blockIdx.z) * kGemmTileM;
  const int rows = static_cast<int>(std::min<int64_t>(kGemmTileM, a.n_rows - i0));
  const bf16* w_uk = a.kv_b + h * (a.dn + a.dv) * kTcRank;  // [dn, r]
  // A placed kv_b (a.kv_b_stable) is never written by a kernel: its tile's copies go out before
  // the wait for the previous kernel (cuda_launch.cuh), overlapping its tail.
  auto load_w = [&] {
    for (int e = t; e < dn * (kAbsorbTileN / 8); e += kGemmThreads) {
      const int j = e / (kAbsorbTileN / 8), c8 = e % (kAbsorbTileN / 8);
      cp_async16(smem_u32(s_b + j * sb + 8 * c8), w_uk + j * kTcRank + n0 + 8 * c8, true);
    }
  };
  if (a.kv_b_stable) load_w();
  pdl_wait();
  pdl_trigger();
  if (!a.kv_b_stable) load_w();
  cp_async_commit();
  const int64_t dqk = a.dn + a.dr;
  for (int e = t; e < kGemmTileM * (dn / 4); e += kGemmThreads) {
    const int ii = e / (dn / 4), c = 4 * (e % (dn / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (ii < rows) v = *reinterpret_cast<const float4*>(a.q + (selected_row(pl, i0 + ii) * a.H + h) * dqk + c);
    *reinterpret_cast<uint2*>(s_a + ii * sa + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
  cp_async_wait<0>();
  __syncthreads();
  if (16 * warp >= rows) return;
  float acc[kAbsorbTileN / 8][4] = {};
  for (int ks = 0; ks < dn / 16; ++ks) {
    uint32_t af[4];
    ldmatrix_x4(af, smem_u32(s_a + (16 * warp + lane % 16) * sa + 16 * ks + 8 * (lane / 16)));
#pragma unroll
    for (int np = 0; np < kAbsorbTileN / 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, smem_u32(s_b + (16 * ks + lane % 8 + 8 * ((lane / 8) % 2)) * sb + 16 * np + 8 * (lane / 16)));
      mma_bf16_16816(acc[2 * np], af, bf[0], bf[1]);
      mma_bf16_16816(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int j = 0; j < kAbsorbTileN / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int ii = 16 * warp + lane / 4 + 8 * half;
      if (ii < rows)
        *reinterpret_cast<float2*>(pl.q_lat + ((i0 + ii) * a.H + h) * kTcRank + n0 + 8 * j + 2 * (lane % 4)) =
            make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
    }
}

// The merged o_lat of 4 channels: Σ over split lanes L = 0..15 in order of (Σ over the splits
// s ≡ L mod 16 in increasing order of w_s · acc_s, an fmaf chain from 0), splits with w_s = 0
// skipped (never read). Both merge paths (mla_merge_kernel's lanes, apply's inline loop over
// ≤ kMergeInline splits: one split per lane) compute exactly this, so a row's bits do not depend
// on which path its launch took.
__device__ __forceinline__ float4 fma4(float w, float4 x, float4 acc) {
  return make_float4(fmaf(w, x.x, acc.x), fmaf(w, x.y, acc.y), fmaf(w, x.z, acc.z), fmaf(w, x.w, acc.w));
}
__device__ __forceinline__ float4 add4(float4 x, float4 y) {
  return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

// o_lat[i, h, c0..c0+63] in bf16 for many splits (> kMergeInline: few rows). Block (selected row
// i, head h, 64-channel tile), 256 threads: thread t = 16·L + q owns channel quad q and split lane
// L, issues all its ≤ 8 float4 loads at once (one L2 round trip), then the 16 lanes' partials are
// added in lane order through shared memory.
__global__ void __launch_bounds__(kThreads) mla_merge_kernel(DecodePlan pl, bf16* o_lat) {
  pdl_wait();
  pdl_trigger();
  constexpr int kQuads = kThreads / kMergeLanes, kPer = kMaxSplits / kMergeLanes;
  __shared__ float sw[kMaxSplits];
  __shared__ float4 spart[kMergeLanes][kQuads];
  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x, lane = t % 32;
  const int64_t i = blockIdx.x, h = blockIdx.y, c = static_cast<int64_t>(blockIdx.z) * 4 * kQuads + 4 * (t % kQuads);
  const int L = t / kQuads;
  if (t < 32) merge_weights(pl, i, h, lane, sw);
  __syncthreads();
  const float* src = pl.part_acc + (i * a.H + h) * kTcRank + c;
  const int64_t stride = a.n_rows * a.H * kTcRank;
  float4 x[kPer];
  float w[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int s = L + kMergeLanes * j;
    w[j] = s < pl.n_splits ? sw[s] : 0.0f;
    x[j] = w[j] != 0.0f ? *reinterpret_cast<const float4*>(src + s * stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (w[j] != 0.0f) p = fma4(w[j], x[j], p);
  spart[L][t % kQuads] = p;
  __syncthreads();
  if (t < kQuads) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // from +0, as the inline merge (never −0)
#pragma unroll
    for (int l = 0; l < kMergeLanes; ++l) v = add4(v, spart[l][t]);
    *reinterpret_cast<uint2*>(o_lat + (i * a.H + h) * kTcRank + c) =
        make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
}

// o_lat[i, h, :] in bf16 under the batch-invariant rule (> kMergeInline splits): merge_coefs /
// merge_step over the splits in order. Block (selected row i, head h), 128 threads: warp 0 gives
// each split its (α, β) — the running max before lane l's splits 4l..4l+3 by a warp scan of the
// lanes' maxima (a max is exact in any order), then those splits in order — and each thread runs
// the chains of its 4 channels and of L over the splits (eight splits' loads issued together).
constexpr int kMergeRunThreads = kTcRank / 4;
__global__ void __launch_bounds__(kMergeRunThreads) mla_merge_running_kernel(DecodePlan pl, bf16* o_lat) {
  pdl_wait();
  pdl_trigger();
  constexpr int kPer = kMaxSplits / 32;
  __shared__ float2 sab[kMaxSplits];
  __shared__ float sls[kMaxSplits];  // l_s, 0 for an empty split
  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x, n_splits = pl.n_splits;
  const int64_t i = blockIdx.x, h = blockIdx.y;
  if (t < 32) {
    float2 ml[kPer];
    float mx = -INFINITY;
#pragma unroll
    for (int x = 0; x < kPer; ++x) {
      const int s = kPer * t + x;
      ml[x] = s < n_splits ? pl.part_ml[(static_cast<int64_t>(s) * a.n_rows + i) * a.H + h]
                           : make_float2(-INFINITY, 0.0f);
      if (ml[x].y > 0.0f) mx = fmaxf(mx, ml[x].x);
    }
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, mx, o);
      if (t >= o) mx = fmaxf(mx, y);
    }
    float m_all = __shfl_up_sync(0xffffffffu, mx, 1);
    if (t == 0) m_all = -INFINITY;
#pragma unroll
    for (int x = 0; x < kPer; ++x) {
      const int s = kPer * t + x;
      if (s >= n_splits) break;
      const bool live = ml[x].y > 0.0f;
      sab[s] = live ? merge_coefs(m_all, ml[x].x) : make_float2(0.0f, 0.0f);
      sls[s] = live ? ml[x].y : 0.0f;
    }
  }
  __syncthreads();
  const float* src = pl.part_acc + (i * a.H + h) * kTcRank + 4 * t;
  const int64_t stride = a.n_rows * a.H * kTcRank;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float l = 0.0f;
  for (int s0 = 0; s0 < n_splits; s0 += 8) {
    float4 x[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int s = s0 + j;
      x[j] = s < n_splits && sls[s] > 0.0f ? *reinterpret_cast<const float4*>(src + s * stride)
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int s = s0 + j;
      if (s >= n_splits || sls[s] == 0.0f) continue;
      const float2 ab = sab[s];
      l = merge_step(sls[s], ab, l);
      o = make_float4(merge_step(x[j].x, ab, o.x), merge_step(x[j].y, ab, o.y), merge_step(x[j].z, ab, o.z),
                      merge_step(x[j].w, ab, o.w));
    }
  }
  *reinterpret_cast<uint2*>(o_lat + (i * a.H + h) * kTcRank + 4 * t) =
      make_uint2(pack_bf16(__fdiv_rn(o.x, l), __fdiv_rn(o.y, l)), pack_bf16(__fdiv_rn(o.z, l), __fdiv_rn(o.w, l)));
}

// out[row(i), h, n0..n0+31] = Σ_c o_lat[i, h, c] · W_UV_h[n, c] for the block's 64 selected rows.
// Block (32-output tile, head h, 64-row tile), 128 threads. Shared: the o_lat tile [64][520] bf16
// — copied from o_lat when non-null (mla_merge_kernel's, mla_merge_running_kernel's or
// mla_rows_merged_kernel's), else merged here from ≤ kMergeInline splits (the merge kernel's
// arithmetic: one split per lane; batch-invariant rule: merge_coefs / merge_step in split order,
// one thread per row computing (α, β) and L) — and W_UV_h[n0..n0+31, :] [32][520] bf16 by
// cp.async. Warp w owns rows 16w..16w+15 (skipped past the rows): 4 n8 tiles over 32 k16 steps
// (ldmatrix A fragments; B = W_UV rows, channel-contiguous, by ldmatrix). Preconditions: r = 512,
// dv % 8 == 0.
__global__ void __launch_bounds__(kGemmThreads) mla_apply_tc_kernel(DecodePlan pl, const bf16* o_lat) {
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  __shared__ float sw[kGemmTileM][kMergeInline];    // merge weights; batch-invariant rule: l_s
  __shared__ float2 sab[kGemmTileM][kMergeInline];  // batch-invariant rule: (α, β) per split
  __shared__ float sl[kGemmTileM];                  // batch-invariant rule: L
  const MlaDecodeArgs& a = pl.a;
  const bool running = a.split_keys > 0;  // merge_coefs / merge_step (every invariant path's merge)
  bf16* s_a = reinterpret_cast<bf16*>(gemm_smem);  // [kGemmTileM][kApplyStride]
  bf16* s_b = s_a + kGemmTileM * kApplyStride;      // [kApplyTileN][kApplyStride]
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kApplyTileN, h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(blockIdx.z) * kGemmTileM;
  const int rows = static_cast<int>(std::min<int64_t>(kGemmTileM, a.n_rows - i0));
  const bf16* w_uv = a.kv_b + (h * (a.dn + a.dv) + a.dn) * kTcRank;  // [dv, r]
  auto load_w = [&] {  // before the wait when kv_b is a placed weight (as in mla_absorb_tc_kernel)
    for (int e = t; e < kApplyTileN * (kTcRank / 8); e += kGemmThreads) {
      const int n = e / (kTcRank / 8), c8 = e % (kTcRank / 8);
      const bool ok = n0 + n < a.dv;
      cp_async16(smem_u32(s_b + n * kApplyStride + 8 * c8), ok ? w_uv + (n0 + n) * kTcRank + 8 * c8 : w_uv, ok);
    }
  };
  if (a.kv_b_stable) load_w();
  pdl_wait();
  pdl_trigger();
  if (!a.kv_b_stable) load_w();
  if (o_lat != nullptr) {
    for (int e = t; e < kGemmTileM * (kTcRank / 8); e += kGemmThreads) {
      const int ii = e / (kTcRank / 8), c8 = e % (kTcRank / 8);
      const bf16* src = ii < rows ? o_lat + ((i0 + ii) * a.H + h) * kTcRank + 8 * c8 : o_lat;
      cp_async16(smem_u32(s_a + ii * kApplyStride + 8 * c8), src, ii < rows);
    }
  }
  cp_async_commit();
  if (o_lat == nullptr && running) {
    if (t < rows) {  // row t's (α, β) per split (l_s in sw; 0: empty) and L, in split order
      float m_all = -INFINITY, l = 0.0f;
#pragma unroll
      for (int s = 0; s < kMergeInline; ++s) {
        const float2 ml = s < pl.n_splits ? pl.part_ml[(static_cast<int64_t>(s) * a.n_rows + i0 + t) * a.H + h]
                                          : make_float2(-INFINITY, 0.0f);
        sw[t][s] = ml.y > 0.0f ? ml.y : 0.0f;
        sab[t][s] = ml.y > 0.0f ? merge_coefs(m_all, ml.x) : make_float2(0.0f, 0.0f);
        if (ml.y > 0.0f) l = merge_step(ml.y, sab[t][s], l);
      }
      sl[t] = l;
    }
    __syncthreads();
    const int64_t stride = a.n_rows * a.H * kTcRank;
    for (int e = t; e < kGemmTileM * (kTcRank / 4); e += kGemmThreads) {
      const int ii = e / (kTcRank / 4), c = 4 * (e % (kTcRank / 4));
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (ii < rows) {
        const float* src = pl.part_acc + ((i0 + ii) * a.H + h) * kTcRank + c;
        float4 x[kMergeInline];
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s)
          x[s] = sw[ii][s] > 0.0f ? *reinterpret_cast<const float4*>(src + s * stride)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s) {
          if (sw[ii][s] == 0.0f) continue;
          const float2 ab = sab[ii][s];
          v = make_float4(merge_step(x[s].x, ab, v.x), merge_step(x[s].y, ab, v.y), merge_step(x[s].z, ab, v.z),
                          merge_step(x[s].w, ab, v.w));
        }
        const float l = sl[ii];
        v = make_float4(__fdiv_rn(v.x, l), __fdiv_rn(v.y, l), __fdiv_rn(v.z, l), __fdiv_rn(v.w, l));
      }
      *reinterpret_cast<uint2*>(s_a + ii * kApplyStride + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
  } else if (o_lat == nullptr) {
    for (int ii = warp; ii < rows; ii += kGemmThreads / 32) merge_weights(pl, i0 + ii, h, lane, sw[ii]);
    __syncthreads();
    const int64_t stride = a.n_rows * a.H * kTcRank;
    for (int e = t; e < kGemmTileM * (kTcRank / 4); e += kGemmThreads) {
      const int ii = e / (kTcRank / 4), c = 4 * (e % (kTcRank / 4));
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (ii < rows) {
        const float* src = pl.part_acc + ((i0 + ii) * a.H + h) * kTcRank + c;
        float4 x[kMergeInline];
        float w[kMergeInline];
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s) {
          w[s] = s < pl.n_splits ? sw[ii][s] : 0.0f;
          x[s] = w[s] != 0.0f ? *reinterpret_cast<const float4*>(src + s * stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        // One split per lane: lane s's partial is fmaf(w_s, x_s, 0); the lanes add in order.
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s)
          if (w[s] != 0.0f) v = add4(v, fma4(w[s], x[s], make_float4(0.0f, 0.0f, 0.0f, 0.0f)));
      }
      *reinterpret_cast<uint2*>(s_a + ii * kApplyStride + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  if (16 * warp >= rows) return;
  float acc[kApplyTileN / 8][4] = {};
  const uint32_t a_addr = smem_u32(s_a + (16 * warp + lane % 16) * kApplyStride + 8 * (lane / 16));
#pragma unroll 4
  for (int kc = 0; kc < kTcRank; kc += 32) {
    uint32_t af[4], ag[4];
    ldmatrix_x4(af, a_addr + 2 * kc);
    ldmatrix_x4(ag, a_addr + 2 * (kc + 16));
#pragma unroll
    for (int nt = 0; nt < kApplyTileN / 8; ++nt) {
      uint32_t bf[4];  // b0, b1 of k-steps kc and kc + 16
      ldmatrix_x4(bf, smem_u32(s_b + (8 * nt + lane % 8) * kApplyStride + kc + 8 * (lane / 8)));
      mma_bf16_16816(acc[nt], af, bf[0], bf[1]);
      mma_bf16_16816(acc[nt], ag, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < kApplyTileN / 8; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int ii = 16 * warp + lane / 4 + 8 * half;
      const int64_t n = n0 + 8 * nt + 2 * (lane % 4);
      if (ii < rows && n < a.dv)
        *reinterpret_cast<float2*>(a.out + (selected_row(pl, i0 + ii) * a.H + h) * a.dv + n) =
            make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
}

// ---- Naive form helpers -------------------------------------------------------------------------

template <typename Out>
__global__ void gather_latent_kernel(const bf16* cache, const int32_t* block_ids, int64_t bs, int64_t width, Out* lat) {
  const int64_t i = blockIdx.x;
  const bf16* src = cache + (static_cast<int64_t>(block_ids[i / bs]) * bs + i % bs) * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    if constexpr (sizeof(Out) == 4) lat[i * width + j] = __bfloat162float(src[j]);
    else lat[i * width + j] = src[j];
  }
}

// One block per (head, row): max, sum, then normalized bf16 probabilities.
__global__ void causal_softmax_kernel(const float* scores, int64_t rows, int64_t S, int64_t first_pos, float scale,
                                      float* P) {
  const int64_t hr = blockIdx.x;  // h * rows + i
  const int64_t i = hr % rows;
  const int64_t limit = first_pos + i;  // last visible key
  const float* sr = scores + hr * S;
  float* pr = P + hr * S;
  __shared__ float red[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  float mx = -FLT_MAX;
  for (int64_t j = threadIdx.x; j <= limit; j += blockDim.x) mx = fmaxf(mx, sr[j] * scale);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = -FLT_MAX;
  for (int w = 0; w < nw; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= limit; j += blockDim.x) sum += expf(sr[j] * scale - mx);
  sum = warp_sum(sum);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0;
  for (int w = 0; w < nw; ++w) sum += red[w];
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
    pr[j] = j <= limit ? expf(sr[j] * scale - mx) * inv : 0.0f;
}

}  // namespace

namespace {
// Splits for `blocks` split blocks per split, one block per SM. With s splits they take
// ceil(blocks·s / SMs) waves of 1/s of a row's keys each: time ∝ waves(s) / s. The fewest splits
// within 10% of the best, since every split also costs a q̃ tile load and a partial state to merge.
int least_waves_splits(int64_t blocks, int max_splits = kMaxSplits) {
  const int n_sm = sm_count();
  blocks = std::max<int64_t>(1, blocks);
  auto cost = [&](int64_t s) { return static_cast<double>((blocks * s + n_sm - 1) / n_sm) / static_cast<double>(s); };
  double best = cost(1);
  for (int64_t s = 2; s <= max_splits; ++s) best = std::min(best, cost(s));
  int splits = 1;
  while (cost(splits) > 1.1 * best) ++splits;
  return splits;
}

// The one-row mma.sync kernels' split cap (their launch shapes predate kMlaMaxSplits = 128).
constexpr int kTcMaxSplits = 64;

// The tensor-core kernels' launch: m-tiles per block, head groups, splits, cluster size, and
// whether the warp-specialized kernel runs.
//  - H < 64, default rule, sm_90a, kernel ≠ 2, n_blocks known, block_size % 16 == 0:
//    mla_split_ws_kernel, 16 heads per block, mla_decode_splits' split count (B = 1: 117
//    splits, one block per SM).
//  - H < 64 otherwise: the one-row kernel at 16 heads per block, least_waves_splits capped at 64;
//    when that count is above 32 (a few rows: the splits alone cannot fill the SMs), each split
//    is shared by a cluster of 2 CTAs. The cluster size is a function of the split count alone,
//    so a row's result still depends on the launch only through the split count (B = 1,
//    H = 16: 59 splits × 2 = 118 CTAs).
//  - H ≥ 64: 64 heads per block (latents read once per 64 heads), splits by least_waves_splits
//    over its own head groups, capped at 64 (B = 1, H = 128: 2 head groups × 59 splits = 118
//    CTAs), no cluster.
//  - batch-invariant rule (split_keys > 0): the launch's max_splits slots, no cluster, never
//    the warp-specialized kernel (the multi-row kernel is bitwise the one-row kernel).
struct TcLaunch {
  int mt, n_hg, n_splits, cluster;
  bool ws;
};
TcLaunch tc_launch(const MlaDecodeArgs& a) {
  static const bool clusters = [] {
    int dev = 0, ok = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&ok, cudaDevAttrClusterLaunch, dev));
    return ok != 0;
  }();
  TcLaunch l{};
  l.mt = a.H >= 64 ? 4 : 1;
  l.n_hg = static_cast<int>((a.H + 16 * l.mt - 1) / (16 * l.mt));
  l.cluster = 1;
  l.ws = l.mt == 1 && a.split_keys == 0 && a.kernel != 2 && a.n_blocks > 0 && a.block_size % 16 == 0 &&
         sm90a_device();
  if (a.split_keys > 0) {
    l.n_splits = static_cast<int>(a.max_splits);
  } else if (l.ws) {
    l.n_splits = mla_decode_splits(a.n_rows, a.H);
  } else {
    l.n_splits = least_waves_splits(a.n_rows * l.n_hg, kTcMaxSplits);
    if (l.mt == 1 && clusters && l.n_splits > kTcMaxSplits / 2) l.cluster = kTcMaxCluster;
  }
  return l;
}

// Dynamic shared memory above 48 KB for every split kernel, set on the first mla_decode (eager,
// never inside a graph capture: a model's first decode step runs before any capture).
void set_split_smem() {
  static const bool done = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(split_smem_bytes(tile_stride(kMaxWidth)))));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_tc_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(TcShape<1>::kSmemBytes)));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_tc_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(TcShape<4>::kSmemBytes)));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_rows_merged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kRowsSmemBytes)));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kWsSmemBytes)));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_absorb_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(absorb_tc_smem_bytes(kAbsorbTcMaxDn))));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_apply_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kApplyTcSmemBytes)));
    return true;
  }();
  (void)done;
}

// The latent cache as a [n_blocks·block_size, 576] bf16 TMA map of [box_rows × 64] boxes with the
// 128-byte swizzle (mla_split_ws_kernel), encoded once per (cache, rows, box_rows): each layer's
// cache keeps its map, so eager steps make no driver call per layer (graph replays carry theirs).
CUtensorMap cache_map(const MlaDecodeArgs& a, int box_rows) {
  using Key = std::tuple<const void*, int64_t, int>;
  static thread_local std::map<Key, CUtensorMap> maps;
  const int64_t rows = a.n_blocks * a.block_size;
  const Key key{a.cache, rows, box_rows};
  auto it = maps.find(key);
  if (it == maps.end())
    it = maps.emplace(key, tensor_map_2d(a.cache, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, kTcWidth, kWsBoxCols,
                                         box_rows)).first;
  return it->second;
}

template <int MT>
void launch_split_tc(const DecodePlan& pl, cudaStream_t s) {
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
}  // namespace

int mla_decode_splits(int64_t n_rows, int64_t H) { return least_waves_splits(n_rows * ((H + kHeads - 1) / kHeads)); }

void mla_decode(const MlaDecodeArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s) {
  if (a.T == 0 || a.n_seqs == 0 || a.n_rows == 0) return;
  DI_CUDA_REQUIRE_MSG(a.r >= 1 && a.r <= kMaxRank, "mla_decode supports kv_lora_rank 1..512");
  DI_CUDA_REQUIRE_MSG(a.dr >= 0 && a.r + a.dr <= kMaxWidth,
                      "mla_decode supports kv_lora_rank + qk_rope_head_dim <= 576");
  DI_CUDA_REQUIRE_MSG(a.dn >= 1 && a.dn <= kMaxDn, "mla_decode supports qk_nope_head_dim 1..512");
  DI_CUDA_REQUIRE_MSG(a.dv >= 1 && a.H >= 1 && a.H <= 65535, "mla_decode needs v_head_dim >= 1 and 1..65535 heads");
  DI_CUDA_REQUIRE_MSG(a.block_size >= 1, "mla_decode needs a positive KV block size");
  DI_CUDA_REQUIRE_MSG(a.n_rows <= a.T, "mla_decode: more selected rows than query rows");
  const int64_t n_hg = (a.H + kHeads - 1) / kHeads, row_tiles = (a.n_rows + kGemmRows - 1) / kGemmRows;
  DI_CUDA_REQUIRE_MSG(a.n_rows * n_hg <= INT32_MAX && row_tiles <= 65535, "mla_decode: too many decode rows");
  DI_CUDA_REQUIRE_MSG(a.kernel >= -1 && a.kernel <= 2, "mla_decode: kernel is -1 (automatic), 0, 1 or 2");
  DI_CUDA_REQUIRE_MSG(a.max_q_len >= 0, "mla_decode: max_q_len is a row count");
  const bool tc_shape = a.r == kTcRank && a.r + a.dr == kTcWidth;
  DI_CUDA_REQUIRE_MSG(a.kernel < 1 || tc_shape, "mla_decode: the tensor-core kernels need r = 512 and dr = 64");
  const bool use_tc = a.kernel >= 1 || (a.kernel == -1 && tc_shape);
  DecodePlan pl{};
  pl.a = a;
  if (a.split_keys > 0) {
    DI_CUDA_REQUIRE_MSG(a.max_splits >= 1 && a.max_splits <= kMlaMaxSplits, "mla_decode: max_splits out of range");
    pl.n_splits = static_cast<int>(a.max_splits);
  } else {
    pl.n_splits = mla_decode_splits(a.n_rows, a.H);
  }
  pl.n_hg = static_cast<int>(n_hg);
  pl.wq = tile_stride(a.r + a.dr);
  pl.cluster = 1;
  int tc_mt = 0;
  bool ws = false;
  if (use_tc) {
    const TcLaunch tl = tc_launch(a);
    tc_mt = tl.mt;
    ws = tl.ws;
    pl.n_hg = tl.n_hg;
    pl.n_splits = tl.n_splits;
    pl.cluster = tl.cluster;
  }
  // With the tensor-core split kernels, q̃ and W_UV on tensor cores too (bf16 operands, fp32
  // accumulation) where the head dims allow; the fp32 CUDA-core kernels otherwise.
  const bool tc_gemms = use_tc && a.dn % 16 == 0 && a.dn <= kAbsorbTcMaxDn && (a.dn + a.dr) % 4 == 0 && a.dv % 8 == 0;
  // Several rows of a sequence per block, every split of theirs merged in the kernel (bitwise each
  // row's one-row result and merge): batch-invariant steps at 16-head groups (H ≥ 64 keeps the
  // 64-head one-row kernel) with the tensor-core W_UV (which reads the merged o_lat), when a
  // sequence has several rows, or when one row per block already fills the SMs (decode-shaped
  // steps of ≥ 3/8 of a block per SM: no partials and no merge launch; fewer rows keep the
  // one-row kernel, whose splits spread a row over several SMs). Measured on V2-Lite's
  // invariant decode (runs s10-7, s10-8; one-row → multi-row, ms per step): B = 32 12.63 →
  // 12.96, 48 14.36 → 14.36, 64 15.80 → 15.49, 128 20.20 → 18.48, 256 24.99 → 21.10. The rows'
  // bits are the same either way; kernel 2 forces the one-row kernel.
  const bool multi_row = tc_mt == 1 && a.split_keys > 0 && tc_gemms && a.kernel != 2 &&
                         (a.max_q_len > 1 || 8 * a.n_rows * pl.n_hg >= 3 * sm_count());
  auto get = [&](size_t bytes) { return alloc(ctx, bytes == 0 ? 16 : bytes); };
  const int64_t lat = a.n_rows * a.H * a.r;  // elements of one [n_rows, H, r] slab
  pl.q_lat = static_cast<float*>(get(sizeof(float) * lat));
  if (!multi_row) {  // the split partials (the multi-row kernel keeps them in registers)
    pl.part_acc = static_cast<float*>(get(sizeof(float) * lat * pl.n_splits));
    pl.part_ml = static_cast<float2*>(get(sizeof(float2) * a.n_rows * a.H * pl.n_splits));
  }
  if (a.n_rows < a.T) {  // some rows belong to sequences that are not selected
    auto* row_map = static_cast<int2*>(get(sizeof(int2) * a.n_rows));
    mla_row_map_kernel<<<1, kThreads, 0, s>>>(a.q_indptr, a.seq_mask, a.n_seqs, row_map);
    DI_CUDA_LAUNCHED();
    pl.row_map = row_map;
  }
  set_split_smem();
  const unsigned tiles = static_cast<unsigned>(row_tiles), heads = static_cast<unsigned>(a.H);
  const unsigned gemm_tiles = static_cast<unsigned>((a.n_rows + kGemmTileM - 1) / kGemmTileM);
  if (tc_gemms) {
    launch_pdl(mla_absorb_tc_kernel, dim3(static_cast<unsigned>(kTcRank / kAbsorbTileN), heads, gemm_tiles),
               kGemmThreads, absorb_tc_smem_bytes(a.dn), s, pl);
  } else {
    mla_absorb_q_kernel<<<dim3(static_cast<unsigned>((a.r + kAbsorbCols - 1) / kAbsorbCols), heads, tiles), kThreads, 0,
                          s>>>(pl);
  }
  DI_CUDA_LAUNCHED();
  if (multi_row) {
    // Tiles ≤ Σ_seq (q_len / R + classes), classes ≤ q_len / period + 2 (mla_row_tiles_kernel),
    // and ≤ n_rows: a bound from sizes alone; the surplus slots exit at once.
    const int64_t period = a.split_keys * pl.n_splits;
    const int64_t n_bound = std::min(a.n_rows, (a.n_rows + kRowsPerTile - 1) / kRowsPerTile +
                                                   (a.n_rows + period - 1) / period + 2 * std::min(a.n_seqs, a.n_rows));
    auto* tiles = static_cast<int4*>(get(sizeof(int4) * n_bound));
    mla_row_tiles_kernel<<<1, kThreads, 0, s>>>(pl, n_bound, tiles);
    DI_CUDA_LAUNCHED();
    DI_CUDA_REQUIRE_MSG(n_bound * pl.n_hg <= INT32_MAX, "mla_decode: too many row tiles");
    bf16* o_lat = static_cast<bf16*>(get(sizeof(bf16) * lat));
    mla_rows_merged_kernel<<<static_cast<unsigned>(n_bound * pl.n_hg), kThreads, kRowsSmemBytes, s>>>(pl, tiles, o_lat);
    DI_CUDA_LAUNCHED();
    launch_pdl(mla_apply_tc_kernel,
               dim3(static_cast<unsigned>((a.dv + kApplyTileN - 1) / kApplyTileN), heads, gemm_tiles), kGemmThreads,
               kApplyTcSmemBytes, s, pl, static_cast<const bf16*>(o_lat));
    DI_CUDA_LAUNCHED();
    return;
  } else if (ws) {
    const int box_rows = a.block_size % 32 == 0 ? 32 : 16;
    launch_pdl(mla_split_ws_kernel, dim3(static_cast<unsigned>(a.n_rows * pl.n_hg), static_cast<unsigned>(pl.n_splits)),
               kWsThreads, kWsSmemBytes, s, cache_map(a, box_rows), box_rows, pl);
    DI_CUDA_LAUNCHED();
  } else if (tc_mt == 1) {
    launch_split_tc<1>(pl, s);
  } else if (tc_mt == 4) {
    launch_split_tc<4>(pl, s);
  } else {
    mla_split_kernel<<<dim3(static_cast<unsigned>(a.n_rows * n_hg), static_cast<unsigned>(pl.n_splits)), kThreads,
                       split_smem_bytes(pl.wq), s>>>(pl);
    DI_CUDA_LAUNCHED();
  }
  if (tc_gemms) {
    bf16* o_lat = nullptr;  // merged by its own kernel beyond kMergeInline splits
    if (pl.n_splits > kMergeInline) {
      o_lat = static_cast<bf16*>(get(sizeof(bf16) * lat));
      if (a.split_keys > 0) {
        launch_pdl(mla_merge_running_kernel, dim3(static_cast<unsigned>(a.n_rows), heads), kMergeRunThreads, 0, s, pl,
                   o_lat);
      } else {
        const unsigned chunks = static_cast<unsigned>(kTcRank / (4 * (kThreads / kMergeLanes)));
        launch_pdl(mla_merge_kernel, dim3(static_cast<unsigned>(a.n_rows), heads, chunks), kThreads, 0, s, pl, o_lat);
      }
      DI_CUDA_LAUNCHED();
    }
    launch_pdl(mla_apply_tc_kernel,
               dim3(static_cast<unsigned>((a.dv + kApplyTileN - 1) / kApplyTileN), heads, gemm_tiles), kGemmThreads,
               kApplyTcSmemBytes, s, pl, o_lat);
    DI_CUDA_LAUNCHED();
    return;
  }
  // Wide channel tiles (each (row tile, head) merged once) when that still gives two blocks per SM.
  const int n_tile = row_tiles * a.H >= 2 * sm_count() ? kUvTileLarge : kUvTileSmall;
  mla_apply_uv_kernel<<<dim3(static_cast<unsigned>((a.dv + n_tile - 1) / n_tile), heads, tiles), kThreads, 0, s>>>(
      pl, n_tile);
  DI_CUDA_LAUNCHED();
}

void gather_latent(const bf16* cache, const int32_t* block_ids, int64_t block_size, int64_t width, int64_t S, void* lat,
                   Elem lat_elem, cudaStream_t s) {
  if (S == 0) return;
  if (lat_elem == Elem::kF32)
    gather_latent_kernel<<<static_cast<unsigned>(S), 128, 0, s>>>(cache, block_ids, block_size, width,
                                                                  static_cast<float*>(lat));
  else
    gather_latent_kernel<<<static_cast<unsigned>(S), 128, 0, s>>>(cache, block_ids, block_size, width,
                                                                  static_cast<bf16*>(lat));
  DI_CUDA_LAUNCHED();
}

void causal_softmax(const float* scores, int64_t H, int64_t rows, int64_t S, int64_t first_pos, float scale, float* P,
                    cudaStream_t s) {
  if (H * rows == 0) return;
  causal_softmax_kernel<<<static_cast<unsigned>(H * rows), 256, 0, s>>>(scores, rows, S, first_pos, scale, P);
  DI_CUDA_LAUNCHED();
}


}  // namespace deepinfer::cuda
