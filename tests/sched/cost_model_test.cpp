// The chunk cost model: least squares recovers known coefficients, the chunk solver returns
// the largest chunk within budget, and the scheduler obeys the limit it induces.
#include <gtest/gtest.h>

#include "sched/cost_model.h"
#include "sched/scheduler.h"

namespace deepinfer {
namespace {

TEST(ChunkCostModel, FitRecoversCoefficients) {
  const ChunkCostModel truth{2e-3, 5e-5, 1e-9, 3e-8};
  std::vector<CostSample> samples;
  uint32_t state = 1;
  for (double q : {1.0, 16.0, 64.0, 256.0, 1024.0, 4096.0})
    for (double c : {0.0, 512.0, 4096.0, 16384.0}) {
      state = state * 1664525u + 1013904223u;
      const double noise = 1.0 + (static_cast<double>((state >> 8) % 1000) - 500.0) * 1e-6;  // ±0.05 %
      samples.push_back({q, c, truth.cost(q, c) * noise});
    }
  auto fit = ChunkCostModel::fit(samples);
  ASSERT_TRUE(fit.has_value()) << fit.status().to_string();
  EXPECT_NEAR(fit->k0, truth.k0, truth.k0 * 0.05);
  EXPECT_NEAR(fit->k1, truth.k1, truth.k1 * 0.02);
  EXPECT_NEAR(fit->k2, truth.k2, truth.k2 * 0.05);
  EXPECT_NEAR(fit->k3, truth.k3, truth.k3 * 0.02);
  auto round_trip = ChunkCostModel::from_json(fit->to_json());
  ASSERT_TRUE(round_trip.has_value());
  EXPECT_EQ(round_trip->k2, fit->k2);
}

TEST(ChunkCostModel, FitRejectsDegenerateSamples) {
  EXPECT_FALSE(ChunkCostModel::fit({{1, 0, 1}, {1, 0, 1}}).has_value());
  EXPECT_FALSE(ChunkCostModel::fit({{1, 0, 1}, {1, 0, 1}, {1, 0, 1}, {1, 0, 1}}).has_value());
  EXPECT_FALSE(ChunkCostModel::from_json(nlohmann::json{{"k0", 1}}).has_value());
  EXPECT_FALSE(ChunkCostModel::from_json(nlohmann::json{{"k0", -1}, {"k1", 0}, {"k2", 0}, {"k3", 0}}).has_value());
}

TEST(ChunkCostModel, MaxChunkIsLargestWithinBudget) {
  const ChunkCostModel m{1e-3, 1e-5, 1e-9, 1e-8};
  for (int64_t cached : {0, 1000, 100000}) {
    const int64_t q = m.max_chunk(cached, 0.05, 32768);
    EXPECT_LE(m.cost(static_cast<double>(q), static_cast<double>(cached)), 0.05);
    if (q < 32768) {
      EXPECT_GT(m.cost(static_cast<double>(q + 1), static_cast<double>(cached)), 0.05);
    }
  }
  EXPECT_EQ(m.max_chunk(0, 1e9, 32768), 32768);  // capped
  EXPECT_EQ(m.max_chunk(0, 0.0, 32768), 1);      // always advances
}

TEST(ChunkCostModel, SchedulerChunksFollowTheLimit) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 100000;
  c.chunk_limit = [](int64_t, int64_t cached) { return cached == 0 ? 10 : 25; };
  Scheduler s(c, std::make_unique<BlockManager>(64, 16, false));
  auto seq = std::make_unique<Sequence>();
  seq->prompt_ids.assign(100, 3);
  seq->params.max_tokens = 4;
  Sequence* raw = s.add(std::move(seq));
  std::vector<int64_t> chunks;
  for (int step = 0; step < 10 && raw->n_computed() < raw->n_tokens(); ++step) {
    StepPlan p = s.schedule();
    ASSERT_EQ(p.seqs.size(), 1u);
    chunks.push_back(p.seqs[0].n_tokens);
    s.on_step_computed(p);
    if (p.seqs[0].sample) break;
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{10, 25, 25, 25, 15}));
}

}  // namespace
}  // namespace deepinfer
