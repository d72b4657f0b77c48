// Internal to the CUDA backend: error checks, element types and the kernel launchers each .cu
// file provides. Every launcher takes sizes in elements, device pointers and the stream, issues
// its kernels asynchronously, handles empty sizes (no launch) and checks the launch.
// Kept free of fmt and the engine headers: nvcc's front end rejects fmt's C++20 constexpr code,
// so the .cu files see only this header and the host glue (cuda_backend.cpp) sees the engine.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>


namespace deepinfer::cuda {
// Prints "DI_CHECK failed at file:line: what: detail" and aborts (a broken invariant or a
// failed CUDA call: never user input).
[[noreturn]] void check_failed(const char* file, int line, const char* what, const char* detail);
}  // namespace deepinfer::cuda

#define DI_CUDA_CHECK(expr)                                                                       \
  do {                                                                                            \
    const cudaError_t di_err_ = (expr);                                                           \
    if (di_err_ != cudaSuccess)                                                                   \
      ::deepinfer::cuda::check_failed(__FILE__, __LINE__, #expr, cudaGetErrorString(di_err_));    \
  } while (0)
#define DI_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                            \
    const cublasStatus_t di_st_ = (expr);                                                         \
    if (di_st_ != CUBLAS_STATUS_SUCCESS)                                                          \
      ::deepinfer::cuda::check_failed(__FILE__, __LINE__, #expr, cublasGetStatusString(di_st_));  \
  } while (0)
#define DI_CUDA_REQUIRE(cond)                                                                     \
  do {                                                                                            \
    if (!(cond)) ::deepinfer::cuda::check_failed(__FILE__, __LINE__, #cond, "");                  \
  } while (0)
// As DI_CUDA_REQUIRE, with a sentence for the reader (an unsupported size, say).
#define DI_CUDA_REQUIRE_MSG(cond, msg)                                                            \
  do {                                                                                            \
    if (!(cond)) ::deepinfer::cuda::check_failed(__FILE__, __LINE__, #cond, msg);                 \
  } while (0)
#define DI_CUDA_LAUNCHED() DI_CUDA_CHECK(cudaGetLastError())

namespace deepinfer::cuda {

using bf16 = __nv_bfloat16;

// Element type codes for launchers that accept several (the Tensor dtype, narrowed).
enum class Elem : int { kF32, kBF16, kF8 };

inline unsigned grid_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }
// Streaming multiprocessors of the current device (read once per process).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// Whether the current device runs the sm_90a code of this build (compute capability 9.0: the
// TMA/mbarrier/wgmma kernels; CMakeLists.txt compiles sm_90a and, compile-only, sm_100a).
inline bool sm90a_device() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
    return major == 9 && minor == 0;
  }();
  return ok;
}

// ---- cuda_elementwise.cu ----
void embedding(const void* table, Elem table_elem, const int32_t* ids, int64_t T, int64_t D, float* out, cudaStream_t s);
void rms_norm(const float* x, int64_t x_stride, const void* w, Elem w_elem, int64_t D, float eps, float* out,
              int64_t out_stride, int64_t T, cudaStream_t s);
void add_rms_norm(float* residual, const float* delta, const void* w, Elem w_elem, int64_t D, float eps, float* out,
                  int64_t T, cudaStream_t s);
// add_rms_norm that also writes out's rows as quantize_fp8_rows_bf16 would quantize them, bit
// for bit: q [T, D] e4m3 (4-byte aligned), sq [T, D / 128] fp32. Returns false, launching
// nothing, unless D % 128 == 0, D ≤ 8,192 and residual, delta, out are 16-byte aligned.
bool add_rms_norm_quantized(float* residual, const float* delta, const void* w, Elem w_elem, int64_t D, float eps,
                            float* out, uint8_t* q, float* sq, int64_t T, cudaStream_t s);
// add_rms_norm that also writes out rounded to bf16 (to_bf16's bits) into xb [T, D] (8-byte
// aligned). Returns false, launching nothing, unless D % 4 == 0, D ≤ 8,192 and residual, delta,
// out are 16-byte aligned.
bool add_rms_norm_bf16(float* residual, const float* delta, const void* w, Elem w_elem, int64_t D, float eps,
                       float* out, bf16* xb, int64_t T, cudaStream_t s);
// add_rms_norm (q_kind 0), add_rms_norm_quantized (1: q e4m3 codes, sq scales) or add_rms_norm_bf16
// (2: q bf16 rows) — the same bits — that also writes out's rows as two bf16 parts into parts
// [T, 2·D]: row t = [RN(o) | RN(o − RN(o))], the difference exact, the sum within 2^-17·|o| of
// o (cuda_norm_row.cuh; the fp32 router's operand, CudaBackend::set_router_parts). Returns false,
// launching nothing, unless the vectorized kernel takes the shapes (D % 4 == 0, D % 128 == 0 for
// codes, D ≤ 8,192, residual / delta / out 16-byte and q / parts 8-byte aligned).
bool add_rms_norm_parts(float* residual, const float* delta, const void* w, Elem w_elem, int64_t D, float eps,
                        float* out, int q_kind, void* q, float* sq, bf16* parts, int64_t T, cudaStream_t s);
void to_bf16(const float* x, int64_t x_stride, int64_t rows, int64_t cols, bf16* out, cudaStream_t s);
// out[n, k] = bf16(q[n, k] · scale[n / block_n, k / block_k]) (scale grid [ceil(N/bn), n_kb]).
void dequant_fp8(const uint8_t* q, const float* scale, int64_t N, int64_t K, int64_t block_n, int64_t block_k,
                 int64_t n_kb, bf16* out, cudaStream_t s);
constexpr int kRopeMaxHalf = 64;  // rotary pairs per head
struct RopeArgs {
  float inv_freq[kRopeMaxHalf];
  int half = 0;
  float attention_factor = 1;
  bool interleave = true;
};
void rope(float* x, int64_t T, int64_t heads, int64_t stride, int64_t offset, const int32_t* positions,
          const RopeArgs& args, cudaStream_t s);
// rms_norm of kv[t, :r] (weight w), RoPE of kv[t, r:] (one head), both in place, then kv_write —
// one block per token, the same arithmetic as the three kernels (rms_norm's block size). With q:
// also rope(q, T, q_heads, q_stride, q_offset, positions, args), from the same rotation table.
// With table (and no q): each token's rotation table written there for a later reader of q
// (MlaParams::q_rope's layout: [T, 2·half], cos of pair i at i, sine at half + i).
struct MlaQRope {
  float* q = nullptr;  // [T, heads, stride] F32, or null
  int64_t heads = 0, stride = 0, offset = 0;
  float* table = nullptr;  // [T, 2·half] F32, or null
};
// Pairs (2i, 2i+1) of channels [offset, offset + 2·half) of every head of x rotated in place by
// the rows of a table mla_kv_write wrote (MlaQRope::table): rope's values, from the table's bits.
void rope_from_table(float* x, int64_t T, int64_t heads, int64_t stride, int64_t offset, const float* table,
                     int half, cudaStream_t s);
void mla_kv_write(float* kv, int64_t T, int64_t width, int64_t r, const void* w, Elem we, float eps,
                  const int32_t* positions, const RopeArgs& args, const int32_t* slots, void* cache, Elem ce,
                  const MlaQRope& q, cudaStream_t s);
// out[t, i] = silu(g[t, i]) * g[t, I + i]; out F32 or BF16 (out_elem).
void silu_mul(const float* gate_up, int64_t T, int64_t I, void* out, Elem out_elem, cudaStream_t s);
void kv_write(const float* latent, const int32_t* slots, int64_t T, int64_t width, void* cache, Elem cache_elem,
              cudaStream_t s);
void gather_rows(const float* x, const int32_t* rows, int64_t R, int64_t D, float* out, cudaStream_t s);
void add(float* out, const float* x, int64_t n, cudaStream_t s);
void fill_random(void* data, Elem elem, int64_t n, uint64_t seed, bool normal, float a, float b, cudaStream_t s);
// ids[i] < 0 → max(0, pending[−ids[i] − 1]).
void resolve_tokens(int32_t* ids, int64_t n, const int32_t* pending, cudaStream_t s);

// ---- cuda_gemm.cu ----
// Row-major C[M, N] (+)= A[M, K] · op(B), batched with element strides; A, B bf16, fp32
// accumulation. b_nt: B stored [N, K] (C = A·Bᵀ); else stored [K, N]. C F32 or BF16.
void gemm(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, int64_t stride_a,
          const bf16* B, int64_t ldb, int64_t stride_b, bool b_nt, void* C, Elem c_elem, int64_t ldc,
          int64_t stride_c, int64_t batch, float beta = 0.0f);

// As gemm, with fp32 operands and output, multiplied in TF32 (10-bit mantissa operands, fp32
// accumulation): 8× less rounding than bf16 operands at about half the bf16 matrix rate.
void gemm_tf32(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, int64_t stride_a,
               const float* B, int64_t ldb, int64_t stride_b, bool b_nt, float* C, int64_t ldc, int64_t stride_c,
               int64_t batch, float beta = 0.0f);
// Row-major C[M, N] = A[M, K] · B[N, K]ᵀ in fp32 (CUBLAS_COMPUTE_32F, pedantic: no tf32).
void gemm_f32(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, float* C, int64_t ldc);

// ---- cuda_mla.cu ----
// The absorbed form over the paged latent cache for the selected sequences' rows: per (row, head)
// q̃ = W_UKᵀ q_nope, softmax(scale · (q̃·c_kv + q_pe·k_pe)) over the causal keys, o_lat = Σ p·c_kv,
// out = W_UV · o_lat, all in fp32 (bf16 cache and kv_b). Rows of other sequences are not touched.
struct MlaDecodeArgs {
  const float* q;      // [T, H, dn + dr] = [q_nope | q_pe] per head, RoPE applied
  const bf16* kv_b;    // [H * (dn + dv), r]: per head W_UK [dn, r] then W_UV [dv, r]
  // kv_b is a placed weight, never written by a kernel: the kernels may start reading it before
  // the previous kernel in the stream ends (cuda_launch.cuh). False when a kernel of this step
  // produced it (an FP8 kv_b dequantized into step memory).
  bool kv_b_stable = false;
  const bf16* cache;   // [n_blocks, block_size, r + dr] = [c_kv | k_pe] per position
  const int32_t* q_indptr;      // [n_seqs + 1]
  const int32_t* kv_len;        // [n_seqs] (≥ the sequence's q_len)
  const int32_t* block_indptr;  // [n_seqs + 1]
  const int32_t* block_ids;     // [block_indptr[n_seqs]]
  const uint8_t* seq_mask;      // [n_seqs] or null = all
  int64_t n_seqs, T, H, r, dr, dn, dv, block_size;
  // Blocks in `cache` (the extent of the TMA map the warp-specialized split kernel reads it
  // through); 0: unknown — that kernel is then not used.
  int64_t n_blocks = 0;
  // Σ q_len over the selected sequences, counted on the host (T when every row is selected). It
  // sizes the grids and scratch, so it must be the same at every replay of a captured graph.
  int64_t n_rows;
  float scale;
  float* out;  // [T, H, dv] fp32
  // Batch-invariant split rule (DEEPINFER_BATCH_INVARIANT). 0: every row uses the launch's
  // n_splits, chosen from the launch size (mla_decode_splits) — fastest, but a row's rounding
  // then depends on the batch. > 0: a row with n_keys keys is cut at multiples of
  // mla_split_span(n_keys, split_keys, max_splits) keys (at most max_splits pieces), a function
  // of n_keys alone, so its result is the same in any batch, chunking or prefix-cache state; the
  // launch has max_splits split slots (rows with fewer leave the rest empty, which merge as
  // exact zeros). A launch's max_splits must cover its longest row (≥ mla_row_splits of it) or
  // be the same cap for every launch: the span then does not depend on it.
  int64_t split_keys = 0;
  int64_t max_splits = 0;  // with split_keys > 0: the launch's split slots, 1..kMlaMaxSplits
  // Most query rows of one selected sequence, counted on the host (0: unknown, taken as 1). With
  // split_keys > 0, H < 64 and the tensor-core shape, a value > 1 selects the multi-row kernel
  // (several rows of a sequence per block, their splits merged in the block; each row's bits
  // unchanged); decode-shaped steps (1) take it from 3/8 of a block per SM, else the one-row
  // kernel. Both launches are graph-safe.
  int64_t max_q_len = 0;
  // Split kernel: −1 automatic (the tensor-core kernels when r = 512 and dr = 64, else fp32),
  // 0 the fp32 CUDA-core kernel, 1 the tensor-core kernels (bf16 q̃, q_pe and probabilities, fp32
  // scores and accumulators; needs r = 512, dr = 64: checked) — with split_keys == 0 and H < 64
  // on sm_90a the warp-specialized one (TMA ring, two consumer warp groups), else the one-row
  // mma.sync kernel; 2 the one-row mma.sync kernel in every case (the previous default, kept
  // for comparison and for GPUs without sm_90a; also never the multi-row kernel).
  int64_t kernel = -1;
};
// Most split slots of an MLA decode launch (one row alone fills the 132 SMs of an H200 at H ≤ 16).
constexpr int64_t kMlaMaxSplits = 128;
// Split slots a row with n_keys keys needs under the batch-invariant rule: ceil(n_keys /
// split_keys), clamped to [1, max_splits] (what a launch's max_splits must cover).
__host__ __device__ inline int64_t mla_row_splits(int64_t n_keys, int64_t split_keys, int64_t max_splits) {
  const int64_t s = (n_keys + split_keys - 1) / split_keys;
  return s < 1 ? 1 : s > max_splits ? max_splits : s;
}
// Keys per split under the batch-invariant rule: split y of a row owns keys
// [y·span, min(n_keys, (y+1)·span)). span = split_keys · ceil(n_keys / (split_keys·max_splits)):
// split_keys up to split_keys·max_splits keys, then the next multiple of split_keys that keeps
// ≤ max_splits pieces. A multiple of split_keys that only changes when n_keys crosses a multiple
// of split_keys·max_splits, so consecutive rows of one sequence (n_keys, n_keys + 1, …) share
// their split boundaries and a block can serve several of them (the multi-row kernel).
__host__ __device__ inline int64_t mla_split_span(int64_t n_keys, int64_t split_keys, int64_t max_splits) {
  const int64_t period = split_keys * max_splits;
  const int64_t c = (n_keys + period - 1) / period;
  return split_keys * (c < 1 ? 1 : c);
}
// Scratch (q̃, per-split partials, merged o_lat: ~n_rows·H·r·(4·(1 + n_splits) + 2) bytes) comes
// from `alloc`.
// Launch shape depends only on the sizes above and the GPU's SM count (graph-safe); no atomics.
// Supported: r ≤ 512, r + dr ≤ 576, dn ≤ 512 (checked).
void mla_decode(const MlaDecodeArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s);
// The KV splits mla_decode uses per row (1..128) when split_keys == 0, a function of
// n_rows · ceil(H / 16) split blocks per split and the SM count only: the fewest within 10% of the
// least waves(s) / s. (The one-row mma.sync kernels use their own count, at most 64: for H ≥ 64,
// 64 heads per block; for H < 64 off sm_90a or with kernel = 2, two blocks per split in a
// cluster when there are more than 32 splits.) A row's result is bitwise reproducible and
// independent of the other rows for a given split count.
int mla_decode_splits(int64_t n_rows, int64_t H);
// lat[i, :] = cache row of position i (< S) of the sequence whose page list starts at block_ids
// (lat F32 or BF16: lat_elem).
void gather_latent(const bf16* cache, const int32_t* block_ids, int64_t block_size, int64_t width, int64_t S, void* lat,
                   Elem lat_elem, cudaStream_t s);
// P[h, i, j] = softmax_j(scale · scores[h, i, j]) over j ≤ first_pos + i, 0 beyond (fp32 out).
void causal_softmax(const float* scores, int64_t H, int64_t rows, int64_t S, int64_t first_pos, float scale, float* P,
                    cudaStream_t s);
// ---- cuda_mla_sublayer.cu ----
// The attention sublayer of a decode step of one token of one sequence, as one persistent
// kernel (the file's comment): out = o_proj(mla_attention(absorbed, q, cache)) with q, kv =
// [q_proj; kv_a_proj_with_mqa] · bf16(x), q_pe rotated, and the new latent (rms_norm of kv[:r],
// RoPE of kv[r:]) written to `slots[0]` first — what matmul_parts, mla_rope_kv_write,
// mla_decode and the o_proj matmul compute, in another summation order (bf16 x, q̃, P, o_lat and
// o, as those kernels round them). Graph-safe: the launch depends only on D and the SM count.
struct MlaSublayerArgs {
  const float* x = nullptr;   // [D] the sublayer's normed input (unless the input norm is folded)
  int64_t D = 0;              // hidden size, % 256 == 0
  // The input norm folded into the kernel (residual != null; D ≤ kMlaSublayerNormMaxD, rows
  // 16-byte aligned): x = RMSNorm(residual + delta) · in_norm as add_rms_norm's kernel computes it
  // (cuda_norm_row.cuh) — every block from the two rows; block 0 writes x into x_out and block
  // G − 1 the sum into residual once every block has read it (x is not read). delta may be `out`
  // (the kernel reads it before it writes out).
  float* residual = nullptr;   // [D]
  const float* delta = nullptr;  // [D]
  const void* in_norm = nullptr;  // [D] (in_norm_elem)
  Elem in_norm_elem = Elem::kF32;
  float in_eps = 0;
  float* x_out = nullptr;  // [D]
  // The three dense linears: bf16, or (fp8) e4m3 codes with one fp32 scale per row and
  // 128-column block — s_q, s_kv, s_o [rows, K / 128] (the CUDA placement's block_n 1, block_k
  // 128) — multiplied as the FP8 decode GEMV does (bf16 x, fp32 sums per block, times the block's
  // scale), or in the invariant form as the W8A8 wgmma GEMM does (x quantized per 1×128 group:
  // that mode's FP8 linears; mla_sublayer_invariant_fp8_fits).
  bool fp8 = false;
  const void* w_q = nullptr;   // [H·(dn + dr), D] q_proj
  const void* w_kv = nullptr;  // [r + dr, D] kv_a_proj_with_mqa
  const float* s_q = nullptr;
  const float* s_kv = nullptr;
  const float* s_o = nullptr;
  const void* kv_norm = nullptr;  // [r] kv_a_layernorm (F32 or BF16: kv_norm_elem)
  Elem kv_norm_elem = Elem::kF32;
  float eps = 0;
  RopeArgs rope;                       // half = dr / 2
  const int32_t* positions = nullptr;  // [1] the token's position (a step input)
  const int32_t* slots = nullptr;      // [1] its cache row (a step input)
  bf16* cache = nullptr;               // [n_blocks, block_size, r + dr]
  int64_t block_size = 0;
  const int32_t* kv_len = nullptr;        // [1] keys after this step's write (a step input)
  const int32_t* block_indptr = nullptr;  // [2] (a step input)
  const int32_t* block_ids = nullptr;     // the sequence's pages (a step input)
  const bf16* kv_b = nullptr;             // [H·(dn + dv), r]: per head W_UK [dn, r], W_UV [dv, r]
  float scale = 0;                        // softmax scale
  const void* w_o = nullptr;              // [D, H·dv] o_proj (bf16, or e4m3 with s_o)
  float* out = nullptr;                   // [D]
  // Scratch (step memory): q [H·(dn + dr)] f32, kv [r + dr] f32, q_lat [H, r] bf16, q_pe
  // [H, dr] bf16, part_acc [mla_sublayer_max_splits(), H, r] f32, part_ml [same, H], o [H·dv] f32.
  float* q = nullptr;
  float* kv = nullptr;
  bf16* q_lat = nullptr;
  bf16* q_pe = nullptr;
  float* part_acc = nullptr;
  float2* part_ml = nullptr;
  float* o = nullptr;
  unsigned long long* counter = nullptr;  // the grid barrier's: zero at first use, only this kernel's
  // The invariant form (split_keys > 0: the batch-invariant mode's arithmetic, so the result is
  // that mode's op-by-op bits for this token in any batch): its MLA split rule, mla_split_span
  // (split_keys % 32 == 0, max_splits 1..32); 0 = the default form.
  int64_t split_keys = 0;
  int64_t max_splits = 0;
  // A lab timeline, or null: [G][kMlaSublayerMarks] global-timer ns per block at entry, before
  // and after the PDL wait, and before and after each grid barrier, and at exit.
  unsigned long long* trace = nullptr;
};
constexpr int kMlaSublayerMarks = 12;
constexpr int64_t kMlaSublayerNormMaxD = 2048;  // the folded input norm's widest row (MlaSublayerArgs::residual)
// Whether mla_sublayer serves these dims on this GPU: H 16, dn 128, dr 64, dv 128, r 512, RoPE
// over all of dr, D % 256 == 0, sm_90a with ≥ 128 SMs, its shared memory within 227 KB (each form:
// default, invariant, FP8).
bool mla_sublayer_fits(int64_t D, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r, int64_t rope_half);
// Whether the invariant form serves FP8 linears at hidden size D on this GPU (a block per 32 rows
// of q_proj | kv_a_proj and of o_proj; mla_sublayer_fits too).
bool mla_sublayer_invariant_fp8_fits(int64_t D);
// Whether the default form serves FP8 linears at hidden size D: a block's rows of q_proj |
// kv_a_proj start at any row, and their scale rows (D / 128 fp32 each) are bulk-copied, which
// takes 16-byte aligned addresses and sizes — D % 512 == 0 (at D = 256 the copies of odd rows
// faulted, "misaligned address": run s42-2). mla_sublayer_fits too.
bool mla_sublayer_fp8_fits(int64_t D);
int64_t mla_sublayer_max_splits();
void mla_sublayer(const MlaSublayerArgs& a, cudaStream_t s);
// ---- cuda_moe_one.cu ----
// A MoE block's experts at one token as one persistent kernel (the file's comment): out = Σ_s<k
// weights[s] · expert_{ids[s]}(x) in slot order, + each shared slice E .. E + n_shared − 1 (weight
// 1) — what the grouped decode GEMVs and their combine compute (MoeArgs' stacked layout), in
// another summation order within each dot product (x and h = silu(g)·u rounded to bf16 as those
// kernels round them). Graph-safe: the launch depends only on the sizes and the SM count.
struct MoeOneArgs {
  const float* x = nullptr;        // [D] the token's normed row
  int64_t D = 0, I = 0, k = 0, E = 0, n_shared = 0;
  const int32_t* ids = nullptr;    // [k] routed experts (< E), from the previous kernel
  const float* weights = nullptr;  // [k]
  const void* w13 = nullptr;       // [(E + n_shared)·2I, D] bf16 or e4m3: gate_e; up_e
  const void* w2 = nullptr;        // [(E + n_shared)·D, I]
  bool fp8 = false;                // e4m3 codes with per-row scales:
  const float* w13_scale = nullptr;  // [(E + n_shared)·2I, ⌈D / block_k⌉]
  const float* w2_scale = nullptr;   // [(E + n_shared)·D, ⌈I / block_k⌉]
  int64_t block_k = 0;
  // bf16 only: the batch-invariant mode's arithmetic (the chain form: each dot product one
  // m16n8k16 MMA chain over K in k order, as its bf16 MoE's one-chain small_m_gemm computes it),
  // so a one-token step's output is that mode's bits for the token in any batch.
  bool chain = false;
  // fp8 only: the W8A8 arithmetic (cuda_moe_one_w8a8.cu: x and h quantized per 1×128 group, the
  // FP8 wgmma GEMM's MMAs and promotion, bf16 gate | up and expert outputs), so a one-token step's
  // output is the MoE's W8A8 form's bits (cuda_moe.cu, form 5) for the token in any batch.
  bool w8a8 = false;
  float* out = nullptr;            // [D]
  float* h = nullptr;              // scratch [(k + n_shared)·I] f32
  unsigned long long* counter = nullptr;  // its grid barrier's (zero at first use, only this kernel's)
  // A lab timeline, or null: [G][kMoeOneMarks] global-timer ns per block at entry; the producer's
  // pre-wait stages issued, its wait returned, its last phase-A stage issued, its last stage
  // issued; the math warps' x staged, first stage full, phase A done, barrier passed, exit.
  unsigned long long* trace = nullptr;
};
constexpr int kMoeOneMarks = 10;
// moe_one_w8a8's timeline: kMoeOneMarks, then h quantized (phase B's A ready) and the first
// phase-B stage done.
constexpr int kMoeOneW8a8Marks = 12;
// Whether moe_one serves these sizes (fp8: e4m3 weights with per-row scales over block_k
// columns; else bf16; chain: MoeOneArgs::chain — bf16, D and I multiples of 64) on this GPU.
bool moe_one_fits(int64_t D, int64_t I, int64_t k, int64_t n_shared, bool fp8 = false, int64_t block_k = 0,
                  bool chain = false);
void moe_one(const MoeOneArgs& a, cudaStream_t s);
// ---- cuda_moe_one_w8a8.cu ----
// Whether moe_one_w8a8 serves these sizes (e4m3 weights with per-row scales over 128 columns) on
// this GPU: D a multiple of 512, I of 128, both up to 2048, k + n_shared ≤ 8.
bool moe_one_w8a8_fits(int64_t D, int64_t I, int64_t k, int64_t n_shared, int64_t block_k);
// MoeOneArgs with fp8 and w8a8 set: the W8A8 form's bits for the one token, in one launch.
void moe_one_w8a8(const MoeOneArgs& a, cudaStream_t s);
// Whether the driver takes moe_one_w8a8's 3-D TMA view of W_down (one box per slot and stage;
// else a box per K block): a lab fact for moe_one_bench.
bool moe_one_w8a8_boxes_3d();
// ---- cuda_sampling.cu ----
struct SampleRowArgs {
  float temperature;
  int64_t top_k;
  float top_p;
  float min_p;
  float u;        // philox_uniform(seed, position, kSample), drawn on the host
  bool greedy;    // temperature < kGreedyTemperature
  int32_t n_top;  // top log-probabilities wanted (≤ SampleArgs::n_top)
};
// A row with logits processors (sample/logits_processors.h); offsets index SampleArgs::proc_data.
struct ProcRowArgs {
  int32_t row;
  float rep, freq, pres;
  int32_t seen_begin, seen_end;  // tokens at [seen_begin, seen_end), their counts at + n_seen
  int32_t n_seen;
  int32_t mask_begin, mask_end;
  int32_t pend_begin, pend_end;  // indices into pending_tokens
};
struct SampleArgs {
  const float* logits;            // [R, V] raw, unchanged
  int64_t R, V;
  const SampleRowArgs* rows;      // [R]
  const int32_t* sampled;         // [n_sampled] the non-greedy rows
  int64_t n_sampled;
  const ProcRowArgs* procs;       // [n_procs]
  int64_t n_procs;
  const int32_t* proc_data;       // seen tokens / counts, masked ids, pending indices
  const int32_t* pending_tokens;  // [P] tokens of steps in flight
  int32_t* tokens;                // [R] (−1: the raw row holds NaN/±Inf)
  float* logprobs;                // [R] log-softmax of the raw row at the token
  int32_t* top_ids;               // [R, n_top] or null
  float* top_logprobs;            // [R, n_top] or null
  int64_t n_top;
};
// Processors on a copy of the processed rows, then the sampler; scratch from `alloc`.
void sample(const SampleArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s);

// ---- cuda_moe.cu ----
struct RouteArgs {
  const float* logits;  // [T, E]
  const float* bias;    // [E] or null
  int64_t T, E, n_group, topk_group, top_k;
  int scoring;  // 0 softmax, 1 sigmoid
  int method;   // 0 greedy, 1 group-limited greedy, 2 noaux_tc
  bool norm_topk_prob;
  float scale;
  int32_t* ids;     // [T, k]
  float* weights;   // [T, k]
};
void moe_route(const RouteArgs& a, cudaStream_t s);

// ---- cuda_norm_route.cu ----
// One token's add_rms_norm (with its quantized rows), fp32 router GEMV and routing in one launch,
// bitwise equal to add_rms_norm_quantized → gemm_f32_ordered → moe_route (the batch-invariant
// mode's ops). Rows 16-byte aligned.
struct NormRouteArgs {
  float* residual;      // [D] += delta
  const float* delta;   // [D]
  const void* norm;     // [D] the norm's weight
  Elem norm_elem;
  int64_t D;
  float eps;
  float* out;           // [D] the normed row
  int q_kind;           // its quantized rows: 0 none, 1 e4m3 codes q [D] + scales sq [D / 128], 2 bf16 q [D]
  void* q;
  float* sq;
  const float* router;  // [E, D] fp32
  float* logits;        // [E] scratch
  unsigned long long* counter;  // zero before the launch, zero after
  RouteArgs route;      // T = 1; E, the rule, ids [k] and weights [k] (route.logits unused)
};
bool norm_route_ok(int64_t D, int64_t E, int64_t n_group, int64_t top_k, int q_kind);
void norm_route(const NormRouteArgs& a, cudaStream_t s);
struct MoeArgs {
  const float* x;          // [T, D]
  const int32_t* ids;      // [T, k]
  const float* weights;    // [T, k]
  int64_t T, D, k, E, I;
  // Shared experts run as n_shared extra experts E .. E + n_shared − 1 (the shared MLP cut into
  // I-wide slices, stacked after the routed experts in w13 and w2): every token gets them as
  // slots k .. k + n_shared − 1 of weight 1, combined after its routed slots. 0: none here.
  int64_t n_shared = 0;
  const void* w13;         // [(E + n_shared)·2I, D] (gate_e; up_e) bf16 | fp8
  const float* w13_scale;  // fp8: [(E + n_shared)·2I, ceil(D / block_k)]
  const void* w2;          // [(E + n_shared)·D, I]
  const float* w2_scale;   // fp8: [(E + n_shared)·D, ceil(I / block_k)]
  bool fp8;
  int64_t block_k;
  // Form 5: the per-row scales of w13 / w2 are uniform over aligned 128-row blocks
  // (LinearWeight::uniform_row_blocks): the FP8 GEMM's block form where 2I / D % 128 == 0.
  bool w13_uniform = false, w2_uniform = false;
  float* out;              // [T, D]
  // [T, D] or null: out = the experts' combine + addend (the separate shared MLP's output,
  // added as the add op would: one fp32 add per element, no extra pass over memory).
  const float* addend = nullptr;
  // [T, D] e4m3 and [T, D / 128] fp32, or null: x already rounded and quantized per 1×128 group
  // (quantize_fp8_rows_bf16, the quantizer form 5 runs): form 5 with k > 1 copies its slots from
  // them instead of quantizing x again.
  const uint8_t* xq = nullptr;
  const float* xq_scale = nullptr;
  // Form 5: the gate|up GEMM's epilogue applies SiLU·mul and quantizes the down GEMM's input
  // (fp8_wgmma_glu_quantize, where fp8_wgmma_glu_ok) instead of writing gate|up in bf16 for
  // silu_mul_quantize_fp8 — the same codes and scales.
  bool glu_fused = false;
  // Form 5 with k > 1 (and not glu_fused): the gate|up GEMM reads each slot's row from the
  // tokens' quantized rows through the permutation (Fp8GemmArgs::a_rows) instead of a gather
  // pass copying them first — where fp8_wgmma_gather_ok. The same bits.
  bool gather_a = false;
  // Form 5: Fp8GemmArgs::idle_skip, ::stagger, ::cluster, ::narrow_tails and ::n192 of its
  // grouped GEMMs (the same bits either way).
  bool idle_skip = true;
  bool stagger = false;
  int fp8_cluster = 0;
  bool narrow_tails = true;
  bool n192 = false;
  int form = 1;            // grouped GEMMs: 0 tiled WMMA kernel, 1 the decode GEMV (bandwidth), 2 one cuBLAS
                           // GEMM per expert with rows (reads the row counts back: one host sync),
                           // 3 small_m_gemm (bitwise equal to form 0; few rows per expert),
                           // 4 bf16 wgmma (bf16 weights on sm_90, K % 8 == 0; from ~10 rows per
                           //   expert; FP8 weights only with `invariant`, widened to bf16 scratch
                           //   first: moe_wgmma_fp8_ok),
                           // 5 W8A8: activations quantized per 1×128 group + the FP8 wgmma GEMM
                           //   (FP8 weights with block_k 128 on sm_90: moe_w8a8_ok; any number of
                           //   rows); gate|up written in bf16, SiLU·mul fused into the down GEMM's
                           //   quantizer
  cublasHandle_t blas = nullptr;  // form 2
  // The batch-invariant K structure in forms 0 and 4 (form 4: K % 64 == 0; form 3 always has it
  // unless one_chain; forms 1 and 2 must not be used; form 5 needs none: every row's arithmetic
  // is fixed by the row, whatever the step's size, so the invariant mode may run it at every size).
  bool invariant = false;
  // Form 3 folds all of K in one chain (small_m_gemm with one split) — the arithmetic of forms 0
  // and 4 without `invariant` (16-wide K chunks from zero in order; form 4 needs K % 64 == 0 for
  // it), so those three forms agree bitwise: the batch-invariant mode's bf16 MoE, whose steps
  // have enough experts × columns for parallelism without K splits.
  bool one_chain = false;
  // Form 1 at one token: its FP8 GEMVs' ring-fed form (GemvArgs::ring).
  bool gemv_ring = false;
  // The next sublayer's input norm on the combine's output, or residual null: none. With it,
  // moe_experts may fold the norm into the combine (combine_norm_kernel: residual += the
  // combine; x = rms_norm(residual) · w; where q: x's rows quantized per 1×128 group (codes q
  // [T, D], scales sq [T, D / 128]); where xb: x's rows in bf16 — add_rms_norm_quantized's /
  // add_rms_norm_bf16's / add_rms_norm's bits) and then not write out; it returns whether it did.
  struct NextNorm {
    float* residual = nullptr;  // [T, D]
    const void* w = nullptr;    // [D] the norm's weight (we)
    Elem we = Elem::kF32;
    float eps = 0;
    float* x = nullptr;     // [T, D]
    uint8_t* q = nullptr;   // or null
    float* sq = nullptr;
    bf16* xb = nullptr;     // or null (not both)
  } norm;
};
// Scratch comes from `alloc` (step memory). Forms 0 and 1 never synchronize (graph-capturable);
// form 1 needs D, I multiples of 8 (bf16) or 16 (FP8; block_k too): moe_gemv_ok.
bool moe_gemv_ok(int64_t D, int64_t I, bool fp8, int64_t block_k);
// Form 5 fits: FP8 weights with 128-wide K blocks, D and I multiples of 16, an sm_90 GPU.
bool moe_w8a8_ok(int64_t D, int64_t I, bool fp8, int64_t block_k);
// Form 4 with FP8 weights (batch-invariant only): D, I % 64 == 0 on sm_90, block_k % 16 == 0, and
// the larger of the widened w13 / w2 (one bf16 buffer, reused) within kMoeWidenMaxBytes.
constexpr int64_t kMoeWidenMaxBytes = int64_t{1} << 30;
bool moe_wgmma_fp8_ok(int64_t E_all, int64_t D, int64_t I, int64_t block_k);
// Returns whether a.norm ran (folded into the combine; out not written).
bool moe_experts(const MoeArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s);

// ---- cuda_moe_sort.cu ----
// The stable counting sort of a MoE step's R = T·kt (token, slot) entries by expert, as
// moe_experts runs it beyond its one-block sort: entry i is token i / kt, slot i % kt, its expert
// ids[token·k + slot] ([T, k] int32, routed) for slot < k, else e_routed + slot − k (the shared
// experts; E = e_routed + kt − k experts in all). perm [R]: the entries by expert, ties in entry order; inv [R]: perm's inverse;
// offsets [E + 1]: each expert's first position, offsets[E] = R; tiles [E + 1]: Σ_{e' < e}
// ⌈count(e') / tile_rows⌉; active [n_active ≤ E]: the experts with entries in increasing order,
// −1 after. scratch: moe_sort_scratch_bytes(R, E) bytes. Three launches (PDL), no sync.
constexpr int64_t kMoeSortMaxExperts = 512;  // routed + shared experts (cuda_moe.cu's limits)
size_t moe_sort_scratch_bytes(int64_t R, int64_t E);
void moe_sort(const int32_t* ids, int64_t k, int64_t kt, int64_t e_routed, int64_t R, int64_t tile_rows,
              int32_t* perm, int32_t* inv, int32_t* offsets, int32_t* tiles, int32_t* active, int64_t n_active,
              void* scratch, cudaStream_t s);
// ---- cuda_gemv.cu ----
// The decode GEMV (default mode, a few rows): C[r, n] (row stride ldc, fp32) = Σ_k A[r, k] · W[n, k],
// dense (rows [0, rows) against W [N, K]) or grouped (active != null: slot i serves expert
// active[i] (−1: idle), whose rows [offsets[e], offsets[e+1]) of A and C meet W rows [e·N, (e+1)·N)).
// W bf16, FP8 e4m3 (w_scale [rows of W, ceil(K / block_k)], one scale per row and K block) or
// fp32; A bf16 or fp32 (rounded to bf16 when W is not fp32), row stride lda elements.
// Bandwidth-shaped: a persistent grid, each warp a contiguous share of (slot, 4 weight rows)
// units. max_rows: an upper bound of the rows any expert (dense: the matrix) has; rows beyond
// 4 take several passes over the weights. Preconditions: gemv_ok; W 16-byte aligned.
struct GemvArgs {
  const void* a = nullptr;  // [rows, lda] bf16 | fp32
  Elem a_elem = Elem::kBF16;
  int64_t lda = 0;
  const void* w = nullptr;  // [E·N, K] bf16 | fp8 | fp32
  Elem w_elem = Elem::kBF16;
  const float* w_scale = nullptr;  // FP8 only
  int64_t block_k = 0;             // FP8 only: a multiple of 16
  int64_t N = 0, K = 0;
  const int32_t* offsets = nullptr;  // grouped: [E + 1]
  const int32_t* active = nullptr;   // grouped: [n_active]
  int64_t n_active = 1;
  int64_t rows = 0;      // dense: the rows of A and C
  int64_t max_rows = 1;  // the kernel's pass height (≤ 4 rows per pass); rows of A < 2^31
  // Row map (null: none): row r of the product reads row a_rows[r] / a_row_div of A (the MoE
  // reads the tokens' rows through its permutation instead of gathering them first).
  const int32_t* a_rows = nullptr;
  int64_t a_row_div = 1;
  // Gated (fp32 A, bf16 or FP8 W, max_rows 1): W holds 2·N rows per expert (gate rows, then
  // the up rows) and C[r, n] = silu(g) · u of the two products for column n (SiLU·mul in the
  // epilogue).
  bool glu = false;
  float* c = nullptr;
  int64_t ldc = 0;
  // Split output (dense, not gated; null: none): columns n ≥ n_split go to c2[r, n − n_split]
  // (row stride ldc2) — two row-stacked linears of one A in one launch.
  float* c2 = nullptr;
  int64_t ldc2 = 0, n_split = 0;
  // FP8: the tensor-core form (gemv_fp8_tc) from this many 8-row units; 0: enough for every
  // SM's warps (below, the CUDA-core form splits K across blocks instead). A lab knob.
  int64_t tc_min_units = 0;
  // FP8 at one row per pass: the ring-fed form (gemv_fp8_ring) where it applies. Off by default:
  // slower in the model than the register-buffered form (docs/perf.md, version 33).
  bool ring = false;
};
// The kernel takes these operands: K a multiple of the 16-byte chunk (8 bf16, 16 FP8, 4 fp32
// weights), FP8 block_k a multiple of 16, A 16-byte aligned rows (pointer and lda), fp32 weights
// with fp32 A.
bool gemv_ok(Elem a_elem, const void* a, int64_t lda, Elem w_elem, int64_t K, int64_t block_k);
void gemv(const GemvArgs& g, cudaStream_t s);
// cuda_gemv_fp8_tc.cu: gemv's FP8 form on the tensor cores, run by gemv when it applies (FP8
// weights with 128-column scale blocks, one A row per pass, K ≤ 8192, enough units of 8 rows for
// every SM's warps, sm_90a); returns whether it ran.
bool gemv_fp8_tc(const GemvArgs& g, cudaStream_t s);
// cuda_gemv_fp8_ring.cu: the same FP8 GEMV with its weights streamed by TMA through a
// shared-memory ring, 16-row units (plain N % 16 == 0, gated N % 8 == 0), K short enough for a
// three-stage ring (V2-Lite's 2,048 and 1,408: yes; 4,096: no), at least one unit per SM, sm_90a,
// GemvArgs::ring set; gemv tries it first; returns whether it ran.
bool gemv_fp8_ring(const GemvArgs& g, cudaStream_t s);
// ---- cuda_bf16_wgmma.cu ----
// Grouped bf16 GEMM on wgmma (sm_90): C[r, n] (row stride ldc, fp32) = Σ_k A[r, k] · W[e·N + n, k]
// for the rows r of expert e, [offsets[e], offsets[e+1]). A [R, K] and W [E·N, K] bf16, 16-byte
// aligned. 128×256 tiles of each expert's rows (tiles past an expert's rows waste their MMAs: meant
// for ≥ 64 rows per expert on average), persistent, sync-free and graph-capturable. fp32
// accumulation over K in 16-wide chunks from zero; `invariant`: the batch-invariant K structure
// (kInvariantSplitK splits added in order, 128×128 tiles) — bitwise what small_m_gemm and the
// tiled GEMMs with the invariant structure compute, so the batch-invariant mode may use it for
// large steps.
bool bf16_wgmma_grouped_ok(int64_t K);    // sm_90 GPU and K % 8 == 0
bool bf16_wgmma_invariant_ok(int64_t K);  // and K % 64 == 0 (whole 64-wide K blocks)
void bf16_wgmma_grouped_gemm(const bf16* A, int64_t R, int64_t K, const bf16* W, int64_t N, const int32_t* offsets,
                             int64_t E, float* C, int64_t ldc, cudaStream_t s, bool invariant = false);
// The MoE's gate|up GEMM with SiLU·mul in its epilogue: act[r, c] (row stride ld_act) =
// bf16(silu(g) · u), g = Σ_k A[r, k] · W13[e·2I + c, k], u = the same with row e·2I + I + c, for
// the rows r of each expert e — the values of the plain GEMM's fp32 [R, 2I] followed by the SiLU·mul
// kernel (bitwise, `invariant` as above), without that intermediate.
void bf16_wgmma_grouped_glu(const bf16* A, int64_t R, int64_t K, const bf16* W13, int64_t I, const int32_t* offsets,
                            int64_t E, bf16* act, int64_t ld_act, cudaStream_t s, bool invariant);
// Dense C[m, n] (row stride ldc) = Σ_k A[m, k] · W[n, k] for m < M on the same kernel (its dense
// row tiles, no offsets). Graph-safe.
void bf16_wgmma_dense_gemm(const bf16* A, int64_t M, int64_t K, const bf16* W, int64_t N, float* C, int64_t ldc,
                           cudaStream_t s, bool invariant);
// Dense C[m, n] (row stride ldc) = Σ_k A[m, k] · W[n, k] for m < M with the tiled grouped GEMM
// (one "expert"): the same per-element fold as small_m_gemm, so either may serve any M in the
// batch-invariant mode. W bf16 or FP8 (per (row, block_k) scales, widened to bf16).
void dense_gemm_tiled(const bf16* A, int64_t M, int64_t K, const void* W, const float* scale, bool fp8,
                      int64_t block_k, int64_t N, float* C, int64_t ldc, cudaStream_t s);
// Tests only: dense_gemm_tiled with the tiled version forced (1, 2 or 3; 2 and 3 need K % 8 == 0
// and FP8 block_k % 8 == 0) and the batch-invariant K structure on or off.
void tiled_gemm_for_test(int version, const bf16* A, int64_t M, int64_t K, const void* W, const float* scale, bool fp8,
                         int64_t block_k, int64_t N, float* C, int64_t ldc, bool invariant, cudaStream_t s);

// ---- cuda_fp8_gemm.cu ----
// FP8 e4m3 block-scaled GEMM with DeepSeek/DeepGEMM semantics (DEEPSEEK.md §3.2).
constexpr int64_t kFp8GroupK = 128;  // K elements per activation group and per weight scale block
// DeepSeek's dynamic activation quantization, per row and 1×128 group g:
// s[m, g] = max(amax(|x[m, 128g .. 128g+127]|), 1e-4) / 448 (ue8m0: rounded up to a power of two),
// x_q[m, k] = e4m3_rn_satfinite(x[m, k] / s[m, k / 128]) (IEEE division). A zero group gets
// s = 1e-4/448 (the reference's clamp) and q = 0, so it dequantizes to exactly 0. A partial last
// group (K % 128 != 0) uses its K % 128 elements. x [M, K] fp32 | bf16 (x_elem), x_q [M, K] e4m3,
// scales [M, ceil(K/128)] fp32. Precondition: K % 16 == 0. ldx: x's row pitch in elements (0:
// K; else ≥ K, a multiple of 4, x 16-byte aligned).
void quantize_fp8_rows(const void* x, Elem x_elem, int64_t M, int64_t K, uint8_t* x_q, float* scales, bool ue8m0,
                       cudaStream_t s, int64_t ldx = 0);
// quantize_fp8_rows of fp32 rows rounded to bf16 first — a bf16 copy and its quantization in one
// pass, the same bits: output row m quantizes row rows[m] / row_div of x (rows null: row m; the
// MoE's permutation) at row pitch ldx (x 16-byte aligned, ldx % 4 == 0). rows: [M] device.
// Precondition: K % 16 == 0.
void quantize_fp8_rows_bf16(const float* x, int64_t ldx, const int32_t* rows, int64_t row_div, int64_t M, int64_t K,
                            uint8_t* x_q, float* scales, cudaStream_t s);
// The gated MLP's activations straight into the quantizer: x_q [M, I], scales [M, ceil(I/128)] =
// quantize_fp8_rows(bf16(silu_times(h[m, c], h[m, I + c]))) for h [M, 2I] ([gate | up], fp32 or
// bf16, 16-byte aligned) — silu_mul's bf16 output and its quantization in one pass, the same bits.
// Precondition: I % 16 == 0.
void silu_mul_quantize_fp8(const void* h, Elem h_elem, int64_t M, int64_t I, uint8_t* x_q, float* scales,
                           cudaStream_t s);
// C[m, n] = Σ_kb (Σ_{k ∈ kb} a[m, k]·w[n, k]) · a_scale[m, kb] · w_scale[n / block_n, kb]: each
// 128-wide K block is summed by the tensor cores in fp32, then scaled and added to an fp32
// accumulator in K-block order (deterministic). Grouped form: rows of A (and C) sorted by expert,
// expert e owns rows [offsets[e], offsets[e+1]) and weights w[e·N .. e·N + N) with scale rows
// [e·ceil(N/block_n), ...); a tile never spans two experts.
struct Fp8GemmArgs {
  const uint8_t* a = nullptr;      // [M, K] e4m3, 16-byte aligned
  const float* a_scale = nullptr;  // [M, ceil(K/128)] fp32
  const uint8_t* w = nullptr;      // [N, K] e4m3 (grouped: [E·N, K]), 16-byte aligned
  const float* w_scale = nullptr;  // [ceil(N/block_n), ceil(K/128)] (grouped: [E·ceil(N/block_n), ...])
  int64_t M = 0, N = 0, K = 0;     // K % 16 == 0
  int64_t block_n = 128;           // weight scale rows: 128 (checkpoint blocks) or 1 (one per output row)
  // block_n = 1 whose scales are equal within each aligned 128-row block (LinearWeight::
  // uniform_row_blocks; grouped: N % 128 == 0): the wgmma form reads one scale row per block —
  // the block form's speed, the same bits as reading every row. Other variants ignore it.
  bool w_scale_uniform = false;
  void* c = nullptr;               // [M, ldc] fp32 | bf16 (c_elem)
  Elem c_elem = Elem::kF32;
  int64_t ldc = 0;                 // ≥ N (≥ n_split with c2)
  // The wgmma form, dense only: columns [n_split, N) written to c2 [M, ldc2] instead (column j
  // at c2[m·ldc2 + j − n_split]) — two stacked linears of the same input in one launch, each
  // output its own tensor; 0 < n_split < N, n_split % 128 == 0 (no tile straddles). Every
  // element's arithmetic is the single-output launch's: the same bits as two launches.
  void* c2 = nullptr;
  int64_t ldc2 = 0, n_split = 0;
  const int32_t* offsets = nullptr;  // grouped only: [E + 1] device, offsets[0] = 0, offsets[E] = M
  int64_t E = 0;                     // grouped only: experts
  // Dense only: no split-K, so a row's result is bitwise independent of M (every tile shape does
  // the same per-element arithmetic; only split-K changes the summation order).
  bool batch_invariant = false;
  // Tile: −1 by size, 0: 16 rows, 1: 64, 2: 128 (mma.sync; bitwise equal to each other), 3: 128
  // on wgmma (cuda_fp8_wgmma.cu: sm_90, no split-K; by size above 64 rows (grouped: rows per
  // expert) unless batch_invariant, since its bits differ from 0–2). Tests force it.
  int variant = -1;
  int64_t splits = 0;  // dense K splits: 0 by size, ≥ 1 forced (clamped to ceil(K/128))
  // The wgmma form only: blocks per cluster, each loading 1/cluster of every A tile and
  // multicasting it to the others (their column tiles are adjacent: the same rows, half the A
  // traffic from L2); 0: the form's default (2 for dense GEMMs of ≥ 2,048 rows and an even count of
  // 128-column tiles or at least 16, else 1: cuda_fp8_wgmma.cu); 1 or 2 forced. The bits do not
  // depend on it.
  int cluster = 0;
  // The wgmma form, dense with one-block clusters: w (and w_scale) are never written by a kernel
  // (placed weights), so each block's first stages of W may be fetched before its PDL wait,
  // under the previous kernel's tail (cuda_launch.cuh). The bits do not depend on it.
  bool w_stable = false;
  // The wgmma form, grouped (and its GLU form): a math warpgroup none of whose 64 rows belong to
  // the tile's expert (an expert's last tile, every tile of a decode step) passes over the tile's
  // stages without issuing MMAs, leaving the tensor cores to the other. Those MMAs' results were
  // never stored: the bits do not depend on it. false: they are issued (the lab's A/B).
  bool idle_skip = true;
  // The wgmma form, grouped: the second math warpgroup takes each tile's first K block alone, so the two
  // warpgroups' pairs of K blocks (each pair's second promotion runs with none of that
  // warpgroup's MMAs in flight) are one block apart. The same bits (the blocks are promoted in
  // K order either way); a lab switch: within the spread in the model (docs/perf.md, version 18).
  bool stagger = false;
  // The wgmma form, grouped, block-form weight scales (block_n 128, or 1 with w_scale_uniform): a
  // tile of at most 64 rows (an expert's last rows, every tile of a decode-sized step) runs on
  // both math warpgroups, each on 64 of its 128 columns (m64n64 MMAs), instead of one warpgroup
  // on all of them. The same bits (each element's MMAs and promotion are the wide tile's);
  // false: the wide path (the lab's A/B).
  bool narrow_tails = true;
  // The wgmma form, grouped, bf16 out, block-form weight scales, one-block clusters (elsewhere
  // ignored): 128 × 192 tiles (each stage's 40 KB of A and W feeding 1.5× the MMAs of a 128 × 128
  // tile's 32 KB; one K block in flight per warpgroup, no narrow tails) instead of 128 × 128. The
  // same bits. Faster at large steps only (CudaBackend::kN192MinRows).
  bool n192 = false;
  // The wgmma form, grouped, bf16 out, block-form weight scales, one-block clusters (checked):
  // the GEMM's A row i is row a_rows[i] / a_row_div of `a` ([a_src_rows, K]) and its scales are
  // that row of a_scale — the MoE's slots read straight from each token's quantized row, which
  // the loader warpgroup copies into the stages (cp.async) instead of a gather pass writing the
  // [M, K] copy first. The same bits as gathering the rows first (CudaFp8Gemm.GatheredRows*).
  // Null: A is [M, K] itself.
  const int32_t* a_rows = nullptr;  // [M] device
  int32_t a_row_div = 1;
  int64_t a_src_rows = 0;
};
// Whether fp8_wgmma_gemm takes Fp8GemmArgs::a_rows for these arguments (sm_90, grouped, bf16
// out, block-form weight scales, a one-block cluster).
bool fp8_wgmma_gather_ok(const Fp8GemmArgs& a);
// The dense launch's shape, a function of the sizes, the flags above, the SM count and the
// kernels' occupancy only (splits: as many as keep one wave of blocks resident, ≥ 2 K blocks each).
struct Fp8GemmPlan {
  int variant = 0;
  int64_t splits = 1, kb_per_split = 0;
  size_t workspace_bytes = 0;  // splits > 1: fp32 partials [splits, M, N]
};
Fp8GemmPlan fp8_gemm_plan(const Fp8GemmArgs& a);
// Dense form (offsets null). The split-K workspace (plan.workspace_bytes, none at 1 split) comes
// from `alloc`; the partials are summed in split order by a second kernel. Never synchronizes;
// grid and workspace depend on sizes only (CUDA-graph safe). Checks its preconditions (aborts).
void fp8_gemm(const Fp8GemmArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s);
// Grouped (MoE) form: M = total sorted rows (offsets[E]); the grid covers the bound
// ceil(M / tile rows) + min(E, M) tiles, surplus blocks exit at once. No split-K, no workspace,
// no host sync. Tile rows by the mean rows per expert unless a.variant forces them.
void fp8_grouped_gemm(const Fp8GemmArgs& a, cudaStream_t s);
int fp8_grouped_gemm_variant(const Fp8GemmArgs& a);
// The wgmma form (variant 3; cuda_fp8_wgmma.cu): whether this GPU runs it (sm_90), and the
// dense (offsets null) or grouped launch. 128×128 tiles, a TMA + mbarrier pipeline feeding
// m64n128k32 wgmmas, DeepGEMM's promotion per K block (block_n = 1: per output row and K block,
// the tile's column scales staged in shared memory). Preconditions (checked): sm_90, block_n 128
// or 1, K % 16 == 0, a and w 16-byte aligned.
bool fp8_wgmma_available();
void fp8_wgmma_gemm(const Fp8GemmArgs& a, cudaStream_t s);
// A gated MLP's gate|up GEMM with SiLU·mul and the down GEMM's quantizer in its epilogue: for a
// (W = each expert's 2I rows, gate then up — dense, offsets null: one such stack; N = 2I;
// block_n 1 with w_scale_uniform), q [M, I] e4m3 and q_scale [M, I / 128] are bitwise what the
// variant-3 GEMM writing gate|up in bf16 (fp8_grouped_gemm, or fp8_gemm dense) followed by
// silu_mul_quantize_fp8 write — without the [M, 2I] round trip. Whether it applies:
// fp8_wgmma_glu_ok (sm_90, I % 128 == 0, uniform scale blocks).
bool fp8_wgmma_glu_ok(int64_t I, bool w_scale_uniform);
void fp8_wgmma_glu_quantize(const Fp8GemmArgs& a, uint8_t* q, float* q_scale, cudaStream_t s);
// ---- cuda_invariant_gemm.cu ----
// The batch-invariant GEMMs' K structure: K is cut into splits of kInvariantSplitK (a function of
// K alone); each split folds its 16-wide chunks in increasing order from zero on the tensor cores
// (WMMA m16n16k16, fp32), and the splits' sums are added in split order. small_m_gemm runs the
// splits in parallel blocks (partials + an ordered sum), the tiled kernels in sequence in
// registers: the same arithmetic, so the same bits.
constexpr int64_t kInvariantSplitK = 512;
inline int64_t invariant_k_splits(int64_t K) {
  return K <= kInvariantSplitK ? 1 : (K + kInvariantSplitK - 1) / kInvariantSplitK;
}
// FP8 weights [rows, K] (one fp32 scale per (row, block_k columns)) widened to bf16 exactly as
// small_m_gemm and the tiled kernels widen them, bf16(float(code) · scale): with it the bf16
// wgmma GEMM's invariant form serves FP8 weights at large steps with the same bits.
bool widen_fp8_weights_ok(int64_t rows, int64_t K, int64_t block_k);  // K, block_k % 16 == 0
void widen_fp8_weights(const uint8_t* W, const float* scale, int64_t rows, int64_t K, int64_t block_k, bf16* out,
                       cudaStream_t s);
// Whether small_m_gemm takes these sizes: K % 8 == 0 (bf16), K and block_k % 16 == 0 (FP8).
bool small_m_gemm_ok(int64_t K, bool fp8, int64_t block_k);
// C[r, n] (row stride ldc) = Σ_k A[r, k] · W[e·N + n, k] over the rows r of each active expert
// (offsets [E + 1], active [n_active] as in the GEMV: the experts with rows first, then −1; rows
// counts the rows of all experts, max_rows bounds any one expert's) or, with active == null and
// n_active == 1, the dense rows [0, rows) (max_rows == rows). The batch-invariant K structure:
// bitwise equal to the tiled GEMMs with split_k = kInvariantSplitK (dense_gemm_tiled, MoE form 0
// with `invariant`) for every row, whatever the launch. Shaped for few rows: blocks of
// (64 columns, expert, K split) in 16-row passes; FP8 weights with max_rows ≤ kSmallMFewRows
// take small_m_fp8_few_rows instead. With more than one K split, `partials` holds
// [invariant_k_splits(K), rows, N] fp32 (else unused); C null then leaves them for the caller to
// add in split order (a fused consumer: the first term as is, then + each next), else a second
// launch adds them into C. k_splits false: all of K in one split (bf16 weights only; the tiled
// GEMMs' arithmetic without split_k). Graph-safe, no sync.
constexpr int64_t kSmallMFewRows = 4;
void small_m_gemm(const bf16* A, int64_t K, const void* W, const float* scale, bool fp8, int64_t block_k, int64_t N,
                  const int32_t* offsets, const int32_t* active, int64_t n_active, int64_t rows, int64_t max_rows,
                  float* C, int64_t ldc, float* partials, cudaStream_t s, bool k_splits = true);
// ---- cuda_small_m_fp8.cu ----
// small_m_gemm's arithmetic (the same bits) for FP8 weights (K, block_k % 16 == 0) when no
// expert has more than max_rows ≤ kSmallMFewRows rows, as a persistent grid of warps streaming
// (16 columns, K split) items through deep per-warp pipelines. out: C [rows, ld_out] when K is
// one split, else the partials [splits, rows, N] (ld_out = N), added by the caller. Graph-safe,
// no sync.
void small_m_fp8_few_rows(const bf16* A, int64_t K, const uint8_t* W, const float* scale, int64_t block_k, int64_t N,
                          const int32_t* offsets, const int32_t* active, int64_t n_active, int64_t rows,
                          int64_t max_rows, float* out, int64_t ld_out, cudaStream_t s);
// C[m, n] (row stride ldc) = Σ_k X[m, k] · W[n, k] in fp32 (X row stride ldx, W [N, K]), each
// element summed in one fixed order — per 256-wide K chunk, 32 fmaf chains (lane l: k = 4l..4l+3,
// then + 128) and a butterfly; the chunk sums added in order — batch-invariant, for the fp32
// router. partials
// null: each block adds its chunks in sequence; else [gemm_f32_ordered_chunks(K), M, N] fp32
// scratch and the chunks run in parallel blocks (few rows: latency), the same bits either way.
// tiled (with partials null): the register-tiled kernel of the same arithmetic (more reuse per
// load for many rows; the same bits).
int64_t gemm_f32_ordered_chunks(int64_t K);
void gemm_f32_ordered(const float* X, int64_t ldx, const float* W, int64_t M, int64_t N, int64_t K, float* C,
                      int64_t ldc, float* partials, cudaStream_t s, bool tiled = false);
// gemm_f32_ordered's parallel-chunk form (the same bits) in one launch: a block per 4 × 4 output
// tile with a warp per K chunk, the chunk sums added in order in shared memory — no partials, no
// second launch. For few rows (the invariant router at decode sizes). _ok: at most 32 chunks (K ≤
// 8,192). Graph-safe, no sync.
bool gemm_f32_ordered_fused_ok(int64_t K);
void gemm_f32_ordered_fused(const float* X, int64_t ldx, const float* W, int64_t M, int64_t N, int64_t K, float* C,
                            int64_t ldc, cudaStream_t s);

// ---- cuda_router_gemm.cu ----
// C[m, n] (row stride ldc) = Σ_k X[m, k] · W[n, k] in fp32-level precision on the bf16 tensor
// cores: X's values split into three bf16 parts in the kernel, W given as its image
// (router_split.h: build_router_image, `parts` 1 or 3 bf16 blocks per tile and chunk) — error
// fp32-level (RouterGemmCuda's bound: 1e-6 of Σ_k |X·W|; router_split.h, cuda_router_gemm.cu). The sums depend on M
// (K splits across a cluster, added in rank order: deterministic, not batch-invariant). X
// non-finite → NaN. _ok: sm_90, K % 64 == 0, X 16-byte aligned, ldx % 4 == 0. Graph-safe, no
// sync; PDL (loads the image before its wait).
bool router_gemm_ok(const float* X, int64_t ldx, int64_t K);
void router_gemm(const float* X, int64_t ldx, const uint16_t* image, int parts, int64_t M, int64_t N, int64_t K,
                 float* C, int64_t ldc, cudaStream_t s);


// ---- cuda_mla_prefill.cu ----
// The naive (prefill) form's attention on tensor cores, FlashAttention-2 style: per selected
// sequence, query rows q_row0 .. q_row0 + q_len − 1 are its LAST q_len positions of kv_len, row i
// seeing keys 0 .. kv_len − q_len + i; out = softmax(scale · [q_nope | q_pe]·[k_nope_h | k_pe]ᵀ)
// · v_h per head. bf16 q, K, V and probabilities; fp32 scores, softmax state and output.
// Deterministic, no atomics; only the sequences' own rows of out are written.
constexpr int64_t kMlaPrefillMaxSeqs = 64;  // sequences per launch (the table is a kernel argument)
struct MlaPrefillSeq {
  int32_t q_row0;    // its first row in q and out
  int32_t q_len;     // its query rows (0: skipped)
  int32_t kv_len;    // its keys, ≥ q_len (cached prefix + these rows)
  int32_t key_row0;  // its first key row in kv and lat
};
struct MlaPrefillArgs {
  const float* q;    // [T, H, dn + dr] fp32 = [q_nope | q_pe] per head, RoPE applied; 16-byte aligned
  // The wgmma kernel only (kernel ≠ 0): q_pe not yet rotated — [T, dr] fp32, row t token t's
  // rotation table (MlaQRope::table: cos of pair i at i, sine at dr / 2 + i; pairs (2i, 2i+1)),
  // applied as the kernel reads q, rope_from_table's values. Null: q is rotated. 16-byte aligned.
  const float* q_rope = nullptr;
  const bf16* kv;    // [n_keys, H·(dn + dv)] bf16: per key and head [k_nope_h | v_h] (kv_b decompressed)
  const bf16* lat;   // [n_keys, ld_lat] bf16: the gathered latents [c_kv | k_pe]; k_pe at column r
  int64_t ld_lat;    // ≥ r + dr, a multiple of 8
  int64_t H, dn, dr, dv, r;
  float scale;       // softmax scale (> 0)
  float* out;        // [T, H, dv] fp32 (unused, may be null, with out_q or out_b)
  // The wgmma kernel only (mla_prefill_wgmma_ok, kernel ≠ 0): the computed rows as o_proj's input
  // instead of `out` — out_q [T, H·dv] e4m3 codes with out_qs [T, H] fp32 scales (dv = 128: one
  // 1×128 group per head; quantize_fp8_rows_bf16's bits of out), or out_b [T, H·dv] bf16 (out
  // rounded, to_bf16's bits). Null: `out`.
  uint8_t* out_q = nullptr;
  float* out_qs = nullptr;
  bf16* out_b = nullptr;
  const MlaPrefillSeq* seqs;  // [n_seqs] host array, n_seqs ≤ kMlaPrefillMaxSeqs
  int64_t n_seqs;
  int64_t n_keys;    // rows of kv and lat (every sequence's keys lie inside)
  int kernel = -1;   // −1: the wgmma kernel where mla_prefill_wgmma_ok, else mma.sync; 0: mma.sync; 1: wgmma
};
// Whether mla_prefill takes these head dims: dn, dr, dv, r multiples of 8 (16-byte rows) with
// dn + dr ≤ 192 and dv ≤ 128 (instances <64, 64> and <192, 128>, zero-padded). Callers fall back
// to the TF32 GEMM path otherwise.
bool mla_prefill_supported(int64_t dn, int64_t dr, int64_t dv, int64_t r);
// One launch over the sequences' row tiles × heads (grid and argument table from the sizes only;
// no scratch, no sync, graph-capturable). Checks its preconditions (aborts).
void mla_prefill(const MlaPrefillArgs& a, cudaStream_t s);
// ---- cuda_mla_prefill_wgmma.cu ----
// The same attention on Hopper's wgmma (FlashAttention-3 style: TMA loads, 128-key tiles, P kept
// in registers): DeepSeek's head dims only (dn 128, dr 64, dv 128) on an sm_90 GPU. Same
// numerics and contract as mla_prefill (which dispatches to it); its results differ from the
// mma.sync kernel's in the rounding of p (per-tile maxima over 128 keys, not 32).
bool mla_prefill_wgmma_ok(int64_t dn, int64_t dr, int64_t dv, int64_t r);
void mla_prefill_wgmma(const MlaPrefillArgs& a, cudaStream_t s);
}  // namespace deepinfer::cuda
