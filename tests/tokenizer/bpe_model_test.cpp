// BpeModel against a naive reference BPE (recompute every pair, merge the lowest rank, leftmost
// first) on random merge tables and random pieces of 1..300 bytes, so both the linear-scan path
// (≤ 48 bytes) and the heap path are checked, plus the piece cache and duplicate merges.
#include "tokenizer/bpe_model.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

struct Table {
  std::array<int32_t, 256> byte_ids{};
  std::vector<BpeMerge> merges;
};

// Byte b is id b; merges combine random existing tokens over a small alphabet.
Table random_table(std::mt19937& rng, int n_merges, const std::string& alphabet) {
  Table t;
  for (int b = 0; b < 256; ++b) t.byte_ids[b] = b;
  std::vector<int32_t> pool;
  for (char c : alphabet) pool.push_back(static_cast<uint8_t>(c));
  int32_t next = 256;
  std::map<std::pair<int32_t, int32_t>, int32_t> seen;
  for (int i = 0; i < n_merges; ++i) {
    const int32_t l = pool[rng() % pool.size()];
    const int32_t r = pool[rng() % pool.size()];
    if (seen.count({l, r})) continue;
    seen[{l, r}] = next;
    t.merges.push_back({l, r, next});
    pool.push_back(next++);
  }
  return t;
}

std::vector<int32_t> reference_bpe(const Table& t, const std::string& piece) {
  std::map<std::pair<int32_t, int32_t>, std::pair<size_t, int32_t>> rank;
  for (size_t i = 0; i < t.merges.size(); ++i) rank[{t.merges[i].left, t.merges[i].right}] = {i, t.merges[i].result};
  std::vector<int32_t> s;
  for (char c : piece) s.push_back(t.byte_ids[static_cast<uint8_t>(c)]);
  for (;;) {
    size_t best = SIZE_MAX, best_rank = SIZE_MAX;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = rank.find({s[i], s[i + 1]});
      if (it != rank.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best = i;
      }
    }
    if (best == SIZE_MAX) return s;
    s[best] = rank[{s[best], s[best + 1]}].second;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

TEST(BpeModel, MatchesReferenceOnRandomTablesAndPieces) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const std::string alphabet = trial % 2 ? "ab" : "abcd ";
    const Table t = random_table(rng, 10 + static_cast<int>(rng() % 60), alphabet);
    BpeModel model(t.byte_ids, t.merges, false, {});
    BpeScratch scratch;
    for (int k = 0; k < 60; ++k) {
      const size_t n = 1 + rng() % (k % 3 == 0 ? 300 : 60);
      std::string piece;
      for (size_t i = 0; i < n; ++i) piece += alphabet[rng() % alphabet.size()];
      std::vector<int32_t> out = {-7};  // encode_piece appends
      model.encode_piece(piece, out, scratch);
      std::vector<int32_t> expected = {-7};
      const auto ref = reference_bpe(t, piece);
      expected.insert(expected.end(), ref.begin(), ref.end());
      ASSERT_EQ(out, expected) << "trial " << trial << " piece '" << piece << "'";
      // Again, now from the cache.
      out.assign(1, -7);
      model.encode_piece(piece, out, scratch);
      ASSERT_EQ(out, expected);
    }
  }
}

TEST(BpeModel, OverlappingPairsMergeLeftmostFirst) {
  Table t;
  for (int b = 0; b < 256; ++b) t.byte_ids[b] = b;
  t.merges = {{'a', 'a', 300}};
  BpeModel model(t.byte_ids, t.merges, false, {});
  BpeScratch scratch;
  for (size_t n : {3u, 5u, 49u, 101u}) {
    std::vector<int32_t> out;
    model.encode_piece(std::string(n, 'a'), out, scratch);
    std::vector<int32_t> expected(n / 2, 300);
    if (n % 2) expected.push_back('a');
    EXPECT_EQ(out, expected) << n;
  }
}

TEST(BpeModel, LaterDuplicateMergeWins) {
  Table t;
  for (int b = 0; b < 256; ++b) t.byte_ids[b] = b;
  // ("b","c") appears at rank 0 and rank 2: HF keeps the later rank, so ("a","b") (rank 1) wins.
  t.merges = {{'b', 'c', 300}, {'a', 'b', 301}, {'b', 'c', 300}};
  BpeModel model(t.byte_ids, t.merges, false, {});
  BpeScratch scratch;
  std::vector<int32_t> out;
  model.encode_piece("abc", out, scratch);
  EXPECT_EQ(out, (std::vector<int32_t>{301, 'c'}));
}

TEST(BpeModel, IgnoreMergesTakesWholeVocabularyTokens) {
  Table t;
  for (int b = 0; b < 256; ++b) t.byte_ids[b] = b;
  t.merges = {{'a', 'b', 300}};
  BpeModel model(t.byte_ids, t.merges, true, {{"abc", 400}});
  BpeScratch scratch;
  std::vector<int32_t> out;
  model.encode_piece("abc", out, scratch);
  model.encode_piece("abd", out, scratch);
  EXPECT_EQ(out, (std::vector<int32_t>{400, 300, 'd'}));
}

TEST(BpeModel, CacheSurvivesEvictionWithCorrectResults) {
  std::mt19937 rng(99);
  const Table t = random_table(rng, 200, "abcdefgh");
  BpeModel model(t.byte_ids, t.merges, false, {});
  BpeScratch scratch;
  // Far more distinct pieces than the cache holds: it is cleared and refilled many times.
  for (int k = 0; k < 30000; ++k) {
    std::string piece;
    const size_t n = 2 + rng() % 12;
    for (size_t i = 0; i < n; ++i) piece += "abcdefgh"[rng() % 8];
    std::vector<int32_t> out;
    model.encode_piece(piece, out, scratch);
    if (k % 97 == 0) {
      ASSERT_EQ(out, reference_bpe(t, piece)) << piece;
    }
  }
}

}  // namespace
}  // namespace deepinfer
