// Logits processors as token lists (logits_processors.h): min_tokens masks, the repetition
// penalty over prompt ∪ output, frequency/presence over output counts — on small hand-computed
// rows — and in-flight ("pending") tokens counting exactly like known output tokens.
#include "sample/logits_processors.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace deepinfer {
namespace {

TEST(LogitsProcessors, HandComputedRow) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  // prompt {1, 1, 3}, output {3, 4, 4}: seen {1, 3, 4}; output counts 3 → 1, 4 → 2.
  const LogitsProcessors proc = make_logits_processors(p, {1, 1, 3}, {3, 4, 4}, 0, {0});
  EXPECT_EQ(proc.seen_tokens, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(proc.seen_counts, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(proc.masked.empty());
  std::vector<float> row = {1.0f, 4.0f, 2.0f, -2.0f, 6.0f, 3.0f};
  apply_logits_processors(row.data(), 6, proc, nullptr);
  EXPECT_EQ(row[0], 1.0f);                   // unseen
  EXPECT_EQ(row[1], 2.0f);                   // prompt only: 4 / 2
  EXPECT_EQ(row[2], 2.0f);                   // unseen
  EXPECT_EQ(row[3], -4.0f - 0.5f - 0.25f);   // −2 · 2, then − (0.5·1 + 0.25)
  EXPECT_EQ(row[4], 3.0f - 1.0f - 0.25f);    // 6 / 2, then − (0.5·2 + 0.25)
  EXPECT_EQ(row[5], 3.0f);
}

TEST(LogitsProcessors, MinTokensMasksEosAndStopIdsUntilReached) {
  SamplingParams p;
  p.min_tokens = 3;
  p.stop_token_ids = {5};
  const std::vector<float> raw(8, 1.0f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Two tokens known and none pending: still masked. One more in flight: the third is the
  // next's predecessor, so the mask lifts.
  LogitsProcessors proc = make_logits_processors(p, {7}, {1, 2}, 0, {0, 6});
  EXPECT_EQ(proc.masked, (std::vector<int32_t>{0, 6, 5}));
  std::vector<float> row = raw;
  apply_logits_processors(row.data(), 8, proc, nullptr);
  EXPECT_EQ(row[0], neg_inf);
  EXPECT_EQ(row[5], neg_inf);
  EXPECT_EQ(row[6], neg_inf);
  EXPECT_EQ(row[1], 1.0f);
  EXPECT_FALSE(make_logits_processors(p, {7}, {1, 2}, 1, {0, 6}).active());
  p.ignore_eos = true;  // EOS stays allowed, stop ids are still masked
  EXPECT_EQ(make_logits_processors(p, {7}, {}, 0, {0}).masked, (std::vector<int32_t>{5}));
}

// A pending token must change the row exactly as the same token known on the host would.
TEST(LogitsProcessors, PendingTokensCountAsOutput) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, 15);
  std::normal_distribution<float> val(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    SamplingParams p;
    p.repetition_penalty = trial % 3 == 0 ? 1.0f : 1.3f;
    p.frequency_penalty = trial % 2 == 0 ? 0.4f : -0.7f;
    p.presence_penalty = trial % 5 == 0 ? 0.0f : 0.3f;
    std::vector<int32_t> prompt(1 + rng() % 6), output(rng() % 6), in_flight(rng() % 3);
    for (auto& t : prompt) t = tok(rng);
    for (auto& t : output) t = tok(rng);
    for (auto& t : in_flight) t = tok(rng);
    std::vector<float> raw(16);
    for (auto& v : raw) v = val(rng);
    std::vector<int32_t> all_output = output;
    all_output.insert(all_output.end(), in_flight.begin(), in_flight.end());
    std::vector<float> known = raw, pending = raw;
    apply_logits_processors(known.data(), 16, make_logits_processors(p, prompt, all_output, 0, {}), nullptr);
    LogitsProcessors proc = make_logits_processors(p, prompt, output, static_cast<int64_t>(in_flight.size()), {});
    for (size_t j = 0; j < in_flight.size(); ++j) proc.pending.push_back(static_cast<int32_t>(j));
    apply_logits_processors(pending.data(), 16, proc, in_flight.data());
    for (int v = 0; v < 16; ++v) ASSERT_EQ(pending[static_cast<size_t>(v)], known[static_cast<size_t>(v)]) << trial << " id " << v;
  }
}

// The runner's cheap pre-check agrees with the processors it would build.
TEST(LogitsProcessors, HasProcessorsMatchesActive) {
  for (int variant = 0; variant < 32; ++variant) {
    SamplingParams p;
    p.repetition_penalty = variant & 1 ? 1.1f : 1.0f;
    p.frequency_penalty = variant & 2 ? 0.3f : 0.0f;
    p.ignore_eos = (variant & 4) != 0;
    if (variant & 8) p.stop_token_ids = {3};
    p.min_tokens = variant & 16 ? 2 : 0;
    for (int64_t n_output : {0, 1, 2, 5})
      EXPECT_EQ(has_logits_processors(p, n_output),
                make_logits_processors(p, {1}, std::vector<int32_t>(static_cast<size_t>(n_output), 2), 0, {0}).active())
          << variant << " n_output " << n_output;
  }
}

}  // namespace
}  // namespace deepinfer
