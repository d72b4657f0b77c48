// MLA attention kernels of the CUDA backend (part 1: correct and simple; part 2 replaces the
// decode kernel with a split-KV FlashMLA-class kernel behind the same launcher).
//  - mla_decode: the absorbed form over the paged latent cache, whole. One block per (query
//    row, head): q̃ = W_UKᵀ q_nope in fp32, then each of its 4 warps takes every 4th key with an
//    online softmax (lanes hold the latent dimensions strided by 32), the warps' partial states
//    merge in shared memory, and out = W_UV · o_lat is written in fp32. No bf16 rounding of
//    q or o_lat (only the cache is bf16).
//  - the naive (prefill) form is cuBLAS GEMMs (cuda_backend.cpp) around gather_latent and
//    causal_softmax: K/V decompressed to fp32, scores and P·V in TF32.
#include "backend/cuda/cuda_common.h"

#include <cfloat>

namespace deepinfer::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxRPerLane = 16;   // kv_lora_rank ≤ 512
constexpr int kMaxPePerLane = 2;   // qk_rope_head_dim ≤ 64

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sequence owning query row `row`: the largest b with q_indptr[b] ≤ row.
__device__ __forceinline__ int64_t seq_of_row(const int32_t* q_indptr, int64_t n_seqs, int64_t row) {
  int64_t lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (q_indptr[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kWarps * 32) mla_decode_kernel(MlaDecodeArgs a) {
  const int64_t row = blockIdx.x, h = blockIdx.y;
  const int64_t b = seq_of_row(a.q_indptr, a.n_seqs, row);
  if (row >= a.q_indptr[b + 1]) return;  // a row of no sequence (cannot happen in a valid batch)
  if (a.seq_mask != nullptr && a.seq_mask[b] == 0) return;
  const int64_t q_len = a.q_indptr[b + 1] - a.q_indptr[b];
  const int64_t pos = a.kv_len[b] - q_len + (row - a.q_indptr[b]);
  const int64_t n_keys = pos + 1;
  const int64_t width = a.r + a.dr, dqk = a.dn + a.dr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16* w_uk = a.kv_b + h * (a.dn + a.dv) * a.r;  // [dn, r]
  const bf16* w_uv = w_uk + a.dn * a.r;                   // [dv, r]

  __shared__ float sm_q[kMaxRPerLane * 32];      // q_nope, then reused for o_lat
  __shared__ float sm_qlat[kMaxRPerLane * 32];
  __shared__ float sm_m[kWarps], sm_l[kWarps];
  __shared__ float sm_acc[kWarps][kMaxRPerLane * 32];

  // q̃[c] = Σ_j q_nope[j] · W_UK[j, c] (coalesced over c).
  const float* qrow = a.q + (row * a.H + h) * dqk;
  for (int64_t j = threadIdx.x; j < a.dn; j += blockDim.x) sm_q[j] = qrow[j];
  __syncthreads();
  for (int64_t c = threadIdx.x; c < a.r; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < a.dn; ++j) acc += sm_q[j] * __bfloat162float(w_uk[j * a.r + c]);
    sm_qlat[c] = acc;
  }
  __syncthreads();

  float ql[kMaxRPerLane], qp[kMaxPePerLane], acc[kMaxRPerLane];
#pragma unroll
  for (int t = 0; t < kMaxRPerLane; ++t) {
    const int64_t c = lane + 32 * t;
    ql[t] = c < a.r ? sm_qlat[c] : 0.0f;
    acc[t] = 0.0f;
  }
#pragma unroll
  for (int t = 0; t < kMaxPePerLane; ++t) {
    const int64_t c = lane + 32 * t;
    qp[t] = c < a.dr ? qrow[a.dn + c] : 0.0f;
  }
  const int32_t* pages = a.block_ids + a.block_indptr[b];
  float m = -FLT_MAX, l = 0.0f;
  for (int64_t s = warp; s < n_keys; s += kWarps) {
    const bf16* lat = a.cache + (static_cast<int64_t>(pages[s / a.block_size]) * a.block_size + s % a.block_size) * width;
    float lv[kMaxRPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxRPerLane; ++t) {
      const int64_t c = lane + 32 * t;
      lv[t] = c < a.r ? __bfloat162float(lat[c]) : 0.0f;
      dot += ql[t] * lv[t];
    }
#pragma unroll
    for (int t = 0; t < kMaxPePerLane; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < a.dr) dot += qp[t] * __bfloat162float(lat[a.r + c]);
    }
    const float score = warp_sum(dot) * a.scale;
    const float m_new = fmaxf(m, score);
    const float corr = __expf(m - m_new), p = __expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int t = 0; t < kMaxRPerLane; ++t) acc[t] = acc[t] * corr + p * lv[t];
    m = m_new;
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int t = 0; t < kMaxRPerLane; ++t) sm_acc[warp][lane + 32 * t] = acc[t];
  __syncthreads();
  float M = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w]);
  float L = 0.0f, f[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    f[w] = sm_l[w] > 0.0f ? __expf(sm_m[w] - M) : 0.0f;  // warps that saw no key contribute nothing
    L += sm_l[w] * f[w];
  }
  float* o_lat = sm_q;  // q_nope is no longer needed
  for (int64_t c = threadIdx.x; c < a.r; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += sm_acc[w][c] * f[w];
    o_lat[c] = o / L;
  }
  __syncthreads();
  // out[j] = Σ_c W_UV[j, c] · o_lat[c]: a warp per output, lanes over c (coalesced).
  float* out = a.out + (row * a.H + h) * a.dv;
  for (int64_t j = warp; j < a.dv; j += kWarps) {
    float v = 0.0f;
    for (int64_t c = lane; c < a.r; c += 32) v += __bfloat162float(w_uv[j * a.r + c]) * o_lat[c];
    v = warp_sum(v);
    if (lane == 0) out[j] = v;
  }
}

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

void mla_decode(const MlaDecodeArgs& a, cudaStream_t s) {
  if (a.T == 0 || a.n_seqs == 0) return;
  DI_CUDA_REQUIRE(a.r <= kMaxRPerLane * 32);
  DI_CUDA_REQUIRE(a.dn <= kMaxRPerLane * 32);
  DI_CUDA_REQUIRE(a.dr <= kMaxPePerLane * 32);
  mla_decode_kernel<<<dim3(static_cast<unsigned>(a.T), static_cast<unsigned>(a.H)), kWarps * 32, 0, s>>>(a);
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
