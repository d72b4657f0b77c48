// DeepSeek's 1×128 activation quantization recipe, the one definition every kernel applying it
// inlines (cuda_fp8_gemm.cu's row quantizers, the FP8 wgmma GEMM's SiLU·mul-quantize epilogue,
// the attention sublayer's invariant FP8 form),
// so their codes and scales agree bitwise: a group's scale s = max(amax, 1e-4) / 448 (IEEE
// division; DeepSeek's act_quant clamp: an all-zero group gets 1e-4 / 448), each value's code
// e4m3_satfinite_rn(x / s) (IEEE division: the CPU reference reproduces every bit) — computed
// from the group's reciprocal of s (fp8_scale_div.h: the same quotient, a third of the work).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/fp8_scale_div.h"

namespace deepinfer::cuda {

constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-4f;

// The scale of a group whose largest |x| is amax.
__device__ __forceinline__ float fp8_group_scale(float amax) { return __fdiv_rn(fmaxf(amax, kAmaxFloor), kE4m3Max); }

// The reciprocal fp8_codes2 takes with a group's scale s: RN(1 / s), once per group.
__device__ __forceinline__ float fp8_scale_inverse(float s) { return __frcp_rn(s); }

// The e4m3 codes of a and b at scale s, inv = fp8_scale_inverse(s) (a in the low byte): the
// codes of a / s and b / s (IEEE quotients, fp8_scale_div.h).
__device__ __forceinline__ __nv_fp8x2_storage_t fp8_codes2(float a, float b, float s, float inv) {
  return __nv_cvt_float2_to_fp8x2(make_float2(div_by_scale(a, s, inv), div_by_scale(b, s, inv)), __NV_SATFINITE,
                                  __NV_E4M3);
}

// One group quantized by a half-warp (threads 16h .. 16h + 15 of their warp; all 32 lanes take
// part in the shuffles): this thread's 8 values v of the group, its codes to q (8 bytes, 8-byte
// aligned) and, from the half's first thread, the group's scale to *scale — where store.
__device__ __forceinline__ void quantize_group8(const float (&v)[8], bool store, uint8_t* q, float* scale) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float sc = fp8_group_scale(amax), inv = fp8_scale_inverse(sc);
  if (store) {
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __nv_fp8x2_storage_t lo = fp8_codes2(v[4 * h], v[4 * h + 1], sc, inv);
      const __nv_fp8x2_storage_t hi = fp8_codes2(v[4 * h + 2], v[4 * h + 3], sc, inv);
      w[h] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    *reinterpret_cast<uint2*>(q) = make_uint2(w[0], w[1]);
    if (threadIdx.x % 16 == 0) *scale = sc;
  }
}

}  // namespace deepinfer::cuda
