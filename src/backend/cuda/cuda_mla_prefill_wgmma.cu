// MLA prefill attention on Hopper's warpgroup MMA (sm_90a), FlashAttention-3 style, for
// DeepSeek's head dims (qk 192 = dn 128 + dr 64, dv 128): the kernel mla_prefill runs there. It
// owns the kernel and its launcher; the argument table, the row-tile order and the softmax's
// helpers are cuda_mla_prefill.cuh's, the mma.sync kernel (every other shape and GPU) is
// cuda_mla_prefill.cu's.
//
// Why: the mma.sync kernel reads every K and V fragment from shared memory by ldmatrix once per
// 32 query rows (20 FLOP/B at 128 B/clk/SM) and ran at ~230 TFLOP/s, 0.29 of the bf16 rate —
// half of a 16K-token V2-Lite prefill (run s14-8). wgmma reads its B operand from shared memory
// once per 64 rows and its A operand (P) from registers; TMA fills the tiles without the math
// warps issuing copies. As FlashAttention-3, each warpgroup issues S_j = Q·K_jᵀ before
// P_{j−1}·V_{j−1} and runs S_j's softmax while that GEMM does, and the two warpgroups take turns
// issuing their GEMM pairs (named barriers), so one's softmax runs under the other's GEMMs.
// Measured (run s15-6, bench/mla_prefill_bench, against bf16 cuBLAS 8192³): 0.63 / 0.84 of that
// rate at V2-Lite's 4K / 16K prefill (mma.sync: 0.31 / 0.33), 0.62 / 0.74 at V3's 128 heads;
// the overlap alone gained nothing (0.76 at 16K), the turns alone lost (s15-2: 0.72), both
// together +9 % over neither (0.77). ptxas keeps the overlap asynchronous only while no register
// an in-flight wgmma reads is written: P is packed into its A fragments after the P·V GEMM
// reading the previous ones has finished (s15-3 wrote them during it: ptxas serialized every
// wgmma, one WARPGROUP.DEPBAR each).
//
// Numerics: the mma.sync kernel's (q, K, V, p rounded to bf16; scores, softmax state, O fp32;
// p = 2^(s·scale·log2 e − m·scale·log2 e) by ex2.approx; a rescale of exactly 1 when a row's max
// is unchanged), with 128-key tiles, so p's maxima — and its bf16 roundings — are those of 128-key
// prefixes. Deterministic, and a row's result depends only on its q row, its key count and the
// K/V bits: key tiles always start at key 0, and a tile past a row's causal limit adds exact
// zeros, so the row tile a row falls in does not change it.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_mla_prefill.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_rope.cuh"
#include "backend/cuda/cuda_sm90.cuh"

#include <cmath>
#include <cstdint>
#include <mutex>

