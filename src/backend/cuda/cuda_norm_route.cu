// A MoE layer's input at one token in one launch: the residual add and the FFN's RMSNorm
// (add_rms_norm_quantized), the fp32 router GEMV (the batch-invariant router's fixed-order dot
// products, gemm_f32_ordered) and the routing (moe_route) — three launches of the op path, each
// a link in a B = 1 step's chain of dependent kernels.
//
// A block per kNrCols experts (16 blocks at V2-Lite's 64, 64 at V3's 256), kNormThreads threads:
//  - before the PDL wait (weights only): its router rows [kNrCols, D] prefetched into L2, the
//    thread's chunks of the norm's weight into registers;
//  - after it: the token's row normed (cuda_norm_row.cuh) into shared memory — block 0 also
//    writes it and its quantized form out —, the block's logits by chunk_sums
//    (cuda_f32_ordered.cuh), a warp per 256-wide K chunk, the chunk sums added in chunk order,
//    written to a scratch [E];
//  - the last block to arrive (a device counter, acq_rel; that block resets it for the next
//    launch) writes the residual (every block has read it by then) and routes on one warp
//    (route_row, cuda_moe_route.cuh) from the logits.
// Each piece is the op path's own arithmetic: the norm add_rms_norm's vectorized kernel's, the
// logits the invariant router's (gemm_f32_ordered in any of its forms), the routing the route
// kernel's — so the outputs equal the batch-invariant mode's three launches bit for bit (the
// default mode's router GEMV sums in another order: its logits differ in the last bits).
// Measured (docs/perf.md, version 29): faster than the three launches before FP8 experts (the
// W8A8 one-token kernel, the grouped GEMVs), slower before the bf16 one-token kernel — the
// backend picks it where the norm's rows are FP8 codes (CudaBackend::set_norm_route_fused).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_f32_ordered.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_moe_route.cuh"
#include "backend/cuda/cuda_norm_row.cuh"

namespace deepinfer::cuda {
namespace {

constexpr int kNrCols = 4;  // experts per block (the ordered GEMM's tile width)
constexpr int kNrWarps = kNormThreads / 32;

__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// Dynamic shared memory (floats): xs [D] | sums [chunks][kNrCols] | lg [E] | route slice.
template <int kVec, int kRows>
__global__ void __launch_bounds__(kNormThreads) norm_route_kernel(NormRouteArgs a) {
  extern __shared__ __align__(16) float smem[];
  __shared__ bool last;
  const int64_t D = a.D, E = a.route.E, chunks = (D + kF32ChunkK - 1) / kF32ChunkK;
  float* xs = smem;
  float* sums = xs + D;
  float* lg = sums + chunks * kNrCols;
  float* slice = lg + E;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kNrCols;
  const int n_cols = static_cast<int>(E - n0 < kNrCols ? E - n0 : kNrCols);
  if (threadIdx.x == 0) prefetch_l2(a.router + n0 * D, static_cast<uint32_t>(n_cols * D * sizeof(float)));
  NormWeight<kVec> nw;
  norm_row_weight(nw, a.norm, a.norm_elem, D);
  pdl_wait();
  pdl_trigger();

  // Block 0 writes the normed row and its quantized form; the residual waits for the last block
  // (every block reads it).
  NormRow<kVec> r;
  norm_row_sum(r, a.residual, a.delta, D, a.eps);
  const bool first = blockIdx.x == 0;
  norm_row_store<kVec, kRows>(r, nw, D, nullptr, first ? a.out : nullptr,
                              first && a.q_kind != 0 ? static_cast<uint8_t*>(a.q) : nullptr, first ? a.sq : nullptr,
                              xs);
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t c = warp; c < chunks; c += kNrWarps) {
    float v[1][kNrCols];
    chunk_sums<1, kNrCols>(v, xs, D, a.router + n0 * D, 1, n_cols, D, 0, 0, c, lane, true);
    if (lane == 0)
#pragma unroll
      for (int j = 0; j < kNrCols; ++j) sums[c * kNrCols + j] = v[0][j];
  }
  __syncthreads();
  if (threadIdx.x < n_cols) {
    float total = sums[threadIdx.x];
    for (int64_t c = 1; c < chunks; ++c) total = total + sums[c * kNrCols + threadIdx.x];
    a.logits[n0 + threadIdx.x] = total;
  }
  // The arrival: the block barrier orders the block's logits before thread 0's release, its
  // acquire every earlier arrival's logits before the block's reads (grid_sync's pattern).
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long old;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;\n" : "=l"(old) : "l"(a.counter) : "memory");
    last = old == gridDim.x - 1;
    if (last) *a.counter = 0;  // no other block of this launch touches it again
  }
  __syncthreads();
  if (!last) return;
  {  // the residual, which every block has read by now
    const int n4 = static_cast<int>(D / 4);
#pragma unroll
    for (int x = 0; x < kVec; ++x) {
      const int j = static_cast<int>(threadIdx.x) + kNormThreads * x;
      if (j < n4) reinterpret_cast<float4*>(a.residual)[j] = r.v[x];
    }
  }
  if (warp != 0) return;
  for (int64_t e = lane; e < E; e += 32) lg[e] = __ldcg(a.logits + e);
  __syncwarp();
  route_row(a.route, lg, slice, lane, a.route.ids, a.route.weights);
}

size_t norm_route_smem(int64_t D, int64_t E) {
  return sizeof(float) * static_cast<size_t>(D + (D + kF32ChunkK - 1) / kF32ChunkK * kNrCols + E + kRouteSmemFloats);
}

}  // namespace

bool norm_route_ok(int64_t D, int64_t E, int64_t n_group, int64_t top_k, int q_kind) {
  return D % 4 == 0 && D > 0 && D <= 4 * kNormThreads * 8 && (q_kind != 1 || D % kFp8GroupK == 0) && E > 0 &&
         E <= kRouteMaxExperts && n_group <= kRouteMaxGroups && top_k >= 1 && top_k <= 32 &&
         norm_route_smem(D, E) <= 48 * 1024;
}

void norm_route(const NormRouteArgs& a, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(norm_route_ok(a.D, a.route.E, a.route.n_group, a.route.top_k, a.q_kind),
                      "norm_route: a shape its kernel does not take (norm_route_ok)");
  DI_CUDA_REQUIRE(a.route.T == 1);
  const unsigned grid = static_cast<unsigned>((a.route.E + kNrCols - 1) / kNrCols);
  const size_t smem = norm_route_smem(a.D, a.route.E);
  const bool wide = a.D > 4 * kNormThreads * 2;
  if (a.q_kind == 1) {
    if (wide) launch_pdl(norm_route_kernel<8, 1>, grid, kNormThreads, smem, s, a);
    else launch_pdl(norm_route_kernel<2, 1>, grid, kNormThreads, smem, s, a);
  } else if (a.q_kind == 2) {
    if (wide) launch_pdl(norm_route_kernel<8, 2>, grid, kNormThreads, smem, s, a);
    else launch_pdl(norm_route_kernel<2, 2>, grid, kNormThreads, smem, s, a);
  } else {
    if (wide) launch_pdl(norm_route_kernel<8, 0>, grid, kNormThreads, smem, s, a);
    else launch_pdl(norm_route_kernel<2, 0>, grid, kNormThreads, smem, s, a);
  }
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
