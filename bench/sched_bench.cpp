// Serving-runtime bookkeeping per step: 256 running requests on a null executor (no model
// work; every sampled sequence gets a fixed token), so the time measured is scheduling,
// page accounting, prefix-cache hashing, stop checks and output snapshots alone.
// Goal from the serving issue: < 50 µs per step. Usage: sched_bench [--requests 256] [--steps 2000]
#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "engine/llm_engine.h"
#include "model/deepseek/deepseek_random.h"

using namespace deepinfer;

namespace {
class NullExecutor : public Executor {
 public:
  std::vector<SampledToken> execute(const StepPlan& plan) override {
    std::vector<SampledToken> out;
    for (const ScheduledSeq& x : plan.seqs)
      if (x.sample) out.push_back({x.seq, 7, -0.5f, {}, false});
    return out;
  }
};
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scheduler bookkeeping benchmark"};
  int64_t n_requests = 256, n_steps = 2000, prompt_len = 128;
  app.add_option("--requests", n_requests);
  app.add_option("--steps", n_steps);
  app.add_option("--prompt-len", prompt_len);
  CLI11_PARSE(app, argc, argv);

  // A tiny real model only to construct the engine; the null executor never runs it.
  const std::string dir = "/tmp/deepinfer-sched-bench-model";
  nlohmann::json c = nlohmann::json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 1000,
    "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1, "kv_lora_rank": 8,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "max_position_embeddings": 65536,
    "eos_token_id": 1})");
  if (Status s = write_random_deepseek_checkpoint(dir, c, 1, DType::kF32, false); !s.is_ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  EngineConfig ec;
  ec.model_dir = dir;
  ec.max_num_seqs = n_requests;
  ec.max_num_batched_tokens = 1 << 20;
  ec.num_kv_blocks = n_requests * ((prompt_len + n_steps) / 64 + 2);
  auto engine = LLMEngine::create(ec);
  if (!engine) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  (*engine)->set_executor(std::make_unique<NullExecutor>());
  for (int64_t i = 0; i < n_requests; ++i) {
    EngineRequest r;
    for (int64_t t = 0; t < prompt_len; ++t) r.prompt_ids.push_back(static_cast<int32_t>(2 + (i * 131 + t) % 997));
    r.params.max_tokens = n_steps + 10;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    if (auto id = (*engine)->add_request(r); !id) return 1;
  }
  (*engine)->step();  // admission + prefill bookkeeping
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < n_steps; ++s) (*engine)->step();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                    static_cast<double>(n_steps);
  std::printf("running %lld, steps %lld: %.1f us per step (%.3f us per sequence)\n", static_cast<long long>(n_requests),
              static_cast<long long>(n_steps), us, us / static_cast<double>(n_requests));
  return 0;
}