namespace deepinfer::cuda {
namespace {

constexpr int kDn = 128, kDr = 64, kDv = 128, kDqk = kDn + kDr;  // DeepSeek's head dims
constexpr int kBM = 128;         // query rows per block: two math warpgroups of 64
constexpr int kBN = 128;         // keys per K/V tile
constexpr int kStages = 2;       // K tiles and V tiles in shared memory (a ring each)
constexpr int kMathGroups = 2;   // warpgroups issuing wgmma; one more warpgroup loads
constexpr int kThreads = 128 * (kMathGroups + 1);
constexpr int kAtom = 64;        // bf16 per 128-byte swizzle row
// Shared memory (1024-byte aligned; every operand is made of [rows][128 B] swizzle atoms):
//   Q:      [kMathGroups][3 channel blocks][64 rows][128 B]                            49,152
//   K ring: [kStages][3 channel blocks][kBN keys][128 B] (k_nope 0..127 from kv, k_pe from lat)
//                                                                            49,152 per stage
//   V ring: [kStages][2 channel blocks][kBN keys][128 B]                     32,768 per stage
//   full / empty mbarriers of each ring. K and V have rings of their own because a tile's V is
//   read a step after its K (the overlap above): a K stage is refilled once both warpgroups'
//   S GEMMs on it are done, a V stage once their P·V GEMMs are.
constexpr int kQGroupBytes = 64 * kDqk * 2;                       // one warpgroup's Q rows
constexpr int kQBytes = kMathGroups * kQGroupBytes;
constexpr int kKBlockBytes = kBN * 128, kKBytes = (kDqk / kAtom) * kKBlockBytes;
constexpr int kVBlockBytes = kBN * 128, kVBytes = (kDv / kAtom) * kVBlockBytes;
constexpr size_t kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes) + 4 * kStages * sizeof(uint64_t) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "one block per SM");
static_assert(kQGroupBytes % 1024 == 0 && kKBlockBytes % 1024 == 0 && kVBlockBytes % 1024 == 0, "atom alignment");
// Registers after setmaxnreg: the launch reserves 168 per thread (65,536 / 384, rounded down to 8).
constexpr int kLoaderRegs = 24, kMathRegs = 240;
static_assert(kMathGroups * 128 * kMathRegs + 128 * kLoaderRegs <= kThreads * 168, "register budget");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The block's (row tile, head) from its linear index: heads in groups of kHeadGroup (the last
// may be smaller), each group's blocks in the order (row tile, head) — head fastest, a
// sequence's heaviest row tile first — and the groups one after another. The blocks resident at
// once (one per SM) then share each head's K/V tiles among ~132 / 4 row tiles, which the L2
// serves, and each group's lightest tiles fill in behind the next group's heaviest. Run s15-4
// (mla_prefill_bench, groups of 1, 2, 4, 8, 16): 4 was the best or within noise of it at every
// case; all heads fastest (the mma.sync kernel's order) left V3's 128 heads one reader per
// head's tiles (16K tokens: 0.55 of the bf16 rate against 0.69), one head at a time (groups of 1)
// ran V2-Lite's 4K prefill with its heaviest tiles last (0.49 against 0.59).
constexpr int kHeadGroup = 4;
__device__ __forceinline__ void block_coords(int b, int n_tiles, int H, int* tile, int* head) {
  const int h0 = b / (kHeadGroup * n_tiles) * kHeadGroup;
  const int heads = min(kHeadGroup, H - h0), r = b - h0 * n_tiles;
  *tile = r / heads;
  *head = h0 + r % heads;
}

// The two rings' barriers: K stages full / empty, V stages full / empty ([kStages] each).
struct Rings {
  uint64_t *k_full, *k_empty, *v_full, *v_empty;
};
// The loader (one thread): for each key tile j of the block, K into K stage j % kStages once both
// math warpgroups have released it — channel blocks 0, 1 (k_nope_h, kv columns h·256 + 0, 64) and
// 2 (k_pe, lat columns r ..) — then V into V stage j % kStages likewise (kv columns h·256 + 128,
// 192), 128 key rows each from key_row0 + 128·j. Rows past n_keys are zero-filled by TMA; rows
// past the sequence's keys but inside the buffer (the next sequence's) are finite and masked by
// the consumers.
__device__ __forceinline__ void load_kv_tiles(const CUtensorMap* map_kv, const CUtensorMap* map_lat, uint8_t* k_ring,
                                              uint8_t* v_ring, const Rings& rg, int h, int r, int key_row0,
                                              int n_tiles) {
  const int32_t x_head = h * (kDn + kDv);
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j % kStages;
    const uint32_t parity = ((j / kStages) & 1u) ^ 1u;
    const int32_t y = key_row0 + j * kBN;
    uint8_t* k = k_ring + s * kKBytes;
    mbar_wait(&rg.k_empty[s], parity);
    mbar_arrive_expect_tx(&rg.k_full[s], kKBytes);
    tma_load_2d(k, map_kv, x_head, y, &rg.k_full[s]);
    tma_load_2d(k + kKBlockBytes, map_kv, x_head + kAtom, y, &rg.k_full[s]);
    tma_load_2d(k + 2 * kKBlockBytes, map_lat, r, y, &rg.k_full[s]);
    uint8_t* v = v_ring + s * kVBytes;
    mbar_wait(&rg.v_empty[s], parity);
    mbar_arrive_expect_tx(&rg.v_full[s], kVBytes);
    tma_load_2d(v, map_kv, x_head + kDn, y, &rg.v_full[s]);
    tma_load_2d(v + kVBlockBytes, map_kv, x_head + kDn + kAtom, y, &rg.v_full[s]);
  }
}

