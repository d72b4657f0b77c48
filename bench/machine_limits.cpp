#include "machine_limits.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "backend/cpu/simd.h"

namespace deepinfer::bench {

double measure_read_bandwidth(ThreadPool& pool, size_t n_bytes) {
  const int64_t n = static_cast<int64_t>(n_bytes / sizeof(float));
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  std::atomic<float> sink{0};
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      simd::v16f a0 = simd::zero(), a1 = simd::zero(), a2 = simd::zero(), a3 = simd::zero();
      int64_t i = b;
      for (; i + 64 <= e; i += 64) {
        a0 += simd::load(buf.data() + i);
        a1 += simd::load(buf.data() + i + 16);
        a2 += simd::load(buf.data() + i + 32);
        a3 += simd::load(buf.data() + i + 48);
      }
      float s = simd::hsum(a0 + a1 + a2 + a3);
      for (; i < e; ++i) s += buf[static_cast<size_t>(i)];
      sink.fetch_add(s);
    });
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, static_cast<double>(n_bytes) / sec);
  }
  return best;
}

double measure_peak_flops(ThreadPool& pool) {
  constexpr int64_t kIters = 20'000'000;
  constexpr int kChains = 12;
  std::atomic<float> sink{0};
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(pool.n_threads(), 1, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w) {
        simd::v16f acc[kChains];
        for (int c = 0; c < kChains; ++c) acc[c] = simd::splat(static_cast<float>(c) * 1e-3f);
        const simd::v16f m = simd::splat(0.999999f), a = simd::splat(1e-7f);
        for (int64_t i = 0; i < kIters / 16; ++i)
          for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * m + a;
        simd::v16f s = simd::zero();
        for (int c = 0; c < kChains; ++c) s += acc[c];
        sink.fetch_add(simd::hsum(s));
      }
    });
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double flops = 2.0 * 16.0 * kChains * static_cast<double>(kIters / 16) * pool.n_threads();
    best = std::max(best, flops / sec);
  }
  return best;
}

}  // namespace deepinfer::bench
