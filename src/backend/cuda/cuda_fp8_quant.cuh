// DeepSeek's 1×128 activation quantization recipe, the one definition every kernel applying it
// inlines (cuda_fp8_gemm.cu's row quantizers, the FP8 wgmma GEMM's SiLU·mul-quantize epilogue),
// so their codes and scales agree bitwise: a group's scale s = max(amax, 1e-4) / 448 (IEEE
// division; DeepSeek's act_quant clamp: an all-zero group gets 1e-4 / 448), each value's code
// e4m3_satfinite_rn(x / s) (IEEE division: the CPU reference reproduces every bit).
#pragma once

#include <cuda_fp8.h>

namespace deepinfer::cuda {

constexpr float kE4m3Max = 448.0f;
constexpr float kAmaxFloor = 1e-4f;

// The scale of a group whose largest |x| is amax.
__device__ __forceinline__ float fp8_group_scale(float amax) { return __fdiv_rn(fmaxf(amax, kAmaxFloor), kE4m3Max); }

// The e4m3 codes of a and b at scale s (a in the low byte).
__device__ __forceinline__ __nv_fp8x2_storage_t fp8_codes2(float a, float b, float s) {
  return __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(a, s), __fdiv_rn(b, s)), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace deepinfer::cuda
