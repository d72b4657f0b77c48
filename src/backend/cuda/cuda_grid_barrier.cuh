// The persistent kernels' grid barrier (cuda_mla_sublayer.cu, cuda_moe_one.cu) and their lab
// timer.
//
// A persistent launch has one block per SM (grid = the SM count, every block resident at once),
// so its blocks may wait for each other. They do so through an arrival counter in global memory
// that only that kernel uses and nobody resets: a launch reads the counter once, after its PDL
// wait (the previous launch of the same kernel is complete by then), floors it to a multiple of
// its arrivals per launch (G blocks × its barriers: every launch adds exactly that), and its
// n-th barrier returns once the counter reaches base + n·G. A 64-bit counter does not wrap.
//
// Ordering: every thread's writes before the barrier are visible to every thread of every block
// after it — the block barrier orders them before the leader's release-add (gpu scope), whose
// value the other leaders read with acquire loads before their own block barrier (the pattern
// of CUTLASS's generic barrier; the PTX memory model's causality order is transitive). Readers
// of such data go through L2 (ld.cg or TMA), never a stale L1 line.
#pragma once

#include "backend/cuda/cuda_common.h"

namespace deepinfer::cuda {

// The counter's value at this launch's start, floored to a multiple of `period` (= G × the
// launch's barriers). Call after the PDL wait; one thread's value (pass it to grid_sync).
__device__ __forceinline__ unsigned long long grid_base(const unsigned long long* counter, unsigned long long period) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(counter) : "memory");
  return v - v % period;
}

// The grid barrier among the threads that call block_sync (every block's same set): returns when
// every block has arrived target − base times in all. `leader` is one of those threads (the one
// that read base). block_sync: __syncthreads, or a named barrier when a warp stays out.
// meanwhile(): work of this block's threads between its arrival and its wait (no block barrier
// inside; what it writes is visible to the block after the barrier, to other blocks only after
// the next one).
template <typename BlockSync, typename Meanwhile>
__device__ __forceinline__ void grid_sync(unsigned long long* counter, unsigned long long target, bool leader,
                                          BlockSync block_sync, Meanwhile meanwhile) {
  block_sync();
  if (leader) asm volatile("red.release.gpu.global.add.u64 [%0], 1;\n" ::"l"(counter) : "memory");
  meanwhile();
  if (leader) {
    unsigned long long v;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(counter) : "memory");
    } while (v < target);
  }
  block_sync();
}
template <typename BlockSync>
__device__ __forceinline__ void grid_sync(unsigned long long* counter, unsigned long long target, bool leader,
                                          BlockSync block_sync) {
  grid_sync(counter, target, leader, block_sync, [] {});
}

// The global timer in ns (the lab timelines: MlaSublayerArgs::trace, MoeOneArgs::trace).
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %globaltimer;\n" : "=l"(v));
  return v;
}

}  // namespace deepinfer::cuda
