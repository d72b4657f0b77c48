// The attention sublayer of a one-token decode step as one persistent kernel (sm_90a): q_proj |
// kv_a_proj, the latent's norm, RoPE and cache write, W_UK absorbed into q, split-KV attention
// over the paged latents, the splits' merge, W_UV and o_proj — seven launches of the op-by-op path
// (the GEMV, the latent write, absorb, split, merge, W_UV, the o_proj GEMV) in one.
//
// Why: at batch 1 those kernels move ~28 MB (V2-Lite) but each waits for its predecessor, so
// the sublayer cost ~40 µs a layer against a ~7 µs floor (perf.md, version 9's ablation). Here
// one block per SM (grid = the SM count, all blocks resident: one block's shared memory fills
// an SM) runs five phases separated by grid barriers (an arrival counter in global memory), and
// every weight byte a block will need — its rows of q_proj | kv_a, its slices of W_UK and W_UV,
// its rows of o_proj, and the cached latents of its key range — is copied into its shared
// memory up front (by the TMA unit; W_UK's 128 short rows by cp.async from every thread):
// before the wait for the previous kernel (cuda_launch.cuh's contract: weights, step inputs
// and latents of earlier steps are never written by this step's kernels before this one), and
// o_proj's rows as soon as the first phase frees their space. The phases then compute on shared
// memory; only the small activations cross the barriers.
//
//   P1 GEMV:    q = W_q x, kv = W_kv x (x rounded to bf16 as the GEMV does, fp32 sums). Block b
//               owns rows [b·N/G, (b+1)·N/G) of the stacked [W_q; W_kv] (N = H·(dn + dr) + r + dr).
//   P2 absorb:  block G − 1: the new latent, rms_norm(kv[:r]) ⊙ w and RoPE(kv[r:]), to the cache
//               (bf16). Blocks 0..127: item (h, c0) = (b / 8, 64·(b % 8)): q̃[h][c0..c0+63] =
//               Σ_d bf16(q_nope[h][d]) · W_UK[h][d][c], rounded to bf16; items with c0 = 0 also
//               rotate head h's q_pe (bf16).
//   P3 split:   the sequence's L keys cut into spans of max(32, ⌈L/128⌉ rounded up to 32) keys;
//               block s < ⌈L/span⌉ attends all 16 heads over span s — mla_split_tc_kernel's
//               numerics (bf16 [q̃ | q_pe] and P on m16n8k16 MMAs, fp32 scores, state and o_lat;
//               the same tc_softmax_update) over 32-key tiles in a two-slot ring — and writes its
//               unnormalized o_lat and (m, l). The step's own key (position L − 1, written in P2)
//               is read with plain loads after the barrier; every other key came by TMA.
//   P4 W_UV:    blocks 0..127, item (h, v0) = (b / 8, 16·(b % 8)): o_lat[h] = Σ_s w_s · acc_s
//               (merge_weights' rule: w_s = e^{m_s − M} / Σ e^{m_s' − M} l_s'), rounded to bf16,
//               then o[h][v0..v0+15] = W_UV[h][v] · o_lat[h].
//   P5 o_proj:  out = W_o bf16(o), block b owning rows [b·D/G, (b+1)·D/G).
//
// The grid barrier (cuda_grid_barrier.cuh): a 64-bit arrival counter that only this kernel
// touches; a launch adds exactly 4·G, so base = counter − counter mod 4G, read after the wait.
//
// Shapes: DeepSeek's MLA heads (dn 128, dr 64, r 512, dv 128) with H = 16 (V2 and V2-Lite),
// D % 256 == 0, bf16 weights, a bf16 cache; one query row of one sequence; G ≥ 128 SMs; the
// whole layout within 227 KB (mla_sublayer_fits). Deterministic: no atomics on data, every sum
// in a fixed order; the result depends on the launch only through G.
#include "backend/cuda/cuda_grid_barrier.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_rope.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {

using mla::kTcPStride;
using mla::kTcRedStride;
using mla::kTcStride;

