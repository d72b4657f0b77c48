// BlockManager as a timeline: random arrivals, appends and releases with the invariants
// (free + held = total, ref counts = holders, LRU pages unheld, hashes findable) checked after
// every step; prefix hits at k×block_size and k×block_size ± 1; eviction order; salts; a
// failed request's pages never hit; shareable prefixes (pages past it neither hit nor registered).
#include <gtest/gtest.h>

#include <random>

#include "kv/block_manager.h"

namespace deepinfer {
namespace {

std::vector<int32_t> seq_tokens(int64_t n, int32_t base) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(base + static_cast<int32_t>(i));
  return t;
}

int64_t refs_of(const std::vector<KvAllocation>& live) {
  int64_t r = 0;
  for (const auto& a : live) r += static_cast<int64_t>(a.kv.block_ids.size());
  return r;
}

TEST(BlockManager, PrefixHitLengths) {
  const int64_t bs = 4;
  for (int64_t len : {8, 7, 9, 4, 3, 5, 1}) {  // k×bs and k×bs ± 1
    BlockManager m(16, bs, true);
    auto tokens = seq_tokens(len, 100);
    KvAllocation a = m.allocate(tokens, 2, 0);
    EXPECT_EQ(a.n_cached_tokens, 0);
    a.kv.n_tokens = len;
    m.commit(a, tokens);
    m.release(a);
    // The same prompt again hits every full page except the one holding the last token.
    KvAllocation b = m.allocate(tokens, 2, 0);
    EXPECT_EQ(b.n_cached_tokens, ((len - 1) / bs) * bs) << "len " << len;
    EXPECT_EQ(b.kv.n_tokens, b.n_cached_tokens);
    // A prompt extending it by one token hits all of its full pages.
    auto longer = tokens;
    longer.push_back(7);
    EXPECT_EQ(m.count_cached_blocks(longer, 0), len / bs) << "len " << len;
    m.release(b);
    ASSERT_TRUE(m.check_invariants(0).is_ok());
    EXPECT_EQ(m.n_free(), 16);
  }
}

// n_shareable (SchedulerConfig::share_prompt_pages_only passes the prompt's length): a sequence
// registers only the full pages within its first n_shareable tokens, and a lookup hits only
// pages within its own first n_shareable tokens, even where later pages are cached.
TEST(BlockManager, ShareableTokensBoundHitsAndRegistrations) {
  const int64_t bs = 4;
  BlockManager m(32, bs, true);
  const auto tokens = seq_tokens(18, 100);  // 4 full pages + 2 tokens
  KvAllocation a = m.allocate(tokens, 0, 0, /*n_shareable=*/9);  // pages 0, 1 shareable
  a.kv.n_tokens = 18;
  m.commit(a, tokens);
  EXPECT_EQ(a.n_committed_blocks, 2);
  m.release(a);
  EXPECT_EQ(m.n_cached_free(), 2);  // pages 2, 3 were never registered
  EXPECT_EQ(m.count_cached_blocks(tokens, 0), 2);
  ASSERT_TRUE(m.check_invariants(0).is_ok());

  // Now every full page cached (an unbounded sequence), then lookups bounded at 5 and 8 tokens.
  KvAllocation b = m.allocate(tokens, 0, 0);
  EXPECT_EQ(b.n_cached_tokens, 8);
  b.kv.n_tokens = 18;
  m.commit(b, tokens);
  EXPECT_EQ(b.n_committed_blocks, 4);
  m.release(b);
  EXPECT_EQ(m.count_cached_blocks(tokens, 0), 4);
  EXPECT_EQ(m.count_cached_blocks(tokens, 0, 5), 1);
  EXPECT_EQ(m.count_cached_blocks(tokens, 0, 8), 2);
  EXPECT_EQ(m.count_cached_blocks(tokens, 0, 0), 0);
  KvAllocation c = m.allocate(tokens, 0, 0, 13);
  EXPECT_EQ(c.n_cached_tokens, 12);
  m.release(c);
  ASSERT_TRUE(m.check_invariants(0).is_ok());
  EXPECT_EQ(m.n_free(), 32);
}

TEST(BlockManager, SaltIsolatesTenants) {
  BlockManager m(8, 4, true);
  auto t = seq_tokens(9, 1);
  KvAllocation a = m.allocate(t, 0, /*salt=*/11);
  a.kv.n_tokens = 9;
  m.commit(a, t);
  m.release(a);
  EXPECT_EQ(m.count_cached_blocks(t, 11), 2);
  EXPECT_EQ(m.count_cached_blocks(t, 12), 0);
}

TEST(BlockManager, DifferentContentNeverShares) {
  BlockManager m(8, 4, true);
  auto t = seq_tokens(9, 1);
  KvAllocation a = m.allocate(t, 0, 0);
  a.kv.n_tokens = 9;
  m.commit(a, t);
  auto u = t;
  u[5] = 999;  // second page differs: only the first page may hit
  EXPECT_EQ(m.count_cached_blocks(u, 0), 1);
  u[0] = 999;  // first page differs: nothing may hit, though later pages are equal
  EXPECT_EQ(m.count_cached_blocks(u, 0), 0);
  m.release(a);
}

TEST(BlockManager, EvictsLeastRecentlyReleasedTailFirst) {
  BlockManager m(4, 2, true);
  auto t = seq_tokens(5, 1);  // 3 pages, 2 full
  KvAllocation a = m.allocate(t, 0, 0);
  a.kv.n_tokens = 5;
  m.commit(a, t);
  m.release(a);
  EXPECT_EQ(m.n_cached_free(), 2);
  EXPECT_EQ(m.n_free(), 4);
  // Needing 3 fresh pages: the unhashed page and the never-used page go first, then one
  // cached page is evicted — the tail page, so the first page still hits.
  KvAllocation b = m.allocate(seq_tokens(6, 50), 0, 0);
  EXPECT_EQ(m.n_cached_free(), 1);
  EXPECT_EQ(m.count_cached_blocks(t, 0), 1);
  m.release(b);
  ASSERT_TRUE(m.check_invariants(0).is_ok());
}

TEST(BlockManager, FailedRequestPagesNeverHit) {
  BlockManager m(8, 4, true);
  auto t = seq_tokens(9, 1);
  KvAllocation a = m.allocate(t, 0, 0);
  a.kv.n_tokens = 9;
  m.commit(a, t);
  m.release(a, /*cacheable=*/false);
  EXPECT_EQ(m.count_cached_blocks(t, 0), 0);
  EXPECT_EQ(m.n_cached_free(), 0);
  ASSERT_TRUE(m.check_invariants(0).is_ok());
}

TEST(BlockManager, RandomTimelineKeepsInvariants) {
  std::mt19937 rng(7);
  const int64_t bs = 4, n_blocks = 40;
  BlockManager m(n_blocks, bs, true);
  std::vector<KvAllocation> live;
  std::vector<std::vector<int32_t>> live_tokens;
  // Prompts share prefixes drawn from a few stems so hits happen.
  for (int step = 0; step < 3000; ++step) {
    const int action = static_cast<int>(rng() % 3);
    if (action == 0) {
      std::vector<int32_t> t = seq_tokens(static_cast<int64_t>(rng() % 3) * 4, static_cast<int32_t>(rng() % 2) * 1000);
      const int64_t extra = 1 + static_cast<int64_t>(rng() % 10);
      for (int64_t i = 0; i < extra; ++i) t.push_back(static_cast<int32_t>(rng() % 5));
      if (m.can_allocate(t, 1, 0)) {
        KvAllocation a = m.allocate(t, 1, 0);
        a.kv.n_tokens = static_cast<int64_t>(t.size());
        m.commit(a, t);
        live.push_back(std::move(a));
        live_tokens.push_back(t);
      }
    } else if (action == 1 && !live.empty()) {
      const size_t i = rng() % live.size();
      if (m.can_append(live[i], 1)) {
        m.append(live[i], 1);
        live_tokens[i].push_back(static_cast<int32_t>(rng() % 5));
        live[i].kv.n_tokens += 1;
        m.commit(live[i], live_tokens[i]);
      }
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      m.release(live[i], rng() % 5 != 0);
      live.erase(live.begin() + static_cast<int64_t>(i));
      live_tokens.erase(live_tokens.begin() + static_cast<int64_t>(i));
    }
    Status s = m.check_invariants(refs_of(live));
    ASSERT_TRUE(s.is_ok()) << "step " << step << ": " << s.to_string();
  }
  for (auto& a : live) m.release(a);
  ASSERT_TRUE(m.check_invariants(0).is_ok());
  EXPECT_EQ(m.n_free(), n_blocks);
}

}  // namespace
}  // namespace deepinfer
