// One row's residual add and RMSNorm on a block of kNormThreads threads: the arithmetic of
// add_rms_norm's vectorized kernel (cuda_elementwise.cu), shared with the kernels that run it
// in their own prologue (cuda_norm_route.cu) so both give the same bits.
#pragma once

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_quant.cuh"

#include <cuda_fp8.h>

namespace deepinfer::cuda {
namespace {

constexpr int kNormThreads = 256;  // threads of a row's block (add_rms_norm_row)

__device__ __forceinline__ float load(const void* p, Elem e, int64_t i) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kBF16: return __bfloat162float(static_cast<const bf16*>(p)[i]);
    default: {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<const uint8_t*>(p)[i];
      return static_cast<float>(v);
    }
  }
}

// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the total: each
// warp's butterfly, then the warp sums added in warp order. partial: shared scratch of
// blockDim.x / 32 floats (block_sum: its own; block_sum_in: the caller's, for kernels whose
// shared memory is all dynamic).
__device__ __forceinline__ float block_sum_in(float v, float* partial) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float t = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) t += partial[w];
  return t;
}
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  return block_sum_in(v, partial);
}

// One row [D] (D % 4 == 0, D ≤ 4·kNormThreads·kVec, rows 16-byte aligned) on a block of exactly
// kNormThreads threads, in two halves so a kernel can write the row later than it reads it:
// norm_row_sum: v = res_in + delta, inv = rsqrt(Σ v² / D + eps) — thread t owns float4 chunks
// t + kNormThreads·x (x < kVec), kept in `r` between the halves; its sum of squares is its chunks
// in x order, then block_sum. Every thread must call it (block_sum's barriers).
// norm_row_store: o = w · (v · inv), w from norm_row_weight (NormWeight: the thread's chunks of the
// norm's weight, which a kernel may load before its PDL wait); writes, each where non-null: res_out ← v, out ← o, xs ← o
// (any address space, e.g. shared memory), and
//  - kRows 1 (D % 128 == 0): q ← o rounded to bf16 and quantized per 1×128 group (e4m3 codes
//    [D]), sq ← the groups' scales [D / 128] — a warp's 32 chunks are one group, so its amax is a
//    warp reduction — with cuda_fp8_quant.cuh's recipe on the same bf16 values as
//    quantize_fp8_rows_bf16: the same codes and scales (a maximum is exact in any order); every
//    thread of the block calls it then (the shuffles);
//  - kRows 2: q ← o rounded to bf16 ([D] bf16, to_bf16's rounding);
// and where `parts` is non-null, o as two bf16 parts [2·D]: parts[c] = RN(o_c), parts[D + c] =
// RN(o_c − RN(o_c)) — the difference exact in fp32, the sum within 2^-17·|o_c| of o_c — the
// fp32 router's operand on the bf16 tensor cores (CudaBackend::set_router_parts).
template <int kVec>
struct NormRow {
  float4 v[kVec];
  float inv;
};
// The thread's chunks of the norm's weight w [D] (F32, BF16 or e4m3: we) in fp32, loadable before
// the PDL wait (weights are never written once placed).
template <int kVec>
struct NormWeight {
  float4 w[kVec];
};

template <int kVec>
__device__ __forceinline__ void norm_row_weight(NormWeight<kVec>& nw, const void* w, Elem we, int64_t D) {
  const int n4 = static_cast<int>(D / 4);
#pragma unroll
  for (int x = 0; x < kVec; ++x) {
    const int j = threadIdx.x + kNormThreads * x;
    if (j >= n4) break;
    const int64_t c = 4 * static_cast<int64_t>(j);
    nw.w[x] = make_float4(load(w, we, c), load(w, we, c + 1), load(w, we, c + 2), load(w, we, c + 3));
  }
}

// Chunk x of the row: v = a + b (the residual's chunk and delta's) into r, its squares added to
// ss — the one spelling of that arithmetic (norm_row_add, and kernels computing delta in
// registers, cuda_moe.cu's combine_norm_kernel), so every caller rounds alike.
template <int kVec>
__device__ __forceinline__ void norm_row_chunk(NormRow<kVec>& r, int x, const float4& a, const float4& b, float& ss) {
  r.v[x] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  ss += r.v[x].x * r.v[x].x + r.v[x].y * r.v[x].y + r.v[x].z * r.v[x].z + r.v[x].w * r.v[x].w;
}

