// The decode GEMVs' stream of work (cuda_gemv.cu, cuda_gemv_fp8_tc.cu): a group (a warp, or a
// block) walks its positions — (unit, pass over A's rows, K batch) — double-buffered in
// registers, so the next position's loads are in flight while this one's math runs, across pass
// and unit boundaries too.
#pragma once

#include "backend/cuda/cuda_launch.cuh"

namespace deepinfer::cuda {

// Walks from enter(first) to the end of the group's range with two buffers: issue(p, buf) starts
// position p's loads into buf, step(p, buf) does its math (and, at a pass's end, the stores);
// advance(p) is the next position (valid == false past the range). `early`: the first
// position's loads go out before the PDL wait for the previous kernel — only for data no kernel
// writes, found from sizes alone (cuda_launch.cuh); otherwise everything follows the wait. Ends
// with the PDL trigger: the dependents launch once the group's work is done.
template <typename P, typename Buf, typename Unit, typename Enter, typename Advance, typename Issue, typename Step>
__device__ __forceinline__ void walk_positions(bool early, Unit first, Enter enter, Advance advance, Issue issue,
                                               Step step) {
  Buf a, b;
  P cur{};
  if (early) {
    cur = enter(first);
    if (cur.valid) issue(cur, a);
  }
  pdl_wait();
  if (!early) {
    cur = enter(first);
    if (cur.valid) issue(cur, a);
  }
  while (cur.valid) {
    const P nxt = advance(cur);
    if (nxt.valid) issue(nxt, b);
    step(cur, a);
    if (!nxt.valid) break;
    cur = advance(nxt);
    if (cur.valid) issue(cur, a);
    step(nxt, b);
  }
  pdl_trigger();
}

}  // namespace deepinfer::cuda
