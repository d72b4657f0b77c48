// The CPU backend against the naive fp32 reference backend, end to end on random checkpoints
// (V2 and V3 shapes, FP8), and the absorbed decode form against a full re-prefill.
// Tolerance: both compute in fp32 with different summation orders (the reference sums in
// double), so logits agree to ~1e-5 relative; 2e-4 absolute leaves margin at |logit| ~ 10.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "engine/generator.h"
#include "model/deepseek/deepseek_random.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

std::string make_model(const std::string& name, const nlohmann::json& config, DType dtype) {
  const std::string dir = fmt::format("{}/parity_{}_{}", ::testing::TempDir(), name, ::getpid());
  Status s = write_random_deepseek_checkpoint(dir, config, 1234, dtype, false);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return dir;
}

std::unique_ptr<Generator> open(const std::string& dir, const std::string& device, bool batch_invariant = false) {
  EngineConfig c;
  c.model_dir = dir;
  c.device = device;
  c.batch_invariant = batch_invariant;
  c.n_threads = 2;
  c.kv_block_size = 4;  // small pages: every prompt crosses page boundaries
  auto g = Generator::create(c);
  EXPECT_TRUE(g.has_value()) << g.status().to_string();
  return std::move(*g);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

GenerateRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  GenerateRequest r;
  r.prompt_ids = std::move(prompt);
  r.max_tokens = n;
  r.sampler.temperature = 0;
  r.ignore_eos = true;
  r.return_prompt_logits = true;
  r.return_step_logits = true;
  return r;
}

void check_parity(const std::string& name, const nlohmann::json& config, DType dtype) {
  const std::string dir = make_model(name, config, dtype);
  auto ref = open(dir, "reference");
  auto cpu = open(dir, "cpu");
  std::vector<GenerateRequest> reqs = {greedy({5, 17, 42, 9, 100, 3, 77}, 6), greedy({2}, 5),
                                       greedy({11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, 4)};
  auto a = ref->generate(reqs);
  auto b = cpu->generate(reqs);
  ASSERT_TRUE(a.has_value()) << a.status().to_string();
  ASSERT_TRUE(b.has_value()) << b.status().to_string();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*a)[i].token_ids, (*b)[i].token_ids) << name << " request " << i;
    EXPECT_LT(max_abs_diff((*a)[i].prompt_logits, (*b)[i].prompt_logits), 2e-4f) << name;
    EXPECT_LT(max_abs_diff((*a)[i].step_logits, (*b)[i].step_logits), 2e-4f) << name;
  }
}

TEST(DeepseekBackendParity, V3Bf16) { check_parity("v3", testing::tiny_v3_config(), DType::kBF16); }
TEST(DeepseekBackendParity, V2F32) { check_parity("v2", testing::tiny_v2_config(), DType::kF32); }
TEST(DeepseekBackendParity, V3Fp8) { check_parity("fp8", testing::tiny_fp8_config(), DType::kF8E4M3); }

// Decoding token t+1 with the absorbed form over the cache must equal re-prefilling the whole
// sequence with the naive form (the two MLA forms are the same math).
TEST(DeepseekBackendParity, AbsorbedDecodeMatchesNaivePrefill) {
  const std::string dir = make_model("absorb", testing::tiny_v3_config(), DType::kBF16);
  auto cpu = open(dir, "cpu");
  auto gen = cpu->generate({greedy({5, 17, 42, 9, 100}, 4)});
  ASSERT_TRUE(gen.has_value());
  const auto& g = gen->front();
  const int64_t vocab = cpu->model().config().vocab_size;
  std::vector<int32_t> seq = {5, 17, 42, 9, 100};
  for (size_t step = 1; step < g.token_ids.size(); ++step) {
    seq.push_back(g.token_ids[step - 1]);
    auto full = cpu->generate({greedy(seq, 1)});
    ASSERT_TRUE(full.has_value());
    const std::vector<float> last(full->front().prompt_logits.end() - vocab, full->front().prompt_logits.end());
    const std::vector<float> decoded(g.step_logits.begin() + static_cast<int64_t>(step) * vocab,
                                     g.step_logits.begin() + static_cast<int64_t>(step + 1) * vocab);
    EXPECT_LT(max_abs_diff(last, decoded), 2e-4f) << "step " << step;
  }
}

// A request's tokens do not depend on its neighbours (the CPU kernels are batch-invariant):
// bitwise-identical logits alone and in a batch.
TEST(DeepseekBackendParity, BatchInvariantOnCpu) {
  const std::string dir = make_model("invariance", testing::tiny_v3_config(), DType::kBF16);
  auto cpu = open(dir, "cpu");
  auto alone = cpu->generate({greedy({7, 8, 9, 10, 11, 12}, 5)});
  auto batched = cpu->generate({greedy({1, 2, 3}, 3), greedy({7, 8, 9, 10, 11, 12}, 5), greedy({99, 98, 97, 96, 95, 94, 93, 92, 91}, 7)});
  ASSERT_TRUE(alone.has_value() && batched.has_value());
  EXPECT_EQ(alone->front().token_ids, (*batched)[1].token_ids);
  EXPECT_EQ(alone->front().step_logits, (*batched)[1].step_logits);
  EXPECT_EQ(alone->front().prompt_logits, (*batched)[1].prompt_logits);
}

// The batch-invariant mode on a host backend (MlaPolicy::kByOrigin): prompt rows take the naive
// form and generated rows the absorbed one, so its logits equal the default mode's bitwise
// wherever the default takes the same forms — multi-token prompts naive, decode steps absorbed
// (the absorbed form's prompt logits differ from these by rounding, ~1e-6).
TEST(DeepseekBackendParity, BatchInvariantModeTakesTheNaiveFormForPrompts) {
  const std::string dir = make_model("by_origin", testing::tiny_v3_config(), DType::kBF16);
  auto plain = open(dir, "cpu");
  auto invariant = open(dir, "cpu", true);
  const std::vector<GenerateRequest> reqs = {greedy({7, 8, 9, 10, 11, 12}, 5), greedy({40, 41}, 3)};
  auto a = plain->generate(reqs);
  auto b = invariant->generate(reqs);
  ASSERT_TRUE(a.has_value() && b.has_value());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*a)[i].token_ids, (*b)[i].token_ids) << "request " << i;
    EXPECT_EQ((*a)[i].prompt_logits, (*b)[i].prompt_logits) << "request " << i;
    EXPECT_EQ((*a)[i].step_logits, (*b)[i].step_logits) << "request " << i;
  }
}

}  // namespace
}  // namespace deepinfer