// v into r, and the thread's part of Σ v² (its chunks in x order).
template <int kVec>
__device__ __forceinline__ float norm_row_add(NormRow<kVec>& r, const float* res_in, const float* delta, int64_t D) {
  const int n4 = static_cast<int>(D / 4);
  const float4* r4 = reinterpret_cast<const float4*>(res_in);
  const float4* d4 = reinterpret_cast<const float4*>(delta);
  float ss = 0;
#pragma unroll
  for (int x = 0; x < kVec; ++x) {
    const int j = threadIdx.x + kNormThreads * x;
    if (j >= n4) break;
    norm_row_chunk(r, x, r4[j], d4[j], ss);
  }
  return ss;
}
template <int kVec>
__device__ __forceinline__ void norm_row_sum(NormRow<kVec>& r, const float* res_in, const float* delta, int64_t D,
                                             float eps) {
  r.inv = rsqrtf(block_sum(norm_row_add(r, res_in, delta, D)) / static_cast<float>(D) + eps);
}
// The same with the block sum's scratch from the caller (partial: kNormThreads / 32 floats of
// shared memory).
template <int kVec>
__device__ __forceinline__ void norm_row_sum_in(NormRow<kVec>& r, const float* res_in, const float* delta, int64_t D,
                                                float eps, float* partial) {
  r.inv = rsqrtf(block_sum_in(norm_row_add(r, res_in, delta, D), partial) / static_cast<float>(D) + eps);
}

template <int kVec, int kRows>
__device__ __forceinline__ void norm_row_store(const NormRow<kVec>& r, const NormWeight<kVec>& nw, int64_t D,
                                               float* res_out, float* out, uint8_t* q, float* sq, float* xs,
                                               bf16* parts = nullptr) {
  const int n4 = static_cast<int>(D / 4);
  const float inv = r.inv;
#pragma unroll
  for (int x = 0; x < kVec; ++x) {
    const int j = threadIdx.x + kNormThreads * x;
    if (j >= n4) break;  // (kRows 1: n4 % 32 == 0, so whole warps leave together)
    const float4 v = r.v[x];
    if (res_out != nullptr) reinterpret_cast<float4*>(res_out)[j] = v;
    const float4 w = nw.w[x];
    const float4 o = make_float4(w.x * (v.x * inv), w.y * (v.y * inv), w.z * (v.z * inv), w.w * (v.w * inv));
    if (out != nullptr) reinterpret_cast<float4*>(out)[j] = o;
    if (xs != nullptr) reinterpret_cast<float4*>(xs)[j] = o;
    if (parts != nullptr) {
      const __nv_bfloat162 h01 = __floats2bfloat162_rn(o.x, o.y), h23 = __floats2bfloat162_rn(o.z, o.w);
      const __nv_bfloat162 m01 =
          __floats2bfloat162_rn(__fsub_rn(o.x, __low2float(h01)), __fsub_rn(o.y, __high2float(h01)));
      const __nv_bfloat162 m23 =
          __floats2bfloat162_rn(__fsub_rn(o.z, __low2float(h23)), __fsub_rn(o.w, __high2float(h23)));
      uint2 hi, mid;
      hi.x = *reinterpret_cast<const uint32_t*>(&h01);
      hi.y = *reinterpret_cast<const uint32_t*>(&h23);
      mid.x = *reinterpret_cast<const uint32_t*>(&m01);
      mid.y = *reinterpret_cast<const uint32_t*>(&m23);
      reinterpret_cast<uint2*>(parts)[j] = hi;
      reinterpret_cast<uint2*>(parts + D)[j] = mid;
    }
    if constexpr (kRows == 2) {
      if (q != nullptr) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo);
        packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        reinterpret_cast<uint2*>(q)[j] = packed;
      }
    }
    if constexpr (kRows == 1) {
      if (q != nullptr) {  // uniform over the block: the shuffles below see whole warps
        const float b[4] = {__bfloat162float(__float2bfloat16(o.x)), __bfloat162float(__float2bfloat16(o.y)),
                            __bfloat162float(__float2bfloat16(o.z)), __bfloat162float(__float2bfloat16(o.w))};
        float amax = fmaxf(fmaxf(fabsf(b[0]), fabsf(b[1])), fmaxf(fabsf(b[2]), fabsf(b[3])));
#pragma unroll
        for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        const float sc = fp8_group_scale(amax), inv = fp8_scale_inverse(sc);
        const uint32_t lo = fp8_codes2(b[0], b[1], sc, inv), hi = fp8_codes2(b[2], b[3], sc, inv);
        reinterpret_cast<uint32_t*>(q)[j] = lo | (hi << 16);
        if (threadIdx.x % 32 == 0) sq[j / 32] = sc;
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda
