// A kernel's share of an L2Prefetch (cuda_common.h): the bytes Backend::prefetch_weights named,
// brought into L2 by the blocks of a kernel with memory bandwidth to spare, so that the kernel
// that reads them next (the next layer's attention) finds them there. .cu files only.
#pragma once

#include "backend/cuda/cuda_common.h"

namespace deepinfer::cuda {

constexpr uint64_t kL2PrefetchPiece = 64 * 1024;  // bytes per prefetch instruction

// Block b of G's share — bytes [⌊b·total/G⌋, ⌊(b+1)·total/G⌋) of the ranges laid end to end,
// ends rounded down to 16 — by cp.async.bulk.prefetch.L2 (no completion to wait for, no data
// returned), from the calling thread. Weights only (no kernel writes them), so it may run before
// the PDL wait (cuda_launch.cuh).
__device__ __forceinline__ void l2_prefetch_share(const L2Prefetch& pf, int b, int G) {
  uint64_t total = 0;
  for (int i = 0; i < pf.n; ++i) total += pf.bytes[i];
  if (total == 0) return;
  const uint64_t lo = total * static_cast<uint64_t>(b) / static_cast<uint64_t>(G) & ~uint64_t{15};
  const uint64_t hi = b + 1 == G ? total : total * static_cast<uint64_t>(b + 1) / static_cast<uint64_t>(G) & ~uint64_t{15};
  uint64_t base = 0;
  for (int i = 0; i < pf.n && base < hi; ++i) {
    const uint64_t end = base + pf.bytes[i];
    const uint64_t s = lo > base ? lo : base, e = hi < end ? hi : end;
    for (uint64_t o = s; o < e; o += kL2PrefetchPiece) {
      const uint64_t n = e - o < kL2PrefetchPiece ? e - o : kL2PrefetchPiece;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(static_cast<const char*>(pf.ptr[i]) + (o - base)),
                   "r"(static_cast<uint32_t>(n))
                   : "memory");
    }
    base = end;
  }
}

}  // namespace deepinfer::cuda
