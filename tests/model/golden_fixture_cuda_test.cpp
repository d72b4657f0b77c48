// Every transformers fixture (tests/fixtures/, see golden_fixture_test.cpp) on the CUDA backend,
// with the GPU bound of the CUDA issue:
//  - greedy tokens identical for all 16 steps, or, at the first step where they differ, a
//    near-tie: each side's token among the other's top-5 (comparison stops there, since the
//    continuations then condition on different tokens), unless a routing near-tie (below)
//    came first;
//  - logits relative error ‖ours − ref‖₂ / ‖ref‖₂ ≤ 2e-2 over each logits tensor (the prompt
//    positions; the greedy steps), and ≤ 6e-2 for every single row, counting the rows before a
//    token divergence and before the first routing near-tie: a position where the GPU chose other
//    experts than the fp32 CPU engine (which routes like transformers: it matches the fixtures to
//    1e-5, far inside their smallest router gap), after which outputs change discontinuously as
//    at a token near-tie (support/routing_trace.h). Reported, not hidden.
// Why these bounds: the GPU rounds GEMM operands and the KV cache to bf16 (relative 2^-8 ≈ 3.9e-3
// each), seven roundings per layer through 2-4 layers of 64-wide models, where errors barely
// average out; the fixtures were computed in fp32. Per tensor that stays ≤ 1.3e-2 on every
// fixture. Single rows go further: transformers itself, run in bf16 on the same fixtures
// (scripts/golden/bf16_reference_error.py, docs/device-runs/2026-11-30-s3/bf16_reference.json),
// lands 1.2e-2 to 4.4e-2 from its fp32 rows before any routing flip (v2_qlora_grouped_yarn,
// routed_scaling_factor 16: 2.9e-2 and 4.4e-2 on prompt rows). We measured ≤ 2.7e-2 there and
// ≤ 1.3e-2 elsewhere while prefill attention ran in TF32; since it runs FlashAttention's numerics
// (bf16 q, K, V and probabilities: cuda_mla_prefill.cu) one greedy-step row of that fixture
// reaches 5.06e-2 (run s5-3; its tensors stay ≤ 1.6e-2, every other fixture's rows ≤ 1.5e-2) —
// the size transformers' own bf16 run reaches there. 6e-2 per row still catches any row-local
// bug (a wrong page, position or mask moves a row by O(1)).
// FP8 checkpoints on sm_90: ≤ 4e-2 per tensor. Their linears past 2 rows (dense, with K a
// multiple of 128) and MoE steps past one token (I a multiple of 16) quantize each GEMM input
// per 1×128 group to e4m3 — DeepSeek's W8A8 recipe, which transformers' own FP8 kernels follow;
// the fixtures were computed on dequantized weights without it — ~2^-4/√3 relative per element
// on top of the bf16 roundings: v3_fp8 measured 2.77e-2 and 2.47e-2 per prompt tensor, 3.4e-2
// worst row (run s17-7; 6e-3 before its 19-token prompts took W8A8). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_common.h"  // fp8_wgmma_available
#endif
#include "engine/generator.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "support/cuda_available.h"
#include "support/logits_compare.h"
#include "support/routing_trace.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using testing::fixture_dirs;
using testing::in_top5;
using testing::row_rel_err;

class GoldenFixtureCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenFixtureCuda, MatchesTransformersWithinBf16) {
  if (!testing::try_cuda_backend()) GTEST_SKIP() << "no CUDA backend/GPU here (runs on the GPU machine)";
  const std::string dir = GetParam();
  auto golden = read_json_file(dir + "/golden.json");
  ASSERT_TRUE(golden.has_value()) << golden.status().to_string();
  auto tensors = SafetensorsFile::open(dir + "/golden.safetensors");
  ASSERT_TRUE(tensors.has_value()) << tensors.status().to_string();
  EngineConfig config;
  config.model_dir = dir;
  config.device = "cuda";
  config.kv_block_size = 8;  // 19-token prompts span three pages
  auto gen = Generator::create(config);
  ASSERT_TRUE(gen.has_value()) << gen.status().to_string();
  config.device = "cpu";
  auto cpu = Generator::create(config);
  ASSERT_TRUE(cpu.has_value()) << cpu.status().to_string();
  const int64_t vocab = (*gen)->model().config().vocab_size;
  auto model_config = read_json_file(dir + "/config.json");
  ASSERT_TRUE(model_config.has_value()) << model_config.status().to_string();
#ifdef DEEPINFER_HAVE_CUDA
  const bool w8a8 = model_config->contains("quantization_config") && cuda::fp8_wgmma_available();
#else
  const bool w8a8 = false;
#endif
  const double tensor_bound = w8a8 ? 4e-2 : 2e-2;
  std::vector<Tensor> trace_cpu, trace_gpu;
  (*cpu)->model().set_routing_trace(&trace_cpu);
  (*gen)->model().set_routing_trace(&trace_gpu);

