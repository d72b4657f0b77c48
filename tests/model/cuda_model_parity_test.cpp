// The whole model on CUDA against the CPU engine (fp32, itself checked against transformers by
// the golden fixtures) on random checkpoints: a dense-only V3, a MoE V3, a V2-Lite shape and
// FP8. Per logits row, relative L2 error ≤ 2e-2 (the CUDA issue's bf16 bound; see
// golden_fixture_cuda_test.cpp) up to the first routing near-tie (support/routing_trace.h), and
// greedy tokens equal up to a near-tie (top-5 rule). FP8 on sm_90 (its dims fit the MoE's W8A8
// form, moe_w8a8_ok): ≤ 8e-2. The GPU then quantizes each expert GEMM's input per 1×128 group
// to e4m3 (DeepSeek's and transformers' own FP8 recipe; the CPU engine does not): ~2^-4/√3
// relative per element, carried to every MoE output (measured 3.6e-2 to 4.7e-2 on this model's
// rows, run s17-6). 8e-2 still catches a row-local bug (a wrong page, position or expert moves a
// row by O(1)).
// The dense-only model isolates attention and GEMM rounding from MoE routing decisions. A model
// with V2-Lite's attention dims, its requests one at a time, runs the CUDA backend's fused
// one-token attention sublayer in its decode steps (graph-captured).
// Skipped without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_common.h"  // moe_w8a8_ok
#endif
#include "engine/generator.h"
#include "model/deepseek/deepseek_random.h"
#include "support/cuda_available.h"
#include "support/logits_compare.h"
#include "support/routing_trace.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

using testing::in_top5;
using testing::row_rel_err;

std::unique_ptr<Generator> open(const std::string& dir, const std::string& device) {
  EngineConfig c;
  c.model_dir = dir;
  c.device = device;
  c.n_threads = 2;
  c.kv_block_size = 4;
  auto g = Generator::create(c);
  EXPECT_TRUE(g.has_value()) << g.status().to_string();
  return std::move(*g);
}

// Greedy requests with prompts of `lens` tokens (ids from a fixed pattern under `vocab`), each
// generating max_tokens with its prompt and step logits returned.
std::vector<GenerateRequest> greedy_requests(const std::vector<int64_t>& lens, int64_t vocab, int64_t max_tokens) {
  std::vector<GenerateRequest> all;
  for (int64_t len : lens) {
    GenerateRequest r;
    for (int64_t i = 0; i < len; ++i) r.prompt_ids.push_back(static_cast<int32_t>(2 + (i * 31 + len) % (vocab - 2)));
    r.max_tokens = max_tokens;
    r.sampler.temperature = 0;
    r.ignore_eos = true;
    r.return_prompt_logits = true;
    r.return_step_logits = true;
    all.push_back(r);
  }
  return all;
}

// one_by_one: each request generated alone (decode steps of one sequence, one token: the CUDA
// backend's fused attention sublayer where the dims take it), not all four in one batch.
void check(const std::string& name, nlohmann::json config, DType dtype, double bound = 2e-2,
           const std::vector<int64_t>& prompt_lens = {1, 6, 23, 40}, bool one_by_one = false) {
  if (!testing::try_cuda_backend()) GTEST_SKIP() << "no CUDA backend/GPU here (runs on the GPU machine)";
  const std::string dir = fmt::format("{}/cuda_parity_{}_{}", ::testing::TempDir(), name, ::getpid());
  ASSERT_TRUE(write_random_deepseek_checkpoint(dir, config, 4321, dtype, false).is_ok());
  auto cpu = open(dir, "cpu");
  auto gpu = open(dir, "cuda");
  const int64_t vocab = cpu->model().config().vocab_size;
  const std::vector<GenerateRequest> all = greedy_requests(prompt_lens, vocab, 12);
  std::vector<std::vector<GenerateRequest>> groups;
  if (one_by_one)
    for (const GenerateRequest& r : all) groups.push_back({r});
  else
    groups.push_back(all);
  size_t req_index = 0;
  for (const std::vector<GenerateRequest>& reqs : groups) {
    std::vector<Tensor> trace_cpu, trace_gpu;
    cpu->model().set_routing_trace(&trace_cpu);
    gpu->model().set_routing_trace(&trace_gpu);
    auto a = cpu->generate(reqs);
    auto b = gpu->generate(reqs);
    ASSERT_TRUE(a && b);
    const auto flip = testing::first_routing_mismatch(trace_cpu, trace_gpu, cpu->model(), reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto &x = (*a)[i], &y = (*b)[i];
      double worst = 0, after_flip = 0;
      const int64_t np = static_cast<int64_t>(reqs[i].prompt_ids.size());
      for (int64_t r = 0; r < np; ++r) {
        const double e = row_rel_err(y.prompt_logits.data() + r * vocab, x.prompt_logits.data() + r * vocab, vocab);
        double& bucket = r < flip[i] ? worst : after_flip;
        bucket = std::max(bucket, e);
      }
      size_t agree = 0;
      for (; agree < x.token_ids.size(); ++agree) {
        const float* ref = x.step_logits.data() + static_cast<int64_t>(agree) * vocab;
        const float* got = y.step_logits.data() + static_cast<int64_t>(agree) * vocab;
        const double e = row_rel_err(got, ref, vocab);
        double& bucket = np - 1 + static_cast<int64_t>(agree) < flip[i] ? worst : after_flip;
        bucket = std::max(bucket, e);
        if (x.token_ids[agree] != y.token_ids[agree]) {
          if (np - 1 + static_cast<int64_t>(agree) >= flip[i]) break;  // downstream of a routing near-tie
          EXPECT_TRUE(in_top5(ref, vocab, y.token_ids[agree]) && in_top5(got, vocab, x.token_ids[agree]))
              << name << " request " << i << " step " << agree;
          break;
        }
      }
      std::printf("[cuda parity] %s request %zu (prompt %lld): %zu/%zu tokens identical, worst rel err %.3e; "
                  "routing near-tie at position %lld (rel err after it %.3e)\n",
                  name.c_str(), req_index + i, static_cast<long long>(np), agree, x.token_ids.size(), worst,
                  static_cast<long long>(flip[i] == INT64_MAX ? -1 : flip[i]), after_flip);
      EXPECT_LE(worst, bound) << name << " request " << req_index + i;
    }
    req_index += reqs.size();
  }
}

