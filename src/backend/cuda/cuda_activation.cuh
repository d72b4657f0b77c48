// The SiLU-and-multiply of a gated MLP, the one definition every kernel applying it inlines
// (the element-wise silu_mul and the MoE path's fused split-sum), so the results agree bitwise.
#pragma once

namespace deepinfer::cuda {

// silu(g) · u = g / (1 + e^−g) · u, in fp32.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

}  // namespace deepinfer::cuda
