// Request checks shared by every entry point (Generator, LLMEngine): the prompt's ids and its
// fit in the context. Messages follow RELIABILITY.md ("Request parameters").
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/status.h"

namespace deepinfer {

// The context limit: the configured max_model_len when set (> 0), never above the model's.
inline int64_t effective_max_model_len(int64_t configured, int64_t model_max) {
  return configured > 0 ? std::min(configured, model_max) : model_max;
}

// Non-empty, every id in [0, vocab), max_tokens ≥ 1, and prompt + max_tokens − 1 ≤ the
// context (the last generated token is never fed back, so a prompt of exactly the context
// length may still generate one token).
inline Status check_prompt(const std::vector<int32_t>& ids, int64_t vocab, int64_t max_tokens, int64_t max_model_len) {
  if (ids.empty()) return make_error(StatusCode::kInvalidArgument, "the prompt is empty");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return make_error(StatusCode::kInvalidArgument, "prompt token id {} at index {} is out of range [0, {})", ids[i],
                        i, vocab);
  if (max_tokens < 1) return make_error(StatusCode::kInvalidArgument, "max_tokens must be >= 1, got {}", max_tokens);
  const int64_t n_prompt = static_cast<int64_t>(ids.size());
  if (n_prompt + max_tokens - 1 > max_model_len)
    return make_error(StatusCode::kOutOfRange,
                      "maximum context length is {} tokens, requested {} (prompt {} + max_tokens {})", max_model_len,
                      n_prompt + max_tokens, n_prompt, max_tokens);
  return Status::ok();
}

}  // namespace deepinfer
