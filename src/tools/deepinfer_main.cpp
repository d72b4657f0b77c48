// The `deepinfer` command: thin front end over the library. Parses flags into native types at
// the edge, maps Status to exit codes (2: bad usage or input, 1: load/runtime failure) and
// prints machine-readable JSON with --json. `tokenize` and `generate --prompt/--chat` use the
// model directory's tokenizer (tokenizer.json).
#include <charconv>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "engine/generator.h"
#include "io/json_file.h"
#include "tokenizer/chat_encoder.h"
#include "tools/bench_command.h"
#include "tools/calibrate_command.h"
#include "tokenizer/tokenizer.h"

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

// Inputs of `tokenize --texts-file`: a JSON array of strings (strict JSON, size-capped).
deepinfer::Expected<std::vector<std::string>> read_texts_file(const std::string& path) {
  auto doc = deepinfer::read_json_file(path);
  if (!doc) return Status(StatusCode::kInvalidArgument, "--texts-file: " + doc.status().message());
  if (!doc->is_array()) return Status(StatusCode::kInvalidArgument, "--texts-file: expected a JSON array of strings");
  std::vector<std::string> texts;
  for (size_t i = 0; i < doc->size(); ++i) {
    if (!(*doc)[i].is_string())
      return deepinfer::make_error(StatusCode::kInvalidArgument, "--texts-file: element {} is not a string", i);
    texts.push_back((*doc)[i].get<std::string>());
  }
  return texts;
}

// The tokenizer shipped in `dir`; errors say that the directory has none.
deepinfer::Expected<std::unique_ptr<deepinfer::Tokenizer>> load_tokenizer(const std::string& dir) {
  if (dir.empty()) return Status(StatusCode::kInvalidArgument, "no tokenizer directory: pass --tokenizer (or --model)");
  return deepinfer::Tokenizer::load(dir);
}