TEST(CudaModelParity, V3DenseOnly) {
  nlohmann::json c = testing::tiny_v3_config();
  c["first_k_dense_replace"] = c["num_hidden_layers"];
  check("v3_dense", c, DType::kBF16);
}
TEST(CudaModelParity, V3Moe) { check("v3_moe", testing::tiny_v3_config(), DType::kBF16); }
TEST(CudaModelParity, V2) { check("v2", testing::tiny_v2_config(), DType::kF32); }
// `c` with DeepSeek-V2-Lite's attention (H 16, dn 128, dr 64, dv 128, r 512, no q-LoRA) at a small
// hidden size (256, dense MLP 256 wide), 2 layers.
nlohmann::json with_v2_lite_attention(nlohmann::json c) {
  c["hidden_size"] = 256;
  c["q_lora_rank"] = nullptr;
  c["num_attention_heads"] = 16;
  c["kv_lora_rank"] = 512;
  c["qk_nope_head_dim"] = 128;
  c["qk_rope_head_dim"] = 64;
  c["v_head_dim"] = 128;
  c["intermediate_size"] = 256;
  c["num_hidden_layers"] = 2;
  return c;
}
// V2-Lite's attention dims, each request alone: its decode steps take the fused one-token
// sublayer kernel (graph-captured, cuda_mla_sublayer.cu) on sm_90a; the 300-token prompt spreads
// its keys over 10 splits.
TEST(CudaModelParity, V2LiteAttentionOneSequence) {
  nlohmann::json c = with_v2_lite_attention(testing::tiny_v2_config());
  c["moe_intermediate_size"] = 64;
  check("v2_lite_attn", c, DType::kF32, 2e-2, {1, 23, 300}, true);
}
// The bound for the FP8 model `c` (the header): 8e-2 where its dims take the MoE's W8A8 form on
// this GPU, else the bf16 bound.
double fp8_bound(const nlohmann::json& c) {
#ifdef DEEPINFER_HAVE_CUDA
  const bool w8a8 = cuda::moe_w8a8_ok(c["hidden_size"].get<int64_t>(), c["moe_intermediate_size"].get<int64_t>(), true,
                                      c["quantization_config"]["weight_block_size"][1].get<int64_t>());
#else
  (void)c;
  const bool w8a8 = false;
#endif
  return w8a8 ? 8e-2 : 2e-2;
}
TEST(CudaModelParity, V3Fp8) {
  const nlohmann::json c = testing::tiny_fp8_config();
  check("v3_fp8", c, DType::kF8E4M3, fp8_bound(c));
}
// FP8 at V2-Lite's attention dims with kv_b's prefill decompression on the W8A8 form
// (DEEPINFER_CUDA_KVB_W8A8=1, read where the backend is made; off by default until measured):
// the 300-token prompt's keys through the FP8 GEMM; decode steps keep kv_b's bf16 copy (the
// absorbed form). The FP8 bound (8e-2, above): kv_b's W8A8 adds its ~3.8e-2 per attention output
// (CudaMlaPrefill.KvbOnW8a8MatchesReference) beside the experts' 3.6–4.7e-2.
TEST(CudaModelParity, V2LiteAttentionFp8KvbOnW8a8) {
  nlohmann::json c = with_v2_lite_attention(testing::tiny_fp8_config());
  c["moe_intermediate_size"] = 128;
  struct Env {  // set for the generators this test makes, cleared after
    Env() { ::setenv("DEEPINFER_CUDA_KVB_W8A8", "1", 1); }
    ~Env() { ::unsetenv("DEEPINFER_CUDA_KVB_W8A8"); }
  } env;
  check("v2_lite_fp8_kvb", c, DType::kF8E4M3, 8e-2, {1, 23, 300}, true);
}

