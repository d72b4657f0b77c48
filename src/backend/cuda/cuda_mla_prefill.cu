// MLA prefill attention (the naive form's attention step) on tensor cores: FlashAttention-2 over
// the per-head keys [k_nope_h | k_pe] and values v_h of the selected sequences, causal with each
// sequence's cached prefix, one launch for up to kMlaPrefillMaxSeqs sequences. It owns only the
// attention kernel and its launcher: gathering the paged latents, the kv_b decompression (one
// cuBLAS GEMM, bf16 out) and the TF32 fallback for shapes this kernel does not take stay in
// CudaBackend::mla_attention (cuda_backend.cpp).
//
// Numerics (FlashAttention's): q, K, V and the probabilities rounded to bf16, scores, softmax
// state and the output accumulators fp32; 1e-2 relative L2 per row of the fp32 reference (the
// error budget is in tests/backend/cuda_mla_prefill_test.cpp). Deterministic (no atomics, fixed
// key-tile order from key 0), and a row's result depends only on its own q row, its key count and
// the K/V bits: key tiles past a row's causal limit add exact zeros, so the row tile (chunk) a row
// falls in does not change it.
// Cost (V2-Lite, 4096-token prefill, dqk 192, dv 128): 87 GFLOP per layer incl. the diagonal
// tiles. With 16 rows per warp each warp re-reads the whole 64-key K and V tiles from shared
// memory by ldmatrix (40 KB per 655 KFLOP = 16 FLOP/B), which caps it near 390 TFLOP/s at
// 128 B/clk/SM. So the DeepSeek instance gives each warp 32 rows (two m16 tiles sharing every K
// and V fragment), 128-row blocks, as FlashAttention-2 does for head dim 128; Q's fragments are
// then read from shared memory per k-step and the key tiles are 32 wide, so that S and P fit in
// registers beside O (255 registers, no spills): 32 KB per 655 KFLOP = 20 FLOP/B.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_mla_prefill.cuh"
#include "backend/cuda/cuda_ptx.cuh"

#include <cmath>

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kStages = 2;     // K/V tiles in shared memory: the one computed on, the one loading

// Shared-memory geometry of the <DQK, DV, MT> instance (MT m16 tiles per warp: 16·MT query rows
// per warp, 64·MT per block). Rows are padded by 8 bf16 (16 bytes), so a row stride is an odd
// number of 16-byte units and the 8 row addresses of one ldmatrix matrix fall in 8 distinct bank
// groups (conflict-free).
template <int DQK, int DV, int MT>
struct PrefillShape {
  static_assert(DQK % 32 == 0, "scores take 32 qk channels per ldmatrix_x4 of K");
  static_assert(DV % 16 == 0, "P·V takes 16 value channels per ldmatrix_x4_trans");
  static_assert(MT == 1 || MT == 2, "one or two m16 tiles per warp");
  static constexpr int kRows = 64 * MT;      // query rows per block
  static constexpr int kKeys = 64 / MT;      // keys per K/V tile (MT = 2: 32, so S and P fit beside O)
  static constexpr int kQkStride = DQK + 8;  // bf16 per K (and Q) row
  static constexpr int kVStride = DV + 8;    // bf16 per V row
  static constexpr int kKTile = kKeys * kQkStride;
  static constexpr int kVTile = kKeys * kVStride;
  // K ring [2][kKeys][DQK + 8], V ring [2][kKeys][DV + 8] bf16; Q [kRows][DQK + 8] bf16: MT = 1 aliases
  // K stage 1 (its fragments move to registers before tile 1 loads), MT = 2 has its own.
  static constexpr size_t kSmemBytes =
      sizeof(bf16) * (kStages * (kKTile + kVTile) + (MT == 1 ? 0 : static_cast<size_t>(kRows) * kQkStride));
  static_assert((kQkStride / 8) % 2 == 1 && (kVStride / 8) % 2 == 1, "odd 16-byte row strides");
  static_assert(kKeys * (DQK / 8) % kThreads == 0 && kKeys * (DV / 8) % kThreads == 0, "whole chunks per thread");
};

