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
// memory up front (the weight rows by the TMA unit, the W_UK slice and the key tiles by cp.async
// from every thread; Layout says why): before the wait for the previous kernel
// (cuda_launch.cuh's contract: weights, step inputs and latents of earlier steps are never
// written by this step's kernels before this one), the rest of the key ring and o_proj's rows
// once the first phase frees their space (o_proj's after P3 where the ring needs that space).
// The phases then compute on shared memory; only the small activations cross the barriers.
//
//   P1 GEMV:    q = W_q x, kv = W_kv x (x rounded to bf16 as the GEMV does, fp32 sums; FP8 rows
//               times their block scales). Block b
//               owns rows [b·N/G, (b+1)·N/G) of the stacked [W_q; W_kv] (N = H·(dn + dr) + r + dr).
//               With the layer's input norm folded in (MlaSublayerArgs::residual: one launch
//               fewer a layer), every block first makes x itself from the residual stream and
//               the previous layer's FFN output, add_rms_norm's arithmetic (cuda_norm_row.cuh);
//               block 0 writes x out, block G − 1 the residual's sum while it waits at B3.
//   P2 absorb:  block G − 1: the new latent, rms_norm(kv[:r]) ⊙ w and RoPE(kv[r:]), to the cache
//               (bf16; mla_kv_write_kernel's arithmetic). Blocks 0..127: item (h, c0) = (b / 8,
//               64·(b % 8)): q̃[h][c0..c0+63] = Σ_d bf16(q_nope[h][d]) · W_UK[h][d][c] on the
//               tensor cores — mla_absorb_tc_kernel's chain (one m16n8k16 MMA per 16 d from zero,
//               q_nope as A's row 0), warp w the 8 channels c0 + 8w.. — rounded to bf16; items with
//               c0 = 0 also rotate head h's q_pe (bf16).
//   P3 split:   the sequence's L keys cut into spans of max(32, ⌈L/128⌉ rounded up to 32) keys
//               (the invariant form: mla_split_span's, as the batch-invariant mode's split kernel);
//               block s < ⌈L/span⌉ attends all 16 heads over span s — mla_split_tc_kernel's
//               numerics (bf16 [q̃ | q_pe] and P on m16n8k16 MMAs, fp32 scores, state and o_lat;
//               the same tc_softmax_update) over 32-key tiles in a four-slot ring — and writes its
//               unnormalized o_lat and (m, l). The step's own key (position L − 1, written in P2)
//               is read with plain loads after the barrier; every other key came by cp.async.
//   P4 W_UV:    blocks 0..127, item (h, v0) = (b / 8, 16·(b % 8)): o_lat[h] = Σ_s w_s · acc_s
//               (merge_weights' rule: w_s = e^{m_s − M} / Σ e^{m_s' − M} l_s'), rounded to bf16,
//               then o[h][v0..v0+15] = W_UV[h][v] · o_lat[h].
//   P5 o_proj:  out = W_o bf16(o), block b owning rows [b·D/G, (b+1)·D/G).
//
// The invariant form (MlaSublayerArgs::split_keys > 0, the batch-invariant mode) computes every
// value as that mode's op-by-op path computes it for this token in any batch, so a one-token step
// keeps the mode's bits: P1 and P5 in the dense linears' K structure (chain_dot8_splits: 512-wide
// K splits, each an MMA chain from zero, added in order — small_m_gemm's sums), P3 on the
// invariant split rule, P4 merging the splits in split order by merge_coefs / merge_step (as
// mla_merge_running_kernel) and W_UV as mla_apply_tc_kernel's chain (chain_dot8 over r). The
// latent row, RoPE and P2's absorb are the same in both forms. With FP8 linears the mode's dense
// linears are W8A8 (cuda_fp8_wgmma.cu: x quantized per 1×128 group, each 128-wide K block's
// e4m3 MMAs promoted by row scale × weight scale in K order), whose accumulation mma.sync e4m3
// does not reproduce; so the invariant FP8 form issues that GEMM's wgmma itself (rows_wgmma): a
// block's 32 weight rows are B of m64n32k32 MMAs (the GEMM's m64n128k32 per 32 columns), the
// token's codes row 0 of A, the block's own quantization of x (fp8_group_scale / fp8_codes2,
// the quantizers' recipe) — so P1 and P5 are the op path's W8A8 outputs bit for bit.
//
// The grid barrier (cuda_grid_barrier.cuh): a 64-bit arrival counter that only this kernel
// touches; a launch adds exactly 4·G, so base = counter − counter mod 4G, read after the wait.
//
// Shapes: DeepSeek's MLA heads (dn 128, dr 64, r 512, dv 128) with H = 16 (V2 and V2-Lite),
// D % 256 == 0, bf16 weights (or FP8 q_proj, kv_a_proj and o_proj: in the default form e4m3
// rows staged with their 128-column block scales and dotted as the FP8 decode GEMV does —
// rows_gemv —, in the invariant form on wgmma as above; kv_b in bf16), a bf16 cache; one query
// row of one sequence; G ≥ 128 SMs; the whole layout within 227 KB (mla_sublayer_fits).
// Deterministic: no atomics on data, every sum in a fixed order; the default form's result
// depends on the launch only through G, the invariant form's on nothing but the token's inputs.
#include "backend/cuda/cuda_chain_dot.cuh"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_grid_barrier.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_norm_row.cuh"
#include "backend/cuda/cuda_rope.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {

using mla::kTcPStride;
using mla::kTcRedStride;
using mla::kTcStride;

