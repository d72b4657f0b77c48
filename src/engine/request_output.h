// What the engine returns for a request, shaped like vLLM's RequestOutput / CompletionOutput.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sched/sequence.h"

namespace deepinfer {

struct CompletionOutput {
  int64_t index = 0;                       // 0..n-1
  std::vector<int32_t> token_ids;
  std::string text;                        // detokenized when the engine has a tokenizer
  std::string finish_reason;               // "" while running; "stop" | "length" | "abort" | "error"
  std::string error;                       // why, when finish_reason == "error"
  std::vector<TokenLogprobs> logprobs;     // when SamplingParams::logprobs is set
  double cumulative_logprob = 0;
  uint64_t seed = 0;                       // the Philox key actually used
};

struct RequestMetrics {
  double arrival_time = 0;                 // seconds since the engine started
  double first_token_time = -1;
  double finished_time = -1;
  int64_t n_cached_prompt_tokens = 0;      // prefix-cache hit (first completion)
  int64_t n_preemptions = 0;
};

struct RequestOutput {
  std::string request_id;
  std::string prompt;
  std::vector<int32_t> prompt_token_ids;
  std::vector<CompletionOutput> outputs;
  bool finished = false;
  RequestMetrics metrics;
};

}  // namespace deepinfer