// Causal attention for one (sequence, head, 64·MT-row query tile), FlashAttention-2 style.
// Grid (H, Σ row tiles): blockIdx.x = head h (fastest: a row tile's heads run together, so the
// shared k_pe rows and the key rows of kv, whose heads are adjacent, are read from L2 once),
// blockIdx.y = row tile, numbered per sequence from its LAST (most keys) tile first, so the
// heaviest blocks start in the first wave. 128 threads: warp w owns query rows
// i0 + 16·MT·w .. +16·MT − 1 of the tile as MT m16 tiles; lane l holds, in every m16n8
// accumulator, rows g = l/4 and g + 8 of its m-tile and columns 2(l%4), +1.
// Per key tile j = 0 .. (the tile's last row's causal limit)/kKeys (64 keys, or 32 at MT = 2):
//   load:    cp.async 16-byte chunks of K rows [k_nope_h (from kv) | k_pe (from lat) | zeros to
//            DQK] and V rows [v_h | zeros to DV] into stage j % 2, issued one tile ahead; keys
//            ≥ kv_len are zero-filled (and masked);
//   scores:  S[16·MT rows][kKeys keys] per warp = Q·Kᵀ by m16n8k16 MMAs, Q's A fragments held in
//            registers for the whole block (MT = 1) or read by ldmatrix per k-step (MT = 2), K's B
//            fragments by ldmatrix (K rows are key-major, channel-contiguous = the "col" operand),
//            each used by the MT m-tiles;
//   softmax: per row, the running max m (raw score units) and a per-thread partial row sum l;
//            p = 2^(s·scale_log2 − m·scale_log2), rounded to bf16 and packed straight into the
//            A fragments of P (an m16n8 accumulator pair is an m16k16 A fragment); l adds the
//            rounded p (exactly the weights P·V applies), so Σ weights / l = 1 up to fp32;
//   P·V:     O[16·MT][DV] += P·V, V's B fragments by ldmatrix.trans (V rows are key-major).
// The causal mask (key > kv_len − q_len + row, or key ≥ kv_len) is applied only on tiles that
// reach past the tile's first row's limit. Finally O / l (l reduced over the 4 lanes of a row)
// is written as fp32 for rows < q_len and channels < dv.
// Shared (dynamic): PrefillShape<DQK, DV, MT>::kSmemBytes: 64/64/1 36,864 bytes (64-key tiles, Q
// staged in K stage 1 before tile 1's copies are issued); DeepSeek's 192/128/2 94,208 bytes
// (32-key tiles, Q [128][200] bf16 of its own); two blocks per SM either way.
// Preconditions (mla_prefill checks them): dn, dr, dv, r multiples of 8, dn + dr ≤ DQK, dv ≤ DV,
// kv / lat / q / out rows as documented in MlaPrefillArgs with 16-byte aligned bases, q_len ≥ 1,
// kv_len ≥ q_len, softmax scale > 0.
template <int DQK, int DV, int MT>
__global__ void __launch_bounds__(kThreads, 2) mla_prefill_kernel(const __grid_constant__ PrefillParams p) {
  using Shape = PrefillShape<DQK, DV, MT>;
  constexpr int kQkStride = Shape::kQkStride, kVStride = Shape::kVStride, kRows = Shape::kRows, kKeys = Shape::kKeys;
  extern __shared__ __align__(16) unsigned char prefill_smem[];
  bf16* sk = reinterpret_cast<bf16*>(prefill_smem);  // [2][64][kQkStride] K ring
  bf16* sv = sk + kStages * Shape::kKTile;            // [2][64][kVStride] V ring
  bf16* sq = MT == 1 ? sk + Shape::kKTile : sv + kStages * Shape::kVTile;  // [kRows][kQkStride] Q

  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int h = blockIdx.x;
  const RowTile rt = row_tile(p, blockIdx.y, kRows);
  const MlaPrefillSeq sq_info = rt.seq;
  const int q_len = sq_info.q_len, kv_len = sq_info.kv_len, i0 = rt.i0;
  const int first_pos = kv_len - q_len;  // row i's last visible key is first_pos + i
  const int last_key = first_pos + min(i0 + kRows, q_len) - 1;
  const int n_tiles = last_key / kKeys + 1;
  const int dn = p.dn, dqk = p.dn + p.dr, dv = p.dv;
  const int64_t kv_ld = static_cast<int64_t>(p.H) * (dn + dv);
  const bf16* kv_head = p.kv + static_cast<int64_t>(sq_info.key_row0) * kv_ld + static_cast<int64_t>(h) * (dn + dv);
  const bf16* lat_pe = p.lat + static_cast<int64_t>(sq_info.key_row0) * p.ld_lat + p.r;

  // K/V tile `j` into stage j % 2: one 16-byte chunk per (key, 8 channels), keys ≥ kv_len and
  // channels past the real dims zero-filled (cp.async with src-size 0 reads nothing).
  auto load_kv = [&](int j) {
    bf16* dk = sk + (j % kStages) * Shape::kKTile;
    bf16* dvs = sv + (j % kStages) * Shape::kVTile;
    const int key0 = j * kKeys;
    constexpr int kKChunks = DQK / 8, kVChunks = DV / 8;
#pragma unroll
    for (int x = 0; x < kKeys * kKChunks / kThreads; ++x) {
      const int e = t + x * kThreads, k = e / kKChunks, c = 8 * (e % kKChunks), key = key0 + k;
      const bool in = key < kv_len;
      const bf16* src = p.kv;
      bool valid = false;
      if (in && c < dn) {
        src = kv_head + static_cast<int64_t>(key) * kv_ld + c;
        valid = true;
      } else if (in && c < dqk) {
        src = lat_pe + static_cast<int64_t>(key) * p.ld_lat + (c - dn);
        valid = true;
      }
      cp_async16(smem_u32(dk + k * kQkStride + c), src, valid);
    }
#pragma unroll
    for (int x = 0; x < kKeys * kVChunks / kThreads; ++x) {
      const int e = t + x * kThreads, k = e / kVChunks, c = 8 * (e % kVChunks), key = key0 + k;
      const bool valid = key < kv_len && c < dv;
      const bf16* src = valid ? kv_head + static_cast<int64_t>(key) * kv_ld + dn + c : p.kv;
      cp_async16(smem_u32(dvs + k * kVStride + c), src, valid);
    }
    cp_async_commit();
  };
  load_kv(0);

  // Q tile → bf16 in shared memory (rows ≥ q_len and channels ≥ dn + dr as zeros); MT = 1 then
  // moves each warp's 16 rows into A fragments: qf[k] covers channels 16k .. 16k + 15.
  {
    const int64_t q_ld = static_cast<int64_t>(p.H) * dqk;
    const float* qh = p.q + static_cast<int64_t>(sq_info.q_row0 + i0) * q_ld + static_cast<int64_t>(h) * dqk;
    for (int e = t; e < kRows * (DQK / 4); e += kThreads) {
      const int row = e / (DQK / 4), c = 4 * (e % (DQK / 4));
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i0 + row < q_len && c < dqk) v = *reinterpret_cast<const float4*>(qh + row * q_ld + c);
      *reinterpret_cast<uint2*>(sq + row * kQkStride + c) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
  }
  __syncthreads();
  uint32_t qf[MT == 1 ? DQK / 16 : 1][4];  // MT = 1: [k-step][a0..a3] Q fragments of rows 16·warp .. +15
  if constexpr (MT == 1) {
#pragma unroll
    for (int k = 0; k < DQK / 16; ++k)
      ldmatrix_x4<true>(qf[k], smem_u32(sq + (16 * warp + lane % 16) * kQkStride + 16 * k + 8 * (lane / 16)));
  }
  // MT = 2: this lane's ldmatrix row address of m-tile 0 (m-tile 1: 16 rows further).
  const uint32_t q_addr = smem_u32(sq + (16 * MT * warp + lane % 16) * kQkStride + 8 * (lane / 16));

  const int g = lane / 4, qd = lane % 4;
  const float sl2 = p.scale_log2;
  int lim_lo[MT], lim_hi[MT], row_lo[MT];
  float m_lo[MT], m_hi[MT], l_lo[MT], l_hi[MT];  // running max (raw scores), this thread's partial Σ p
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    row_lo[mt] = i0 + 16 * (MT * warp + mt) + g;
    // Last visible key of rows g and g + 8 (rows past q_len: the last key, so nothing is NaN).
    lim_lo[mt] = min(first_pos + row_lo[mt], kv_len - 1);
    lim_hi[mt] = min(first_pos + row_lo[mt] + 8, kv_len - 1);
    m_lo[mt] = m_hi[mt] = -INFINITY;
    l_lo[mt] = l_hi[mt] = 0.0f;
  }
  float o[MT][DV / 8][4] = {};  // O [16·MT rows][DV] accumulator fragments

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<0>();  // this thread's copies of tile j have landed
    __syncthreads();     // everyone's have; stage (j + 1) % 2 (and Q, at j = 0, MT = 1) is no longer read
    if (j + 1 < n_tiles) load_kv(j + 1);
    const bf16* kt = sk + (j % kStages) * Shape::kKTile;
    const bf16* vt = sv + (j % kStages) * Shape::kVTile;

    float s[MT][kKeys / 8][4] = {};  // S [16·MT rows][kKeys keys]: n-tile n = keys 8n .. 8n + 7