// S[64 rows][128 keys] = Q·Kᵀ of the warpgroup's rows (dq) and a K stage (dk), issued and
// committed (no wait): 3 channel blocks × 4 k16 steps, both operands K-major in shared memory
// (+32 bytes per k16 step; Q's blocks 8 KB apart, K's 16 KB).
__device__ __forceinline__ void issue_scores(float (&sc)[64], uint64_t dq, uint64_t dk) {
  wgmma_fence();
#pragma unroll
  for (int cb = 0; cb < kDqk / kAtom; ++cb)
#pragma unroll
    for (int k = 0; k < kAtom / 16; ++k)
      wgmma_m64n128k16_bf16(sc, dq + cb * (64 * 128 / 16) + 2 * k, dk + cb * (kKBlockBytes / 16) + 2 * k, cb + k > 0);
  wgmma_commit();
}
// O[64 rows][128 channels] += P·V, P from registers (pa[k]: keys 16k .. 16k + 15), a V stage as
// an MN-major B (k16 step: 16 key rows = 2048 bytes), issued and committed. P's registers must
// not be written until the GEMM has finished (wgmma reads them asynchronously).
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[kBN / 16][4], const uint8_t* v) {
  const uint64_t dv = sw128_desc_mn(v, kVBlockBytes);
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(o[i]);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kBN / 16; ++k) wgmma_m64n128k16_bf16_rs(o, pa[k], dv + k * (16 * 128 / 16), 1);
  wgmma_commit();
}

// One row pair's online-softmax state (rows g and g + 8 of the thread's warp, as the wgmma
// accumulators lay them out): running max m, the thread's share of the row sums l (its 32
// columns of each tile; the row's 4 lanes are summed at the end).
struct SoftmaxRows {
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
};
// The softmax of a finished S tile (keys key0 ..), in place: keys past a row's limit masked
// (only when `mask`), the running max updated over the row's 4 lanes, sc = p = 2^(s·sl2 − m·sl2)
// rounded to bf16 (pack_p then packs them exactly), l = l·corr + Σ rounded p. Returns O's
// rescale factors (corr_lo, corr_hi) for the caller to apply before this tile's P·V: exactly 1
// when a row's max is unchanged (a tile past a row's limit then adds exact zeros), and a row with
// no visible key yet subtracts 0 (never −inf − −inf).
__device__ __forceinline__ float2 softmax_tile(float (&sc)[64], SoftmaxRows& st, bool mask, int key0, int lim_lo,
                                               int lim_hi, int qd, float sl2) {
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(sc[i]);
  if (mask) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int key = key0 + 8 * (i / 4) + 2 * qd + (i & 1);
      if (key > ((i & 2) ? lim_hi : lim_lo)) sc[i] = -INFINITY;
    }
  }
  float mx_lo = st.m_lo, mx_hi = st.m_hi;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    mx_lo = fmaxf(mx_lo, fmaxf(sc[4 * n], sc[4 * n + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(sc[4 * n + 2], sc[4 * n + 3]));
  }
  const MaxStep step = quad_max_step(mx_lo, mx_hi, st.m_lo, st.m_hi, sl2);
  const float ms_lo = step.ms_lo, ms_hi = step.ms_hi, corr_lo = step.corr_lo, corr_hi = step.corr_hi;
  st.m_lo = mx_lo;
  st.m_hi = mx_hi;
  float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    float2 flo, fhi;
    exp2_pack(sc[4 * n], sc[4 * n + 1], sl2, ms_lo, ps_lo, flo);
    exp2_pack(sc[4 * n + 2], sc[4 * n + 3], sl2, ms_hi, ps_hi, fhi);
    sc[4 * n] = flo.x, sc[4 * n + 1] = flo.y, sc[4 * n + 2] = fhi.x, sc[4 * n + 3] = fhi.y;
  }
  st.l_lo = st.l_lo * corr_lo + ps_lo;
  st.l_hi = st.l_hi * corr_hi + ps_hi;
  return make_float2(corr_lo, corr_hi);
}
// P's A fragments from a tile softmax_tile left in sc: accumulator columns 16k .. 16k + 15 are
// k-step k's fragment (a[0], a[1]: rows g, g + 8 of columns 2qd, +1; a[2], a[3]: of 8 + 2qd, +1).
__device__ __forceinline__ void pack_p(const float (&sc)[64], uint32_t (&pa)[kBN / 16][4]) {
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    pa[n / 2][2 * (n % 2)] = pack_bf16x2(sc[4 * n], sc[4 * n + 1]);
    pa[n / 2][2 * (n % 2) + 1] = pack_bf16x2(sc[4 * n + 2], sc[4 * n + 3]);
  }
}
__device__ __forceinline__ void rescale(float (&o)[64], float2 corr) {
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] *= (i & 2) ? corr.y : corr.x;
}
// Arrives on named barrier `id` without waiting (the other side of a bar.sync by other warps).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
#endif

