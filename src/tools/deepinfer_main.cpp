// The `deepinfer` command: thin front end over the library. Parses flags into native types at
// the edge, maps Status to exit codes (2: bad usage or input, 1: load/runtime failure) and
// prints machine-readable JSON with --json.
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "engine/generator.h"

namespace {

using deepinfer::Status;
using deepinfer::StatusCode;

int exit_code_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

int fail(const Status& s) {
  std::fprintf(stderr, "deepinfer: error: %s\n", s.message().c_str());
  return exit_code_for(s);
}

deepinfer::Expected<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || v < INT32_MIN || v > INT32_MAX)
      return deepinfer::make_error(StatusCode::kInvalidArgument, "--prompt-ids: '{}' is not a token id", item);
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer: inference for DeepSeek-architecture models"};
  app.require_subcommand(1);

  auto env = deepinfer::EngineConfig::from_env();
  if (!env) return fail(env.status());
  deepinfer::EngineConfig config = *env;

  CLI::App* gen = app.add_subcommand("generate", "Generate tokens from a prompt");
  std::string prompt_ids_text;
  int64_t max_tokens = 16;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int64_t top_k = 0;
  int64_t seed = -1;
  bool json = false, logits = false, ignore_eos = false;
  gen->add_option("--model", config.model_dir, "Model directory (config.json + *.safetensors); default $DEEPINFER_HF_MODEL_DIR");
  gen->add_option("--prompt-ids", prompt_ids_text, "Comma-separated prompt token ids")->required();
  gen->add_option("--max-tokens", max_tokens, "Maximum tokens to generate");
  gen->add_option("--temperature", temperature, "Sampling temperature (0 = greedy)");
  gen->add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)");
  gen->add_option("--top-p", top_p, "Nucleus sampling mass");
  gen->add_option("--min-p", min_p, "Drop tokens below min_p x the top probability");
  gen->add_option("--seed", seed, "Sampling seed (random when unset)");
  gen->add_flag("--ignore-eos", ignore_eos, "Do not stop at EOS");
  gen->add_flag("--json", json, "Print one JSON object");
  gen->add_flag("--logits", logits, "Include prompt_logits_last (the last prompt position's logits)");
  gen->add_option("--device", config.device, "cpu | reference");
  gen->add_option("--threads", config.n_threads, "CPU threads (0 = all cores)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (gen->parsed()) {
    auto ids = parse_ids(prompt_ids_text);
    if (!ids) return fail(ids.status());
    auto generator = deepinfer::Generator::create(config);
    if (!generator) return fail(generator.status());
    deepinfer::GenerateRequest req;
    req.prompt_ids = *ids;
    req.max_tokens = max_tokens;
    req.sampler.temperature = temperature;
    req.sampler.top_k = top_k;
    req.sampler.top_p = top_p;
    req.sampler.min_p = min_p;
    req.ignore_eos = ignore_eos;
    if (seed >= 0) req.seed = static_cast<uint64_t>(seed);
    req.return_prompt_logits = false;
    req.return_step_logits = logits;  // step 0's logits are the last prompt position's
    auto results = (*generator)->generate({req});
    if (!results) return fail(results.status());
    const deepinfer::GenerateResult& r = results->front();
    if (json) {
      nlohmann::json out;
      out["token_ids"] = r.token_ids;
      out["finish_reason"] = r.finish_reason;
      out["seed"] = r.seed;
      out["prompt_tokens"] = req.prompt_ids.size();
      out["prefill_seconds"] = r.prefill_seconds;
      out["decode_seconds"] = r.decode_seconds;
      if (logits) {
        const int64_t vocab = (*generator)->model().config().vocab_size;
        out["prompt_logits_last"] = std::vector<float>(r.step_logits.begin(), r.step_logits.begin() + vocab);
      }
      std::printf("%s\n", out.dump().c_str());
    } else {
      for (size_t i = 0; i < r.token_ids.size(); ++i) std::printf("%s%d", i ? "," : "", r.token_ids[i]);
      std::printf("\n");
    }
    return 0;
  }
  return 0;
}
