// The pieces the two one-token MoE kernels share (cuda_moe_one.cu, cuda_moe_one_w8a8.cu; .cu
// files only): the producer's turn before each stage and the final combine. Both kernels order
// the same way: the shared slices' stages first (their experts known before the router runs),
// then the routed ones, then phase B; the combine in the grouped kernel's slot order.
#pragma once

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_moe_route.cuh"
#include "backend/cuda/cuda_sm90.cuh"

namespace deepinfer::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The routing in the kernel (MoeOneArgs::logits): the producer warp routes the token itself.
struct MoeOneRouting {
  RouteArgs args;         // route_row's fields
  const float* logits;    // [E], the router's
  int32_t* s_ids;         // [k] shared memory: the routed experts
  float* s_w;             // [k] shared memory: their weights
  int32_t* ids_out;       // [k] global (block 0), else null
  float* w_out;           // [k]
  uint64_t* done;         // an mbarrier of one arrival: s_ids and s_w written
};

// The producer's PDL wait, then the routed experts into lane l < k's my_e: ids[l] — or, with r
// (MoeOneArgs::logits), the warp's own routing (route_row, moe_route's arithmetic) from the
// logits, its scratch `slice` [kRouteSmemFloats] (a ring stage not yet refilled), into r->s_ids
// and r->s_w, block 0 writing them out too, then one arrival on r->done (release: the math
// warps' combine reads s_w after waiting on it).
// route_row out of line: its registers (a lane's experts, in registers) would otherwise count
// against the whole kernel's (the FP8 kernel spilled), for a call made once per launch.
__device__ __noinline__ void moe_one_route_warp(const RouteArgs a, const float* lg, float* slice, int lane, int32_t* ids,
                                                float* w) {
  route_row(a, lg, slice, lane, ids, w);
}

__device__ __forceinline__ void moe_one_routed_experts(const int32_t* ids, int64_t k, int lane, int64_t& my_e,
                                                       const MoeOneRouting* r, float* slice) {
  pdl_wait();
  if (r == nullptr) {
    if (lane < k) my_e = ids[lane];
    return;
  }
  moe_one_route_warp(r->args, r->logits, slice, lane, r->s_ids, r->s_w);
  __syncwarp();
  if (lane < k) {
    my_e = r->s_ids[lane];
    if (r->ids_out != nullptr) {
      r->ids_out[lane] = r->s_ids[lane];
      r->w_out[lane] = r->s_w[lane];
    }
  }
  // The scratch is a ring stage the producer fills by TMA next: the generic proxy's writes
  // ordered before the async proxy's.
  fence_proxy_async();
  __syncwarp();
  if (lane == 0) mbar_arrive(r->done);
}

// The producer warp's turn before stage q of kStages ring slots: waits until the slot is free;
// at the first stage past the shared slices' (q ≥ n_shared_stages), moe_one_routed_experts — the
// routed experts come from the previous kernel, or from the routing here (r: its scratch is the
// free slot's stage, at `ring` + slot · stride) — (lanes k.. hold the shared slices' experts from
// the start). mark(m): the timeline's marks 1 (the shared stages issued) and 2 (the wait
// returned), from lane 0. Returns the ring slot.
template <int kStages, typename Mark>
__device__ __forceinline__ int moe_one_producer_turn(int64_t q, uint64_t* empty, int64_t n_shared_stages,
                                                     const int32_t* ids, int64_t k, int lane, int64_t& my_e,
                                                     bool& waited, Mark mark, const MoeOneRouting* r = nullptr,
                                                     unsigned char* ring = nullptr, uint32_t stride = 0) {
  const int st = static_cast<int>(q % kStages);
  mbar_wait(&empty[st], static_cast<uint32_t>(((q / kStages) & 1) ^ 1));
  if (!waited && q >= n_shared_stages) {
    if (lane == 0) mark(1);
    moe_one_routed_experts(ids, k, lane, my_e, r, r != nullptr ? reinterpret_cast<float*>(ring + st * stride) : nullptr);
    if (lane == 0) mark(2);
    waited = true;
  }
  return st;
}

// out[j0 + r] = Σ_{s<k} w_s·ys[s][r] in slot order, then + ys[s][r] of each shared slot
// (s = k .. slots − 1) — the grouped kernel's combine (cuda_moe.cu) — for r < rows, by threads
// t, t + n_threads, ...; ys [slots][rows_max] in shared memory, complete.
// weights: global (the previous kernel's), or in shared memory (w_shared: the routing in the kernel).
__device__ __forceinline__ void moe_one_combine(const float* ys, int64_t rows, int64_t rows_max, int64_t k,
                                                int64_t slots, const float* weights, float* out, int t,
                                                int n_threads, bool w_shared = false) {
  for (int64_t r = t; r < rows; r += n_threads) {
    float o = 0.0f;
    for (int64_t s = 0; s < k; ++s) o = fmaf(w_shared ? weights[s] : __ldcg(weights + s), ys[s * rows_max + r], o);
    for (int64_t s = k; s < slots; ++s) o += ys[s * rows_max + r];
    out[r] = o;
  }
}
#endif

}  // namespace deepinfer::cuda