// Causal attention for one (sequence, head, 128-row query tile). 1-D grid of Σ row tiles × H
// blocks (block_coords). 384 threads: warpgroups 0 and 1 own query rows i0 + 64·wg .. +63
// (thread t of a warpgroup — warp w, lane l — rows 16w + l/4 and +8 of them, as every wgmma
// accumulator lays them out); warp 8 loads (load_kv_tiles), the rest of warpgroup 2 exits after
// giving its registers back.
// A math warpgroup: its Q rows → bf16 in shared memory (q_pe rotated first where p.q_rope gives
// the rows' tables; rows ≥ q_len zero; written in the 128-byte swizzle TMA would use, then fenced
// for the async proxy), then every key tile j of the
// block (the tiles up to its last row's causal limit; both warpgroups take all of them, so their
// turns pair up — a tile past all of a warpgroup's rows adds exact zeros): S_0 and its softmax;
// then per j ≥ 1, in its turn (named barrier kTurn + wg, handed to the other warpgroup after):
// issue S_j = Q·K_jᵀ (issue_scores), rescale O for P_{j−1}'s max, issue O += P_{j−1}·V_{j−1}
// (issue_pv); out of turn: wait for S_j (release K_j), its softmax (softmax_tile; masked only on
// tiles reaching past the warpgroup's first row's limit), wait for P_{j−1}·V_{j−1} (release
// V_{j−1}), pack P_j (pack_p); finally the last P·V. The same operations on O in the same order
// as one tile at a time. Releases are one arrival per warp. Finally O / l (l summed over the
// row's 4 lanes) for rows < q_len: as fp32 into out, or (p.out_q) as o_proj's W8A8 input — the
// head's 128 values of a row are one 1×128 quantization group, held by the row's 4 lanes: the
// values rounded to bf16, the group's |·| maximum over the quad, its scale and the codes, every
// step quantize_fp8_rows_bf16's own (cuda_fp8_quant.cuh) on the fp32 values out would hold, so the
// same bits without out's round trip (docs/perf.md version 38) — or (p.out_b) rounded to bf16.
// Preconditions (mla_prefill_wgmma): sm_90a, the DeepSeek dims, kv / lat as TMA maps of their
// n_keys rows, q (and q_rope) 16-byte aligned, out 8-byte aligned, q_len ≥ 1, kv_len ≥ q_len.
__global__ void __launch_bounds__(kThreads, 1)
    mla_prefill_wgmma_kernel(const __grid_constant__ CUtensorMap map_kv, const __grid_constant__ CUtensorMap map_lat,
                             const __grid_constant__ PrefillParams p, int n_row_tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t pw_smem_raw[];
  uint8_t* smem = pw_smem_raw + ((1024 - smem_u32(pw_smem_raw) % 1024) % 1024);
  uint8_t* sq = smem;                                                  // [kMathGroups][3][64][128 B]
  uint8_t* k_ring = smem + kQBytes;                                    // [kStages][3][kBN][128 B]
  uint8_t* v_ring = k_ring + kStages * kKBytes;                        // [kStages][2][kBN][128 B]
  auto* bars = reinterpret_cast<uint64_t*>(v_ring + kStages * kVBytes);  // [4][kStages]
  const Rings rg{bars, bars + kStages, bars + 2 * kStages, bars + 3 * kStages};

  // wg through a shuffle from lane 0: warp-uniform to ptxas, so the descriptors stay in the
  // uniform datapath (cuda_fp8_wgmma.cu's compute_tiles; docs/perf.md version 21).
  const int t = threadIdx.x, wg = __shfl_sync(0xffffffffu, t / 128, 0), warp = t / 32, lane = t % 32;
  if (t == 0) {  // one release per math warp
    init_ring(rg.k_full, rg.k_empty, kStages, 1, kMathGroups * 4);
    init_ring(rg.v_full, rg.v_empty, kStages, 1, kMathGroups * 4);
  }
  __syncthreads();

  int tile, h;
  block_coords(static_cast<int>(blockIdx.x), n_row_tiles, p.H, &tile, &h);
  const RowTile rt = row_tile(p, tile, kBM);
  const int q_len = rt.seq.q_len, kv_len = rt.seq.kv_len, i0 = rt.i0;
  const int first_pos = kv_len - q_len;  // row i's last visible key is first_pos + i
  const int n_tiles = (first_pos + min(i0 + kBM, q_len) - 1) / kBN + 1;

  if (wg == kMathGroups) {
    setmaxnreg_dec<kLoaderRegs>();
    if (warp == kMathGroups * 4 && lane == 0)
      load_kv_tiles(&map_kv, &map_lat, k_ring, v_ring, rg, h, p.r, rt.seq.key_row0, n_tiles);
    return;
  }
  setmaxnreg_inc<kMathRegs>();

  // This warpgroup's Q rows → bf16, 16-byte chunk c (channels 8c ..) of row rr at channel block
  // c / 8, chunk (c % 8) ^ (rr % 8). Every load is issued before the first store: in one loop of
  // load, convert, store, each store may alias the next iteration's loads, so each chunk waited
  // for its own L2 round trip — run s39-5 (Nsight Compute's stall sampling inside the V2-Lite
  // FP8 4K prefill) put 12.8 % of the kernel's warp samples on the first conversion's wait.
  // A thread's chunks: q_nope's (16 a row) e = tw + 128·i, row e / 16, chunk e % 16; then q_pe's
  // (8 a row) e = tw + 128·j, row e / 8, chunk 16 + e % 8 — always chunk 16 + tw % 8, pairs
  // 4·(tw % 8) .. +3 of its row. With p.q_rope those four pairs are rotated by the row's table
  // entries (two float4 loads beside the row's) before rounding: rope_from_table's arithmetic.
  const int tw = t % 128;
  const int w_row0 = i0 + 64 * wg;  // the warpgroup's first query row
  uint8_t* sqw = sq + wg * kQGroupBytes;
  {
    constexpr int kNopeChunks = 64 * (kDn / 8) / 128, kPeChunks = 64 * (kDr / 8) / 128;  // per thread: 8, 4
    constexpr int kChunks = kNopeChunks + kPeChunks;
    static_assert(64 * (kDn / 8) % 128 == 0 && 64 * (kDr / 8) % 128 == 0,
                  "a warpgroup's Q chunks split evenly over its threads");
    auto chunk = [tw](int i, int& rr, int& c) {
      const int e = tw + 128 * (i < kNopeChunks ? i : i - kNopeChunks);
      rr = i < kNopeChunks ? e / (kDn / 8) : e / (kDr / 8);
      c = i < kNopeChunks ? e % (kDn / 8) : kDn / 8 + e % (kDr / 8);
    };
    const int64_t q_ld = static_cast<int64_t>(p.H) * kDqk;
    const int64_t row0 = static_cast<int64_t>(rt.seq.q_row0) + w_row0;  // q's row of the warpgroup's first
    const float* qh = p.q + row0 * q_ld + static_cast<int64_t>(h) * kDqk;
    const bool rope = p.q_rope != nullptr;
    float4 a[kChunks], b[kChunks], rc[kPeChunks], rs[kPeChunks];
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      int rr, c;
      chunk(i, rr, c);
      a[i] = b[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (w_row0 + rr < q_len) {
        a[i] = __ldg(reinterpret_cast<const float4*>(qh + rr * q_ld + 8 * c));
        b[i] = __ldg(reinterpret_cast<const float4*>(qh + rr * q_ld + 8 * c + 4));
      }
    }
#pragma unroll
    for (int j = 0; j < kPeChunks; ++j) {
      int rr, c;
      chunk(kNopeChunks + j, rr, c);
      rc[j] = rs[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (rope && w_row0 + rr < q_len) {
        const float* cs = p.q_rope + (row0 + rr) * kDr + 4 * (c - kDn / 8);
        rc[j] = __ldg(reinterpret_cast<const float4*>(cs));
        rs[j] = __ldg(reinterpret_cast<const float4*>(cs + kDr / 2));
      }
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      int rr, c;
      chunk(i, rr, c);
      if (rope && i >= kNopeChunks) {
        const int j = i - kNopeChunks;
        rotate_cs(rc[j].x, rs[j].x, a[i].x, a[i].y, a[i].x, a[i].y);
        rotate_cs(rc[j].y, rs[j].y, a[i].z, a[i].w, a[i].z, a[i].w);
        rotate_cs(rc[j].z, rs[j].z, b[i].x, b[i].y, b[i].x, b[i].y);
        rotate_cs(rc[j].w, rs[j].w, b[i].z, b[i].w, b[i].z, b[i].w);
      }
      *reinterpret_cast<uint4*>(sqw + (c / 8) * (64 * 128) + rr * 128 + (((c % 8) ^ (rr % 8)) * 16)) =
          make_uint4(pack_bf16x2(a[i].x, a[i].y), pack_bf16x2(a[i].z, a[i].w), pack_bf16x2(b[i].x, b[i].y),
                     pack_bf16x2(b[i].z, b[i].w));
    }
  }
  fence_proxy_async();           // the generic-proxy writes, visible to wgmma's reads
  named_barrier(1 + wg, 128);    // ... by every warp of the warpgroup

  const int g = lane / 4, qd = lane % 4;
  const float sl2 = p.scale_log2;
  const int row_lo = w_row0 + 16 * (warp % 4) + g;
  // Last visible key of rows g and g + 8 (rows past q_len: the last key, so nothing is NaN).
  const int lim_lo = min(first_pos + row_lo, kv_len - 1), lim_hi = min(first_pos + row_lo + 8, kv_len - 1);
  const int w_first_lim = first_pos + w_row0;  // the warpgroup's first row's limit
  SoftmaxRows st;
  float o[64];  // O [64 rows][128 channels]: o[4d + v] = row g + 8·(v / 2), channel 8d + 2qd + v % 2
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  const uint64_t dq = sw128_desc(sqw);

  auto phase = [](int j) { return static_cast<uint32_t>((j / kStages) & 1); };
  auto release = [&](uint64_t* empty, int j) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[j % kStages]);
  };
  auto masked = [&](int j) { return j * kBN + kBN - 1 > w_first_lim; };  // reaches past some row's limit
  constexpr int kTurn = 3;  // named barriers 3 (warpgroup 0's turn) and 4 (1's); 1, 2: the Q fences
  if (wg == 1) named_barrier_arrive(kTurn, 256);  // warpgroup 0 goes first

  float sc[64];  // S_j [64 rows][128 keys], then P_j: sc[4n + v] = row g + 8·(v / 2), key 8n + 2qd + v % 2
  uint32_t pa[kBN / 16][4];  // P_{j−1} as A fragments while P_{j−1}·V_{j−1} is issued
  mbar_wait(&rg.k_full[0], 0);
  issue_scores(sc, dq, sw128_desc(k_ring));
  wgmma_wait<0>();
  release(rg.k_empty, 0);
  // Every row sees key 0, so tile 0's max is finite and its corr is 0: O stays 0.
  float2 corr = softmax_tile(sc, st, masked(0), 0, lim_lo, lim_hi, qd, sl2);
  pack_p(sc, pa);
  for (int j = 1; j < n_tiles; ++j) {
    named_barrier(kTurn + wg, 256);
    mbar_wait(&rg.k_full[j % kStages], phase(j));
    issue_scores(sc, dq, sw128_desc(k_ring + (j % kStages) * kKBytes));
    rescale(o, corr);
    mbar_wait(&rg.v_full[(j - 1) % kStages], phase(j - 1));
    issue_pv(o, pa, v_ring + ((j - 1) % kStages) * kVBytes);
    named_barrier_arrive(kTurn + 1 - wg, 256);
    wgmma_wait<1>();  // S_j done; P_{j−1}·V_{j−1} may still run
    release(rg.k_empty, j);
    corr = softmax_tile(sc, st, masked(j), j * kBN, lim_lo, lim_hi, qd, sl2);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_operand(o[i]);
    release(rg.v_empty, j - 1);
    pack_p(sc, pa);
  }
  rescale(o, corr);
  mbar_wait(&rg.v_full[(n_tiles - 1) % kStages], phase(n_tiles - 1));
  issue_pv(o, pa, v_ring + ((n_tiles - 1) % kStages) * kVBytes);
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_operand(o[i]);
  release(rg.v_empty, n_tiles - 1);
  if (wg == 0) named_barrier(kTurn, 256);  // warpgroup 1's last hand-over

  float ll = st.l_lo, lh = st.l_hi;
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    ll += __shfl_xor_sync(0xffffffffu, ll, x);
    lh += __shfl_xor_sync(0xffffffffu, lh, x);
  }
  // l ≥ the bf16 of e^0 = 1 (the row's max key), so the division is safe for real rows.
  const float inv_lo = ll > 0.0f ? 1.0f / ll : 0.0f, inv_hi = lh > 0.0f ? 1.0f / lh : 0.0f;
  const int64_t o_ld = static_cast<int64_t>(p.H) * kDv;
  const int64_t o_off = static_cast<int64_t>(rt.seq.q_row0) * o_ld + static_cast<int64_t>(h) * kDv;
  const bool st_lo = row_lo < q_len, st_hi = row_lo + 8 < q_len;
  if (p.out_q != nullptr) {
    float amax_lo = 0.0f, amax_hi = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      o[i] = __bfloat162float(__float2bfloat16(o[i] * ((i & 2) ? inv_hi : inv_lo)));
      if (i & 2) amax_hi = fmaxf(amax_hi, fabsf(o[i]));
      else amax_lo = fmaxf(amax_lo, fabsf(o[i]));
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      amax_lo = fmaxf(amax_lo, __shfl_xor_sync(0xffffffffu, amax_lo, x));
      amax_hi = fmaxf(amax_hi, __shfl_xor_sync(0xffffffffu, amax_hi, x));
    }
    const float s_lo = fp8_group_scale(amax_lo), s_hi = fp8_group_scale(amax_hi);
    const float r_lo = fp8_scale_inverse(s_lo), r_hi = fp8_scale_inverse(s_hi);
    uint8_t* q_lo = p.out_q + o_off + row_lo * o_ld + 2 * qd;
