// Generator on a random tiny checkpoint: request validation (ids, lengths, context limit,
// sampler parameters), stop reasons (EOS vs max_tokens), seeded reproducibility, batch
// independence, and EngineConfig::from_env.
#include "engine/generator.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/deepseek/deepseek_random.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 301;      // tiny_v3_config
constexpr int64_t kContext = 8;      // EngineConfig.max_model_len used below

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string((fs::path(::testing::TempDir()) / fmt::format("deepinfer_generator_{}", ::getpid())).string());
    fs::remove_all(*dir_);
    Status s = write_random_deepseek_checkpoint(*dir_, testing::tiny_v3_config(), 11, DType::kF32, false);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }

  static EngineConfig engine_config(int64_t max_model_len = kContext) {
    EngineConfig c;
    c.model_dir = *dir_;
    c.device = "cpu";
    c.n_threads = 2;
    c.kv_block_size = 4;
    c.max_model_len = max_model_len;
    return c;
  }

  static std::unique_ptr<Generator> make(int64_t max_model_len = kContext) {
    auto g = Generator::create(engine_config(max_model_len));
    EXPECT_TRUE(g.has_value()) << g.status().to_string();
    return g.has_value() ? std::move(*g) : nullptr;
  }

  static GenerateRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens, bool ignore_eos = true) {
    GenerateRequest r;
    r.prompt_ids = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampler.temperature = 0.0f;
    r.ignore_eos = ignore_eos;
    return r;
  }

  static GenerateResult run_one(Generator& g, const GenerateRequest& r) {
    auto res = g.generate({r});
    EXPECT_TRUE(res.has_value()) << res.status().to_string();
    if (!res.has_value()) return {};
    EXPECT_EQ(res->size(), 1u);
    return res->front();
  }

  static void expect_rejected(Generator& g, const GenerateRequest& r, StatusCode code,
                              std::initializer_list<std::string> needles) {
    const Status v = g.validate(r);
    EXPECT_EQ(v.code(), code) << v.to_string();
    for (const std::string& n : needles)
      EXPECT_NE(v.message().find(n), std::string::npos) << "expected '" << n << "' in: " << v.message();
    auto res = g.generate({r});
    ASSERT_FALSE(res.has_value());
    EXPECT_EQ(res.status().code(), code);
  }

  static std::string* dir_;
};

std::string* GeneratorTest::dir_ = nullptr;

std::vector<int32_t> prompt_of(int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(2 + (i * 37) % (kVocab - 2));
  return p;
}

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// ---------------------------------------------------------------------------------------------
// Validation

TEST_F(GeneratorTest, RejectsEmptyPrompt) {
  auto g = make();
  ASSERT_TRUE(g);
  expect_rejected(*g, greedy({}, 1), StatusCode::kInvalidArgument, {"empty"});
}

TEST_F(GeneratorTest, RejectsOutOfRangeIdsNamingIndexAndRange) {
  auto g = make();
  ASSERT_TRUE(g);
  expect_rejected(*g, greedy({-1, 5}, 1), StatusCode::kInvalidArgument, {"-1", "index 0", "[0, 301)"});
  expect_rejected(*g, greedy({5, 6, static_cast<int32_t>(kVocab)}, 1), StatusCode::kInvalidArgument,
                  {"301", "index 2", "[0, 301)"});
  expect_rejected(*g, greedy({std::numeric_limits<int32_t>::min()}, 1), StatusCode::kInvalidArgument, {"index 0"});
  // The largest valid id is fine.
  EXPECT_TRUE(g->validate(greedy({static_cast<int32_t>(kVocab - 1)}, 1)).is_ok());
}

TEST_F(GeneratorTest, RejectsNonPositiveMaxTokens) {
  auto g = make();
  ASSERT_TRUE(g);
  expect_rejected(*g, greedy({5}, 0), StatusCode::kInvalidArgument, {"max_tokens"});
  expect_rejected(*g, greedy({5}, -3), StatusCode::kInvalidArgument, {"max_tokens"});
}

TEST_F(GeneratorTest, RejectsBadSamplerParameters) {
  auto g = make();
  ASSERT_TRUE(g);
  GenerateRequest r = greedy({5}, 1);
  r.sampler.temperature = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(*g, r, StatusCode::kInvalidArgument, {"temperature"});
  r = greedy({5}, 1);
  r.sampler.top_p = 0.0f;
  expect_rejected(*g, r, StatusCode::kInvalidArgument, {"top_p"});
}

