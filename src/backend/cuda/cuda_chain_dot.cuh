// The batch-invariant mode's bf16 dot products at one token, by one warp on the tensor cores:
// each output is what that mode's GEMMs compute for a row in any batch (.cu files only).
//
// Those GEMMs (small_m_gemm, the tiled and wgmma kernels; cuda_common.h's K structure) fold each
// output's K in 16-wide chunks, one mma.sync.m16n8k16 (bf16 operands, fp32 accumulation; WMMA's
// m16n16k16 is two of these) per chunk in k order from zero. The same MMA with the same operands
// in the same roles gives the same bits: here x is row 0 of the A operand (rows 1..15 zero — an
// output of row 0 does not depend on them) and 8 weight rows are B's 8 columns (B column-major
// = the rows as stored, so ldmatrix without .trans), so one warp computes 8 outputs of one token.
// Users: the one-token MoE kernel's chain form (cuda_moe_one.cu, all of K in one chain), the
// attention sublayer's invariant form (cuda_mla_sublayer.cu, the dense linears' 512-wide splits).
#pragma once

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ptx.cuh"

namespace deepinfer::cuda {

// A's fragments for the two 16-wide chunks at k0 and k0 + 16 with x (bf16 in shared memory, as
// 32-bit words xw) as row 0: lanes 0..3 hold row 0's k = k0 + 2i, +1 (a[0]) and k0 + 8 + 2i, +1
// (a[2]); every other register is zero. k0 % 32 == 0.
__device__ __forceinline__ void chain_a_row0(const uint32_t* xw, int k0, int lane, uint32_t (&a0)[4],
                                             uint32_t (&a1)[4]) {
  const bool row0 = lane < 4;
  const int w = k0 / 2 + lane % 4;  // x's word holding k = k0 + 2i, k0 + 2i + 1
  a0[0] = row0 ? xw[w] : 0u;
  a0[1] = 0u;
  a0[2] = row0 ? xw[w + 4] : 0u;
  a0[3] = 0u;
  a1[0] = row0 ? xw[w + 8] : 0u;
  a1[1] = 0u;
  a1[2] = row0 ? xw[w + 12] : 0u;
  a1[3] = 0u;
}

// Σ_k w[j][k]·x[k], k < K, for 8 weight rows j in one chain from zero (all of K: the MoE's
// one-chain structure). row_addr: the shared-memory address of row lane % 8 (its K bf16
// contiguous); x: K bf16 in shared memory. Lane l addresses its row at k offset 8·(l / 8) of a
// 32-wide span, so the 8 rows' starts should differ mod 128 bytes in 16-byte steps (rows staged
// 16 bytes past a multiple of 128 apart: no bank conflicts). K % 32 == 0. Lane i < 4 returns the
// sums of rows 2i (y0) and 2i + 1 (y1).
__device__ __forceinline__ void chain_dot8(uint32_t row_addr, int K, const bf16* x, int lane, float& y0, float& y1) {
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(x);
  uint32_t addr = row_addr + static_cast<uint32_t>(lane / 8) * 16;
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
  for (int k0 = 0; k0 < K; k0 += 32, addr += 64) {
    uint32_t b[4];  // chunk k0: b[0], b[1]; chunk k0 + 16: b[2], b[3]
    ldmatrix_x4(b, addr);
    uint32_t a0[4], a1[4];
    chain_a_row0(xw, k0, lane, a0, a1);
    mma_bf16_16816(c, a0, b[0], b[1]);
    mma_bf16_16816(c, a1, b[2], b[3]);
  }
  y0 = c[0];
  y1 = c[1];
}

// The same sums in the dense linears' K structure (cuda_common.h): K cut into kInvariantSplitK
// (512) wide splits, each one chain from zero, the split sums added in split order (the first as
// is) — small_m_gemm's blocks and their ordered sum, or the tiled kernels' close_k_split. Four
// splits' chains advance together (independent accumulators): per 32-wide step the four loads,
// then each chain's first MMA, then each chain's second, so four MMAs can be in flight.
// K % 32 == 0; the last split may be shorter.
__device__ __forceinline__ void chain_dot8_splits(uint32_t row_addr, int K, const bf16* x, int lane, float& y0,
                                                  float& y1) {
  constexpr int kSplit = static_cast<int>(kInvariantSplitK), kAtOnce = 4;
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(x);
  const uint32_t addr = row_addr + static_cast<uint32_t>(lane / 8) * 16;
  float t0 = 0.0f, t1 = 0.0f;
  for (int s0 = 0; s0 * kSplit < K; s0 += kAtOnce) {
    float c[kAtOnce][4] = {};
#pragma unroll 2
    for (int j = 0; j < kSplit; j += 32) {
      uint32_t b[kAtOnce][4], a0[kAtOnce][4], a1[kAtOnce][4];
      bool live[kAtOnce];
#pragma unroll
      for (int u = 0; u < kAtOnce; ++u) {
        const int k0 = (s0 + u) * kSplit + j;
        live[u] = k0 < K;  // warp-uniform
        if (live[u]) {
          ldmatrix_x4(b[u], addr + 2 * static_cast<uint32_t>(k0));
          chain_a_row0(xw, k0, lane, a0[u], a1[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kAtOnce; ++u)
        if (live[u]) mma_bf16_16816(c[u], a0[u], b[u][0], b[u][1]);
#pragma unroll
      for (int u = 0; u < kAtOnce; ++u)
        if (live[u]) mma_bf16_16816(c[u], a1[u], b[u][2], b[u][3]);
    }
#pragma unroll
    for (int u = 0; u < kAtOnce; ++u) {
      const int s = s0 + u;
      if (s * kSplit >= K) break;
      t0 = s == 0 ? c[u][0] : t0 + c[u][0];
      t1 = s == 0 ? c[u][1] : t1 + c[u][1];
    }
  }
  y0 = t0;
  y1 = t1;
}

}  // namespace deepinfer::cuda