#pragma unroll
    for (int d = 0; d < 16; ++d) {
      if (st_lo) *reinterpret_cast<__nv_fp8x2_storage_t*>(q_lo + 8 * d) = fp8_codes2(o[4 * d], o[4 * d + 1], s_lo, r_lo);
      if (st_hi)
        *reinterpret_cast<__nv_fp8x2_storage_t*>(q_lo + 8 * o_ld + 8 * d) =
            fp8_codes2(o[4 * d + 2], o[4 * d + 3], s_hi, r_hi);
    }
    if (qd == 0) {  // scales [T, H]: group h of the row
      float* qs = p.out_qs + (static_cast<int64_t>(rt.seq.q_row0) + row_lo) * p.H + h;
      if (st_lo) qs[0] = s_lo;
      if (st_hi) qs[8 * p.H] = s_hi;
    }
  } else if (p.out_b != nullptr) {
    bf16* b_lo = p.out_b + o_off + row_lo * o_ld + 2 * qd;
#pragma unroll
    for (int d = 0; d < 16; ++d) {
      if (st_lo) *reinterpret_cast<uint32_t*>(b_lo + 8 * d) = pack_bf16x2(o[4 * d] * inv_lo, o[4 * d + 1] * inv_lo);
      if (st_hi)
        *reinterpret_cast<uint32_t*>(b_lo + 8 * o_ld + 8 * d) = pack_bf16x2(o[4 * d + 2] * inv_hi, o[4 * d + 3] * inv_hi);
    }
  } else {
    float* out_h = p.out + o_off;
#pragma unroll
    for (int d = 0; d < 16; ++d) {
      const int c = 8 * d + 2 * qd;
      if (st_lo)
        *reinterpret_cast<float2*>(out_h + row_lo * o_ld + c) = make_float2(o[4 * d] * inv_lo, o[4 * d + 1] * inv_lo);
      if (st_hi)
        *reinterpret_cast<float2*>(out_h + (row_lo + 8) * o_ld + c) =
            make_float2(o[4 * d + 2] * inv_hi, o[4 * d + 3] * inv_hi);
    }
  }