TEST_F(GeneratorTest, ContextLimit) {
  auto g = make();
  ASSERT_TRUE(g);
  EXPECT_EQ(g->max_model_len(), kContext);
  // prompt + max_tokens - 1 tokens are fed; that must fit in the context.
  expect_rejected(*g, greedy(prompt_of(kContext), 2), StatusCode::kOutOfRange, {"maximum context length is 8"});
  expect_rejected(*g, greedy(prompt_of(kContext + 1), 1), StatusCode::kOutOfRange, {"maximum context length is 8"});
  expect_rejected(*g, greedy(prompt_of(1), kContext + 1), StatusCode::kOutOfRange, {"maximum context length is 8"});

  // A prompt of exactly the context length with max_tokens = 1 works.
  GenerateResult full = run_one(*g, greedy(prompt_of(kContext), 1));
  EXPECT_EQ(full.token_ids.size(), 1u);
  EXPECT_EQ(full.finish_reason, "length");
  GenerateResult a = run_one(*g, greedy(prompt_of(kContext - 1), 2));
  EXPECT_EQ(a.token_ids.size(), 2u);
  GenerateResult b = run_one(*g, greedy(prompt_of(1), kContext));
  EXPECT_EQ(b.token_ids.size(), static_cast<size_t>(kContext));
}

TEST_F(GeneratorTest, MaxModelLenIsClampedToTheModel) {
  auto big = make(100000);
  ASSERT_TRUE(big);
  EXPECT_EQ(big->max_model_len(), 256);  // max_position_embeddings
  auto unset = make(0);
  ASSERT_TRUE(unset);
  EXPECT_EQ(unset->max_model_len(), 256);
}

TEST_F(GeneratorTest, OneBadRequestRejectsTheBatchNamingIt) {
  auto g = make();
  ASSERT_TRUE(g);
  auto res = g->generate({greedy({5, 6}, 2), greedy({5, 400}, 2)});
  ASSERT_FALSE(res.has_value());
  EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(res.status().message().find("request 1"), std::string::npos) << res.status().message();
}

TEST_F(GeneratorTest, CreateErrorsNameTheProblem) {
  EngineConfig c = engine_config();
  c.model_dir = "";
  auto a = Generator::create(c);
  ASSERT_FALSE(a.has_value());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  c.model_dir = *dir_ + "/does-not-exist";
  auto b = Generator::create(c);
  ASSERT_FALSE(b.has_value());
  EXPECT_EQ(b.status().code(), StatusCode::kNotFound);
  EXPECT_NE(b.status().message().find("does-not-exist"), std::string::npos) << b.status().message();
  c = engine_config();
  c.device = "tpu";
  auto d = Generator::create(c);
  ASSERT_FALSE(d.has_value());
  EXPECT_NE(d.status().message().find("tpu"), std::string::npos) << d.status().message();
}

// ---------------------------------------------------------------------------------------------
// Stopping

TEST_F(GeneratorTest, MaxTokensGivesLength) {
  auto g = make(0);
  ASSERT_TRUE(g);
  GenerateResult r = run_one(*g, greedy({3, 4, 5}, 5));
  EXPECT_EQ(r.token_ids.size(), 5u);
  EXPECT_EQ(r.finish_reason, "length");
  for (int32_t t : r.token_ids) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, kVocab);
  }
}

TEST_F(GeneratorTest, EosStopsWithStop) {
  auto g = make(0);
  ASSERT_TRUE(g);
  const GenerateResult free_run = run_one(*g, greedy({3, 4, 5}, 4));
  ASSERT_EQ(free_run.token_ids.size(), 4u);

  // A model identical but for eos_token_id = the k-th greedy token stops at its first
  // occurrence, inclusive, with "stop".
  for (size_t k : {size_t{0}, size_t{2}}) {
    const int32_t eos = free_run.token_ids[k];
    DeepseekConfig cfg = g->model().config();
    cfg.eos_token_ids = {eos};
    auto backend = make_backend("cpu", 2);
    ASSERT_TRUE(backend);
    Generator with_eos(g->config(), std::make_unique<DeepseekModel>(cfg, g->model().weights()), std::move(*backend));
    const size_t first = static_cast<size_t>(
        std::find(free_run.token_ids.begin(), free_run.token_ids.end(), eos) - free_run.token_ids.begin());
    const GenerateResult stopped = run_one(with_eos, greedy({3, 4, 5}, 4, /*ignore_eos=*/false));
    EXPECT_EQ(stopped.finish_reason, "stop") << "eos " << eos;
    EXPECT_EQ(stopped.token_ids,
              std::vector<int32_t>(free_run.token_ids.begin(), free_run.token_ids.begin() + static_cast<std::ptrdiff_t>(first) + 1));
    // ignore_eos runs on to max_tokens.
    const GenerateResult ignored = run_one(with_eos, greedy({3, 4, 5}, 4, /*ignore_eos=*/true));
    EXPECT_EQ(ignored.finish_reason, "length");
    EXPECT_EQ(ignored.token_ids, free_run.token_ids);
  }
}

