// The fp32 router GEMM's operand split and its weight image (cuda_router_gemm.cu reads both), in a
// header of its own (no CUDA includes) so that the CPU test checks the very layout and split the
// kernel relies on. Owns: the K permutation inside a 64-wide chunk, the image's layout, the host
// split. Does not own the kernel or its launch.
//
// Why: the MoE router's logits are an fp32 GEMM (the references compute F.linear in fp32; a bf16
// router flips experts at near-ties), C [M, E] = X [M, K] · Wᵀ. cuBLAS's SGEMM runs it at ~39 µs a
// V2-Lite layer at 4,096 rows — four times the 33.5 MB of X at the copy rate — on the CUDA cores
// (1.07 GFLOP of FFMA). Here each fp32 value becomes a sum of bf16 values and the products run on
// the bf16 tensor cores, whose products of two bf16 are exact in fp32:
//   x = xh + xm + xl,  xh = RN_bf16(x), xm = RN_bf16(x − xh), xl = RN_bf16(x − xh − xm)
// (both differences exact in fp32: x − RN_p(x) lies on x's ulp grid), |x − (xh + xm + xl)| ≤
// 2^-24·|x| — fp32's own rounding error. Weights likewise, except that checkpoints store the
// router in bf16 (V2, V3: the fp32 weights are bf16 values), so the image usually holds one part
// and x·w = xh·w + xm·w + xl·w takes three products; weights that are not bf16 values get three
// parts and the six products of order ≤ 2 (the dropped three are ≤ 2^-24·|x·w| each).
//
// The image: per 64-row N tile and 64-wide K chunk, `parts` blocks of 64 rows × 64 bf16 (8 KB
// each) in the shared-memory form the wgmma descriptors read — row r's 16-byte unit u at unit
// u ^ (r % 8) of its 128-byte row (the 128-byte swizzle) — so one stage of the kernel is one
// contiguous copy. Inside a chunk the K order is permuted (router_phys_k) so that each thread's
// wgmma A fragment is 16 contiguous fp32 of X per row: a dot product does not care about its
// terms' order, as long as X and W agree on it.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace deepinfer::cuda {

constexpr int64_t kRouterChunkK = 64;   // K per pipeline chunk: one 128-byte bf16 row per part
constexpr int64_t kRouterTileN = 64;    // W rows per tile: the wgmma's n64
constexpr int64_t kRouterTileM = 64;    // X rows per block: one warpgroup's m64
constexpr int64_t kRouterBlockElems = kRouterTileN * kRouterChunkK;  // one part of one (tile, chunk)

// The column inside a 64-wide chunk of X and W that the wgmma sees at logical k = L (k16 step
// s = L / 16, index c = L % 16 inside it). Thread t = lane % 4 of a warp holds the A fragment's
// columns c ∈ {2t, 2t + 1, 2t + 8, 2t + 9} of every step (mma.m16n8k16's A layout, which wgmma's
// register A shares); they map to 16t + 4s + {0, 1, 2, 3}: one float4 per step and row, the four
// steps' float4 side by side.
constexpr int router_phys_k(int L) {
  const int s = L / 16, c = L % 16;
  const int t = (c % 8) / 2, j = 2 * (c / 8) + c % 2;
  return 16 * t + 4 * s + j;
}

// The offset (in bf16 elements) of (row r, logical k L) inside one 64 × 64 block of the image:
// 128-byte rows, the 16-byte unit L / 8 stored at unit (L / 8) ^ (r % 8).
constexpr int64_t router_image_offset(int r, int L) { return r * 64 + (((L / 8) ^ (r % 8)) * 8) + L % 8; }

// 1 where every value of w [n] is a bf16 value (the checkpoints' routers), else 3.
inline int router_image_parts(const float* w, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (bf16_to_f32(f32_to_bf16(w[i])) != w[i]) return 3;  // NaN too: NaN != NaN
  return 1;
}

// x's three bf16 parts (hi, mid, lo), as bits: the split above, rounding to nearest even.
inline void router_split(float x, uint16_t (&p)[3]) {
  p[0] = f32_to_bf16(x);
  const float r = x - bf16_to_f32(p[0]);
  p[1] = f32_to_bf16(r);
  p[2] = f32_to_bf16(r - bf16_to_f32(p[1]));
}

// The image's (tile, chunk) pairs: ceil(N / 64) tiles × K / 64 chunks, `parts` blocks each.
inline int64_t router_image_chunks(int64_t N, int64_t K) {
  return (N + kRouterTileN - 1) / kRouterTileN * (K / kRouterChunkK);
}
// The image's size in bf16 elements.
inline int64_t router_image_elems(int64_t N, int64_t K, int parts) {
  return router_image_chunks(N, K) * parts * kRouterBlockElems;
}

// image [ceil(N / 64)][K / 64][parts][64 × 64] bf16 bits ← W [N, K] fp32 (row-major), as above;
// rows past N are zero. Preconditions: K % 64 == 0, parts 1 (W's values all bf16) or 3, image
// holding router_image_elems(N, K, parts) elements.
inline void build_router_image(const float* w, int64_t N, int64_t K, int parts, uint16_t* image) {
  const int64_t n_tiles = (N + kRouterTileN - 1) / kRouterTileN, n_chunks = K / kRouterChunkK;
  std::memset(image, 0, static_cast<size_t>(router_image_elems(N, K, parts)) * sizeof(uint16_t));
  for (int64_t nt = 0; nt < n_tiles; ++nt)
    for (int64_t ch = 0; ch < n_chunks; ++ch) {
      uint16_t* blocks = image + (nt * n_chunks + ch) * parts * kRouterBlockElems;
      for (int r = 0; r < kRouterTileN && nt * kRouterTileN + r < N; ++r)
        for (int L = 0; L < kRouterChunkK; ++L) {
          const float v = w[(nt * kRouterTileN + r) * K + ch * kRouterChunkK + router_phys_k(L)];
          uint16_t p[3];
          router_split(v, p);
          for (int b = 0; b < parts; ++b) blocks[b * kRouterBlockElems + router_image_offset(r, L)] = p[b];
        }
    }
}

}  // namespace deepinfer::cuda
