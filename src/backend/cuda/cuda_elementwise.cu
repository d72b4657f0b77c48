// Element-wise and row-wise kernels of the CUDA backend: one thread block per row for the
// reductions (RMSNorm), grid-stride loops elsewhere. All fp32 math; bf16 only in storage.
#include "backend/cuda/cuda_activation.cuh"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_quant.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_norm_row.cuh"
#include "backend/cuda/cuda_rope.cuh"

#include <cuda_fp8.h>

namespace deepinfer::cuda {
namespace {

__global__ void embedding_kernel(const void* table, Elem e, const int32_t* ids, int64_t D, float* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t row = ids[t];
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[t * D + j] = load(table, e, row * D + j);
}

__global__ void rms_norm_kernel(const float* x, int64_t x_stride, const void* w, Elem we, int64_t D, float eps,
                                float* out, int64_t out_stride) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const float* xr = x + t * x_stride;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) ss = __fmaf_rn(xr[j], xr[j], ss);
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(D) + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[t * out_stride + j] = load(w, we, j) * (xr[j] * inv);
}

__global__ void add_rms_norm_kernel(float* res, const float* delta, const void* w, Elem we, int64_t D, float eps,
                                    float* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  float* r = res + t * D;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = r[j] + delta[t * D + j];
    r[j] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(D) + eps);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[t * D + j] = load(w, we, j) * (r[j] * inv);
}

__global__ void to_bf16_kernel(const float* x, int64_t x_stride, int64_t rows, int64_t cols, bf16* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = __float2bfloat16(x[r * x_stride + c]);
  }
}

// The same values, 8 per thread (two 16-byte loads, one 16-byte store), a block per row strip:
// block (r, y) converts columns [y·8·256, ...) of row r — no 64-bit division per element (the
// scalar kernel ran at ~1.2 TB/s, instruction-bound, run s14-6). Needs cols % 8 == 0, x_stride % 4
// == 0, x and out 16-byte aligned.
__global__ void to_bf16_vec_kernel(const float* x, int64_t x_stride, int64_t cols, bf16* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.x, c = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  if (c >= cols) return;
  const float4 a = *reinterpret_cast<const float4*>(x + r * x_stride + c);
  const float4 b = *reinterpret_cast<const float4*>(x + r * x_stride + c + 4);
  const __nv_bfloat162 v[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                               __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
  *reinterpret_cast<uint4*>(out + r * cols + c) = *reinterpret_cast<const uint4*>(v);
}

__global__ void dequant_fp8_kernel(const uint8_t* q, const float* scale, int64_t N, int64_t K, int64_t bn,
                                   int64_t bk, int64_t n_kb, bf16* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = N * K;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / K, c = i % K;
    __nv_fp8_e4m3 v;
    v.__x = q[i];
    out[i] = __float2bfloat16(static_cast<float>(v) * scale[(r / bn) * n_kb + c / bk]);
  }
}

__global__ void rope_kernel(float* x, int64_t heads, int64_t stride, int64_t offset, const int32_t* positions,
                            RopeArgs a) {
  // The token's cos/sin once for all heads (double-precision trigonometry is the kernel's cost),
  // before the wait for the previous kernel (positions are a step input; see mla_kv_write_kernel).
  __shared__ float cs[2 * kRopeMaxHalf];
  const int64_t t = blockIdx.x;
  rope_table(a, positions[t], cs);
  pdl_wait();
  pdl_trigger();
  for (int64_t k = threadIdx.x; k < heads * a.half; k += blockDim.x)
    rope_pair(a, cs, x + (t * heads + k / a.half) * stride + offset, k % a.half);
}

// Pairs (2i, 2i+1) at [offset, offset + 2·half) of token t's heads by table row t (cos at i, sine
// at half + i): the values rope_kernel gives where the table holds rope_table's entries.
__global__ void rope_from_table_kernel(float* x, int64_t heads, int64_t stride, int64_t offset, const float* table,
                                       int half) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const float* cs = table + t * 2 * half;
  for (int64_t k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int64_t i = k % half;
    float* v = x + (t * heads + k / half) * stride + offset + 2 * i;
    rotate_cs(cs[i], cs[half + i], v[0], v[1], v[0], v[1]);
  }
}

// Token t's latent: rms_norm_kernel's arithmetic on kv[t, :r] (launched with the block size
// rms_norm would use, so block_sum adds the same partials), rope_kernel's on kv[t, r:] (one
// head), then kv_write_kernel's store of the whole row; with q.q, rope_kernel's on the token's
// query heads too, from the same table; with q.table, the table stored there instead (after the
// wait: the buffer is step memory the previous kernel may still read). Every load is issued
// before the first barrier and every value is stored from the registers that computed it (the
// row is not read back): one global round trip per block, not four (28 µs per V2-Lite layer at
// 4,096 tokens, run s21-3, for ~14 MB).
// Needs r ≤ kKvPerThread · blockDim.x and a.half ≤ blockDim.x.
constexpr int kKvPerThread = 4;
__global__ void mla_kv_write_kernel(float* kv, int64_t width, int64_t r, const void* w, Elem we, float eps,
                                    const int32_t* positions, RopeArgs a, const int32_t* slots, void* cache,
                                    Elem ce, MlaQRope q) {
  __shared__ float cs[2 * kRopeMaxHalf];
  const int64_t t = blockIdx.x;
  // The rotation table first, before the wait for the previous kernel: it reads only the step's
  // positions (an input, never written by a kernel), so its trigonometry overlaps that kernel.
  rope_table(a, positions[t], cs);
  pdl_wait();
  pdl_trigger();
  float* x = kv + t * width;
  float v[kKvPerThread];
  float ss = 0;
#pragma unroll
  for (int u = 0; u < kKvPerThread; ++u) {
    const int64_t j = threadIdx.x + int64_t{u} * blockDim.x;
    v[u] = j < r ? x[j] : 0.0f;
  }
  const bool pe = threadIdx.x < a.half;  // this thread rotates k_pe's pair threadIdx.x
  const int64_t ia = pair_a(a, threadIdx.x), ib = pair_b(a, threadIdx.x);
  float p0 = 0, p1 = 0;
  if (pe) p0 = x[r + ia], p1 = x[r + ib];
  if (q.q != nullptr) {  // the queries' pairs, independent of the norm
    for (int64_t k = threadIdx.x; k < q.heads * a.half; k += blockDim.x)
      rope_pair(a, cs, q.q + (t * q.heads + k / a.half) * q.stride + q.offset, k % a.half);
  } else if (q.table != nullptr && pe) {  // the table, for the queries' reader
    float* row = q.table + t * 2 * a.half;
    row[threadIdx.x] = cs[threadIdx.x];
    row[a.half + threadIdx.x] = cs[kRopeMaxHalf + threadIdx.x];
  }
#pragma unroll
  for (int u = 0; u < kKvPerThread; ++u)
    if (threadIdx.x + int64_t{u} * blockDim.x < r) ss = __fmaf_rn(v[u], v[u], ss);
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(r) + eps);
  const int64_t slot = slots[t];
  auto put = [&](int64_t j, float val) {
    x[j] = val;
    if (ce == Elem::kBF16) static_cast<bf16*>(cache)[slot * width + j] = __float2bfloat16(val);
    else static_cast<float*>(cache)[slot * width + j] = val;
  };
#pragma unroll
  for (int u = 0; u < kKvPerThread; ++u) {
    const int64_t j = threadIdx.x + int64_t{u} * blockDim.x;
    if (j < r) put(j, load(w, we, j) * (v[u] * inv));
  }
  if (pe) {
    float y0, y1;
    rotate(cs, threadIdx.x, p0, p1, y0, y1);
    put(r + ia, y0);
    put(r + ib, y1);
  }
  // Channels past r + 2·half (none at DeepSeek's shapes) are cached as they are.
  for (int64_t j = r + 2 * a.half + threadIdx.x; j < width; j += blockDim.x) put(j, x[j]);
}

__global__ void silu_mul_kernel(const float* g, int64_t T, int64_t I, void* out, Elem oe) {
  pdl_wait();
  pdl_trigger();
  const int64_t n = T * I;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / I, c = i % I;
    const float v = silu_times(g[t * 2 * I + c], g[t * 2 * I + I + c]);
    if (oe == Elem::kBF16) static_cast<bf16*>(out)[i] = __float2bfloat16(v);
    else static_cast<float*>(out)[i] = v;
  }
}

__global__ void kv_write_kernel(const float* latent, const int32_t* slots, int64_t width, void* cache, Elem ce) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    const float v = latent[t * width + j];
    if (ce == Elem::kBF16) static_cast<bf16*>(cache)[slot * width + j] = __float2bfloat16(v);
    else static_cast<float*>(cache)[slot * width + j] = v;
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t D, float* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = blockIdx.x;
  const int64_t r = rows[i];
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[i * D + j] = x[r * D + j];
}

__global__ void add_kernel(float* out, const float* x, int64_t n) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] += x[i];
}

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(void* data, Elem e, int64_t n, uint64_t seed, bool normal, float a, float b) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t r = splitmix(seed ^ splitmix(static_cast<uint64_t>(i)));
    float v;
    if (normal) {
      const float s = static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
      v = (s / 65536.0f - 2.0f) * 1.7320508f * a;
    } else {
      v = a + (b - a) * static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    }
    if (e == Elem::kF32) static_cast<float*>(data)[i] = v;
    else if (e == Elem::kBF16) static_cast<bf16*>(data)[i] = __float2bfloat16(v);
    else static_cast<uint8_t*>(data)[i] = __nv_fp8_e4m3(v).__x;
  }
}

__global__ void resolve_tokens_kernel(int32_t* ids, int64_t n, const int32_t* pending) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n && ids[i] < 0) ids[i] = max(0, pending[-static_cast<int64_t>(ids[i]) - 1]);
}

// add_rms_norm for D % 4 == 0, D ≤ 1024·kVec: a block of kNormThreads per row, norm_row_sum and
// norm_row_store (cuda_norm_row.cuh: the row read once, written twice, 16-byte accesses) — kRows
// 1: out's row also quantized per 1×128 group (e4m3 codes q [T, D], scales sq [T, D / 128]);
// kRows 2: out's row rounded to bf16 into q [T, D] bf16; with parts, out's row also as two bf16
// parts into parts [T, 2·D].
template <int kVec, int kRows>
__global__ void __launch_bounds__(kNormThreads)
    add_rms_norm_vec_kernel(float* res, const float* delta, const void* w, Elem we, int64_t D, float eps, float* out,
                            uint8_t* q, float* sq, bf16* parts) {
  NormWeight<kVec> nw;
  norm_row_weight(nw, w, we, D);  // before the wait: its HBM latency off the chain
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  NormRow<kVec> r;
  norm_row_sum(r, res + t * D, delta + t * D, D, eps);
  norm_row_store<kVec, kRows>(r, nw, D, res + t * D, out + t * D,
                              kRows == 0 ? nullptr : q + t * D * (kRows == 2 ? 2 : 1),
                              kRows == 1 ? sq + t * (D / kFp8GroupK) : nullptr, nullptr,
                              parts == nullptr ? nullptr : parts + t * 2 * D);
}

constexpr unsigned kMaxGrid = 65535u * 16u;
unsigned elementwise_grid(int64_t n) { return grid_for(n, 256) < kMaxGrid ? grid_for(n, 256) : kMaxGrid; }
unsigned row_threads(int64_t D) { return D >= 1024 ? 1024u : D >= 256 ? 256u : 128u; }

}  // namespace

void embedding(const void* table, Elem e, const int32_t* ids, int64_t T, int64_t D, float* out, cudaStream_t s) {
  if (T == 0 || D == 0) return;
  launch_pdl(embedding_kernel, static_cast<unsigned>(T), row_threads(D), 0, s, table, e, ids, D, out);
  DI_CUDA_LAUNCHED();
}

void rms_norm(const float* x, int64_t x_stride, const void* w, Elem we, int64_t D, float eps, float* out,
              int64_t out_stride, int64_t T, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(rms_norm_kernel, static_cast<unsigned>(T), row_threads(D), 0, s, x, x_stride, w, we, D, eps, out,
             out_stride);
  DI_CUDA_LAUNCHED();
}

// add_rms_norm_vec_kernel for x's rows of form q_kind (0 none, 1 e4m3 codes q with scales sq, 2
// bf16 rows q) and, where parts is non-null, its two-part rows: the one launcher behind
// add_rms_norm, add_rms_norm_quantized, add_rms_norm_bf16 and add_rms_norm_parts. False
// (nothing launched) unless the kernel takes the shapes: D % 4 == 0 (% 128 for codes), D ≤
// 4·kNormThreads·8, residual / delta / out 16-byte aligned, codes 4-byte, bf16 rows and parts
// 8-byte.
static bool add_rms_norm_vec(float* residual, const float* delta, const void* w, Elem we, int64_t D, float eps,
                             float* out, int q_kind, void* q, float* sq, bf16* parts, int64_t T, cudaStream_t s) {
  auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  const bool vec = D % 4 == 0 && (q_kind != 1 || D % kFp8GroupK == 0) && D <= 4 * kNormThreads * 8 &&
                   aligned(residual, 16) && aligned(delta, 16) && aligned(out, 16) &&
                   aligned(q, q_kind == 1 ? 4 : 8) && aligned(parts, 8);
  if (!vec) return false;
  if (T == 0) return true;
  auto* qb = static_cast<uint8_t*>(q);
  auto launch = [&](auto kernel) {
    launch_pdl(kernel, static_cast<unsigned>(T), kNormThreads, 0, s, residual, delta, w, we, D, eps, out, qb, sq,
               parts);
  };
  const bool narrow = D <= 4 * kNormThreads * 2;
  if (q_kind == 0) narrow ? launch(add_rms_norm_vec_kernel<2, 0>) : launch(add_rms_norm_vec_kernel<8, 0>);
  else if (q_kind == 1) narrow ? launch(add_rms_norm_vec_kernel<2, 1>) : launch(add_rms_norm_vec_kernel<8, 1>);
  else narrow ? launch(add_rms_norm_vec_kernel<2, 2>) : launch(add_rms_norm_vec_kernel<8, 2>);
  DI_CUDA_LAUNCHED();
  return true;
}

void add_rms_norm(float* residual, const float* delta, const void* w, Elem we, int64_t D, float eps, float* out,
                  int64_t T, cudaStream_t s) {
  if (T == 0) return;
  if (add_rms_norm_vec(residual, delta, w, we, D, eps, out, 0, nullptr, nullptr, nullptr, T, s)) return;
  launch_pdl(add_rms_norm_kernel, static_cast<unsigned>(T), row_threads(D), 0, s, residual, delta, w, we, D, eps, out);
  DI_CUDA_LAUNCHED();
}

bool add_rms_norm_quantized(float* residual, const float* delta, const void* w, Elem we, int64_t D, float eps,
                            float* out, uint8_t* q, float* sq, int64_t T, cudaStream_t s) {
  return add_rms_norm_vec(residual, delta, w, we, D, eps, out, 1, q, sq, nullptr, T, s);
}

bool add_rms_norm_bf16(float* residual, const float* delta, const void* w, Elem we, int64_t D, float eps, float* out,
                       bf16* xb, int64_t T, cudaStream_t s) {
  return add_rms_norm_vec(residual, delta, w, we, D, eps, out, 2, xb, nullptr, nullptr, T, s);
}

bool add_rms_norm_parts(float* residual, const float* delta, const void* w, Elem we, int64_t D, float eps, float* out,
                        int q_kind, void* q, float* sq, bf16* parts, int64_t T, cudaStream_t s) {
  return parts != nullptr && q_kind >= 0 && q_kind <= 2 &&
         add_rms_norm_vec(residual, delta, w, we, D, eps, out, q_kind, q, sq, parts, T, s);
}