  const auto& prompts = golden->at("prompts");
  std::vector<GenerateRequest> reqs;
  for (const auto& p : prompts) {
    GenerateRequest r;
    r.prompt_ids = p.at("prompt_ids").get<std::vector<int32_t>>();
    r.max_tokens = static_cast<int64_t>(p.at("greedy_ids").size());
    r.sampler.temperature = 0;
    r.ignore_eos = true;
    r.return_prompt_logits = true;
    r.return_step_logits = true;
    reqs.push_back(r);
  }
  auto out = (*gen)->generate(reqs);
  ASSERT_TRUE(out.has_value()) << out.status().to_string();
  ASSERT_TRUE((*cpu)->generate(reqs).has_value());
  const auto flip = testing::first_routing_mismatch(trace_cpu, trace_gpu, (*cpu)->model(), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string tag = dir + " prompt " + std::to_string(i);
    const auto expected = prompts[i].at("greedy_ids").get<std::vector<int32_t>>();
    const auto& ours = (*out)[i];
    const int64_t np = static_cast<int64_t>(reqs[i].prompt_ids.size());
    Tensor ref_prompt = tensors->tensor(*tensors->find("p" + std::to_string(i) + ".prompt_logits"));
    Tensor ref_steps = tensors->tensor(*tensors->find("p" + std::to_string(i) + ".greedy_logits"));
    double worst = 0;                        // worst single row
    testing::TensorRelErr prompt_err, step_err;  // per tensor
    std::string over;  // rows beyond 2e-2, for the log
    for (int64_t row = 0; row < ref_prompt.size(0); ++row) {
      const float* a = ours.prompt_logits.data() + row * vocab;
      const float* ref = ref_prompt.data<float>() + row * vocab;
      const double e = row_rel_err(a, ref, vocab);
      if (e > 2e-2) over += fmt::format(" prompt[{}]={:.2e}", row, e);
      if (row < flip[i]) {
        worst = std::max(worst, e);
        prompt_err.add(a, ref, vocab);
      }
    }
    size_t agree = 0;
    for (; agree < expected.size() && agree < ours.token_ids.size(); ++agree) {
      // Step `agree`'s logits were computed on identical prefixes: compare them.
      const float* a = ours.step_logits.data() + static_cast<int64_t>(agree) * vocab;
      const float* ref = ref_steps.data<float>() + static_cast<int64_t>(agree) * vocab;
      const double e = row_rel_err(a, ref, vocab);
      if (e > 2e-2) over += fmt::format(" step[{}]={:.2e}", agree, e);
      if (np - 1 + static_cast<int64_t>(agree) < flip[i]) {
        worst = std::max(worst, e);
        step_err.add(a, ref, vocab);
      }
      if (ours.token_ids[agree] != expected[agree]) {
        if (np - 1 + static_cast<int64_t>(agree) >= flip[i]) break;  // downstream of a routing near-tie
        EXPECT_TRUE(in_top5(ref, vocab, ours.token_ids[agree])) << tag << " step " << agree;
        EXPECT_TRUE(in_top5(a, vocab, expected[agree])) << tag << " step " << agree;
        break;
      }
    }
    EXPECT_LE(prompt_err.value(), tensor_bound) << tag << " (prompt logits tensor)";
    EXPECT_LE(step_err.value(), tensor_bound) << tag << " (greedy-step logits tensor)";
    EXPECT_LE(worst, 6e-2) << tag << " (worst row)";
    RecordProperty("p" + std::to_string(i) + "_worst_rel_err", std::to_string(worst));
    RecordProperty("p" + std::to_string(i) + "_tokens_agreeing", std::to_string(agree));
    std::printf("[cuda fixture] %s: %zu/%zu greedy tokens identical, logits rel err per tensor %.3e (prompt) %.3e "
                "(steps), worst row %.3e, before routing near-tie at position %lld;%s\n",
                tag.c_str(), agree, expected.size(), prompt_err.value(), step_err.value(), worst,
                static_cast<long long>(flip[i] == INT64_MAX ? -1 : flip[i]), over.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenFixtureCuda, ::testing::ValuesIn(fixture_dirs()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return fs::path(param.param).filename().string();
                         });

}  // namespace
}  // namespace deepinfer
