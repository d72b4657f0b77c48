// Sampler and Philox: argmax tie/NaN rules, the truncations (top-k, top-p, min-p) on small
// hand-computed tables, empirical frequencies over seeded draws, (seed, position)
// determinism, parameter validation, and Random123's Philox-4x32-10 known answers.
#include "sample/sampler.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sample/philox.h"

namespace deepinfer {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double mx = -1e300;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l) / temperature);
  std::vector<double> p;
  double sum = 0;
  for (float l : logits) sum += p.emplace_back(std::exp(static_cast<double>(l) / temperature - mx));
  for (double& v : p) v /= sum;
  return p;
}

// Frequencies of each token over n draws at positions 0..n-1 with one seed.
std::vector<double> frequencies(const std::vector<float>& logits, const SamplerParams& params, int n,
                                uint64_t seed = 1234) {
  std::vector<double> freq(logits.size(), 0.0);
  std::vector<float> scratch;
  const auto vocab = static_cast<int64_t>(logits.size());
  for (int i = 0; i < n; ++i) {
    const int32_t t = sample_token(logits.data(), vocab, params, seed, static_cast<uint64_t>(i), &scratch);
    EXPECT_GE(t, 0);
    EXPECT_LT(t, vocab);
    if (t >= 0 && t < vocab) freq[static_cast<size_t>(t)] += 1.0 / n;
  }
  return freq;
}

// ---------------------------------------------------------------------------------------------
// Philox

TEST(Philox, Random123KnownAnswers) {
  // Random123 kat_vectors, "philox4x32 10": counter[4] key[2] -> output[4].
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, UniformIsInUnitIntervalAndSeparatesPurposes) {
  double sum = 0;
  int same_purpose_collisions = 0;
  for (uint64_t pos = 0; pos < 20000; ++pos) {
    const float u = philox_uniform(99, pos, RngPurpose::kSample);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    if (u == philox_uniform(99, pos, RngPurpose::kSpeculativeAccept)) ++same_purpose_collisions;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
  EXPECT_LT(same_purpose_collisions, 5);
  // Positions above 2^32 are distinct counters, not wrapped.
  EXPECT_NE(philox_uniform(5, uint64_t{1} << 32, RngPurpose::kSample), philox_uniform(5, 0, RngPurpose::kSample));
  // So are seeds differing only in the high word.
  EXPECT_NE(philox_uniform(uint64_t{1} << 32, 0, RngPurpose::kSample), philox_uniform(0, 0, RngPurpose::kSample));
}

// ---------------------------------------------------------------------------------------------
// Argmax

TEST(Sampler, ArgmaxLowestIdWinsTies) {
  const std::vector<float> a = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(argmax_token(a.data(), 4), 1);
  const std::vector<float> b = {5.0f, 5.0f, 5.0f};
  EXPECT_EQ(argmax_token(b.data(), 3), 0);
  const std::vector<float> c = {-kInf, -kInf, -1.0f};
  EXPECT_EQ(argmax_token(c.data(), 3), 2);
  const std::vector<float> d = {-kInf, -kInf};
  EXPECT_EQ(argmax_token(d.data(), 2), 0);
  const std::vector<float> e = {0.0f, kInf, kInf};
  EXPECT_EQ(argmax_token(e.data(), 3), 1);
  const std::vector<float> one = {-3.0f};
  EXPECT_EQ(argmax_token(one.data(), 1), 0);
}

TEST(Sampler, ArgmaxNeverPicksNaNUnlessAllAre) {
  const std::vector<float> a = {kNaN, 1.0f, 2.0f};
  EXPECT_EQ(argmax_token(a.data(), 3), 2);
  const std::vector<float> b = {1.0f, kNaN, 0.5f};
  EXPECT_EQ(argmax_token(b.data(), 3), 0);
  const std::vector<float> c = {kNaN, 0.5f, kNaN, 2.0f, kNaN};
  EXPECT_EQ(argmax_token(c.data(), 5), 3);
  const std::vector<float> d = {kNaN, kNaN, -kInf};
  EXPECT_EQ(argmax_token(d.data(), 3), 2);
  const std::vector<float> e = {kNaN, kNaN, kNaN};
  EXPECT_EQ(argmax_token(e.data(), 3), 0);
}

// ---------------------------------------------------------------------------------------------
// Truncations that leave exactly one token

TEST(Sampler, TemperatureZeroIsGreedy) {
  const std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f, 1.9f};
  SamplerParams p;
  p.temperature = 0.0f;
  std::vector<float> scratch;
  for (uint64_t pos = 0; pos < 500; ++pos)
    ASSERT_EQ(sample_token(logits.data(), 5, p, pos * 7 + 3, pos, &scratch), 1) << pos;
}