namespace {

constexpr int kThreads = 256;                    // 8 warps
constexpr int kNormVec = 2;  // the folded input norm's float4 chunks per thread (cuda_norm_row.cuh)
static_assert(kThreads == kNormThreads && 4 * kNormThreads * kNormVec == kMlaSublayerNormMaxD,
              "the folded norm is add_rms_norm's kernel for rows up to kMlaSublayerNormMaxD");
constexpr int kH = 16, kDn = 128, kDr = 64, kR = 512, kDv = 128;
constexpr int kQRows = kH * (kDn + kDr);         // 3,072 rows of q_proj
constexpr int kWidth = kR + kDr;                 // 576: a cached latent
constexpr int kN1 = kQRows + kWidth;             // P1's rows
constexpr int kK5 = kH * kDv;                    // o_proj's K (2,048)
constexpr int kItems = 128;                      // P2 / P4 work items: 16 heads × 8 slices
constexpr int kAbsorbCols = kR / 8;              // 64 q̃ channels per P2 item
constexpr int kUvRows = kDv / 8;                 // 16 output channels per P4 item
constexpr int kTileKeys = 32;                    // keys per ring slot
constexpr int kSlots = 4;                        // the key ring: slots 0, 1 of their own; 2, 3 in P1's space
constexpr int kFrontSlots = 2;                   // slots filled before the wait
constexpr int kMaxSplits = 128;
constexpr int kInvMaxSplits = 32;                // the invariant form's merge: a split per lane
constexpr int kOptinSmem = 227 * 1024;
constexpr int kRowPad = 8;                       // invariant form: bf16 of padding per P1 / P5 row pair, per W_UV row
static_assert(kAbsorbCols == 8 * (kThreads / 32), "P2: a warp per 8 q̃ channels");
static_assert(kUvRows == 16, "P4's invariant form: two 8-row chains");

// Byte offsets of the dynamic shared memory (every piece 16-byte aligned, barriers 8). P1's and
// P5's weight rows are staged in pairs: rows 2p and 2p + 1 back to back, pair p at p·pair bytes.
// The default form's pairs are back to back too (one TMA copy per block: the TMA unit issues a
// block's copies one after another, ~50 ns each, and the prologue is on the step's critical
// path); the invariant form's lie 16 bytes past a multiple of 128 apart (a TMA copy per pair),
// so its ldmatrix over 8 rows meets 2-way bank conflicts, not 8-way (a copy per padded row, or
// 16-byte cp.async from every thread, put ~2–3 µs more into the prologue: runs s28-2, s28-3).
// The invariant form's W_UV rows are padded (cp.async); W_UK's slice (128-byte rows) is
// XOR-swizzled by 16-byte chunk in both (chunk j of row d at j ^ (d % 8)).
//
// The key ring's slots 0 and 1 have their own space (filled before the wait); slots 2 and 3
// lie at the start of P1's space, filled once P1 is done. A block with more than two key tiles
// (P3) loads its o_proj rows there after its last tile; the others load them after P1.
// The invariant FP8 form (rows_wgmma) stages a block's P1 / P5 tile of kWgRows rows as wgmma's B
// operand — per 128-wide K block [kWgRows][128] e4m3 with TMA's 128-byte swizzle (16-byte chunk
// c of row i at chunk c ^ (i % 8)), the blocks kWgRows · 128 bytes apart: one 2-D TMA box per K
// block (WgMaps), from one thread, where 16-byte cp.async from every thread put ~2.6 µs more
// into the prologue (run s30-1: "issued" 4.5 µs against the FP8 form's 1.9) — then A's atoms, one
// 1 KB atom [8][128] per K block whose row 0 holds the token's codes (rows 1–7, and the rows
// 8–63 the descriptor finds in the atoms after, are never read back: a row's MMA results do not
// depend on the other rows). Swizzled tiles need a 1,024-byte aligned base: the form aligns the
// dynamic shared memory's base at run time (kWgAlign more bytes).
constexpr int kWgRows = 32;                      // rows per P1 / P5 tile of the invariant FP8 form
constexpr uint32_t kWgAtom = 1024;               // a 128-byte-swizzle atom: 8 rows of 128 bytes
constexpr uint32_t kWgAlign = 1024;
constexpr uint32_t kWgSlack = 7 * kWgAtom;       // A's rows 8–63 past its last atom (read, never used)
static_assert(kQRows % kWgRows == 0 && kWidth % kWgRows == 0 && kK5 % 128 == 0, "whole tiles of W_q, W_kv");

// The invariant FP8 form's tensor maps (kernel parameters): W_q, W_kv and W_o as e4m3 matrices in
// boxes of kWgRows rows × 128 bytes with the 128-byte swizzle; zeros in the other forms.
struct WgMaps {
  CUtensorMap q, kv, o;
};

struct Layout {
  bool wg;                   // the invariant FP8 form (wgmma tiles)
  int rows1, rows5;          // most P1 / P5 rows of one block
  int eb;                    // bytes per weight element of P1 / P5: 2 (bf16), 1 (FP8)
  uint32_t pair1, pair5;     // staged row pairs' bytes: 2·eb·D, 2·eb·kK5 (+ 16 in the invariant form)
  int uv_pitch;              // a staged W_UV row, elements: kR (+ 8 in the invariant form)
  uint32_t w;                // P1's rows [rows1 / 2][pair1]; then key slots 2, 3 or o_proj's rows [rows5 / 2][pair5]
  uint32_t attn;             // P2 / P3 scratch inside w past slots 2, 3 and o_proj's rows (free once P1 is done)
  uint32_t uk, uv, keys;     // W_UK slice [128][64] (swizzled), W_UV slice [16][uv_pitch], key slots 0, 1 [2][32][584] bf16
  uint32_t x;                // P1's x, P5's o: [max(D, kK5)] bf16
  uint32_t cs;               // the RoPE table [2 · kRopeMaxHalf] fp32
  uint32_t sc1, sc5;         // FP8: P1's and P5's rows' block scales [rows][K / 128] fp32 (else empty)
  uint32_t a1, a5;           // invariant FP8: P1's / P5's A atoms (inside w, past the B tile)
  uint32_t sa;               // invariant FP8: x's (then o's) group scales [max(D, kK5) / 128] fp32
  uint32_t bars;             // mbarriers: w1, uk, uv, o, key[4]
  uint32_t total;
};
constexpr int kBars = 4 + kSlots;
constexpr uint32_t kSlotBytes = kTileKeys * kTcStride * 2;  // one key tile: [32][584] bf16
// P3's scratch inside `attn`: q tile [16][584] bf16, scores [2][16][36] fp32, P [16][40] bf16,
// corr [16] fp32; P2's bf16 q_nope [128] and the latent writer's warp sums [8] alias it.
constexpr uint32_t kAttnQ = 0;
constexpr uint32_t kAttnRed = kAttnQ + kH * kTcStride * 2;
constexpr uint32_t kAttnP = kAttnRed + 2 * kH * kTcRedStride * 4;
constexpr uint32_t kAttnCorr = kAttnP + kH * kTcPStride * 2;
constexpr uint32_t kAttnBytes = kAttnCorr + kH * 4;
static_assert(kAttnRed % 16 == 0 && kAttnP % 16 == 0 && kAttnCorr % 16 == 0, "aligned scratch pieces");

__host__ __device__ inline uint32_t align16(uint64_t v) { return static_cast<uint32_t>((v + 15) / 16 * 16); }

__host__ __device__ inline Layout layout(int64_t D, int G, bool inv, bool fp8) {
  Layout l;
  l.wg = inv && fp8;
  l.rows1 = l.wg ? kWgRows : (kN1 + G - 1) / G;
  l.rows5 = l.wg ? kWgRows : static_cast<int>((D + G - 1) / G);
  l.eb = fp8 ? 1 : 2;
  const int pad = inv && !fp8 ? kRowPad : 0;
  l.pair1 = static_cast<uint32_t>(2 * l.eb * D + 2 * pad);
  l.pair5 = 2 * l.eb * kK5 + 2 * pad;
  l.uv_pitch = kR + (inv ? kRowPad : 0);
  // The bytes up to the end of staged row n (pairs of `pair` bytes, rows of `row`; an odd n ends
  // half-way into a pair).
  auto rows_end = [](int n, uint64_t pair, uint64_t row) { return uint64_t(n / 2) * pair + uint64_t(n % 2) * row; };
  // The invariant FP8 form: B tile, then A's atoms (one per K block); the kWgSlack bytes A's
  // descriptor reads past them lie in whatever follows (attn's scratch, idle in P1 and P5).
  l.a1 = static_cast<uint32_t>(kWgRows * D);
  l.a5 = kWgRows * kK5;
  const uint64_t o_bytes = l.wg ? l.a5 + (kK5 / 128) * kWgAtom
                                : rows_end(l.rows5, l.pair5, static_cast<uint64_t>(l.eb) * kK5);
  const uint64_t ring_bytes = uint64_t{kSlots - kFrontSlots} * kSlotBytes;
  l.w = 0;
  l.attn = align16(o_bytes > ring_bytes ? o_bytes : ring_bytes);
  const uint64_t w_bytes = l.wg ? l.a1 + uint64_t(D / 128) * kWgAtom
                                : rows_end(l.rows1, l.pair1, static_cast<uint64_t>(l.eb) * static_cast<uint64_t>(D));
  const uint64_t w_end = w_bytes > l.attn + kAttnBytes ? w_bytes : l.attn + kAttnBytes;
  l.uk = align16(w_end);
  l.uv = l.uk + kDn * kAbsorbCols * 2;
  l.keys = l.uv + kUvRows * l.uv_pitch * 2;
  l.x = l.keys + kFrontSlots * kSlotBytes;
  l.cs = l.x + align16(uint64_t{2} * (D > kK5 ? D : kK5));
  l.sc1 = l.cs + 2 * kRopeMaxHalf * 4;
  l.sc5 = l.sc1 + (fp8 ? align16(uint64_t{4} * l.rows1 * (D / 128)) : 0u);
  l.sa = l.sc5 + (fp8 ? align16(uint64_t{4} * l.rows5 * (kK5 / 128)) : 0u);
  l.bars = l.sa + (l.wg ? align16(uint64_t{4} * ((D > kK5 ? D : kK5) / 128)) : 0u);
  l.total = l.bars + kBars * 8 + (l.wg ? kWgAlign : 0u);
  return l;
}
// P4's scratch in key slots 0, 1 (free once P3 is done): default form, the split weights [128]
// and o_lat [512] fp32; invariant form, (α, β) [32] and l [32] per split, o_lat [512] bf16.
static_assert(kFrontSlots * kSlotBytes >= (kMaxSplits + kR) * 4, "P4's scratch fits in the key ring");

// Fixed dims of the shape this kernel serves.
static_assert(kTcStride == kWidth + 8, "the key ring and q tile use the tensor-core split kernel's stride");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kPhases = 4;                  // grid barriers per launch

__device__ __forceinline__ uint4 ldcg16(const void* p) { return __ldcg(static_cast<const uint4*>(p)); }

// y[i] = W[i]·x for the block's n rows of K weights in shared memory (row i at w + (i / 2)·pair +
// (i % 2)·K·eb bytes: Layout's row pairs), x [K] bf16 in shared memory; emit(i, y) takes each sum.
// Default form: warp w takes rows w, w + 8, … (mla::dot8_bf16's two fp32 chains per lane, then
// the butterfly; lane 0 emits). FP8 rows (kFp8, sc: their block scales [n][K / 128]): the same
// rows per warp, lane l the 16-code chunks l, l + 32, … (chunk c in scale block c / 8), each
// chunk's 16 products summed in fp32 from zero (e4m3x2 → f16x2 → f32, exact) and added times its
// block's scale — the FP8 decode GEMV's arithmetic class (bf16 x, fp32 sums, the scale per block).
// Invariant form: warp w takes the 8-row groups w, w + 8, … (chain_dot8_splits: the dense
// linears' K structure; a group past the block's rows repeats its last row, its sums dropped).
template <bool kInv, bool kFp8, typename Emit>
__device__ __forceinline__ void rows_gemv(const unsigned char* w, uint32_t pair, const bf16* x, int n, int K,
                                          const float* sc, Emit emit) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kEb = kFp8 ? 1 : 2;
  auto row_at = [&](int i) { return static_cast<uint32_t>(i / 2) * pair + static_cast<uint32_t>(i % 2 * K * kEb); };
  if constexpr (kFp8) {
    static_assert(!kInv, "the FP8 form is the default form's");
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const int n_kb = K / 128;
    for (int i = warp; i < n; i += kThreads / 32) {
      const uint4* wr = reinterpret_cast<const uint4*>(w + row_at(i));
      const float* srow = sc + i * n_kb;
      float acc = 0.0f;
#pragma unroll 4
      for (int c = lane; c < K / 16; c += 32) {
        const uint4 q = wr[c], x0 = xv[2 * c], x1 = xv[2 * c + 1];
        const uint32_t qw[4] = {q.x, q.y, q.z, q.w}, xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float part = 0.0f;
#pragma unroll
        for (int v = 0; v < 8; ++v) {  // codes 2v, 2v + 1 of the chunk
          const float2 f = e4m3x2_to_float2(qw[v / 2] >> (16 * (v % 2)));
          part = fmaf(f.x, mla::bf16_lo(xw[v]), part);
          part = fmaf(f.y, mla::bf16_hi(xw[v]), part);
        }
        acc = fmaf(part, srow[c / 8], acc);
      }
      acc = mla::warp_sum(acc);
      if (lane == 0) emit(i, acc);
    }
  } else if constexpr (kInv) {
    for (int g = warp; 8 * g < n; g += kThreads / 32) {
      const int row = std::min(8 * g + lane % 8, n - 1);
      float y0, y1;
      chain_dot8_splits(smem_u32(w) + row_at(row), K, x, lane, y0, y1);
      if (lane < 4 && 8 * g + 2 * lane < n) emit(8 * g + 2 * lane, y0);
      if (lane < 4 && 8 * g + 2 * lane + 1 < n) emit(8 * g + 2 * lane + 1, y1);
    }
  } else {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int i = warp; i < n; i += kThreads / 32) {
      const uint4* wr = reinterpret_cast<const uint4*>(w + row_at(i));
      float acc = 0.0f;
#pragma unroll 4
      for (int c = lane; c < K / 8; c += 32) acc = mla::dot8_bf16(wr[c], xv[c], acc);
      acc = mla::warp_sum(acc);
      if (lane == 0) emit(i, acc);
    }
  }
}

