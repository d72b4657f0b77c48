// Sixteen FP8 weight rows against one activation row on the tensor cores, by one warp: the dot
// every one-token FP8 reader of staged weight rows shares (cuda_moe_one.cu's stages,
// cuda_gemv_fp8_ring.cu's ring).
//
// fp8_rows_dot: rows ρ = 0..15 (K e4m3 codes each at sw + ρ·ld, shared memory; their nk scales
// at sc + ρ·nk, one per block_k = gpb·64 columns) against xs (K f16 in shared memory: bf16(x)·2^−e,
// the caller's staging) — the weights as the A operand of m16n8k16 f16 MMAs (fp32 sums), x as
// column 0 of B (the other columns zero). Per scale block the MMAs sum from zero, then · the
// row's scale is added to the row's sum, blocks in order; lanes 4g return rows g and g + 8 in
// y0, y8 (the other lanes: unspecified). K is permuted as the decode GEMV's tensor-core form
// permutes it: lane (g = lane/4, i = lane%4) holds row g's and row g+8's 16 codes at columns
// 64·c + 16i .. + 15 of 64-column group c, and MMA j of the group takes codes 4j .. 4j + 3 of
// them in its k slots 2i, 2i + 1, 2i + 8, 2i + 9 — B's lanes 0..3 hold x at the same columns.
// kFp8Interleave scale blocks at a time run as independent MMA chains, interleaved MMA by MMA (a
// block's chain is 4·gpb dependent MMAs), the remaining nk mod kFp8Interleave blocks one at a
// time; each block still sums from zero and its scaled sum is added in block order, so the
// result is the one-block-at-a-time loop's bit for bit.
// Shared-memory banks: a 16-byte load's quarter-warp reads rows g and g + 1 at the same column,
// conflict-free when ld ≡ 64 (mod 128) (cuda_gemv_fp8_ring.cu pads its rows so), two-way when
// ld ≡ 0 (mod 128). sw, xs and every row 16-byte aligned.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace deepinfer::cuda {