namespace {

constexpr int kThreads = 256;                    // 8 warps
constexpr int kH = 16, kDn = 128, kDr = 64, kR = 512, kDv = 128;
constexpr int kQRows = kH * (kDn + kDr);         // 3,072 rows of q_proj
constexpr int kWidth = kR + kDr;                 // 576: a cached latent
constexpr int kN1 = kQRows + kWidth;             // P1's rows
constexpr int kK5 = kH * kDv;                    // o_proj's K (2,048)
constexpr int kItems = 128;                      // P2 / P4 work items: 16 heads × 8 slices
constexpr int kAbsorbCols = kR / 8;              // 64 q̃ channels per P2 item
constexpr int kUvRows = kDv / 8;                 // 16 output channels per P4 item
constexpr int kTileKeys = 32;                    // keys per ring slot
constexpr int kSlots = 2;
constexpr int kMaxSplits = 128;
constexpr int kOptinSmem = 227 * 1024;

// Byte offsets of the dynamic shared memory (every piece 16-byte aligned, barriers 8).
struct Layout {
  int rows1, rows5;       // most P1 / P5 rows of one block
  uint32_t w;             // P1's rows [rows1][D] bf16, then o_proj's [rows5][kK5] bf16
  uint32_t attn;          // P2 / P3 scratch inside w past o_proj's rows (free once P1 is done)
  uint32_t uk, uv, keys;  // W_UK slice [128][64], W_UV slice [16][512], key ring [2][32][584] bf16
  uint32_t x;             // P1's x, P5's o: [max(D, kK5)] bf16
  uint32_t cs;            // the RoPE table [2 · kRopeMaxHalf] fp32
  uint32_t bars;          // mbarriers: w1, uk, uv, o, key[2]
  uint32_t total;
};
// P3's scratch inside `attn`: q tile [16][584] bf16, scores [2][16][36] fp32, P [16][40] bf16,
// corr [16] fp32; P2's partial sums [4][64] fp32 and q_nope [128] fp32 alias it.
constexpr uint32_t kAttnQ = 0;
constexpr uint32_t kAttnRed = kAttnQ + kH * kTcStride * 2;
constexpr uint32_t kAttnP = kAttnRed + 2 * kH * kTcRedStride * 4;
constexpr uint32_t kAttnCorr = kAttnP + kH * kTcPStride * 2;
constexpr uint32_t kAttnBytes = kAttnCorr + kH * 4;
static_assert(kAttnBytes >= (4 * kAbsorbCols + kDn) * 4, "P2's sums fit in P3's scratch");
static_assert(kAttnRed % 16 == 0 && kAttnP % 16 == 0 && kAttnCorr % 16 == 0, "aligned scratch pieces");

__host__ __device__ inline uint32_t align16(uint64_t v) { return static_cast<uint32_t>((v + 15) / 16 * 16); }

__host__ __device__ inline Layout layout(int64_t D, int G) {
  Layout l;
  l.rows1 = (kN1 + G - 1) / G;
  l.rows5 = static_cast<int>((D + G - 1) / G);
  const uint64_t o_bytes = uint64_t{2} * l.rows5 * kK5;
  l.w = 0;
  l.attn = align16(o_bytes);
  const uint64_t w_bytes = uint64_t{2} * l.rows1 * D;
  const uint64_t w_end = w_bytes > l.attn + kAttnBytes ? w_bytes : l.attn + kAttnBytes;
  l.uk = align16(w_end);
  l.uv = l.uk + kDn * kAbsorbCols * 2;
  l.keys = l.uv + kUvRows * kR * 2;
  l.x = l.keys + kSlots * kTileKeys * kTcStride * 2;
  l.cs = l.x + align16(uint64_t{2} * (D > kK5 ? D : kK5));
  l.bars = l.cs + 2 * kRopeMaxHalf * 4;
  l.total = l.bars + 6 * 8;
  return l;
}

// Fixed dims of the shape this kernel serves.
static_assert(kTcStride == kWidth + 8, "the key ring and q tile use the tensor-core split kernel's stride");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kPhases = 4;                  // grid barriers per launch
constexpr uint32_t kKeyBytes = kWidth * 2;  // 1,152

__device__ __forceinline__ uint4 ldcg16(const void* p) { return __ldcg(static_cast<const uint4*>(p)); }

// y[i] = W[i]·x for the block's n rows of K bf16 in shared memory (row stride K), x [K] bf16 in
// shared memory: warp w takes rows w, w + 8, …; lane 0 hands each sum to emit(i, y).
template <typename Emit>
__device__ __forceinline__ void smem_gemv(const bf16* w, const bf16* x, int n, int K, Emit emit) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  for (int i = warp; i < n; i += kThreads / 32) {
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(i) * K);
    float acc = 0.0f;
#pragma unroll 4
    for (int c = lane; c < K / 8; c += 32) acc = mla::dot8_bf16(wr[c], xv[c], acc);
    acc = mla::warp_sum(acc);
    if (lane == 0) emit(i, acc);
  }
}