// d[64×32] fp32 (+)= A[64×32] e4m3 · B[32×32]ᵀ e4m3, both K-major in shared memory (128-byte
// swizzle); accumulate = 0 overwrites d. d[4j + v]: row 16w + l/4 + 8·(v/2), column 8j + 2·(l%4)
// + v%2 (warp w of the warpgroup, lane l), j < 4 — cuda_fp8_wgmma.cu's m64n128k32 per 32 columns.
__device__ __forceinline__ void wgmma_m64n32k32_e4m3(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
               : DI_WGMMA_ACC8(d, 0), DI_WGMMA_ACC8(d, 8)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The invariant FP8 form's P1 / P5 (Layout::wg): y[i] for the block's n ≤ kWgRows rows, as the
// W8A8 wgmma GEMM (cuda_fp8_wgmma.cu) computes the token's row in any batch. bt: the rows as B
// tiles (Layout's comment), their weight scales sc [kWgRows][K / 128], both by TMA completing on
// bar (not yet waited for); x [K] bf16 in shared memory.
// Every thread first quantizes x per 1×128 group into A's atoms `at` (row 0) and its scales
// into sa — quantize_group8's recipe and layout, a half-warp per group —, then warpgroup 0
// issues each K block's four m64n32k32 MMAs (the first overwriting), two blocks in flight, and
// promotes them in K order: acc = fmaf(part, sa[kb] · sc[i][kb], acc) — the GEMM's promotion.
// Warp 0's lanes 0–3 hold row 0; emit(i, y) takes each output. Block-collective. (The K blocks
// split between the two warpgroups, warpgroup 1's sums handed over in shared memory, ran the
// kernel 0.6–0.7 µs slower: run s30-3.)
template <typename Emit>
__device__ __forceinline__ void rows_wgmma(const unsigned char* bt, uint64_t* bar, unsigned char* at, float* sa,
                                           const bf16* x, int n, int K, const float* sc, Emit emit) {
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int n_kb = K / 128;
  for (int g0 = 0; g0 < n_kb; g0 += kThreads / 16) {  // whole warps in every round (the shuffles)
    const int g = g0 + t / 16, j = t % 16;
    const bool live = g < n_kb;
    float v[8] = {};
    if (live) {
      const uint4 u = *reinterpret_cast<const uint4*>(x + g * 128 + 8 * j);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) v[2 * i] = mla::bf16_lo(w[i]), v[2 * i + 1] = mla::bf16_hi(w[i]);
    }
    quantize_group8(v, live, at + g * kWgAtom + 8 * j, sa + g);  // row 0 of g's atom: chunks unswizzled
  }
  fence_proxy_async();  // the codes, written through the generic proxy, before wgmma reads them
  __syncthreads();
  if (warp >= 4) return;
  mbar_wait(bar, 0);  // the tile and its scales
  const uint64_t da = sw128_desc(at), db = sw128_desc(bt);
  float acc[16], p0[16], p1[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = p0[i] = p1[i] = 0.0f;
  auto issue = [&](float (&p)[16], int kb) {
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(p[i]);
    wgmma_fence();
    const uint32_t oa = static_cast<uint32_t>(kb) * (kWgAtom >> 4);          // A: an atom per K block
    const uint32_t ob = static_cast<uint32_t>(kb) * (kWgRows * 128 >> 4);  // B: a tile per K block
#pragma unroll
    for (int k = 0; k < 4; ++k) wgmma_m64n32k32_e4m3(p, desc_advance(da, oa + 2 * k), desc_advance(db, ob + 2 * k), k);
    wgmma_commit();
  };
  auto promote = [&](float (&p)[16], int kb) {
#pragma unroll
    for (int i = 0; i < 16; ++i) fence_operand(p[i]);
    const float a0 = sa[kb];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
      acc[i] = fmaf(p[i], a0 * sc[col * n_kb + kb], acc[i]);
    }
  };
  for (int kb = 0; kb < n_kb; kb += 2) {  // n_kb even (D % 256 == 0); nothing in flight across the back edge
    issue(p0, kb);
    issue(p1, kb + 1);
    wgmma_wait<1>();
    promote(p0, kb);
    wgmma_wait<0>();
    promote(p1, kb + 1);
  }
  if (warp == 0 && lane < 4) {
#pragma unroll
    for (int jj = 0; jj < 4; ++jj)
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int col = 8 * jj + 2 * lane + v;
        if (col < n) emit(col, acc[4 * jj + v]);
      }
  }
}