int run_tokenize(const std::string& dir, const std::string& texts_file, const std::vector<std::string>& text_args,
                 bool add_special, bool json, int n_threads) {
  auto tokenizer = load_tokenizer(dir);
  if (!tokenizer) return fail(tokenizer.status());
  std::vector<std::string> texts = text_args;
  if (!texts_file.empty()) {
    auto from_file = read_texts_file(texts_file);
    if (!from_file) return fail(from_file.status());
    texts.insert(texts.end(), from_file->begin(), from_file->end());
  }
  deepinfer::ThreadPool pool(n_threads);
  deepinfer::EncodeOptions options;
  options.add_special_tokens = add_special;
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = (*tokenizer)->encode_parallel(texts[i], pool, options);
    if (!ids) return fail(ids.status().with_context(fmt::format("text {}", i)));
    if (json) {
      out.push_back(*ids);
    } else {
      for (size_t k = 0; k < ids->size(); ++k) std::printf("%s%d", k ? "," : "", (*ids)[k]);
      std::printf("\n");
    }
  }
  if (json) std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer: inference for DeepSeek-architecture models"};
  app.require_subcommand(1);

  auto env = deepinfer::EngineConfig::from_env();
  if (!env) return fail(env.status());
  deepinfer::EngineConfig config = *env;

  CLI::App* gen = app.add_subcommand("generate", "Generate tokens from a prompt");
  std::string prompt_ids_text, prompt_text;
  bool chat = false;
  int64_t max_tokens = 16;
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int64_t top_k = 0;
  int64_t seed = -1;
  bool json = false, logits = false, ignore_eos = false;
  gen->add_option("--model", config.model_dir, "Model directory (config.json + *.safetensors); default $DEEPINFER_HF_MODEL_DIR");
  auto* prompt_ids_opt = gen->add_option("--prompt-ids", prompt_ids_text, "Comma-separated prompt token ids");
  auto* prompt_opt = gen->add_option("--prompt", prompt_text, "Prompt text, encoded with the model's tokenizer.json (BOS as tokenizer_config.json says)");
  prompt_opt->excludes(prompt_ids_opt);
  gen->add_flag("--chat", chat, "With --prompt: send it as a user message in the DeepSeek-V3 chat format")->needs(prompt_opt);
  gen->add_option("--max-tokens", max_tokens, "Maximum tokens to generate");
  gen->add_option("--temperature", temperature, "Sampling temperature (0 = greedy)");
  gen->add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)");
  gen->add_option("--top-p", top_p, "Nucleus sampling mass");
  gen->add_option("--min-p", min_p, "Drop tokens below min_p x the top probability");
  gen->add_option("--seed", seed, "Sampling seed (random when unset)");
  gen->add_flag("--ignore-eos", ignore_eos, "Do not stop at EOS");
  gen->add_flag("--json", json, "Print one JSON object");
  gen->add_flag("--logits", logits, "Include prompt_logits_last (the last prompt position's logits)");
  gen->add_option("--device", config.device, "cpu | cuda | reference");
  gen->add_option("--threads", config.n_threads, "CPU threads (0 = all cores)");

  CLI::App* tok = app.add_subcommand("tokenize", "Encode texts to token ids with a tokenizer.json");
  std::string tokenizer_dir, texts_file;
  std::vector<std::string> texts;
  bool add_special = false, tok_json = false;
  tok->add_option("--tokenizer", tokenizer_dir, "Directory with tokenizer.json (+ tokenizer_config.json); default: the model directory");
  tok->add_option("--texts-file", texts_file, "JSON file holding an array of strings");
  tok->add_option("--text", texts, "A text to encode (repeatable; encoded before --texts-file's)");
  tok->add_flag("--add-special", add_special, "Add BOS/EOS as tokenizer_config.json says (default: none)");
  tok->add_flag("--json", tok_json, "Print one JSON array of id arrays");
  tok->add_option("--threads", config.n_threads, "Threads for long texts (0 = all cores)");

  deepinfer::CalibrateCommand calibrate;
  calibrate.add_to(app);
  deepinfer::BenchCommand bench;
  bench.add_to(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (calibrate.app->parsed()) return calibrate.run();
  if (bench.app->parsed()) return bench.run();

  if (tok->parsed()) {
    return run_tokenize(tokenizer_dir.empty() ? config.model_dir : tokenizer_dir, texts_file, texts, add_special,
                        tok_json, config.n_threads);
  }

  if (gen->parsed()) {
    const bool from_text = prompt_opt->count() > 0;
    if (!from_text && prompt_ids_opt->count() == 0)
      return fail(Status(StatusCode::kInvalidArgument, "one of --prompt-ids or --prompt is required"));
    std::vector<int32_t> prompt_ids;
    std::unique_ptr<deepinfer::Tokenizer> tokenizer;
    if (from_text) {
      auto t = load_tokenizer(config.model_dir);
      if (!t) return fail(t.status().with_context("--prompt needs the model's tokenizer"));
      tokenizer = std::move(*t);
      if (chat) {
        auto encoder = deepinfer::ChatEncoder::create(*tokenizer);
        if (!encoder) return fail(encoder.status());
        deepinfer::ChatMessage user;
        user.content = prompt_text;
        auto encoded = encoder->encode(std::vector<deepinfer::ChatMessage>{user});
        if (!encoded) return fail(encoded.status().with_context("--prompt"));
        prompt_ids = std::move(*encoded);
      } else {
        deepinfer::EncodeOptions options;
        options.add_special_tokens = true;
        auto encoded = tokenizer->encode(prompt_text, options);
        if (!encoded) return fail(encoded.status().with_context("--prompt"));
        prompt_ids = std::move(*encoded);
      }
    } else {
      auto ids = parse_ids(prompt_ids_text);
      if (!ids) return fail(ids.status());
      prompt_ids = std::move(*ids);
    }
    auto generator = deepinfer::Generator::create(config);
    if (!generator) return fail(generator.status());
    if (tokenizer) {
      const int64_t vocab = (*generator)->model().config().vocab_size;
      if (tokenizer->vocab_size() > vocab)
        return fail(deepinfer::make_error(StatusCode::kCorrupt, "the tokenizer has {} ids but the model's vocab_size is {}",
                                          tokenizer->vocab_size(), vocab));
    }
    deepinfer::GenerateRequest req;
    req.prompt_ids = prompt_ids;
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
      if (tokenizer) out["text"] = tokenizer->decode(r.token_ids, /*skip_special_tokens=*/true);
      if (logits) {
        const int64_t vocab = (*generator)->model().config().vocab_size;
        out["prompt_logits_last"] = std::vector<float>(r.step_logits.begin(), r.step_logits.begin() + vocab);
      }
      std::printf("%s\n", out.dump().c_str());
    } else if (tokenizer) {
      std::printf("%s\n", tokenizer->decode(r.token_ids, /*skip_special_tokens=*/true).c_str());
    } else {
      for (size_t i = 0; i < r.token_ids.size(); ++i) std::printf("%s%d", i ? "," : "", r.token_ids[i]);
      std::printf("\n");
    }
    return 0;
  }
  return 0;
}