// ---------------------------------------------------------------------------------------------
// Logits and sampling

TEST_F(GeneratorTest, ReturnedLogitsAgreeWithGreedyTokens) {
  auto g = make(0);
  ASSERT_TRUE(g);
  GenerateRequest r = greedy({7, 8, 9, 10}, 3);
  r.return_prompt_logits = true;
  r.return_step_logits = true;
  GenerateResult res = run_one(*g, r);
  ASSERT_EQ(res.token_ids.size(), 3u);
  ASSERT_EQ(res.prompt_logits.size(), static_cast<size_t>(4 * kVocab));
  ASSERT_EQ(res.step_logits.size(), static_cast<size_t>(3 * kVocab));
  for (float v : res.prompt_logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(argmax(res.prompt_logits.data() + 3 * kVocab, kVocab), res.token_ids[0]);
  EXPECT_TRUE(std::equal(res.step_logits.begin(), res.step_logits.begin() + kVocab,
                         res.prompt_logits.begin() + 3 * kVocab));
  for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(argmax(res.step_logits.data() + s * kVocab, kVocab), res.token_ids[static_cast<size_t>(s)]);
}

TEST_F(GeneratorTest, SeededSamplingIsReproducibleAndReportsSeed) {
  auto g = make(0);
  ASSERT_TRUE(g);
  GenerateRequest r = greedy({3, 4, 5}, 6);
  r.sampler.temperature = 0.8f;
  r.seed = 42;
  const GenerateResult a = run_one(*g, r);
  const GenerateResult b = run_one(*g, r);
  EXPECT_EQ(a.seed, 42u);
  EXPECT_EQ(a.token_ids.size(), 6u);
  EXPECT_EQ(a.token_ids, b.token_ids);

  // Unseeded: the reported seed replays the same tokens.
  r.seed.reset();
  const GenerateResult c = run_one(*g, r);
  r.seed = c.seed;
  const GenerateResult d = run_one(*g, r);
  EXPECT_EQ(c.token_ids, d.token_ids);

  // Different seeds do not all agree (hot temperature over a 301-token vocab).
  r.sampler.temperature = 5.0f;
  std::set<std::vector<int32_t>> outcomes;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    r.seed = seed;
    outcomes.insert(run_one(*g, r).token_ids);
  }
  EXPECT_GT(outcomes.size(), 1u);
}

TEST_F(GeneratorTest, BatchedRequestsMatchSoloRuns) {
  auto g = make(0);
  ASSERT_TRUE(g);
  GenerateRequest a = greedy({3, 4, 5}, 5);
  GenerateRequest b = greedy({9, 8, 7, 6, 5, 4}, 3);
  b.sampler.temperature = 0.9f;
  b.seed = 5;
  GenerateRequest c = greedy({100}, 4);
  auto batch = g->generate({a, b, c});
  ASSERT_TRUE(batch.has_value()) << batch.status().to_string();
  ASSERT_EQ(batch->size(), 3u);
  EXPECT_EQ((*batch)[0].token_ids, run_one(*g, a).token_ids);
  EXPECT_EQ((*batch)[1].token_ids, run_one(*g, b).token_ids);
  EXPECT_EQ((*batch)[2].token_ids, run_one(*g, c).token_ids);
  EXPECT_EQ((*batch)[1].seed, 5u);
}

// ---------------------------------------------------------------------------------------------
// EngineConfig::from_env