TEST(Sampler, TopK1IsArgmax) {
  const std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f, 1.9f};
  SamplerParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  std::vector<float> scratch;
  for (uint64_t pos = 0; pos < 500; ++pos) ASSERT_EQ(sample_token(logits.data(), 5, p, 11, pos, &scratch), 1) << pos;
}

TEST(Sampler, TinyTopPKeepsOnlyTheTopToken) {
  const std::vector<float> logits = {0.5f, 0.4f, 0.45f, 0.3f};
  SamplerParams p;
  p.top_p = 1e-6f;
  std::vector<float> scratch;
  for (uint64_t pos = 0; pos < 500; ++pos) ASSERT_EQ(sample_token(logits.data(), 4, p, 5, pos, &scratch), 0) << pos;
}

TEST(Sampler, MinP1KeepsOnlyTheTopToken) {
  const std::vector<float> logits = {0.4f, 0.5f, 0.45f, 0.3f};
  SamplerParams p;
  p.min_p = 1.0f;
  std::vector<float> scratch;
  for (uint64_t pos = 0; pos < 500; ++pos) ASSERT_EQ(sample_token(logits.data(), 4, p, 5, pos, &scratch), 1) << pos;
}

// validate_sampler_params accepts any finite temperature > 0; tiny ones must act like greedy,
// not overflow logits / T into inf - inf = NaN probabilities.
TEST(Sampler, TinyPositiveTemperatureActsGreedy) {
  const std::vector<float> logits = {1.0f, 8.0f, -3.0f, 7.5f};
  std::vector<float> scratch;
  for (float t : {1e-3f, 1e-30f, 1e-38f, 1e-45f}) {
    SamplerParams p;
    p.temperature = t;
    ASSERT_TRUE(validate_sampler_params(p).is_ok()) << t;
    for (uint64_t pos = 0; pos < 50; ++pos)
      ASSERT_EQ(sample_token(logits.data(), 4, p, 9, pos, &scratch), 1) << "temperature " << t << " position " << pos;
  }
}

// ---------------------------------------------------------------------------------------------
// Distributions

TEST(Sampler, EmpiricalFrequenciesMatchSoftmax) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  for (float t : {1.0f, 0.7f, 2.0f}) {
    SamplerParams p;
    p.temperature = t;
    const auto want = softmax(logits, t);
    const auto got = frequencies(logits, p, 20000);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 0.02) << "token " << i << " T " << t;
  }
}

TEST(Sampler, TopKRenormalizesOverTheBest) {
  const std::vector<float> logits = {1.0f, 2.0f, -1.0f, 0.5f};
  SamplerParams p;
  p.temperature = 0.9f;
  p.top_k = 2;
  const auto full = softmax(logits, 0.9);
  const double kept = full[1] + full[0];
  const auto got = frequencies(logits, p, 20000);
  EXPECT_EQ(got[2], 0.0);
  EXPECT_EQ(got[3], 0.0);
  EXPECT_NEAR(got[1], full[1] / kept, 0.02);
  EXPECT_NEAR(got[0], full[0] / kept, 0.02);
  // top_k >= vocab or <= 0 is no truncation.
  for (int64_t k : {int64_t{0}, int64_t{-3}, int64_t{4}, int64_t{100}}) {
    p.top_k = k;
    const auto all = frequencies(logits, p, 20000);
    for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(all[i], full[i], 0.02) << "top_k " << k << " token " << i;
  }
}

