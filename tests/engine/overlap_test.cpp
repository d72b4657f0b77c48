// Overlapped scheduling (DEEPINFER_OVERLAP): step N+1 is scheduled and launched before step N
// is post-processed. A fake executor that answers only at collect() (one step late) checks the
// ordering and bookkeeping; the real CPU runner checks that outputs equal the synchronous
// engine's, including stops, preemption and aborts in flight.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <random>

#include "engine/llm_engine.h"
#include "model/deepseek/deepseek_random.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

// Samples a pure function of (seed, position): EOS (id 1) now and then. Checks that every
// sequence's scheduled positions are contiguous, that collects come in launch order, and that
// it is never asked for more than two steps at once.
class DelayedFakeExecutor : public Executor {
 public:
  static int32_t token_for(uint64_t seed, int64_t position) {
    if ((seed + static_cast<uint64_t>(position)) % 23 == 0) return 1;
    return static_cast<int32_t>(2 + (seed * 31 + static_cast<uint64_t>(position) * 17) % 250);
  }
  std::vector<SampledToken> execute(const StepPlan&) override { ADD_FAILURE() << "synchronous execute"; return {}; }
  void launch(const StepPlan& plan) override {
    std::vector<std::pair<Sequence*, int64_t>> samples;  // (sequence, position of the new token)
    for (const ScheduledSeq& x : plan.seqs) {
      auto it = next_position_.find(x.seq->seq_id);
      if (x.start == 0 || x.start == x.seq->n_cached_prompt_tokens || it == next_position_.end()) {
        // first chunk, or a restart after preemption (recompute from a cached or empty prefix)
      } else {
        EXPECT_EQ(x.start, it->second) << "seq " << x.seq->seq_id;
      }
      next_position_[x.seq->seq_id] = x.start + x.n_tokens;
      if (x.sample) samples.emplace_back(x.seq, x.start + x.n_tokens);
    }
    queue_.push_back(std::move(samples));
    EXPECT_LE(queue_.size(), 2u);
    max_depth = std::max(max_depth, queue_.size());
  }
  std::vector<SampledToken> collect() override {
    std::vector<SampledToken> out;
    for (auto [seq, pos] : queue_.front()) out.push_back({seq, token_for(seq->seed, pos), -0.1f, {}, false});
    queue_.pop_front();
    return out;
  }
  static inline size_t max_depth = 0;  // most steps in flight at once, over the test

 private:
  std::deque<std::vector<std::pair<Sequence*, int64_t>>> queue_;
  std::map<int64_t, int64_t> next_position_;
};

const std::string& model_dir() {
  static const std::string dir = [] {
    const std::string d = fmt::format("{}/overlap_model_{}", ::testing::TempDir(), ::getpid());
    nlohmann::json c = testing::tiny_v3_config();
    c["max_position_embeddings"] = 1024;
    c["rope_scaling"]["original_max_position_embeddings"] = 256;
    EXPECT_TRUE(write_random_deepseek_checkpoint(d, c, 99, DType::kBF16, false).is_ok());
    return d;
  }();
  return dir;
}

std::unique_ptr<LLMEngine> make_engine(bool overlap, int64_t n_blocks, bool fake) {
  EngineConfig c;
  c.model_dir = model_dir();
  c.n_threads = 2;
  c.kv_block_size = 16;
  c.num_kv_blocks = n_blocks;
  c.overlap = overlap;
  c.batch_invariant = true;
  auto e = LLMEngine::create(c);
  EXPECT_TRUE(e.has_value()) << e.status().to_string();
  if (fake) (*e)->set_executor(std::make_unique<DelayedFakeExecutor>());
  return std::move(*e);
}

std::vector<EngineRequest> jobs(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<EngineRequest> out;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.request_id = fmt::format("r{}", i);
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < len; ++t) r.prompt_ids.push_back(2 + static_cast<int32_t>(rng() % 290));
    r.params.temperature = 1.0f;
    r.params.max_tokens = 1 + static_cast<int64_t>(rng() % 25);
    r.params.seq_seed = static_cast<uint64_t>(i) * 7 + 3;
    if (i % 5 == 0) r.params.stop_token_ids = {static_cast<int32_t>(2 + rng() % 250)};
    if (i % 4 == 0) r.params.repetition_penalty = 1.3f;  // needs the in-flight tokens
    if (i % 7 == 0) r.params.min_tokens = std::min<int64_t>(3, r.params.max_tokens);
    out.push_back(r);
  }
  return out;
}

