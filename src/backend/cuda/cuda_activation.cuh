// The SiLU-and-multiply of a gated MLP, the one definition every kernel applying it inlines
// (the element-wise silu_mul and the MoE path's fused split-sum), so the results agree bitwise.
#pragma once

namespace deepinfer::cuda {

// silu(g) · u = g / (1 + e^−g) · u, in fp32, with the hardware's exp2 and reciprocal
// (__expf, __fdividef: a few ulp each, ~3e-7 relative, far below the bf16 rounding every caller
// applies next) instead of the IEEE expf and division: a third fewer instructions in the
// half-warp SiLU·mul quantizer (PTX 265 → 179), which was bound by its instruction count (its
// time at the 4K FP8 prefill 2.64 → 2.17 ms; docs/perf.md version 18). g → −∞: e^−g overflows to inf and the quotient is −0 (the limit, 0);
// g → +∞: g; NaN stays NaN.
__device__ __forceinline__ float silu_times(float g, float u) { return __fdividef(g, 1.0f + __expf(-g)) * u; }

}  // namespace deepinfer::cuda