TEST(Sampler, TopPKeepsShortestPrefixReachingP) {
  // softmax = {0.6095, 0.2242, 0.1360, 0.0303}
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  const auto full = softmax(logits, 1.0);
  SamplerParams p;
  p.top_p = 0.8f;  // 0.6095 < 0.8 <= 0.8337: two tokens
  auto got = frequencies(logits, p, 20000);
  EXPECT_EQ(got[2] + got[3], 0.0);
  EXPECT_NEAR(got[0], full[0] / (full[0] + full[1]), 0.02);
  p.top_p = 0.84f;  // three tokens
  got = frequencies(logits, p, 20000);
  EXPECT_EQ(got[3], 0.0);
  EXPECT_GT(got[2], 0.0);
  EXPECT_NEAR(got[2], full[2] / (full[0] + full[1] + full[2]), 0.02);
}

TEST(Sampler, MinPDropsTokensBelowFractionOfTop) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  const auto full = softmax(logits, 1.0);
  SamplerParams p;
  p.min_p = 0.25f;  // floor 0.152: keeps 0.2242, drops 0.1360
  auto got = frequencies(logits, p, 20000);
  EXPECT_EQ(got[2] + got[3], 0.0);
  EXPECT_NEAR(got[1], full[1] / (full[0] + full[1]), 0.02);
}

TEST(Sampler, NegativeInfinityLogitsAreNeverSampled) {
  const std::vector<float> logits = {-kInf, 0.0f, -kInf, 0.0f};
  SamplerParams p;
  const auto got = frequencies(logits, p, 4000);
  EXPECT_EQ(got[0] + got[2], 0.0);
  EXPECT_NEAR(got[1], 0.5, 0.03);
}

// ---------------------------------------------------------------------------------------------
// Determinism

TEST(Sampler, SameSeedAndPositionGiveSameToken) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(static_cast<double>(i)));
  SamplerParams p;
  p.temperature = 1.3f;
  std::vector<float> scratch_a, scratch_b;
  std::set<int32_t> by_seed;
  std::set<int32_t> by_position;
  for (uint64_t s = 0; s < 200; ++s) {
    const int32_t a = sample_token(logits.data(), 50, p, s, 17, &scratch_a);
    const int32_t b = sample_token(logits.data(), 50, p, s, 17, &scratch_b);
    ASSERT_EQ(a, b) << "seed " << s;
    by_seed.insert(a);
    by_position.insert(sample_token(logits.data(), 50, p, 3, s, &scratch_a));
  }
  EXPECT_GT(by_seed.size(), 5u);      // different seeds differ
  EXPECT_GT(by_position.size(), 5u);  // different positions differ
}

// ---------------------------------------------------------------------------------------------
// Validation

void expect_invalid(const SamplerParams& p, const std::string& name) {
  const Status s = validate_sampler_params(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
  EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
}

TEST(Sampler, ValidateRejectsBadParameters) {
  EXPECT_TRUE(validate_sampler_params(SamplerParams{}).is_ok());
  SamplerParams ok;
  ok.temperature = 0.0f;
  ok.top_p = 1.0f;
  ok.min_p = 1.0f;
  ok.top_k = -1;
  EXPECT_TRUE(validate_sampler_params(ok).is_ok());

  for (float t : {kNaN, -0.1f, kInf, -kInf}) {
    SamplerParams p;
    p.temperature = t;
    expect_invalid(p, "temperature");
  }
  for (float v : {0.0f, -0.5f, 1.0001f, 1.5f, kNaN, kInf}) {
    SamplerParams p;
    p.top_p = v;
    expect_invalid(p, "top_p");
  }
  for (float v : {-0.1f, 1.1f, kNaN, -kInf}) {
    SamplerParams p;
    p.min_p = v;
    expect_invalid(p, "min_p");
  }
}

}  // namespace
}  // namespace deepinfer
