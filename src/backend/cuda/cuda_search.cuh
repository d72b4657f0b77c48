// Device-side search over sorted offset arrays (.cu files only): which segment an index falls in.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// The largest i in [0, n) with starts[i] ≤ v, for non-decreasing starts[0 .. n) with starts[0] ≤ v
// (binary search, log2(n) loads). With empty segments (equal consecutive starts) it returns the
// last of them, so the segment i it names holds v whenever v < starts[i + 1].
template <typename T>
__device__ __forceinline__ int64_t last_at_most(const T* starts, int64_t n, int64_t v) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (starts[mid] <= v) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace deepinfer::cuda
