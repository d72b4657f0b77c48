// The pieces the two one-token MoE kernels share (cuda_moe_one.cu, cuda_moe_one_w8a8.cu; .cu
// files only): the producer's turn before each stage and the final combine. Both kernels order
// the same way: the shared slices' stages first (their experts known before the router runs),
// then the routed ones, then phase B; the combine in the grouped kernel's slot order.
#pragma once

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The producer warp's turn before stage q of kStages ring slots: waits until the slot is free;
// at the first stage past the shared slices' (q ≥ n_shared_stages), the PDL wait — the routed
// experts come from the previous kernel — and lane l < k takes ids[l] into my_e (lanes k.. hold
// the shared slices' experts from the start). mark(m): the timeline's marks 1 (the shared
// stages issued) and 2 (the wait returned), from lane 0. Returns the ring slot.
template <int kStages, typename Mark>
__device__ __forceinline__ int moe_one_producer_turn(int64_t q, uint64_t* empty, int64_t n_shared_stages,
                                                     const int32_t* ids, int64_t k, int lane, int64_t& my_e,
                                                     bool& waited, Mark mark) {
  const int st = static_cast<int>(q % kStages);
  mbar_wait(&empty[st], static_cast<uint32_t>(((q / kStages) & 1) ^ 1));
  if (!waited && q >= n_shared_stages) {
    if (lane == 0) mark(1);
    pdl_wait();
    if (lane < k) my_e = ids[lane];
    if (lane == 0) mark(2);
    waited = true;
  }
  return st;
}

// out[j0 + r] = Σ_{s<k} w_s·ys[s][r] in slot order, then + ys[s][r] of each shared slot
// (s = k .. slots − 1) — the grouped kernel's combine (cuda_moe.cu) — for r < rows, by threads
// t, t + n_threads, ...; ys [slots][rows_max] in shared memory, complete.
__device__ __forceinline__ void moe_one_combine(const float* ys, int64_t rows, int64_t rows_max, int64_t k,
                                                int64_t slots, const float* weights, float* out, int t,
                                                int n_threads) {
  for (int64_t r = t; r < rows; r += n_threads) {
    float o = 0.0f;
    for (int64_t s = 0; s < k; ++s) o = fmaf(__ldcg(weights + s), ys[s * rows_max + r], o);
    for (int64_t s = k; s < slots; ++s) o += ys[s * rows_max + r];
    out[r] = o;
  }
}
#endif

}  // namespace deepinfer::cuda