// Sets environment variables for one scope and restores the previous values afterwards.
class ScopedEnv {
 public:
  void set(const char* name, const char* value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(EngineConfigEnv, ReadsVariables) {
  ScopedEnv env;
  for (const char* v : {"DEEPINFER_DEVICE", "DEEPINFER_KV_BLOCK_SIZE", "DEEPINFER_MAX_MODEL_LEN"}) env.set(v, nullptr);
  env.set("DEEPINFER_HF_MODEL_DIR", "/models/tiny");
  env.set("DEEPINFER_NUM_THREADS", "3");
  auto c = EngineConfig::from_env();
  ASSERT_TRUE(c.has_value()) << c.status().to_string();
  EXPECT_EQ(c->model_dir, "/models/tiny");
  EXPECT_EQ(c->n_threads, 3);
  EXPECT_EQ(c->kv_block_size, 64);  // default
  EXPECT_EQ(c->device, "cpu");
  EXPECT_EQ(c->max_model_len, 0);

  env.set("DEEPINFER_KV_BLOCK_SIZE", "16");
  env.set("DEEPINFER_MAX_MODEL_LEN", "4096");
  env.set("DEEPINFER_DEVICE", "reference");
  c = EngineConfig::from_env();
  ASSERT_TRUE(c.has_value()) << c.status().to_string();
  EXPECT_EQ(c->kv_block_size, 16);
  EXPECT_EQ(c->max_model_len, 4096);
  EXPECT_EQ(c->device, "reference");
}

TEST(EngineConfigEnv, DefaultsWhenUnset) {
  ScopedEnv env;
  for (const char* v : {"DEEPINFER_HF_MODEL_DIR", "DEEPINFER_NUM_THREADS", "DEEPINFER_DEVICE",
                        "DEEPINFER_KV_BLOCK_SIZE", "DEEPINFER_MAX_MODEL_LEN"})
    env.set(v, nullptr);
  auto c = EngineConfig::from_env();
  ASSERT_TRUE(c.has_value()) << c.status().to_string();
  EXPECT_EQ(c->model_dir, DEEPINFER_DEFAULT_MODEL_DIR);  // the demo model (models/demo)
  EXPECT_EQ(c->n_threads, 0);
  EXPECT_EQ(c->kv_block_size, 64);
}

TEST(EngineConfigEnv, RejectsBadValuesNamingTheVariable) {
  ScopedEnv env;
  for (const char* v : {"DEEPINFER_NUM_THREADS", "DEEPINFER_DEVICE", "DEEPINFER_MAX_MODEL_LEN"}) env.set(v, nullptr);
  for (const char* bad : {"abc", "0", "-4", "16x", " 16", "4097", "1e3", "99999999999999999999"}) {
    env.set("DEEPINFER_KV_BLOCK_SIZE", bad);
    auto c = EngineConfig::from_env();
    ASSERT_FALSE(c.has_value()) << "accepted DEEPINFER_KV_BLOCK_SIZE=" << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("DEEPINFER_KV_BLOCK_SIZE"), std::string::npos) << c.status().message();
  }
  env.set("DEEPINFER_KV_BLOCK_SIZE", nullptr);
  env.set("DEEPINFER_NUM_THREADS", "-1");
  auto t = EngineConfig::from_env();
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.status().message().find("DEEPINFER_NUM_THREADS"), std::string::npos) << t.status().message();
  env.set("DEEPINFER_NUM_THREADS", nullptr);
  env.set("DEEPINFER_DEVICE", "tpu");
  auto d = EngineConfig::from_env();
  ASSERT_FALSE(d.has_value());
  EXPECT_NE(d.status().message().find("tpu"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("DEEPINFER_DEVICE"), std::string::npos) << d.status().message();
  env.set("DEEPINFER_DEVICE", nullptr);
  for (const char* bad : {"0", "1.5", "-0.1", "abc", "nan", ""}) {
    env.set("DEEPINFER_GPU_MEMORY_UTILIZATION", bad);
    auto g = EngineConfig::from_env();
    if (std::string(bad).empty()) {  // set but empty: the default
      EXPECT_TRUE(g.has_value());
      continue;
    }
    ASSERT_FALSE(g.has_value()) << "accepted DEEPINFER_GPU_MEMORY_UTILIZATION=" << bad;
    EXPECT_NE(g.status().message().find("DEEPINFER_GPU_MEMORY_UTILIZATION"), std::string::npos) << g.status().message();
  }
  env.set("DEEPINFER_GPU_MEMORY_UTILIZATION", "0.5");
  env.set("DEEPINFER_CUDA_GRAPHS", "0");
  auto ok = EngineConfig::from_env();
  ASSERT_TRUE(ok.has_value()) << ok.status().to_string();
  EXPECT_DOUBLE_EQ(ok->gpu_memory_utilization, 0.5);
  EXPECT_FALSE(ok->cuda_graphs);
  env.set("DEEPINFER_CUDA_GRAPHS", "2");
  EXPECT_FALSE(EngineConfig::from_env().has_value());
  env.set("DEEPINFER_CUDA_GRAPHS", nullptr);
  env.set("DEEPINFER_GPU_MEMORY_UTILIZATION", nullptr);
  // DEEPINFER_OVERLAP: unset leaves the per-backend default (on for GPUs), 0/1 force it.
  env.set("DEEPINFER_OVERLAP", nullptr);
  EXPECT_FALSE(EngineConfig::from_env()->overlap.has_value());
  env.set("DEEPINFER_OVERLAP", "0");
  EXPECT_EQ(EngineConfig::from_env()->overlap, std::optional<bool>(false));
  env.set("DEEPINFER_OVERLAP", "1");
  EXPECT_EQ(EngineConfig::from_env()->overlap, std::optional<bool>(true));
  env.set("DEEPINFER_OVERLAP", "yes");
  auto bad = EngineConfig::from_env();
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("DEEPINFER_OVERLAP"), std::string::npos) << bad.status().message();
  env.set("DEEPINFER_OVERLAP", nullptr);
}

}  // namespace
}  // namespace deepinfer