#else
  (void)p;
  (void)n_row_tiles;
  __trap();  // built for another architecture: mla_prefill_wgmma_ok() is false there
#endif
}

}  // namespace

bool mla_prefill_wgmma_ok(int64_t dn, int64_t dr, int64_t dv, int64_t r) {
  return dn == kDn && dr == kDr && dv == kDv && r > 0 && r % 8 == 0 && sm90a_device();
}

void mla_prefill_wgmma(const MlaPrefillArgs& a, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(mla_prefill_wgmma_ok(a.dn, a.dr, a.dv, a.r),
                      "MLA prefill (wgmma): needs an sm_90 GPU and dn 128, dr 64, dv 128");
  DI_CUDA_REQUIRE(a.H > 0 && a.H <= 65535 && a.n_keys >= 0 && a.ld_lat >= a.r + a.dr && a.ld_lat % 8 == 0);
  const bool rows = a.out_q != nullptr || a.out_b != nullptr;
  DI_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && (rows || reinterpret_cast<uintptr_t>(a.out) % 8 == 0));
  DI_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(a.q_rope) % 16 == 0);
  DI_CUDA_REQUIRE_MSG(a.out_q == nullptr || (a.out_b == nullptr && a.out_qs != nullptr &&
                                             reinterpret_cast<uintptr_t>(a.out_q) % 2 == 0),
                      "MLA prefill (wgmma): o_proj's codes need their scales, 2-byte aligned, and no bf16 rows");
  DI_CUDA_REQUIRE(a.out_b == nullptr || reinterpret_cast<uintptr_t>(a.out_b) % 4 == 0);
  PrefillParams pp;
  const int64_t n_tiles = prefill_params(a, kBM, &pp);
  if (n_tiles == 0) return;
  // kv [n_keys, H·256] and lat [n_keys, r + dr] (rows ld_lat apart) in boxes of 128 key rows ×
  // 64 channels; rows past n_keys read zeros.
  const CUtensorMap map_kv =
      tensor_map_2d(a.kv, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.n_keys, a.H * (kDn + kDv), kAtom, kBN);
  const CUtensorMap map_lat = tensor_map_2d_strided(a.lat, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a.n_keys,
                                                    a.r + a.dr, a.ld_lat, kAtom, kBN);
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_prefill_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmemBytes)));
  });
  const int64_t n_blocks = n_tiles * a.H;
  DI_CUDA_REQUIRE(n_blocks <= INT32_MAX);
  mla_prefill_wgmma_kernel<<<static_cast<unsigned>(n_blocks), kThreads, kSmemBytes, s>>>(map_kv, map_lat, pp,
                                                                                        static_cast<int>(n_tiles));
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