__device__ __forceinline__ float load_elem(const void* p, Elem e, int64_t i) {
  return e == Elem::kF32 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const bf16*>(p)[i]);
}
#endif

}  // namespace

__global__ void __launch_bounds__(kThreads, 1) mla_sublayer_kernel(MlaSublayerArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem[];
  const int G = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const Layout L = layout(a.D, G);
  bf16* sw = reinterpret_cast<bf16*>(smem + L.w);
  bf16* suk = reinterpret_cast<bf16*>(smem + L.uk);
  bf16* suv = reinterpret_cast<bf16*>(smem + L.uv);
  bf16* skeys = reinterpret_cast<bf16*>(smem + L.keys);
  bf16* sx = reinterpret_cast<bf16*>(smem + L.x);
  float* cs = reinterpret_cast<float*>(smem + L.cs);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t *bar_w1 = bars, *bar_uk = bars + 1, *bar_uv = bars + 2, *bar_o = bars + 3, *bar_key = bars + 4;
  unsigned char* attn = smem + L.attn;
  // The phase timeline (MlaSublayerArgs::trace): thread 0's global timer at mark m.
  auto mark = [&](int m) {
    if (a.trace != nullptr && threadIdx.x == 0) a.trace[blockIdx.x * kMlaSublayerMarks + m] = global_ns();
  };
  mark(0);

  const int64_t D = a.D;
  const int r1_begin = static_cast<int>(int64_t{b} * kN1 / G), r1_end = static_cast<int>(int64_t{b + 1} * kN1 / G);
  const int64_t r5_begin = int64_t{b} * D / G, r5_end = int64_t{b + 1} * D / G;
  const bool item = b < kItems;
  const int ih = b / 8, islice = b % 8;  // P2 / P4 item: head, slice

  // The key range of this block's split (P3), from step inputs only.
  const int64_t n_keys = a.kv_len[0];
  const int32_t* pages = a.block_ids + a.block_indptr[0];
  const int64_t span = std::max<int64_t>(kTileKeys, ((n_keys + kMaxSplits - 1) / kMaxSplits + kTileKeys - 1) /
                                                        kTileKeys * kTileKeys);
  const int n_splits = static_cast<int>((n_keys + span - 1) / span);
  const int64_t k_begin = int64_t{b} * span, k_end = std::min(n_keys, k_begin + span);
  const int64_t n_tiles = b < n_splits ? (k_end - k_begin + kTileKeys - 1) / kTileKeys : 0;
  const int64_t new_key = n_keys - 1;  // written in P2: never read by TMA
  const uint32_t bs = static_cast<uint32_t>(a.block_size);
  // Step inputs the later phases need, loaded now (off their latency chains): the new key's
  // cache row for the block whose span holds it (P3), the token's slot for the latent's writer
  // (P2), and the RoPE angles for the blocks that rotate (P2; their cosines and sines are
  // computed while B1 waits).
  const int64_t new_row = new_key >= k_begin && new_key < k_end ? int64_t{pages[new_key / bs]} * bs + new_key % bs : 0;
  const int64_t latent_row = b == G - 1 ? int64_t{a.slots[0]} : 0;
  const bool needs_rope = b == G - 1 || (item && islice == 0);
  const float rope_ang = needs_rope && t < a.rope.half ? rope_angle(a.rope, a.positions[0], t) : 0.0f;

  // Warp 0 issues a key tile's TMA copies into its ring slot: one 1,152-byte row per key.
  auto issue_tile = [&](int64_t tile) {
    const int slot = static_cast<int>(tile % kSlots);
    const int64_t key = k_begin + tile * kTileKeys + lane;
    const bool load = key < k_end && key != new_key;
    const unsigned n = __popc(__ballot_sync(0xffffffffu, load));
    if (lane == 0) mbar_arrive_expect_tx(&bar_key[slot], n * kKeyBytes);
    __syncwarp();
    if (load) {
      const int64_t row = static_cast<int64_t>(pages[key / bs]) * bs + key % bs;
      bulk_load(skeys + (slot * kTileKeys + lane) * kTcStride, a.cache + row * kWidth, kKeyBytes, &bar_key[slot]);
    }
  };

  // ---- Before the wait: barriers, every weight copy, the first key tiles, the RoPE angles ----
  if (t == 0) {
    for (int i = 0; i < 6; ++i) mbar_init(&bars[i], &bars[i] == bar_uk ? kThreads : 1);  // W_UK: cp.async arrivals
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {
    if (lane == 0) {
      const int n_rows = r1_end - r1_begin;
      mbar_arrive_expect_tx(bar_w1, static_cast<uint32_t>(n_rows * D * 2));
      const int q_end = std::min(r1_end, int{kQRows});
      if (r1_begin < q_end)
        bulk_load(sw, a.w_q + int64_t{r1_begin} * D, static_cast<uint32_t>((q_end - r1_begin) * D * 2), bar_w1);
      const int kv_begin = std::max(r1_begin, int{kQRows});
      if (kv_begin < r1_end)
        bulk_load(sw + int64_t{kv_begin - r1_begin} * D, a.w_kv + int64_t{kv_begin - kQRows} * D,
                  static_cast<uint32_t>((r1_end - kv_begin) * D * 2), bar_w1);
      if (item) {
        mbar_arrive_expect_tx(bar_uv, kUvRows * kR * 2);
        bulk_load(suv, a.kv_b + (int64_t{ih} * (kDn + kDv) + kDn + islice * kUvRows) * kR, kUvRows * kR * 2, bar_uv);
      }
    }
    __syncwarp();
    for (int64_t tile = 0; tile < std::min<int64_t>(n_tiles, kSlots); ++tile) issue_tile(tile);
  }
  // W_UK[h][d][c0 .. c0 + 63] (128 rows of 128 bytes) by cp.async from every thread, 16 bytes a
  // copy: as 128 TMA copies (with the RoPE table computed here) the prologue took 5.4 µs, now
  // 1.7 (run s27-3; the TMA unit seems to take a block's copies one after another, ~20–30 ns each).
  if (item) {
    const bf16* uk = a.kv_b + int64_t{ih} * (kDn + kDv) * kR + islice * kAbsorbCols;
    for (int e = t; e < kDn * kAbsorbCols / 8; e += kThreads) {
      const int d = e / (kAbsorbCols / 8), c = 8 * (e % (kAbsorbCols / 8));
      cp_async16(smem_u32(suk + d * kAbsorbCols + c), uk + int64_t{d} * kR + c, true);
    }
    cp_async_arrive(bar_uk);
  }
  mark(1);

  pdl_wait();
  pdl_trigger();
  mark(2);
  const unsigned long long base = t == 0 ? grid_base(a.counter, static_cast<unsigned long long>(kPhases) * G) : 0;

  // ---- P1: q | kv = [W_q; W_kv] · bf16(x) ----
  mla::stage_bf16<kThreads>(a.x, D, sx, threadIdx.x);
  __syncthreads();
  mbar_wait(bar_w1, 0);
  smem_gemv(sw, sx, r1_end - r1_begin, static_cast<int>(D), [&](int i, float y) {
    const int row = r1_begin + i;
    if (row < kQRows) a.q[row] = y;
    else a.kv[row - kQRows] = y;
  });
  fence_proxy_async();  // P1's reads of sw before the async proxy overwrites it
  __syncthreads();
  if (t == 0) {
    const uint32_t bytes = static_cast<uint32_t>((r5_end - r5_begin) * kK5 * 2);
    mbar_arrive_expect_tx(bar_o, bytes);
    if (bytes > 0) bulk_load(sw, a.w_o + r5_begin * kK5, bytes, bar_o);
  }
  mark(3);
  grid_sync(a.counter, base + 1ull * G, t == 0, [] { __syncthreads(); }, [&] {
    if (needs_rope && t < a.rope.half) rope_entries(a.rope, rope_ang, t, cs);  // read in P2, after the barrier
  });
  mark(4);

  // ---- P2: the new latent to the cache; q̃ = W_UKᵀ q_nope and q_pe rotated ----
  if (b == G - 1) {
    float* red = reinterpret_cast<float*>(attn);  // [8] warp sums
    float v[2], ss = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      v[u] = __ldcg(a.kv + t + u * kThreads);
      ss = fmaf(v[u], v[u], ss);
    }
    ss = mla::warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) tot += red[w];
    const float inv = rsqrtf(tot / static_cast<float>(kR) + a.eps);
    bf16* dst = a.cache + latent_row * kWidth;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = t + u * kThreads;
      dst[j] = __float2bfloat16(load_elem(a.kv_norm, a.kv_norm_elem, j) * (v[u] * inv));
    }
    if (t < a.rope.half) {
      const int64_t ia = pair_a(a.rope, t), ib = pair_b(a.rope, t);
      float y0, y1;
      rotate(cs, t, __ldcg(a.kv + kR + ia), __ldcg(a.kv + kR + ib), y0, y1);
      dst[kR + ia] = __float2bfloat16(y0);
      dst[kR + ib] = __float2bfloat16(y1);
    }
  }
  if (item) {
    float* qn = reinterpret_cast<float*>(attn) + 4 * kAbsorbCols;  // [128] bf16-rounded q_nope[h]
    float* part = reinterpret_cast<float*>(attn);                  // [4][64]
    __syncthreads();  // block G − 1 (when it is also an item) is done with `red`
    if (t < kDn) qn[t] = __bfloat162float(__float2bfloat16(__ldcg(a.q + ih * (kDn + kDr) + t)));
    if (islice == 0 && t < a.rope.half) {
      const float* qp = a.q + ih * (kDn + kDr) + kDn;
      const int64_t ia = pair_a(a.rope, t), ib = pair_b(a.rope, t);
      float y0, y1;
      rotate(cs, t, __ldcg(qp + ia), __ldcg(qp + ib), y0, y1);
      a.q_pe[ih * kDr + ia] = __float2bfloat16(y0);
      a.q_pe[ih * kDr + ib] = __float2bfloat16(y1);
    }
    __syncthreads();
    mbar_wait(bar_uk, 0);
    const int c = t % kAbsorbCols, dg = t / kAbsorbCols;  // 4 groups of 32 d
    float acc = 0.0f;
#pragma unroll 8
    for (int d = 32 * dg; d < 32 * dg + 32; ++d) acc = fmaf(qn[d], __bfloat162float(suk[d * kAbsorbCols + c]), acc);
    part[dg * kAbsorbCols + c] = acc;
    __syncthreads();
    if (t < kAbsorbCols) {
      const float s = ((part[t] + part[kAbsorbCols + t]) + part[2 * kAbsorbCols + t]) + part[3 * kAbsorbCols + t];
      a.q_lat[ih * kR + islice * kAbsorbCols + t] = __float2bfloat16(s);
    }
  }
  mark(5);
  grid_sync(a.counter, base + 2ull * G, t == 0, [] { __syncthreads(); });
  mark(6);

  // ---- P3: split-KV attention over this block's keys (mla_split_tc_kernel<1>'s tile loop) ----
  if (n_tiles > 0) {
    bf16* sq = reinterpret_cast<bf16*>(attn + kAttnQ);
    float* sred = reinterpret_cast<float*>(attn + kAttnRed);
    bf16* sp = reinterpret_cast<bf16*>(attn + kAttnP);
    float* scorr = reinterpret_cast<float*>(attn + kAttnCorr);
    {  // [q̃ | q_pe] per head, bf16: every load issued before the first store (one L2 latency)
      constexpr int kVecs = kH * (kWidth / 8), kIters = (kVecs + kThreads - 1) / kThreads;
      uint4 v[kIters];
#pragma unroll
      for (int x = 0; x < kIters; ++x) {
        const int e = t + x * kThreads, h = e / (kWidth / 8), c = 8 * (e % (kWidth / 8));
        if (e < kVecs) v[x] = c < kR ? ldcg16(a.q_lat + h * kR + c) : ldcg16(a.q_pe + h * kDr + (c - kR));
      }
#pragma unroll
      for (int x = 0; x < kIters; ++x) {
        const int e = t + x * kThreads, h = e / (kWidth / 8), c = 8 * (e % (kWidth / 8));
        if (e < kVecs) *reinterpret_cast<uint4*>(sq + h * kTcStride + c) = v[x];
      }
    }
    constexpr int kTph = kThreads / kH;  // softmax threads per head (16)
    const int hh = t / kTph, hj = t % kTph;
    const int s_nt = warp % 4, s_kh = warp / 4, s_c0 = s_kh * (kWidth / 2);
    const uint32_t q_addr = smem_u32(sq + (lane % 16) * kTcStride + s_c0 + 8 * (lane / 16));
    float m_run = -INFINITY, l_run = 0.0f;
    float acc[8][4] = {};
    for (int64_t it = 0; it < n_tiles; ++it) {
      const int slot = static_cast<int>(it % kSlots);
      bf16* lat = skeys + slot * kTileKeys * kTcStride;
      const int64_t t0 = k_begin + it * kTileKeys;
      const int n_valid = static_cast<int>(std::min<int64_t>(kTileKeys, k_end - t0));
      mbar_wait(&bar_key[slot], static_cast<uint32_t>((it / kSlots) & 1));
      const int64_t nk = new_key - t0;  // the step's own key: from the cache by plain loads
      if (nk >= 0 && nk < kTileKeys && t < kWidth / 8)
        *reinterpret_cast<uint4*>(lat + nk * kTcStride + 8 * t) = ldcg16(a.cache + new_row * kWidth + 8 * t);
      for (int e = t; e < (kTileKeys - n_valid) * (kWidth / 8); e += kThreads)  // P·V reads zeros past the keys
        *reinterpret_cast<uint4*>(lat + (n_valid + e / (kWidth / 8)) * kTcStride + 8 * (e % (kWidth / 8))) =
            make_uint4(0, 0, 0, 0);
      __syncthreads();
      {
        float s[4] = {};
        const uint32_t l_addr = smem_u32(lat + (8 * s_nt + lane % 8) * kTcStride + s_c0 + 8 * (lane / 8));
#pragma unroll 3
        for (int kc = 0; kc < kWidth / 2; kc += 32) {
          uint32_t qa[4], qb[4], lb[4];
          ldmatrix_x4(qa, q_addr + 2 * kc);
          ldmatrix_x4(qb, q_addr + 2 * (kc + 16));
          ldmatrix_x4(lb, l_addr + 2 * kc);
          mma_bf16_16816(s, qa, lb[0], lb[1]);
          mma_bf16_16816(s, qb, lb[2], lb[3]);
        }
        float* red = sred + (s_kh * kH + lane / 4) * kTcRedStride + 8 * s_nt + 2 * (lane % 4);
        *reinterpret_cast<float2*>(red) = make_float2(s[0], s[1]);
        *reinterpret_cast<float2*>(red + 8 * kTcRedStride) = make_float2(s[2], s[3]);
      }
      __syncthreads();
      {
        const float corr = mla::tc_softmax_update<kTph, 2>(sred + hh * kTcRedStride, kH * kTcRedStride, hj, n_valid,
                                                           a.scale, sp + hh * kTcPStride, m_run, l_run);
        if (hj == 0) scorr[hh] = corr;
      }
      __syncthreads();
      const float c_lo = scorr[lane / 4], c_hi = scorr[lane / 4 + 8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        acc[j][0] *= c_lo;
        acc[j][1] *= c_lo;
        acc[j][2] *= c_hi;
        acc[j][3] *= c_hi;
      }
#pragma unroll
      for (int ks = 0; ks < kTileKeys / 16; ++ks) {
        uint32_t pa[4];
        ldmatrix_x4(pa, smem_u32(sp + (lane % 16) * kTcPStride + 16 * ks + 8 * (lane / 16)));
#pragma unroll
        for (int pr = 0; pr < 4; ++pr) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, smem_u32(lat + (16 * ks + lane % 8 + 8 * ((lane / 8) % 2)) * kTcStride + 64 * warp +
                                         16 * pr + 8 * (lane / 16)));
          mma_bf16_16816(acc[2 * pr], pa, vb[0], vb[1]);
          mma_bf16_16816(acc[2 * pr + 1], pa, vb[2], vb[3]);
        }
      }
      if (it + kSlots < n_tiles) {
        fence_proxy_async();  // this slot's generic reads and writes before the TMA refills it
        __syncthreads();
        if (warp == 0) issue_tile(it + kSlots);
      }
    }
    float* acc_out = a.part_acc + int64_t{b} * kH * kR;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = 64 * warp + 8 * j + 2 * (lane % 4), h = lane / 4;
      *reinterpret_cast<float2*>(acc_out + h * kR + c) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(acc_out + (h + 8) * kR + c) = make_float2(acc[j][2], acc[j][3]);
    }
    if (hj == 0) a.part_ml[b * kH + hh] = make_float2(m_run, l_run);
  }
  mark(7);
  grid_sync(a.counter, base + 3ull * G, t == 0, [] { __syncthreads(); });
  mark(8);

  // ---- P4: the splits merged, then W_UV ----
  if (item) {
    float* sws = reinterpret_cast<float*>(smem + L.keys);        // [128] split weights
    float* so = reinterpret_cast<float*>(smem + L.keys) + kMaxSplits;  // [512] o_lat[h], bf16-rounded
    if (warp == 0) {
      float2 st[kMaxSplits / 32];
      float m = -INFINITY;
#pragma unroll
      for (int x = 0; x < kMaxSplits / 32; ++x) {
        const int s = lane + 32 * x;
        st[x] = s < n_splits ? __ldcg(a.part_ml + s * kH + ih) : make_float2(-INFINITY, 0.0f);
        if (st[x].y > 0.0f) m = fmaxf(m, st[x].x);
      }
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      float e[kMaxSplits / 32], l = 0.0f;
#pragma unroll
      for (int x = 0; x < kMaxSplits / 32; ++x) {
        e[x] = st[x].y > 0.0f ? __expf(st[x].x - m) : 0.0f;
        l = fmaf(e[x], st[x].y, l);
      }
      l = mla::warp_sum(l);
#pragma unroll
      for (int x = 0; x < kMaxSplits / 32; ++x)
        if (lane + 32 * x < n_splits) sws[lane + 32 * x] = e[x] / l;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int c = t + u * kThreads;
      float o = 0.0f;
      for (int s = 0; s < n_splits; ++s) o = fmaf(sws[s], __ldcg(a.part_acc + (int64_t{s} * kH + ih) * kR + c), o);
      so[c] = __bfloat162float(__float2bfloat16(o));
    }
    __syncthreads();
    mbar_wait(bar_uv, 0);
    for (int i = warp; i < kUvRows; i += kThreads / 32) {
      const uint4* wr = reinterpret_cast<const uint4*>(suv + i * kR);
      float y = 0.0f;
#pragma unroll
      for (int c = lane; c < kR / 8; c += 32) {
        const float4 x0 = *reinterpret_cast<const float4*>(so + 8 * c), x1 = *reinterpret_cast<const float4*>(so + 8 * c + 4);
        const uint4 w = wr[c];
        y = fmaf(mla::bf16_lo(w.x), x0.x, y);
        y = fmaf(mla::bf16_hi(w.x), x0.y, y);
        y = fmaf(mla::bf16_lo(w.y), x0.z, y);
        y = fmaf(mla::bf16_hi(w.y), x0.w, y);
        y = fmaf(mla::bf16_lo(w.z), x1.x, y);
        y = fmaf(mla::bf16_hi(w.z), x1.y, y);
        y = fmaf(mla::bf16_lo(w.w), x1.z, y);
        y = fmaf(mla::bf16_hi(w.w), x1.w, y);
      }
      y = mla::warp_sum(y);
      if (lane == 0) a.o[ih * kDv + islice * kUvRows + i] = y;
    }
  }
  mark(9);
  grid_sync(a.counter, base + 4ull * G, t == 0, [] { __syncthreads(); });
  mark(10);

  // ---- P5: out = W_o · bf16(o) ----
  mla::stage_bf16<kThreads>(a.o, kK5, sx, threadIdx.x);
  __syncthreads();
  mbar_wait(bar_o, 0);
  smem_gemv(sw, sx, static_cast<int>(r5_end - r5_begin), kK5, [&](int i, float y) { a.out[r5_begin + i] = y; });
  mark(11);
#else
  __trap();  // sm_90a only (mla_sublayer_fits)
#endif
}

bool mla_sublayer_fits(int64_t D, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r, int64_t rope_half) {
  if (H != kH || dn != kDn || dr != kDr || dv != kDv || r != kR || rope_half * 2 != kDr) return false;
  if (D <= 0 || D % 256 != 0 || !sm90a_device()) return false;
  const int G = sm_count();
  return G >= kItems && layout(D, G).total <= static_cast<uint32_t>(kOptinSmem);
}

void mla_sublayer(const MlaSublayerArgs& a, cudaStream_t s) {
  const int G = sm_count();
  const Layout l = layout(a.D, G);
  DI_CUDA_REQUIRE(l.total <= static_cast<uint32_t>(kOptinSmem));
  static const bool attr = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_sublayer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    return true;
  }();
  (void)attr;
  launch_pdl(mla_sublayer_kernel, dim3(static_cast<unsigned>(G)), dim3(kThreads), l.total, s, a);
}

int64_t mla_sublayer_max_splits() { return kMaxSplits; }

}  // namespace deepinfer::cuda