// Runs to completion, aborting `abort_at[step]` requests; checks invariants every step.
std::map<std::string, CompletionOutput> run(LLMEngine& e, const std::vector<EngineRequest>& reqs,
                                            const std::map<int, std::string>& abort_at = {}) {
  for (const auto& r : reqs) EXPECT_TRUE(e.add_request(r).has_value());
  std::map<std::string, CompletionOutput> out;
  for (int step = 0; e.has_unfinished() && step < 100000; ++step) {
    if (auto it = abort_at.find(step); it != abort_at.end()) e.abort_request(it->second);
    for (auto& o : e.step()) {
      if (!o.finished) continue;
      EXPECT_FALSE(out.count(o.request_id)) << "finished twice " << o.request_id;
      out[o.request_id] = o.outputs[0];
    }
    Status s = e.scheduler().check_invariants();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  EXPECT_EQ(out.size(), reqs.size());
  EXPECT_EQ(e.scheduler().blocks().n_free(), e.scheduler().blocks().n_blocks());
  return out;
}

void expect_equal(const std::map<std::string, CompletionOutput>& a, const std::map<std::string, CompletionOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, c] : a) {
    EXPECT_EQ(c.token_ids, b.at(id).token_ids) << id;
    EXPECT_EQ(c.finish_reason, b.at(id).finish_reason) << id;
  }
}

TEST(Overlap, DelayedExecutorMatchesSynchronousOrderingAndStops) {
  auto reqs = jobs(40, 1);
  // The synchronous reference runs the same fake through the default launch/collect adapter.
  auto sync_engine = make_engine(false, 512, false);
  class SyncFake : public Executor {
   public:
    std::vector<SampledToken> execute(const StepPlan& plan) override {
      std::vector<SampledToken> out;
      for (const ScheduledSeq& x : plan.seqs)
        if (x.sample)
          out.push_back({x.seq, DelayedFakeExecutor::token_for(x.seq->seed, x.start + x.n_tokens), -0.1f, {}, false});
      return out;
    }
  };
  sync_engine->set_executor(std::make_unique<SyncFake>());
  auto expected = run(*sync_engine, reqs);
  DelayedFakeExecutor::max_depth = 0;
  auto overlap_engine = make_engine(true, 512, true);
  auto got = run(*overlap_engine, reqs);
  expect_equal(expected, got);
  EXPECT_EQ(DelayedFakeExecutor::max_depth, 2u);  // step N+1 was launched before N was collected
  int stops = 0;
  for (auto& [id, c] : got) stops += c.finish_reason == "stop";
  EXPECT_GT(stops, 3);  // EOS and stop_token_ids both fired
}

TEST(Overlap, AbortsInFlightEndEverythingAndLeakNothing) {
  auto reqs = jobs(30, 2);
  std::map<int, std::string> abort_at;
  for (int i = 0; i < 30; i += 3) abort_at[1 + i] = fmt::format("r{}", i);
  auto engine = make_engine(true, 512, true);
  auto got = run(*engine, reqs, abort_at);
  int aborted = 0;
  for (auto& [id, c] : got) aborted += c.finish_reason == "abort";
  EXPECT_GT(aborted, 3);
}

TEST(Overlap, RealRunnerMatchesSynchronous) {
  auto reqs = jobs(24, 3);
  auto expected = run(*make_engine(false, 512, false), reqs);
  auto got = run(*make_engine(true, 512, false), reqs);
  expect_equal(expected, got);
}

TEST(Overlap, PreemptionWithOverlapMatchesUnpressured) {
  auto reqs = jobs(20, 4);
  for (auto& r : reqs) r.params.max_tokens = 20;
  auto expected = run(*make_engine(false, 512, false), reqs);
  auto engine = make_engine(true, 7, false);
  auto got = run(*engine, reqs);
  EXPECT_GT(engine->scheduler().n_preemptions(), 0);
  expect_equal(expected, got);
}

}  // namespace
}  // namespace deepinfer