void to_bf16(const float* x, int64_t x_stride, int64_t rows, int64_t cols, bf16* out, cudaStream_t s) {
  if (rows * cols == 0) return;
  if (cols % 8 == 0 && x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0 && rows < (int64_t{1} << 31) && cols / 8 / 256 < 65535) {
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((cols / 8 + 255) / 256));
    launch_pdl(to_bf16_vec_kernel, grid, 256, 0, s, x, x_stride, cols, out);
  } else {
    launch_pdl(to_bf16_kernel, elementwise_grid(rows * cols), 256, 0, s, x, x_stride, rows, cols, out);
  }
  DI_CUDA_LAUNCHED();
}

void dequant_fp8(const uint8_t* q, const float* scale, int64_t N, int64_t K, int64_t bn, int64_t bk, int64_t n_kb,
                 bf16* out, cudaStream_t s) {
  if (N * K == 0) return;
  launch_pdl(dequant_fp8_kernel, elementwise_grid(N * K), 256, 0, s, q, scale, N, K, bn, bk, n_kb, out);
  DI_CUDA_LAUNCHED();
}

void rope(float* x, int64_t T, int64_t heads, int64_t stride, int64_t offset, const int32_t* positions,
          const RopeArgs& args, cudaStream_t s) {
  if (T == 0 || args.half == 0) return;
  launch_pdl(rope_kernel, static_cast<unsigned>(T), 128, 0, s, x, heads, stride, offset, positions, args);
  DI_CUDA_LAUNCHED();
}

void mla_kv_write(float* kv, int64_t T, int64_t width, int64_t r, const void* w, Elem we, float eps,
                  const int32_t* positions, const RopeArgs& args, const int32_t* slots, void* cache, Elem ce,
                  const MlaQRope& q, cudaStream_t s) {
  if (T == 0) return;
  const unsigned threads = row_threads(r);
  DI_CUDA_REQUIRE_MSG(r <= kKvPerThread * int64_t{threads} && args.half <= static_cast<int>(threads),
                      "mla_kv_write: the latent is too wide for one block");
  launch_pdl(mla_kv_write_kernel, static_cast<unsigned>(T), threads, 0, s, kv, width, r, w, we, eps, positions, args,
             slots, cache, ce, q);
  DI_CUDA_LAUNCHED();
}

void rope_from_table(float* x, int64_t T, int64_t heads, int64_t stride, int64_t offset, const float* table,
                     int half, cudaStream_t s) {
  if (T == 0 || half == 0) return;
  launch_pdl(rope_from_table_kernel, static_cast<unsigned>(T), 128, 0, s, x, heads, stride, offset, table, half);
  DI_CUDA_LAUNCHED();
}

void silu_mul(const float* gate_up, int64_t T, int64_t I, void* out, Elem oe, cudaStream_t s) {
  if (T * I == 0) return;
  launch_pdl(silu_mul_kernel, elementwise_grid(T * I), 256, 0, s, gate_up, T, I, out, oe);
  DI_CUDA_LAUNCHED();
}

void kv_write(const float* latent, const int32_t* slots, int64_t T, int64_t width, void* cache, Elem ce,
              cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(kv_write_kernel, static_cast<unsigned>(T), 128, 0, s, latent, slots, width, cache, ce);
  DI_CUDA_LAUNCHED();
}

void gather_rows(const float* x, const int32_t* rows, int64_t R, int64_t D, float* out, cudaStream_t s) {
  if (R == 0 || D == 0) return;
  launch_pdl(gather_rows_kernel, static_cast<unsigned>(R), row_threads(D), 0, s, x, rows, D, out);
  DI_CUDA_LAUNCHED();
}

void add(float* out, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(add_kernel, elementwise_grid(n), 256, 0, s, out, x, n);
  DI_CUDA_LAUNCHED();
}

void resolve_tokens(int32_t* ids, int64_t n, const int32_t* pending, cudaStream_t s) {
  if (n == 0) return;
  resolve_tokens_kernel<<<grid_for(n, 256), 256, 0, s>>>(ids, n, pending);
  DI_CUDA_LAUNCHED();
}

void fill_random(void* data, Elem e, int64_t n, uint64_t seed, bool normal, float a, float b, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<<<elementwise_grid(n), 256, 0, s>>>(data, e, n, seed, normal, a, b);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