__device__ __forceinline__ float load_elem(const void* p, Elem e, int64_t i) {
  return e == Elem::kF32 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const bf16*>(p)[i]);
}
#endif

}  // namespace

template <bool kInv, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1)
    mla_sublayer_kernel(const __grid_constant__ MlaSublayerArgs a, const __grid_constant__ WgMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  constexpr bool kWg = kInv && kFp8;  // the invariant FP8 form: P1 / P5 on wgmma (rows_wgmma)
  // kWg: the base 1,024-byte aligned (its swizzled tiles; Layout reserved kWgAlign more bytes).
  unsigned char* const smem =
      kWg ? smem_raw + ((kWgAlign - (smem_u32(smem_raw) & (kWgAlign - 1))) & (kWgAlign - 1)) : smem_raw;
  const int G = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const Layout L = layout(a.D, G, kInv, kFp8);
  unsigned char* sw = smem + L.w;  // P1's rows, then P5's (Layout::pair1, pair5)
  bf16* suk = reinterpret_cast<bf16*>(smem + L.uk);
  bf16* suv = reinterpret_cast<bf16*>(smem + L.uv);
  bf16* skeys = reinterpret_cast<bf16*>(smem + L.keys);
  bf16* sx = reinterpret_cast<bf16*>(smem + L.x);
  float* cs = reinterpret_cast<float*>(smem + L.cs);
  float* sc1 = reinterpret_cast<float*>(smem + L.sc1);  // FP8: P1's rows' block scales
  float* sc5 = reinterpret_cast<float*>(smem + L.sc5);  // FP8: P5's
  float* ssa = reinterpret_cast<float*>(smem + L.sa);   // invariant FP8: x's / o's group scales
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t *bar_w1 = bars, *bar_uk = bars + 1, *bar_uv = bars + 2, *bar_o = bars + 3, *bar_key = bars + 4;
  auto slot_tile = [&](int slot) {  // key slot `slot`: [32][kTcStride] bf16
    return slot < kFrontSlots ? skeys + slot * (kSlotBytes / 2)
                              : reinterpret_cast<bf16*>(sw) + (slot - kFrontSlots) * (kSlotBytes / 2);
  };
  unsigned char* attn = smem + L.attn;
  // The phase timeline (MlaSublayerArgs::trace): thread 0's global timer at mark m.
  auto mark = [&](int m) {
    if (a.trace != nullptr && threadIdx.x == 0) a.trace[blockIdx.x * kMlaSublayerMarks + m] = global_ns();
  };
  mark(0);

  const int64_t D = a.D;
  // P1's and P5's rows: spread over the grid, or (kWg) tiles of kWgRows on the first blocks.
  const int r1_begin = kWg ? std::min(int{kN1}, kWgRows * b) : static_cast<int>(int64_t{b} * kN1 / G);
  const int r1_end = kWg ? std::min(int{kN1}, kWgRows * (b + 1)) : static_cast<int>(int64_t{b + 1} * kN1 / G);
  const int64_t r5_begin = kWg ? std::min<int64_t>(D, kWgRows * b) : int64_t{b} * D / G;
  const int64_t r5_end = kWg ? std::min<int64_t>(D, kWgRows * (b + 1)) : int64_t{b + 1} * D / G;
  const bool item = b < kItems;
  const int ih = b / 8, islice = b % 8;  // P2 / P4 item: head, slice

  // The key range of this block's split (P3), from step inputs only.
  const int64_t n_keys = a.kv_len[0];
  const int32_t* pages = a.block_ids + a.block_indptr[0];
  const int64_t span = kInv ? mla_split_span(n_keys, a.split_keys, a.max_splits)
                            : std::max<int64_t>(kTileKeys, ((n_keys + kMaxSplits - 1) / kMaxSplits + kTileKeys - 1) /
                                                               kTileKeys * kTileKeys);
  const int n_splits = static_cast<int>((n_keys + span - 1) / span);
  const int64_t k_begin = int64_t{b} * span, k_end = std::min(n_keys, k_begin + span);
  const int64_t n_tiles = b < n_splits ? (k_end - k_begin + kTileKeys - 1) / kTileKeys : 0;
  const int64_t new_key = n_keys - 1;  // written in P2: never in the ring's copies
  const uint32_t bs = static_cast<uint32_t>(a.block_size);
  // Step inputs the later phases need, loaded now (off their latency chains): the new key's
  // cache row for the block whose span holds it (P3), the token's slot for the latent's writer
  // (P2), and the RoPE angles for the blocks that rotate (P2; their cosines and sines are
  // computed while B1 waits).
  const int64_t new_row = new_key >= k_begin && new_key < k_end ? int64_t{pages[new_key / bs]} * bs + new_key % bs : 0;
  const int64_t latent_row = b == G - 1 ? int64_t{a.slots[0]} : 0;
  const bool needs_rope = b == G - 1 || (item && islice == 0);
  const float rope_ang = needs_rope && t < a.rope.half ? rope_angle(a.rope, a.positions[0], t) : 0.0f;

  // Every thread copies its share of a key tile into its ring slot by cp.async — 16 bytes a
  // copy, the slot's mbarrier counting each thread's arrival (cp.async.mbarrier.arrive): as 32
  // TMA row copies from one warp a tile took ~1.6 µs to issue (the TMA unit takes a block's
  // copies one after another, ~50 ns each: run s28-2), on P3's critical path at every refill.
  // Lane l looks up the cache row of the tile's key l (tile_row; −1: none), the copies take their
  // keys' rows from the lanes by shuffles. Keys past the span and the step's own key (written in
  // P2, stored from registers in P3) are zero-filled.
  auto tile_row = [&](int64_t tile) {
    const int64_t key = k_begin + tile * kTileKeys + lane;
    return key < k_end && key != new_key ? int64_t{pages[key / bs]} * bs + key % bs : int64_t{-1};
  };
  auto load_tile = [&](int64_t tile, int64_t my_row) {
    const int slot = static_cast<int>(tile % kSlots);
    bf16* dst = slot_tile(slot);
#pragma unroll
    for (int j = 0; j < kTileKeys * (kWidth / 8) / kThreads; ++j) {
      const int e = t + j * kThreads, k = e / (kWidth / 8), c8 = e % (kWidth / 8);
      const int64_t row = __shfl_sync(0xffffffffu, my_row, k);
      cp_async16(smem_u32(dst + k * kTcStride + 8 * c8), row >= 0 ? a.cache + row * kWidth + 8 * c8 : a.cache, row >= 0);
    }
    cp_async_arrive(&bar_key[slot]);
  };
  static_assert(kTileKeys * (kWidth / 8) % kThreads == 0, "a key tile in whole rounds of 16-byte copies");
  // A block with more than kFrontSlots key tiles fills slots 2, 3 once P1 is done and loads its
  // o_proj rows into that space after its last tile; every other block loads them after P1.
  const bool late_o = n_tiles > kFrontSlots;
  // kWg (thread 0): a whole tile — kWgRows rows of K codes from row y of map's matrix — into B's
  // layout at dst, a box per K block, and the rows' scales (kWgRows · K / 128 fp32, contiguous from
  // scale) into sdst, completing on bar.
  auto load_wg_tile = [&](const CUtensorMap* map, int y, const float* scale, int K, unsigned char* dst, float* sdst,
                          uint64_t* bar) {
    const int n_kb = K / 128;
    const uint32_t sc_bytes = static_cast<uint32_t>(kWgRows * n_kb * 4);
    mbar_arrive_expect_tx(bar, static_cast<uint32_t>(kWgRows * K) + sc_bytes);
    for (int kb = 0; kb < n_kb; ++kb) tma_load_2d(dst + kb * (kWgRows * 128), map, 128 * kb, y, bar);
    bulk_load(sdst, scale, sc_bytes, bar);
  };
  // This block's o_proj rows: default form, one TMA copy; invariant form, a copy per row pair
  // from warp 0's lanes (FP8: a wgmma tile).
  auto load_o_rows = [&] {
    const int n_rows = static_cast<int>(r5_end - r5_begin);
    if constexpr (kWg) {
      if (n_rows > 0 && t == 0)
        load_wg_tile(&maps.o, static_cast<int>(r5_begin), a.s_o + r5_begin * (kK5 / 128), kK5, sw, sc5, bar_o);
    } else if constexpr (kInv) {
      if (warp == 0) {
        if (lane == 0) mbar_arrive_expect_tx(bar_o, static_cast<uint32_t>(n_rows * kK5 * 2));
        __syncwarp();
        for (int p = lane; 2 * p < n_rows; p += 32)
          bulk_load(sw + p * L.pair5, static_cast<const bf16*>(a.w_o) + (r5_begin + 2 * p) * kK5,
                    static_cast<uint32_t>(std::min(2, n_rows - 2 * p) * kK5 * 2), bar_o);
      }
    } else if (t == 0) {
      const uint32_t sc_bytes = kFp8 ? static_cast<uint32_t>(n_rows * (kK5 / 128) * 4) : 0u;
      mbar_arrive_expect_tx(bar_o, static_cast<uint32_t>(n_rows * kK5 * L.eb) + sc_bytes);
      if (n_rows > 0) {
        bulk_load(sw, static_cast<const unsigned char*>(a.w_o) + r5_begin * kK5 * L.eb,
                  static_cast<uint32_t>(n_rows * kK5 * L.eb), bar_o);
        if constexpr (kFp8) bulk_load(sc5, a.s_o + r5_begin * (kK5 / 128), sc_bytes, bar_o);
      }
    }
  };

  // ---- Before the wait: barriers, every weight copy, the first key tiles, the RoPE angles ----
  if (t == 0) {  // cp.async arrivals of every thread: W_UK, the key slots, and the invariant form's copies
    for (int i = 0; i < kBars; ++i) {
      const bool cp = &bars[i] == bar_uk || i >= 4 || (kInv && &bars[i] == bar_uv);
      mbar_init(&bars[i], cp ? kThreads : 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // P1's rows: default form, one TMA copy from each of W_q and W_kv (and W_UV's slice); the
  // invariant form, a copy per row pair from warp 0's lanes (two where a pair straddles W_q and
  // W_kv). Then the first key tiles.
  if constexpr (kWg) {  // tiles never straddle W_q and W_kv (kQRows % kWgRows == 0)
    const int64_t n_kb = D / 128;
    if (r1_begin < r1_end && t == 0) {
      if (r1_begin < kQRows)
        load_wg_tile(&maps.q, r1_begin, a.s_q + r1_begin * n_kb, static_cast<int>(D), sw, sc1, bar_w1);
      else
        load_wg_tile(&maps.kv, r1_begin - kQRows, a.s_kv + (r1_begin - kQRows) * n_kb, static_cast<int>(D), sw, sc1,
                     bar_w1);
    }
  } else if constexpr (kInv) {
    if (warp == 0) {
      const int n_rows = r1_end - r1_begin;
      if (lane == 0) mbar_arrive_expect_tx(bar_w1, static_cast<uint32_t>(n_rows * D * 2));
      __syncwarp();
      auto src = [&](int row) {
        return row < kQRows ? static_cast<const bf16*>(a.w_q) + int64_t{row} * D
                            : static_cast<const bf16*>(a.w_kv) + int64_t{row - kQRows} * D;
      };
      for (int p = lane; 2 * p < n_rows; p += 32) {
        const int row = r1_begin + 2 * p, n = std::min(2, n_rows - 2 * p);
        if (n == 2 && row + 1 == kQRows) {  // W_q's last row, then W_kv's first
          bulk_load(sw + p * L.pair1, src(row), static_cast<uint32_t>(D * 2), bar_w1);
          bulk_load(sw + p * L.pair1 + D * 2, src(row + 1), static_cast<uint32_t>(D * 2), bar_w1);
        } else {
          bulk_load(sw + p * L.pair1, src(row), static_cast<uint32_t>(n * D * 2), bar_w1);
        }
      }
    }
  } else if (t == 0) {
    // FP8: each part's block scales too (rows of D / 128 fp32, contiguous per part).
    const int64_t eb = L.eb, n_kb = D / 128;
    const uint32_t sc_bytes = kFp8 ? static_cast<uint32_t>((r1_end - r1_begin) * n_kb * 4) : 0u;
    mbar_arrive_expect_tx(bar_w1, static_cast<uint32_t>((r1_end - r1_begin) * D * eb) + sc_bytes);
    const auto* wq = static_cast<const unsigned char*>(a.w_q);
    const auto* wkv = static_cast<const unsigned char*>(a.w_kv);
    const int q_end = std::min(r1_end, int{kQRows});
    if (r1_begin < q_end) {
      bulk_load(sw, wq + int64_t{r1_begin} * D * eb, static_cast<uint32_t>((q_end - r1_begin) * D * eb), bar_w1);
      if constexpr (kFp8)
        bulk_load(sc1, a.s_q + int64_t{r1_begin} * n_kb, static_cast<uint32_t>((q_end - r1_begin) * n_kb * 4), bar_w1);
    }
    const int kv_begin = std::max(r1_begin, int{kQRows});
    if (kv_begin < r1_end) {
      bulk_load(sw + int64_t{kv_begin - r1_begin} * D * eb, wkv + int64_t{kv_begin - kQRows} * D * eb,
                static_cast<uint32_t>((r1_end - kv_begin) * D * eb), bar_w1);
      if constexpr (kFp8)
        bulk_load(sc1 + (kv_begin - r1_begin) * n_kb, a.s_kv + int64_t{kv_begin - kQRows} * n_kb,
                  static_cast<uint32_t>((r1_end - kv_begin) * n_kb * 4), bar_w1);
    }
    if (item) {
      mbar_arrive_expect_tx(bar_uv, kUvRows * kR * 2);
      bulk_load(suv, a.kv_b + (int64_t{ih} * (kDn + kDv) + kDn + islice * kUvRows) * kR, kUvRows * kR * 2, bar_uv);
    }
  }
  {
    const int64_t row0 = tile_row(0), row1 = tile_row(1);  // both lookups in flight at once
    if (n_tiles > 0) load_tile(0, row0);
    if (n_tiles > 1) load_tile(1, row1);
  }
  // W_UK[h][d][c0 .. c0 + 63] (128 rows of 128 bytes, swizzled) and, in the invariant form,
  // W_UV[h][v0 .. v0 + 15] (16 padded rows of 1 KB) by cp.async from every thread, 16 bytes a
  // copy: W_UK as 128 TMA copies (with the RoPE table computed here) put the prologue at 5.4 µs,
  // by cp.async 1.7 (run s27-3; the TMA unit takes a block's copies one after another, ~20–30
  // ns each).
  if (item) {
    const bf16* uk = a.kv_b + int64_t{ih} * (kDn + kDv) * kR + islice * kAbsorbCols;
    for (int e = t; e < kDn * kAbsorbCols / 8; e += kThreads) {
      const int d = e / (kAbsorbCols / 8), j = e % (kAbsorbCols / 8);
      cp_async16(smem_u32(suk + d * kAbsorbCols + 8 * (j ^ (d % 8))), uk + int64_t{d} * kR + 8 * j, true);
    }
    cp_async_arrive(bar_uk);
    if constexpr (kInv) {
      const bf16* uv = a.kv_b + (int64_t{ih} * (kDn + kDv) + kDn + islice * kUvRows) * kR;
      for (int e = t; e < kUvRows * kR / 8; e += kThreads) {
        const int v = e / (kR / 8), c = 8 * (e % (kR / 8));
        cp_async16(smem_u32(suv + v * L.uv_pitch + c), uv + int64_t{v} * kR + c, true);
      }
      cp_async_arrive(bar_uv);
    }
  }
  // The folded input norm's weight (a weight: before the wait).
  NormWeight<kNormVec> nw;
  if (a.residual != nullptr) norm_row_weight(nw, a.in_norm, a.in_norm_elem, D);
  mark(1);

  pdl_wait();
  pdl_trigger();
  mark(2);
  const unsigned long long base = t == 0 ? grid_base(a.counter, static_cast<unsigned long long>(kPhases) * G) : 0;

  // ---- P1: q | kv = [W_q; W_kv] · bf16(x) ----
  if (a.residual != nullptr) {  // x from the residual stream (cs: the block sum's scratch, the RoPE table's after B1)
    NormRow<kNormVec> r;
    norm_row_sum_in(r, a.residual, a.delta, D, a.in_eps, cs);
    norm_row_store<kNormVec, 2>(r, nw, D, nullptr, b == 0 ? a.x_out : nullptr, reinterpret_cast<uint8_t*>(sx),
                                nullptr, nullptr);
  } else {
    mla::stage_bf16<kThreads>(a.x, D, sx, threadIdx.x);
  }
  __syncthreads();
  auto emit1 = [&](int i, float y) {
    const int row = r1_begin + i;
    if (row < kQRows) a.q[row] = y;
    else a.kv[row - kQRows] = y;
  };
  if constexpr (kWg) {
    if (r1_begin < r1_end)
      rows_wgmma(sw, bar_w1, sw + L.a1, ssa, sx, r1_end - r1_begin, static_cast<int>(D), sc1, emit1);
  } else {
    mbar_wait(bar_w1, 0);
    rows_gemv<kInv, kFp8>(sw, L.pair1, sx, r1_end - r1_begin, static_cast<int>(D), sc1, emit1);
  }
  fence_proxy_async();  // P1's reads of sw before the async proxy overwrites it
  __syncthreads();
  if (late_o) {  // into the space P1's rows leave: key tiles 2, 3, or o_proj's rows
    const int64_t row2 = tile_row(2), row3 = tile_row(3);
    load_tile(2, row2);
    if (n_tiles > 3) load_tile(3, row3);
  } else {
    load_o_rows();
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
    bf16* qn = reinterpret_cast<bf16*>(attn);  // [128] bf16(q_nope[h])
    __syncthreads();  // block G − 1 (when it is also an item) is done with `red`
    if (t < kDn) qn[t] = __float2bfloat16(__ldcg(a.q + ih * (kDn + kDr) + t));
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
    // Warp w: channels c0 + 8w .. + 7, one MMA chain over d (k) in 16-wide chunks from zero —
    // mla_absorb_tc_kernel's: q_nope as A's row 0, W_UK[d][c] as B (k-major: ldmatrix.trans,
    // lane l addressing row d = 16·ks + l, two chunks per load, chunk w of the swizzled row).
    const uint32_t* xw = reinterpret_cast<const uint32_t*>(qn);
    const uint32_t b_addr = smem_u32(suk + lane * kAbsorbCols + 8 * (warp ^ (lane % 8)));
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < kDn / 16; ks += 2) {
      uint32_t bm[4], a0[4], a1[4];
      ldmatrix_x4_trans(bm, b_addr + 2 * 16 * ks * kAbsorbCols);
      chain_a_row0(xw, 16 * ks, lane, a0, a1);
      mma_bf16_16816(c, a0, bm[0], bm[1]);
      mma_bf16_16816(c, a1, bm[2], bm[3]);
    }
    if (lane < 4)  // q̃[h][c0 + 8w + 2i], + 1: row 0's sums (lanes 0..3), rounded to bf16
      *reinterpret_cast<uint32_t*>(a.q_lat + ih * kR + islice * kAbsorbCols + 8 * warp + 2 * lane) =
          mla::pack_bf16(c[0], c[1]);
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
    // The step's own key (written in P2), 16 bytes each for threads kNewKeyT0 .. + 71 — the
    // threads with one q load fewer — loaded beside the q tile (one L2 latency for both).
    constexpr int kVecs = kH * (kWidth / 8), kIters = (kVecs + kThreads - 1) / kThreads;
    constexpr int kNewKeyT0 = kVecs - (kIters - 1) * kThreads;
    static_assert(kNewKeyT0 + kWidth / 8 <= kThreads, "the new key's loaders have a free load slot");
    const bool new_loader = new_key >= k_begin && new_key < k_end && t >= kNewKeyT0 && t < kNewKeyT0 + kWidth / 8;
    uint4 new_v = make_uint4(0, 0, 0, 0);
    {  // [q̃ | q_pe] per head, bf16: every load issued before the first store (one L2 latency)
      uint4 v[kIters];
#pragma unroll
      for (int x = 0; x < kIters; ++x) {
        const int e = t + x * kThreads, h = e / (kWidth / 8), c = 8 * (e % (kWidth / 8));
        if (e < kVecs) v[x] = c < kR ? ldcg16(a.q_lat + h * kR + c) : ldcg16(a.q_pe + h * kDr + (c - kR));
      }
      if (new_loader) new_v = ldcg16(a.cache + new_row * kWidth + 8 * (t - kNewKeyT0));
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
      bf16* lat = slot_tile(slot);
      // The refill's cache rows, looked up now: the load's latency passes under this tile's math.
      const int64_t refill_row = it + kSlots < n_tiles ? tile_row(it + kSlots) : int64_t{-1};
      const int64_t t0 = k_begin + it * kTileKeys;
      const int n_valid = static_cast<int>(std::min<int64_t>(kTileKeys, k_end - t0));
      mbar_wait(&bar_key[slot], static_cast<uint32_t>((it / kSlots) & 1));
      const int64_t nk = new_key - t0;  // the step's own key, loaded with the q tile (past the span: zeros)
      if (nk >= 0 && nk < kTileKeys && new_loader)
        *reinterpret_cast<uint4*>(lat + nk * kTcStride + 8 * (t - kNewKeyT0)) = new_v;
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
        __syncthreads();  // every thread is done with this slot
        load_tile(it + kSlots, refill_row);
      }
    }
    if (late_o) {  // every slot read: o_proj's rows into slots 2, 3's space (P5 waits for them)
      fence_proxy_async();  // the slots' generic reads before the TMA copies overwrite them
      __syncthreads();
      load_o_rows();
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
  // The folded norm's residual sum, by the last block while it waits (every block read the
  // residual in P1, before B1; delta is read before P5 may overwrite it as `out`).
  grid_sync(a.counter, base + 3ull * G, t == 0, [] { __syncthreads(); }, [&] {
    if (a.residual != nullptr && b == G - 1)
      for (int j = t; j < D / 4; j += kThreads) {
        const float4 h = reinterpret_cast<const float4*>(a.residual)[j];
        const float4 d = __ldcg(reinterpret_cast<const float4*>(a.delta) + j);
        reinterpret_cast<float4*>(a.residual)[j] = make_float4(h.x + d.x, h.y + d.y, h.z + d.z, h.w + d.w);
      }
  });
  mark(8);

  // ---- P4: the splits merged, then W_UV ----
  if (item && !kInv) {
    float* sws = reinterpret_cast<float*>(smem + L.keys);              // [128] split weights
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
      const uint4* wr = reinterpret_cast<const uint4*>(suv + i * L.uv_pitch);
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
  if (item && kInv) {
    // mla_merge_running_kernel's merge: warp 0 gives split s (lane s) its (α, β) from the running
    // max before it (an exclusive scan of the live splits' maxima: a max is exact in any order),
    // then each thread runs L's chain and its 2 channels' over the splits in order.
    float2* sab = reinterpret_cast<float2*>(smem + L.keys);  // [32] (α, β)
    float* sls = reinterpret_cast<float*>(sab + kInvMaxSplits);  // [32] l_s, 0 for an empty split
    bf16* sob = reinterpret_cast<bf16*>(sls + kInvMaxSplits);    // [512] o_lat[h] in bf16
    if (warp == 0) {
      const float2 ml = lane < n_splits ? __ldcg(a.part_ml + lane * kH + ih) : make_float2(-INFINITY, 0.0f);
      const bool live = ml.y > 0.0f;
      float mx = live ? ml.x : -INFINITY;
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, mx, o);
        if (lane >= o) mx = fmaxf(mx, y);
      }
      float m_all = __shfl_up_sync(0xffffffffu, mx, 1);
      if (lane == 0) m_all = -INFINITY;
      if (lane < n_splits) {
        sab[lane] = live ? mla::merge_coefs(m_all, ml.x) : make_float2(0.0f, 0.0f);
        sls[lane] = live ? ml.y : 0.0f;
      }
    }
    __syncthreads();
    float o[2] = {0.0f, 0.0f}, l = 0.0f;
    for (int s0 = 0; s0 < n_splits; s0 += 8) {  // eight splits' loads issued together
      float x[8][2];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int u = 0; u < 2; ++u)
          x[j][u] = s0 + j < n_splits && sls[s0 + j] > 0.0f
                        ? __ldcg(a.part_acc + (int64_t{s0 + j} * kH + ih) * kR + t + u * kThreads)
                        : 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (s0 + j >= n_splits || sls[s0 + j] == 0.0f) continue;
        const float2 ab = sab[s0 + j];
        l = mla::merge_step(sls[s0 + j], ab, l);
#pragma unroll
        for (int u = 0; u < 2; ++u) o[u] = mla::merge_step(x[j][u], ab, o[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) sob[t + u * kThreads] = __float2bfloat16(__fdiv_rn(o[u], l));
    __syncthreads();
    mbar_wait(bar_uv, 0);
    if (warp < kUvRows / 8) {  // mla_apply_tc_kernel's chain over r: rows 8w .. 8w + 7 of the slice
      float y0, y1;
      chain_dot8(smem_u32(suv + (8 * warp + lane % 8) * L.uv_pitch), kR, sob, lane, y0, y1);
      if (lane < 4) {
        float* o_out = a.o + ih * kDv + islice * kUvRows + 8 * warp + 2 * lane;
        o_out[0] = y0;
        o_out[1] = y1;
      }
    }
  }
  mark(9);
  grid_sync(a.counter, base + 4ull * G, t == 0, [] { __syncthreads(); });
  mark(10);

  // ---- P5: out = W_o · bf16(o) ----
  mla::stage_bf16<kThreads>(a.o, kK5, sx, threadIdx.x);
  __syncthreads();
  auto emit5 = [&](int i, float y) { a.out[r5_begin + i] = y; };
  if constexpr (kWg) {
    if (r5_begin < r5_end)
      rows_wgmma(sw, bar_o, sw + L.a5, ssa, sx, static_cast<int>(r5_end - r5_begin), kK5, sc5, emit5);
  } else {
    mbar_wait(bar_o, 0);
    rows_gemv<kInv, kFp8>(sw, L.pair5, sx, static_cast<int>(r5_end - r5_begin), kK5, sc5, emit5);
  }
  mark(11);
#else
  __trap();  // sm_90a only (mla_sublayer_fits)
#endif
}

bool mla_sublayer_fits(int64_t D, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r, int64_t rope_half) {
  if (H != kH || dn != kDn || dr != kDr || dv != kDv || r != kR || rope_half * 2 != kDr) return false;
  if (D <= 0 || D % 256 != 0 || !sm90a_device()) return false;
  const int G = sm_count();
  return G >= kItems && layout(D, G, false, false).total <= static_cast<uint32_t>(kOptinSmem) &&
         layout(D, G, true, false).total <= static_cast<uint32_t>(kOptinSmem) &&
         layout(D, G, false, true).total <= static_cast<uint32_t>(kOptinSmem);
}

void mla_sublayer(const MlaSublayerArgs& a, cudaStream_t s) {
  const int G = sm_count();
  const bool inv = a.split_keys > 0;
  const Layout l = layout(a.D, G, inv, a.fp8);
  DI_CUDA_REQUIRE(l.total <= static_cast<uint32_t>(kOptinSmem));
  DI_CUDA_REQUIRE_MSG(!a.fp8 || (a.s_q != nullptr && a.s_kv != nullptr && a.s_o != nullptr),
                      "mla_sublayer: FP8 weights need their block scales");
  DI_CUDA_REQUIRE_MSG(!a.fp8 || !inv || mla_sublayer_invariant_fp8_fits(a.D),
                      "mla_sublayer: the invariant FP8 form does not fit this D on this GPU");
  DI_CUDA_REQUIRE_MSG(!a.fp8 || inv || mla_sublayer_fp8_fits(a.D),
                      "mla_sublayer: the default FP8 form needs D % 512 == 0 (its scale rows' bulk copies)");
  DI_CUDA_REQUIRE_MSG(!inv || (a.split_keys % kTileKeys == 0 && a.max_splits >= 1 && a.max_splits <= kInvMaxSplits),
                      "mla_sublayer: the invariant split rule needs split_keys % 32 == 0 and 1..32 splits");
  static const bool attr = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_sublayer_kernel<false, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_sublayer_kernel<true, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_sublayer_kernel<false, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_sublayer_kernel<true, true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kOptinSmem));
    return true;
  }();
  (void)attr;
  auto* kernel = inv ? (a.fp8 ? mla_sublayer_kernel<true, true> : mla_sublayer_kernel<true, false>)
                     : (a.fp8 ? mla_sublayer_kernel<false, true> : mla_sublayer_kernel<false, false>);
  WgMaps maps{};
  if (l.wg) {
    const auto u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    maps.q = tensor_map_2d(a.w_q, u8, 1, kQRows, a.D, 128, kWgRows);
    maps.kv = tensor_map_2d(a.w_kv, u8, 1, kWidth, a.D, 128, kWgRows);
    maps.o = tensor_map_2d(a.w_o, u8, 1, a.D, kK5, 128, kWgRows);
  }
  launch_pdl(kernel, dim3(static_cast<unsigned>(G)), dim3(kThreads), l.total, s, a, maps);
}

bool mla_sublayer_invariant_fp8_fits(int64_t D) {
  const int G = sm_count();
  const Layout l = layout(D, G, true, true);
  // Every tile on its own block; A's atoms and the slack its descriptor reads past them inside
  // the allocation.
  return D > 0 && D % 256 == 0 && (kN1 + kWgRows - 1) / kWgRows <= G && D / kWgRows <= G &&
         l.total <= static_cast<uint32_t>(kOptinSmem) &&
         l.a1 + (D / 128) * kWgAtom + kWgSlack + kWgAlign <= l.total &&
         l.a5 + (kK5 / 128) * kWgAtom + kWgSlack + kWgAlign <= l.total;
}

bool mla_sublayer_fp8_fits(int64_t D) { return D > 0 && D % (4 * 128) == 0; }

int64_t mla_sublayer_max_splits() { return kMaxSplits; }

}  // namespace deepinfer::cuda
