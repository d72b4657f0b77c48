#include "sample/sampling_params.h"

#include <cmath>
#include <limits>

namespace deepinfer {

Status validate_sampling_params(const SamplingParams& p, const ParamLimits& lim) {
  DI_RETURN_IF_ERROR(validate_sampler_params(p.sampler()));
  if (p.n < 1 || p.n > lim.max_n)
    return make_error(StatusCode::kInvalidArgument, "n must be in [1, {}], got {}", lim.max_n, p.n);
  if (p.top_k < -1) return make_error(StatusCode::kInvalidArgument, "top_k must be -1, 0 or positive, got {}", p.top_k);
  auto check_penalty = [](const char* name, float v) -> Status {
    if (!std::isfinite(v) || v < -2.0f || v > 2.0f)
      return make_error(StatusCode::kInvalidArgument, "{} must be finite and in [-2, 2], got {}", name, v);
    return Status::ok();
  };
  DI_RETURN_IF_ERROR(check_penalty("presence_penalty", p.presence_penalty));
  DI_RETURN_IF_ERROR(check_penalty("frequency_penalty", p.frequency_penalty));
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f || p.repetition_penalty > 100.0f)
    return make_error(StatusCode::kInvalidArgument, "repetition_penalty must be finite and in (0, 100], got {}",
                      p.repetition_penalty);
  if (p.max_tokens < 1) return make_error(StatusCode::kInvalidArgument, "max_tokens must be >= 1, got {}", p.max_tokens);
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return make_error(StatusCode::kInvalidArgument, "min_tokens must be in [0, max_tokens={}], got {}", p.max_tokens,
                      p.min_tokens);
  if (static_cast<int64_t>(p.stop.size()) > lim.max_stop_strings)
    return make_error(StatusCode::kInvalidArgument, "at most {} stop strings, got {}", lim.max_stop_strings, p.stop.size());
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) return make_error(StatusCode::kInvalidArgument, "stop[{}] is empty", i);
    if (static_cast<int64_t>(p.stop[i].size()) > lim.max_stop_string_bytes)
      return make_error(StatusCode::kInvalidArgument, "stop[{}] is longer than {} bytes", i, lim.max_stop_string_bytes);
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i)
    if (p.stop_token_ids[i] < 0 || p.stop_token_ids[i] >= lim.vocab_size)
      return make_error(StatusCode::kInvalidArgument, "stop_token_ids[{}] = {} is out of range [0, {})", i,
                        p.stop_token_ids[i], lim.vocab_size);
  if (p.logprobs && (*p.logprobs < 0 || *p.logprobs > lim.max_logprobs))
    return make_error(StatusCode::kInvalidArgument, "logprobs must be in [0, {}], got {}", lim.max_logprobs, *p.logprobs);
  return Status::ok();
}

}  // namespace deepinfer
