// Measures this machine's ceilings in the same run as a benchmark: streaming read bandwidth
// and fp32 FMA throughput over all threads. Ratios against these, not absolute times, are
// the figures the performance notes record.
#pragma once

#include "core/thread_pool.h"

namespace deepinfer::bench {

// Bytes per second reading a buffer far larger than the caches (best of several passes).
double measure_read_bandwidth(ThreadPool& pool, size_t n_bytes);
// fp32 FLOP/s of independent 16-lane FMA chains on every thread (the vector unit's peak).
double measure_peak_flops(ThreadPool& pool);

}  // namespace deepinfer::bench
