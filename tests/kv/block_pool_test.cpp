// BlockPool and KvSequence: allocation accounting along a random timeline (free + used = total
// after every step), can_allocate edges, the lowest-ids-first order, and the page/slot
// arithmetic at page boundaries.
#include "kv/block_pool.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "backend/reference/reference_backend.h"
#include "kv/paged_kv_cache.h"

namespace deepinfer {
namespace {

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

TEST(BlockPool, FreshPoolHandsOutLowestIdsInOrder) {
  BlockPool pool(8);
  EXPECT_EQ(pool.n_blocks(), 8);
  EXPECT_EQ(pool.n_free(), 8);
  EXPECT_EQ(pool.allocate(3), ids({0, 1, 2}));
  EXPECT_EQ(pool.allocate(1), ids({3}));
  EXPECT_EQ(pool.n_free(), 4);
  EXPECT_EQ(pool.allocate(4), ids({4, 5, 6, 7}));
  EXPECT_EQ(pool.n_free(), 0);
}

TEST(BlockPool, CanAllocateEdges) {
  BlockPool pool(5);
  EXPECT_TRUE(pool.can_allocate(0));
  EXPECT_TRUE(pool.can_allocate(5));
  EXPECT_FALSE(pool.can_allocate(6));
  EXPECT_FALSE(pool.can_allocate(-1));
  EXPECT_FALSE(pool.can_allocate(INT64_MIN));
  EXPECT_FALSE(pool.can_allocate(INT64_MAX));
  EXPECT_TRUE(pool.allocate(0).empty());
  EXPECT_EQ(pool.n_free(), 5);
  auto a = pool.allocate(5);
  EXPECT_TRUE(pool.can_allocate(0));
  EXPECT_FALSE(pool.can_allocate(1));
  pool.release(a);
  EXPECT_TRUE(pool.can_allocate(5));

  BlockPool empty(0);
  EXPECT_EQ(empty.n_free(), 0);
  EXPECT_TRUE(empty.can_allocate(0));
  EXPECT_FALSE(empty.can_allocate(1));
  EXPECT_TRUE(empty.allocate(0).empty());
}

TEST(BlockPool, ReleaseMakesIdsReusable) {
  BlockPool pool(4);
  auto a = pool.allocate(4);
  pool.release({a[1], a[3]});
  EXPECT_EQ(pool.n_free(), 2);
  auto b = pool.allocate(2);
  std::sort(b.begin(), b.end());
  EXPECT_EQ(b, ids({1, 3}));
  pool.release(ids({}));  // releasing nothing is a no-op
  EXPECT_EQ(pool.n_free(), 0);
}

// The header promises "lowest ids first": after any sequence of releases, allocate(n) must
// return the n lowest free ids, in ascending order.
TEST(BlockPool, AllocatesLowestFreeIdsAfterReleases) {
  BlockPool pool(8);
  auto a = pool.allocate(2);  // {0, 1}
  auto b = pool.allocate(1);  // {2}
  pool.release(a);
  pool.release(b);            // free: 0, 1, 2, 3..7
  EXPECT_EQ(pool.allocate(3), ids({0, 1, 2}));
}

TEST(BlockPool, RandomTimelineKeepsAccounting) {
  constexpr int64_t kBlocks = 37;
  BlockPool pool(kBlocks);
  std::mt19937 rng(2024);
  std::vector<std::vector<int32_t>> owners;  // blocks held by each live "sequence"
  for (int step = 0; step < 3000; ++step) {
    const bool do_alloc = owners.empty() || rng() % 3 != 0;
    if (do_alloc) {
      const int64_t want = static_cast<int64_t>(rng() % 6);
      if (pool.can_allocate(want)) {
        const int64_t before = pool.n_free();
        auto got = pool.allocate(want);
        ASSERT_EQ(static_cast<int64_t>(got.size()), want);
        ASSERT_EQ(pool.n_free(), before - want);
        owners.push_back(std::move(got));
      } else {
        ASSERT_GT(want, pool.n_free());
      }
    } else {
      const size_t victim = rng() % owners.size();
      // Release all the victim's blocks, in a random order.
      auto blocks = owners[victim];
      std::shuffle(blocks.begin(), blocks.end(), rng);
      pool.release(blocks);
      owners.erase(owners.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    // Invariants: free + used = total; held ids unique and in range.
    std::set<int32_t> held;
    int64_t used = 0;
    for (const auto& o : owners) {
      used += static_cast<int64_t>(o.size());
      for (int32_t id : o) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, kBlocks);
        ASSERT_TRUE(held.insert(id).second) << "block " << id << " handed out twice (step " << step << ")";
      }
    }
    ASSERT_EQ(pool.n_free() + used, kBlocks) << "step " << step;
  }
  for (const auto& o : owners) pool.release(o);
  EXPECT_EQ(pool.n_free(), kBlocks);
  auto all = pool.allocate(kBlocks);
  std::sort(all.begin(), all.end());
  std::vector<int32_t> want(kBlocks);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(all, want);
}

TEST(BlockPool, SameOperationsGiveSameIds) {
  auto run = [] {
    BlockPool pool(16);
    std::vector<int32_t> trace;
    auto a = pool.allocate(5);
    auto b = pool.allocate(3);
    pool.release({a[4], a[0], a[2]});
    auto c = pool.allocate(4);
    pool.release(b);
    auto d = pool.allocate(6);
    for (const auto* v : {&a, &b, &c, &d}) trace.insert(trace.end(), v->begin(), v->end());
    return trace;
  };
  EXPECT_EQ(run(), run());
}

TEST(BlockPoolDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        BlockPool pool(2);
        (void)pool.allocate(3);
      },
      "DI_CHECK failed");
  EXPECT_DEATH(
      {
        BlockPool pool(2);
        auto a = pool.allocate(1);
        pool.release(a);
        pool.release(a);  // double free
      },
      "DI_CHECK failed");
  EXPECT_DEATH(
      {
        BlockPool pool(2);
        pool.release({5});
      },
      "DI_CHECK failed");
}