#pragma unroll
    for (int kc = 0; kc < DQK; kc += 32) {
      uint32_t qa[MT][2][4];  // A fragments of channels kc .. kc + 15 and kc + 16 .. kc + 31
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          if constexpr (MT == 1) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qa[mt][x][e] = qf[kc / 16 + x][e];
          } else {
            ldmatrix_x4(qa[mt][x], q_addr + 2 * (16 * mt * kQkStride + kc + 16 * x));
          }
        }
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        uint32_t kb[4];  // b0, b1 of channels kc .. kc + 15, then of kc + 16 .. kc + 31
        ldmatrix_x4(kb, smem_u32(kt + (8 * n + lane % 8) * kQkStride + kc + 8 * (lane / 8)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(s[mt][n], qa[mt][0], kb[0], kb[1]);
          mma_bf16_16816(s[mt][n], qa[mt][1], kb[2], kb[3]);
        }
      }
    }

    const int key0 = j * kKeys;
    uint32_t pa[MT][kKeys / 16][4];  // P as A fragments: k-step kk = keys 16kk .. 16kk + 15
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (key0 + kKeys - 1 > first_pos + i0) {  // the tile reaches past some row's last key
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + 8 * n + 2 * qd + (e & 1);
            if (key > (e < 2 ? lim_lo[mt] : lim_hi[mt])) s[mt][n][e] = -INFINITY;
          }
      }

      float mx_lo = m_lo[mt], mx_hi = m_hi[mt];
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        mx_lo = fmaxf(mx_lo, fmaxf(s[mt][n][0], s[mt][n][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[mt][n][2], s[mt][n][3]));
      }
      const MaxStep step = quad_max_step(mx_lo, mx_hi, m_lo[mt], m_hi[mt], sl2);
      const float ms_lo = step.ms_lo, ms_hi = step.ms_hi, corr_lo = step.corr_lo, corr_hi = step.corr_hi;
      m_lo[mt] = mx_lo;
      m_hi[mt] = mx_hi;

      float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        const uint32_t lo =
            pack_bf16x2(fast_exp2(fmaf(s[mt][n][0], sl2, -ms_lo)), fast_exp2(fmaf(s[mt][n][1], sl2, -ms_lo)));
        const uint32_t hi =
            pack_bf16x2(fast_exp2(fmaf(s[mt][n][2], sl2, -ms_hi)), fast_exp2(fmaf(s[mt][n][3], sl2, -ms_hi)));
        const float2 flo = unpack_bf16x2(lo), fhi = unpack_bf16x2(hi);
        ps_lo += flo.x + flo.y;
        ps_hi += fhi.x + fhi.y;
        // m16n8 C (rows g / g+8, keys 2qd, +1 of n-tile n) → m16k16 A: a0/a1 = n-tile 2kk's rows
        // g / g+8, a2/a3 = n-tile 2kk + 1's.
        pa[mt][n / 2][2 * (n % 2)] = lo;
        pa[mt][n / 2][2 * (n % 2) + 1] = hi;
      }
      l_lo[mt] = l_lo[mt] * corr_lo + ps_lo;
      l_hi[mt] = l_hi[mt] * corr_hi + ps_hi;
