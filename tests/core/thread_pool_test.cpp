// ThreadPool::parallel_for: exact coverage of [0, n), grain-aligned chunk starts, a split that
// depends only on (n, grain, n_threads), and serial execution of nested calls.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

// Runs one parallel_for and returns the chunks it was split into (sorted), after checking
// that every index in [0, n) was visited exactly once.
std::vector<std::pair<int64_t, int64_t>> run_and_check(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    {
      std::lock_guard<std::mutex> lock(mu);
      chunks.emplace_back(begin, end);
    }
    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1)
        << "index " << i << " n " << n << " grain " << grain << " threads " << pool.n_threads();
  std::sort(chunks.begin(), chunks.end());
  // Non-empty, contiguous, grain-aligned starts, tiling [0, n).
  int64_t expect_begin = 0;
  for (const auto& [b, e] : chunks) {
    EXPECT_EQ(b, expect_begin);
    EXPECT_LT(b, e);
    EXPECT_EQ(b % std::max<int64_t>(grain, 1), 0) << "chunk start " << b << " grain " << grain;
    expect_begin = e;
  }
  if (n > 0) {
    EXPECT_EQ(expect_begin, n);
  }
  EXPECT_LE(static_cast<int64_t>(chunks.size()), pool.n_threads());
  return chunks;
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int64_t n : {1, 2, 3, 5, 7, 8, 16, 31, 64, 97, 128, 1000, 4097}) {
      for (int64_t grain : {1, 2, 3, 4, 8, 16, 64, 5000}) run_and_check(pool, n, grain);
    }
  }
}

TEST(ThreadPool, NonPositiveNCallsNothing) {
  ThreadPool pool(4);
  int calls = 0;
  pool.parallel_for(0, 1, [&](int64_t, int64_t) { ++calls; });
  pool.parallel_for(-5, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPool, NonPositiveGrainActsAsOne) {
  ThreadPool pool(3);
  run_and_check(pool, 10, 0);
  run_and_check(pool, 10, -4);
}

TEST(ThreadPool, ZeroThreadsMeansHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.n_threads(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  run_and_check(pool, 100, 3);
}

TEST(ThreadPool, SplitIsDeterministic) {
  ThreadPool pool(4);
  const auto first = run_and_check(pool, 1003, 8);
  EXPECT_GT(first.size(), 1u);  // actually split across threads
  for (int rep = 0; rep < 20; ++rep) EXPECT_EQ(run_and_check(pool, 1003, 8), first);
  ThreadPool other(4);
  EXPECT_EQ(run_and_check(other, 1003, 8), first);
}

TEST(ThreadPool, NestedCallRunsSeriallyOnTheCallingThread) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> inner_chunks;
  std::atomic<int> wrong_thread{0};
  std::atomic<int64_t> total{0};
  pool.parallel_for(8, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto me = std::this_thread::get_id();
      std::vector<std::pair<int64_t, int64_t>> mine;
      pool.parallel_for(50, 1, [&](int64_t b, int64_t e) {
        if (std::this_thread::get_id() != me) wrong_thread.fetch_add(1);
        mine.emplace_back(b, e);
        total.fetch_add(e - b);
      });
      std::lock_guard<std::mutex> lock(mu);
      inner_chunks.push_back(mine);
    }
  });
  EXPECT_EQ(wrong_thread.load(), 0);
  EXPECT_EQ(total.load(), 8 * 50);
  ASSERT_EQ(inner_chunks.size(), 8u);
  for (const auto& c : inner_chunks) EXPECT_EQ(c, (std::vector<std::pair<int64_t, int64_t>>{{0, 50}}));
  // The pool still works in parallel afterwards (the caller's nesting flag was reset).
  EXPECT_GT(run_and_check(pool, 100, 1).size(), 1u);
}

TEST(ThreadPool, ManyBackToBackLoops) {
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 2000; ++rep)
    pool.parallel_for(17, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
    });
  EXPECT_EQ(sum.load(), 2000 * (16 * 17 / 2));
}

}  // namespace
}  // namespace deepinfer