// ---------------------------------------------------------------------------------------------
// KvSequence arithmetic

TEST(KvSequence, BlocksNeededAtPageBoundaries) {
  for (int64_t bs : {1, 2, 16, 64}) {
    for (int64_t k : {0, 1, 2, 5}) {
      KvSequence s;
      // Empty sequence: ceil(n / bs) pages.
      EXPECT_EQ(s.blocks_needed(k * bs, bs), k) << "bs " << bs << " k " << k;
      EXPECT_EQ(s.blocks_needed(k * bs + 1, bs), k + 1) << "bs " << bs << " k " << k;
      if (k > 0) {
        EXPECT_EQ(s.blocks_needed(k * bs - 1, bs), bs == 1 ? k - 1 : k) << "bs " << bs << " k " << k;
      }
      // A sequence owning k full pages.
      s.block_ids.assign(static_cast<size_t>(k), 0);
      s.n_tokens = k * bs;
      EXPECT_EQ(s.blocks_needed(0, bs), 0);
      EXPECT_EQ(s.blocks_needed(1, bs), 1);
      EXPECT_EQ(s.blocks_needed(bs, bs), 1);
      EXPECT_EQ(s.blocks_needed(bs + 1, bs), 2);
      if (k > 0) {
        // One slot short of full: the next token fits, the one after needs a page.
        s.n_tokens = k * bs - 1;
        EXPECT_EQ(s.blocks_needed(1, bs), 0);
        EXPECT_EQ(s.blocks_needed(2, bs), 1);
      }
    }
  }
  // Owning more pages than needed (reserved ahead) never goes negative.
  KvSequence s;
  s.block_ids = {3, 4, 5};
  s.n_tokens = 1;
  EXPECT_EQ(s.blocks_needed(1, 16), 0);
  EXPECT_EQ(s.blocks_needed(47, 16), 0);
  EXPECT_EQ(s.blocks_needed(48, 16), 1);
}

TEST(KvSequence, SlotMapsPositionsThroughThePageList) {
  KvSequence s;
  s.block_ids = {5, 2, 9};
  const int64_t bs = 16;
  EXPECT_EQ(s.slot(0, bs), 80);
  EXPECT_EQ(s.slot(15, bs), 95);
  EXPECT_EQ(s.slot(16, bs), 32);
  EXPECT_EQ(s.slot(17, bs), 33);
  EXPECT_EQ(s.slot(31, bs), 47);
  EXPECT_EQ(s.slot(32, bs), 144);
  EXPECT_EQ(s.slot(47, bs), 159);
  // Every position maps to a distinct slot inside its own page.
  std::set<int32_t> seen;
  for (int64_t pos = 0; pos < 48; ++pos) {
    const int32_t slot = s.slot(pos, bs);
    EXPECT_EQ(slot / bs, s.block_ids[static_cast<size_t>(pos / bs)]);
    EXPECT_EQ(slot % bs, pos % bs);
    EXPECT_TRUE(seen.insert(slot).second);
  }
  KvSequence one;
  one.block_ids = {7, 0};
  EXPECT_EQ(one.slot(0, 1), 7);
  EXPECT_EQ(one.slot(1, 1), 0);
}

TEST(PagedKvCache, LayersAndPool) {
  ReferenceBackend backend;
  PagedKvCache cache(backend, {{KvKind::kMlaLatent, 40}, {KvKind::kMlaLatent, 40}}, 6, 4, DType::kF32);
  EXPECT_EQ(cache.n_layers(), 2);
  EXPECT_EQ(cache.block_size(), 4);
  EXPECT_EQ(cache.bytes_per_token(), 2 * 40 * 4);
  EXPECT_EQ(cache.layer(1).shape(), (std::vector<int64_t>{6, 4, 40}));
  EXPECT_EQ(cache.pool().n_blocks(), 6);
  EXPECT_EQ(cache.pool().n_free(), 6);
}

}  // namespace
}  // namespace deepinfer