#pragma unroll
      for (int d = 0; d < DV / 8; ++d) {
        o[mt][d][0] *= corr_lo;
        o[mt][d][1] *= corr_lo;
        o[mt][d][2] *= corr_hi;
        o[mt][d][3] *= corr_hi;
      }
    }

#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int pr = 0; pr < DV / 16; ++pr) {
        uint32_t vb[4];  // b0, b1 of value channels 16pr .. +7, then of 16pr + 8 .. +15
        ldmatrix_x4_trans(vb, smem_u32(vt + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * kVStride + 16 * pr +
                                       8 * (lane / 16)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(o[mt][2 * pr], pa[mt][kk], vb[0], vb[1]);
          mma_bf16_16816(o[mt][2 * pr + 1], pa[mt][kk], vb[2], vb[3]);
        }
      }
    }
  }

  const int64_t o_ld = static_cast<int64_t>(p.H) * dv;
  float* out_h = p.out + static_cast<int64_t>(sq_info.q_row0) * o_ld + static_cast<int64_t>(h) * dv;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float ll = l_lo[mt], lh = l_hi[mt];
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      ll += __shfl_xor_sync(0xffffffffu, ll, x);
      lh += __shfl_xor_sync(0xffffffffu, lh, x);
    }
    // l ≥ the bf16 of e^0 = 1 (the row's max key), so the division is safe for real rows.
    const float inv_lo = ll > 0.0f ? 1.0f / ll : 0.0f, inv_hi = lh > 0.0f ? 1.0f / lh : 0.0f;
    const int rlo = row_lo[mt], rhi = rlo + 8;
