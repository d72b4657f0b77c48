// One token's routing on one warp: DeepSeek's selection rule as in the reference's
// route_one_token, shared by the route kernel (cuda_moe.cu) and the kernels that route in their
// own epilogue (cuda_norm_route.cu), so both give the same ids and weights.
#pragma once

#include "backend/cuda/cuda_common.h"

#include <climits>

namespace deepinfer::cuda {
namespace {

constexpr int kRouteMaxExperts = 256;  // routed experts (the router's limit)
constexpr int kRouteMaxGroups = 64;
constexpr int kRouteSmemFloats = 2 * kRouteMaxExperts + kRouteMaxGroups;  // a warp's slice (route_row)

// Routes one token from its logits lg [E] (a.E ≤ kRouteMaxExperts, a.n_group ≤
// kRouteMaxGroups, 1 ≤ a.top_k ≤ 32) into ids [top_k] and w [top_k]; every lane of the warp
// calls it. Lane l owns experts l, l + 32, …; scores and choice scores sit in the warp's shared
// slice smem [kRouteSmemFloats] so group scores can read whole groups. Top-k: k rounds of a warp
// arg-max over (choice desc, id asc) — the reference's scan keeps the first maximum, i.e. the
// lowest id on ties, −inf entries included. Only a.E, a.bias, a.n_group, a.topk_group,
// a.top_k, a.scoring, a.method, a.norm_topk_prob and a.scale are read from a.
__device__ __forceinline__ void route_row(const RouteArgs& a, const float* lg, float* smem, int lane, int32_t* ids,
                                          float* w) {
  float* scores = smem;
  float* choice = scores + kRouteMaxExperts;
  float* group_score = choice + kRouteMaxExperts;
  const int E = static_cast<int>(a.E);
  if (a.scoring == 0) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0;
    for (int e = lane; e < E; e += 32) sum += (scores[e] = expf(lg[e] - mx));
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int e = lane; e < E; e += 32) scores[e] /= sum;
  } else {
    for (int e = lane; e < E; e += 32) scores[e] = 1.0f / (1.0f + expf(-lg[e]));
  }
  for (int e = lane; e < E; e += 32) choice[e] = scores[e] + (a.bias != nullptr ? a.bias[e] : 0.0f);
  __syncwarp();
  if (a.method != 0 && a.n_group > 1) {
    const int per = static_cast<int>(a.E / a.n_group), G = static_cast<int>(a.n_group);
    for (int g = lane; g < G; g += 32) {
      const float* c = choice + g * per;
      if (a.method == 1) {
        float m = c[0];
        for (int e = 1; e < per; ++e) m = fmaxf(m, c[e]);
        group_score[g] = m;
      } else {
        float x = -INFINITY, y = -INFINITY;
        for (int e = 0; e < per; ++e) {
          if (c[e] > x) { y = x; x = c[e]; } else if (c[e] > y) { y = c[e]; }
        }
        group_score[g] = x + y;
      }
    }
    __syncwarp();
    // Keep the topk_group best groups (stable: ties to the lower group id); mask the others.
    for (int g = lane; g < G; g += 32) {
      int rank = 0;
      for (int o = 0; o < G; ++o) rank += group_score[o] > group_score[g] || (group_score[o] == group_score[g] && o < g);
      if (rank >= a.topk_group)
        for (int e = 0; e < per; ++e) choice[g * per + e] = -INFINITY;
    }
    __syncwarp();
  }
  uint32_t taken = 0;  // bit i: this lane's expert lane + 32 i is chosen
  float wsum = 0;
  int32_t my_id = 0;  // lane j keeps pick j (top_k ≤ 32), written once at the end
  float my_w = 0.0f;
  for (int64_t j = 0; j < a.top_k; ++j) {
    float bv = -INFINITY;
    int be = INT_MAX;
    for (int i = 0, e = lane; e < E; ++i, e += 32) {
      if (taken & (1u << i)) continue;
      if (be == INT_MAX || choice[e] > bv) {
        bv = choice[e];
        be = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (oe != INT_MAX && (be == INT_MAX || ov > bv || (ov == bv && oe < be))) {
        bv = ov;
        be = oe;
      }
    }
    if (be % 32 == lane) taken |= 1u << (be / 32);
    const float sj = scores[be];
    wsum += sj;
    if (lane == j) {
      my_id = be;
      my_w = sj;
    }
  }
  if (lane >= a.top_k) return;
  if (a.norm_topk_prob) my_w /= wsum + 1e-20f;
  ids[lane] = my_id;
  w[lane] = my_w * a.scale;
}

}  // namespace
}  // namespace deepinfer::cuda
