// RoPE on the CUDA backend's devices: a token's rotation table and the rotation of one channel
// pair, shared by every kernel that rotates (rope, the latent write, the fused MLA sublayer), so
// each rounds a pair the same way.
#pragma once

#include "backend/cuda/cuda_common.h"

namespace deepinfer::cuda {

// Pair i's angle, pos · inv_freq[i] in fp32 (like transformers), and its entries of a RoPE table
// from it: cs[i] = cos(angle) · attention_factor, cs[kRopeMaxHalf + i] the sine, in double like
// the reference backend. Apart, a kernel may load the angles early and hide the cosines and
// sines behind another wait (cuda_mla_sublayer.cu).
__device__ __forceinline__ float rope_angle(const RopeArgs& a, int32_t pos, int i) {
  return static_cast<float>(pos) * a.inv_freq[i];
}
__device__ __forceinline__ void rope_entries(const RopeArgs& a, float angle, int i, float* cs) {
  cs[i] = static_cast<float>(cos(static_cast<double>(angle))) * a.attention_factor;
  cs[kRopeMaxHalf + i] = static_cast<float>(sin(static_cast<double>(angle))) * a.attention_factor;
}
// A token's RoPE table at position pos (every pair's entries). Block-wide; ends with a barrier.
__device__ inline void rope_table(const RopeArgs& a, int32_t pos, float* cs) {
  for (int i = threadIdx.x; i < a.half; i += blockDim.x) rope_entries(a, rope_angle(a, pos, i), i, cs);
  __syncthreads();
}

// Pair (x0, x1) rotated by cosine c and sine s: (x0·c − x1·s, x1·c + x0·s), each one fma after
// one multiply, spelled out so that every kernel rotating a pair rounds it the same way.
__device__ __forceinline__ void rotate_cs(float c, float s, float x0, float x1, float& y0, float& y1) {
  y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
  y1 = __fmaf_rn(x1, c, __fmul_rn(x0, s));
}
// Pair (x0, x1) rotated by table entry i.
__device__ __forceinline__ void rotate(const float* cs, int64_t i, float x0, float x1, float& y0, float& y1) {
  rotate_cs(cs[i], cs[kRopeMaxHalf + i], x0, x1, y0, y1);
}
// The two channels of pair i of a head: (2i, 2i+1) interleaved, else (i, i + half).
__device__ __forceinline__ int64_t pair_a(const RopeArgs& a, int64_t i) { return a.interleave ? 2 * i : i; }
__device__ __forceinline__ int64_t pair_b(const RopeArgs& a, int64_t i) { return a.interleave ? 2 * i + 1 : i + a.half; }
// Rotates pair i of the head at v.
__device__ __forceinline__ void rope_pair(const RopeArgs& a, const float* cs, float* v, int64_t i) {
  const int64_t ia = pair_a(a, i), ib = pair_b(a, i);
  rotate(cs, i, v[ia], v[ib], v[ia], v[ib]);
}

}  // namespace deepinfer::cuda
