// x / s for DeepSeek's activation quantizer (cuda_fp8_quant.cuh) through s's reciprocal, in a
// header of its own (no library includes) so that the CPU test compiles the very formula the
// device runs.
//
// The recipe divides each value of a 1×128 group by the group's scale s with an IEEE division
// (then rounds the quotient to e4m3). __fdiv_rn costs a reciprocal approximation, its refinement
// and a range check per value; the quantizers were bound by their instruction count (run s37-2:
// the MoE's SiLU·mul-quantize issues 39 lane-instructions per value). Here the group's
// reciprocal inv = RN(1/s) is computed once (__frcp_rn) and each value takes a product and two
// fmas — Markstein's correction: with inv correctly rounded and q = RN(x · inv) within an ulp of
// x / s, the residual r = x − q·s is exact and RN(q + r · inv) is the correctly rounded quotient
// (Handbook of Floating-Point Arithmetic, §5.3), so every code is the division's. The theorem
// needs r not to underflow, i.e. |x| above ~2^-100; a quotient the e4m3 rounding does not send to
// ±0 needs |x / s| ≥ 2^-10 with s ≥ 1e-4 / 448 (the recipe's floor), so |x| ≥ 2^-32 — far inside.
// Below, the quotient may differ in its last bits but its code is ±0 either way. The quotient's
// sign is x's (s > 0); the formula alone would turn x = −0 into +0 (r = +0 + −0 = +0), so x's sign
// bit is or-ed in at the end (for a nonzero quotient a no-op; one LOP3 on the device).
// tests/backend/fp8_scale_div_test.cpp checks the formula against IEEE division on the host.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define DI_FP8_HD __host__ __device__
#else
#define DI_FP8_HD
#endif

namespace deepinfer {

// RN(x / s) for inv = RN(1 / s), wherever |x| ≥ 2^-100 (see above); s a positive normal float.
DI_FP8_HD inline float div_by_scale(float x, float s, float inv) {
#ifdef __CUDA_ARCH__
  const float q = __fmul_rn(x, inv);
  const float y = __fmaf_rn(__fmaf_rn(-q, s, x), inv, q);
  return __uint_as_float(__float_as_uint(y) | (__float_as_uint(x) & 0x80000000u));
#else
  const float q = x * inv;
  const float y = std::fma(std::fma(-q, s, x), inv, q);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(y) | (std::bit_cast<uint32_t>(x) & 0x80000000u));
#endif
}

}  // namespace deepinfer

#undef DI_FP8_HD