// The router on the norm's two-part bf16 rows (DEEPINFER_CUDA_ROUTER_PARTS=1, from one row here:
// _ROWS=1; read where the backend is made; off by default until timed) within the suite's bounds
// against the CPU engine, bf16 and FP8 checkpoints (their routers are bf16 values, so the GPU
// placement builds [W | W] — checked, else the form would not run). Routing may move at
// near-ties of ~1e-5 of Σ|x·w|; the check's rule holds logits to the bound before a request's
// first moved route.
TEST(CudaModelParity, V3MoeRouterParts) {
  if (!testing::try_cuda_backend()) GTEST_SKIP() << "no CUDA backend/GPU here (runs on the GPU machine)";
  struct Env {  // set for the generators this test makes, cleared after
    Env() {
      ::setenv("DEEPINFER_CUDA_ROUTER_PARTS", "1", 1);
      ::setenv("DEEPINFER_CUDA_ROUTER_PARTS_ROWS", "1", 1);
    }
    ~Env() {
      ::unsetenv("DEEPINFER_CUDA_ROUTER_PARTS");
      ::unsetenv("DEEPINFER_CUDA_ROUTER_PARTS_ROWS");
    }
  } env;
  {
    const std::string dir = fmt::format("{}/cuda_router_parts_{}", ::testing::TempDir(), ::getpid());
    ASSERT_TRUE(write_random_deepseek_checkpoint(dir, testing::tiny_v3_config(), 4321, DType::kBF16, false).is_ok());
    auto gen = open(dir, "cuda");
    ASSERT_TRUE(gen);
    bool placed = false;
    for (const DeepseekLayerWeights& l : gen->model().weights().layers) placed = placed || l.gate.derived2.defined();
    ASSERT_TRUE(placed) << "no MoE router placed with [W | W]: the form would not run";
  }
  check("v3_moe_router_parts", testing::tiny_v3_config(), DType::kBF16);
  const nlohmann::json c = testing::tiny_fp8_config();
  check("v3_fp8_router_parts", c, DType::kF8E4M3, fp8_bound(c));
}

// q_pe's rotation in the prefill attention kernel (DEEPINFER_CUDA_MLA_Q_ROPE=1, read where the
// backend is made; off by default until timed) changes no value: the same three prompts (one
// step of prefill rows only, where the latent write leaves q to the attention, then decode
// steps) on two CUDA generators, the knob off and on — prompt and step logits bitwise equal,
// tokens equal. V2-Lite's attention dims, bf16 and FP8 checkpoints.
TEST(CudaModelParity, V2LiteQRopeInAttentionSameBits) {
  if (!testing::try_cuda_backend()) GTEST_SKIP() << "no CUDA backend/GPU here (runs on the GPU machine)";
  for (DType dtype : {DType::kF32, DType::kF8E4M3}) {
    nlohmann::json c = with_v2_lite_attention(dtype == DType::kF32 ? testing::tiny_v2_config()
                                                                   : testing::tiny_fp8_config());
    c["moe_intermediate_size"] = 128;
    const std::string dir =
        fmt::format("{}/cuda_q_rope_{}_{}", ::testing::TempDir(), dtype == DType::kF32 ? "bf16" : "fp8", ::getpid());
    ASSERT_TRUE(write_random_deepseek_checkpoint(dir, c, 4321, dtype, false).is_ok());
    const std::vector<GenerateRequest> reqs = greedy_requests({5, 23, 300}, c["vocab_size"].get<int64_t>(), 6);
    std::vector<GenerateResult> out[2];
    for (int knob = 0; knob < 2; ++knob) {
      ::setenv("DEEPINFER_CUDA_MLA_Q_ROPE", knob ? "1" : "0", 1);
      auto gen = open(dir, "cuda");
      ::unsetenv("DEEPINFER_CUDA_MLA_Q_ROPE");
      ASSERT_TRUE(gen);
      auto res = gen->generate(reqs);
      ASSERT_TRUE(res) << res.status().to_string();
      out[knob] = std::move(*res);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      const GenerateResult &a = out[0][i], &b = out[1][i];
      SCOPED_TRACE(fmt::format("{} request {}", dtype == DType::kF32 ? "bf16" : "fp8", i));
      ASSERT_EQ(a.prompt_logits.size(), b.prompt_logits.size());
      EXPECT_EQ(std::memcmp(a.prompt_logits.data(), b.prompt_logits.data(), a.prompt_logits.size() * sizeof(float)), 0)
          << "prompt logits";
      EXPECT_EQ(a.token_ids, b.token_ids);
      ASSERT_EQ(a.step_logits.size(), b.step_logits.size());
      EXPECT_EQ(std::memcmp(a.step_logits.data(), b.step_logits.data(), a.step_logits.size() * sizeof(float)), 0)
          << "step logits";
    }
  }
}

}  // namespace
}  // namespace deepinfer
