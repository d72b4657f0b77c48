// The FP8 → bf16 widening of small_m_gemm's kernels (cuda_invariant_gemm.cu, cuda_small_m_fp8.cu):
// bf16(float(code) · scale), the tiled grouped GEMM's rounding, 16 e4m3 codes at a time; and the
// two-code conversions every CUDA-core or f16-MMA reader of e4m3 codes shares (the decode GEMVs,
// the tiled MoE GEMM, moe_one, the sublayer's FP8 rows).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace deepinfer::cuda {

// Two e4m3 codes (the low byte first) as an f16x2 (exact), e.g. an m16n8k16 f16 MMA operand.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | static_cast<uint32_t>(h.y) << 16;
}

// Two e4m3 codes (the low byte first) as floats: e4m3x2 → f16x2 → f32, exact.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_codes) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&hr));
}

// dst[0..16) = bf16(float(code_i) · scale) for the 16 codes of raw (byte i = code i). Two codes
// per conversion (e4m3x2 → f16x2 is exact, as is f16 → f32), two products per rounding: the
// values of the one-code form in half the instructions. dst 16-byte aligned.
__device__ __forceinline__ void widen_fp8x16(const uint4& raw, float scale, __nv_bfloat16* dst) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
  __align__(16) __nv_bfloat162 out[8];
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    const float2 f = e4m3x2_to_float2(u[v / 2] >> (16 * (v % 2)));
    out[v] = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  }
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
  *reinterpret_cast<uint4*>(dst + 8) = *reinterpret_cast<const uint4*>(out + 4);
}

}  // namespace deepinfer::cuda
