// SamplingParams: one request's decoding parameters, shaped like vLLM's (plus DeepInfer's
// `seq_seed`). Validation happens once, at submission, against the model's vocabulary size and
// context length; the engine then trusts them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "sample/sampler.h"

namespace deepinfer {

struct SamplingParams {
  int64_t n = 1;                       // completions per prompt (each its own seed stream)
  float temperature = 1.0f;            // 0 = greedy
  int64_t top_k = 0;                   // ≤ 0 = off (vLLM's -1 accepted)
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;       // [-2, 2]: minus p for every token already generated
  float frequency_penalty = 0.0f;      // [-2, 2]: minus p × its count among generated tokens
  float repetition_penalty = 1.0f;     // > 0: prompt and generated tokens' logits divided (>0) or multiplied (<0)
  int64_t max_tokens = 16;             // ≥ 1
  int64_t min_tokens = 0;              // EOS and stop_token_ids are masked until this many tokens
  std::vector<std::string> stop;       // stop strings (need a tokenizer; matched on detokenized text)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::optional<int64_t> logprobs;     // top-n log-probabilities per generated token (0 = only the chosen)
  std::optional<uint64_t> seq_seed;    // random when unset; drives Philox keyed by (seed, position)

  SamplerParams sampler() const { return {temperature, top_k, top_p, min_p}; }
};

struct ParamLimits {
  int64_t vocab_size = 0;       // logits width: every id must be below it
  int64_t max_n = 64;           // fan-out cap
  int64_t max_logprobs = 20;
  int64_t max_stop_strings = 64;
  int64_t max_stop_string_bytes = 1024;
};

// Rejects NaN/Inf, out-of-range values and ids outside [0, vocab_size), naming the parameter.
Status validate_sampling_params(const SamplingParams& p, const ParamLimits& limits);

}  // namespace deepinfer