// One warp stages an activation row for the f16 MMAs of the FP8 GEMVs (fp8_rows_dot here,
// cuda_gemv_fp8_tc.cu's dot): dst[k] = f16(bf16(row[k]) · 2^−e) for k < K, where e ≥ 0 is the
// least keeping every |bf16(row[k])| · 2^−e < 2^14 (e = 0 unless the row holds a magnitude past
// 16,384) — exact for every magnitude in [2^−14 · 2^e, 2^14 · 2^e]; returns 2^e (the sums' factor
// back). row: K fp32 (kF32) or bf16 values, 16-byte aligned (global memory); dst: K f16, 16-byte
// aligned (shared memory); K % 128 == 0. Every lane of the warp calls it; it begins with a
// __syncwarp (the warp's reads of the previous row are done) and ends with one (dst visible).
template <bool kF32>
__device__ __forceinline__ float stage_row_f16_warp(const void* row, int64_t K, __half* dst, int lane) {
  __syncwarp();
  auto quad = [&](int64_t k) {  // row[k..k+3] rounded to bf16, as floats
    if constexpr (kF32) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(row) + k / 4);
      const float2 lo = __bfloat1622float2(__floats2bfloat162_rn(v.x, v.y));
      const float2 hi = __bfloat1622float2(__floats2bfloat162_rn(v.z, v.w));
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row) + k / 4);
      return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                         __uint_as_float(v.y & 0xffff0000u));
    }
  };
  float amax = 0.0f;
  for (int64_t k = 4 * lane; k < K; k += 128) {
    const float4 v = quad(k);
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const int e = amax > 16384.0f ? ilogbf(amax) - 13 : 0;  // |a| · 2^−e < 2^14
  const float inv = ldexpf(1.0f, -e);
  for (int64_t k = 4 * lane; k < K; k += 128) {  // the row again, from L1
    const float4 v = quad(k);
    const __half2 lo = __floats2half2_rn(v.x * inv, v.y * inv), hi = __floats2half2_rn(v.z * inv, v.w * inv);
    *reinterpret_cast<uint2*>(dst + k) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
  __syncwarp();
  return ldexpf(1.0f, e);
}

constexpr int kMmaGroup = 64;  // fp8_rows_dot: columns a lane's 16-byte chunk covers in 4 MMAs

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kFp8Interleave = 4;
// Blocks kb0 .. kb0 + N − 1 of fp8_rows_dot (all < nk), their scaled sums added to y0, y8 in order.
template <int N>
__device__ __forceinline__ void fp8_rows_blocks(const unsigned char* sw, int64_t ld, const float* sc, int nk, int gpb,
                                                const __half* xs, int g, int i, int kb0, float& y0, float& y8) {
  float c[N][4] = {};
  for (int gr = 0; gr < gpb; ++gr) {
    uint4 w0[N], w8[N], xa[N], xb[N];
#pragma unroll
    for (int bb = 0; bb < N; ++bb) {
      const int64_t col = (int64_t{kb0 + bb} * gpb + gr) * kMmaGroup + 16 * i;
      w0[bb] = *reinterpret_cast<const uint4*>(sw + g * ld + col);
      w8[bb] = *reinterpret_cast<const uint4*>(sw + (g + 8) * ld + col);
      xa[bb] = xb[bb] = make_uint4(0, 0, 0, 0);
      if (g == 0) {
        xa[bb] = *reinterpret_cast<const uint4*>(xs + col);
        xb[bb] = *reinterpret_cast<const uint4*>(xs + col + 8);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int bb = 0; bb < N; ++bb) {
        const uint32_t r0 = j == 0 ? w0[bb].x : j == 1 ? w0[bb].y : j == 2 ? w0[bb].z : w0[bb].w;
        const uint32_t r8 = j == 0 ? w8[bb].x : j == 1 ? w8[bb].y : j == 2 ? w8[bb].z : w8[bb].w;
        const uint32_t x0 = j == 0 ? xa[bb].x : j == 1 ? xa[bb].z : j == 2 ? xb[bb].x : xb[bb].z;
        const uint32_t x1 = j == 0 ? xa[bb].y : j == 1 ? xa[bb].w : j == 2 ? xb[bb].y : xb[bb].w;
        const uint32_t a[4] = {e4m3x2_to_f16x2(r0 & 0xffffu), e4m3x2_to_f16x2(r8 & 0xffffu), e4m3x2_to_f16x2(r0 >> 16),
                               e4m3x2_to_f16x2(r8 >> 16)};
        mma_f16_16816(c[bb], a, x0, x1);
      }
    }
  }
  if (i == 0) {
#pragma unroll
    for (int bb = 0; bb < N; ++bb) {
      y0 = fmaf(c[bb][0], sc[g * nk + kb0 + bb], y0);
      y8 = fmaf(c[bb][2], sc[(g + 8) * nk + kb0 + bb], y8);
    }
  }
}
// ld: the row stride in bytes (≥ the row's nk·block_k codes).
__device__ __forceinline__ void fp8_rows_dot(const unsigned char* sw, int64_t ld, const float* sc, int nk, int gpb,
                                             const __half* xs, int lane, float& y0, float& y8) {
  const int g = lane / 4, i = lane % 4;
  y0 = 0.0f, y8 = 0.0f;
  int kb = 0;
  for (; kb + kFp8Interleave <= nk; kb += kFp8Interleave)
    fp8_rows_blocks<kFp8Interleave>(sw, ld, sc, nk, gpb, xs, g, i, kb, y0, y8);
  for (; kb < nk; ++kb) fp8_rows_blocks<1>(sw, ld, sc, nk, gpb, xs, g, i, kb, y0, y8);
}
#endif

}  // namespace deepinfer::cuda