#pragma unroll
    for (int d = 0; d < DV / 8; ++d) {
      const int c = 8 * d + 2 * qd;
      if (8 * d >= dv) break;  // dv is a multiple of 8: n-tile d is all in or all out
      if (rlo < q_len)
        *reinterpret_cast<float2*>(out_h + rlo * o_ld + c) = make_float2(o[mt][d][0] * inv_lo, o[mt][d][1] * inv_lo);
      if (rhi < q_len)
        *reinterpret_cast<float2*>(out_h + rhi * o_ld + c) = make_float2(o[mt][d][2] * inv_hi, o[mt][d][3] * inv_hi);
    }
  }
}

// The instance for (dn + dr, dv): the smallest of <64, 64> (the tiny test models) and <192, 128>
// (DeepSeek V2/V3) that holds both; 0 when neither does.
int prefill_instance(int64_t dqk, int64_t dv) {
  if (dqk <= 64 && dv <= 64) return 1;
  if (dqk <= 192 && dv <= 128) return 2;
  return 0;
}

template <int DQK, int DV, int MT>
void launch_prefill(const PrefillParams& pp, int64_t n_tiles, cudaStream_t s) {
  // Once per process (the attribute is the function's; the first call is a prefill step, never
  // inside a graph capture).
  static const bool attr_set = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_prefill_kernel<DQK, DV, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(PrefillShape<DQK, DV, MT>::kSmemBytes)));
    return true;
  }();
  (void)attr_set;
  mla_prefill_kernel<DQK, DV, MT><<<dim3(static_cast<unsigned>(pp.H), static_cast<unsigned>(n_tiles)), kThreads,
                                    PrefillShape<DQK, DV, MT>::kSmemBytes, s>>>(pp);
  DI_CUDA_LAUNCHED();
}

// Query rows per block of the instance for these head dims.
int64_t prefill_rows(int instance) { return instance == 1 ? PrefillShape<64, 64, 1>::kRows : PrefillShape<192, 128, 2>::kRows; }

}  // namespace

bool mla_prefill_supported(int64_t dn, int64_t dr, int64_t dv, int64_t r) {
  return dn > 0 && dv > 0 && dr >= 0 && r > 0 && dn % 8 == 0 && dr % 8 == 0 && dv % 8 == 0 && r % 8 == 0 &&
         prefill_instance(dn + dr, dv) != 0;
}

void mla_prefill(const MlaPrefillArgs& a, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(mla_prefill_supported(a.dn, a.dr, a.dv, a.r), "MLA prefill kernel: unsupported head dims");
  DI_CUDA_REQUIRE(a.n_seqs >= 0 && a.n_seqs <= kMlaPrefillMaxSeqs && a.n_keys >= 0);
  DI_CUDA_REQUIRE(a.H > 0 && a.H <= 65535 && a.scale > 0.0f && a.ld_lat >= a.r + a.dr && a.ld_lat % 8 == 0);
  // 16-byte cp.async / float4 sources: aligned bases (step memory is 256-byte aligned).
  const bool rows = a.out_q != nullptr || a.out_b != nullptr;  // o_proj's rows instead of out
  DI_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(a.kv) % 16 == 0 && reinterpret_cast<uintptr_t>(a.lat) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && (rows || reinterpret_cast<uintptr_t>(a.out) % 8 == 0));
  const bool wgmma = mla_prefill_wgmma_ok(a.dn, a.dr, a.dv, a.r);
  DI_CUDA_REQUIRE_MSG(a.kernel != 1 || wgmma, "MLA prefill: the wgmma kernel needs sm_90 and DeepSeek's head dims");
  DI_CUDA_REQUIRE_MSG(!rows || (wgmma && a.kernel != 0), "MLA prefill: o_proj's rows come from the wgmma kernel only");
  DI_CUDA_REQUIRE_MSG(a.q_rope == nullptr || (wgmma && a.kernel != 0 && reinterpret_cast<uintptr_t>(a.q_rope) % 16 == 0),
                      "MLA prefill: q's rotation by a table is the wgmma kernel's only (16-byte aligned table)");
  if (wgmma && a.kernel != 0) {
    mla_prefill_wgmma(a, s);
    return;
  }
  const int instance = prefill_instance(a.dn + a.dr, a.dv);
  PrefillParams pp;
  const int64_t n_tiles = prefill_params(a, prefill_rows(instance), &pp);
  if (n_tiles == 0) return;
  if (instance == 1)
    launch_prefill<64, 64, 1>(pp, n_tiles, s);
  else
    launch_prefill<192, 128, 2>(pp, n_tiles, s);
}

}  // namespace deepinfer::cuda
