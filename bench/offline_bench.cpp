// Offline throughput through the serving runtime (continuous batching on the CPU backend):
// N requests with prompts of mixed length submitted at once, greedy decoding to max_tokens.
// Usage: offline_bench [--model models/demo] [--requests 64] [--max-tokens 64] [--threads 0]
#include <chrono>
#include <cstdio>
#include <random>

#include <CLI/CLI.hpp>

#include "engine/llm.h"

using namespace deepinfer;

int main(int argc, char** argv) {
  CLI::App app{"offline throughput benchmark"};
  std::string model = std::string(DEEPINFER_BENCH_DIR) + "/../models/demo";
  int64_t n_requests = 64, max_tokens = 64, min_prompt = 16, max_prompt = 256;
  int threads = 0;
  app.add_option("--model", model);
  app.add_option("--requests", n_requests);
  app.add_option("--max-tokens", max_tokens);
  app.add_option("--min-prompt", min_prompt);
  app.add_option("--max-prompt", max_prompt);
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);

  EngineConfig c;
  c.model_dir = model;
  c.n_threads = threads;
  auto llm = LLM::create(c);
  if (!llm) {
    std::fprintf(stderr, "%s\n", llm.status().to_string().c_str());
    return 1;
  }
  const int64_t vocab = (*llm)->model().config().vocab_size;
  std::mt19937 rng(1);
  std::vector<std::vector<int32_t>> prompts;
  int64_t n_prompt_tokens = 0;
  for (int64_t i = 0; i < n_requests; ++i) {
    const int64_t len = min_prompt + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_prompt - min_prompt + 1));
    std::vector<int32_t> p;
    for (int64_t t = 0; t < len; ++t) p.push_back(static_cast<int32_t>(2 + rng() % static_cast<uint32_t>(vocab - 2)));
    n_prompt_tokens += len;
    prompts.push_back(std::move(p));
  }
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  (void)(*llm)->generate(std::vector<std::vector<int32_t>>{prompts[0]}, params);  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  auto out = (*llm)->generate(prompts, params);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!out) {
    std::fprintf(stderr, "%s\n", out.status().to_string().c_str());
    return 1;
  }
  int64_t n_out = 0;
  for (const auto& o : *out) n_out += static_cast<int64_t>(o.outputs[0].token_ids.size());
  std::printf("%lld requests, %lld prompt + %lld generated tokens in %.2f s: %.1f output tok/s, %.1f total tok/s\n",
              static_cast<long long>(n_requests), static_cast<long long>(n_prompt_tokens), static_cast<long long>(n_out),
              sec, static_cast<double>(n_out) / sec, static_cast<double>(n_out + n_prompt_tokens) / sec);
  return 0;
}
