// LogitsProcessors: one sampled row's logits processors (min_tokens masking, repetition /
// frequency / presence penalties) in a form every backend can apply — a sorted list of the
// tokens the request has seen with their output counts — so the CUDA sampler processes rows on
// the device with the host's exact arithmetic. Not the sampling itself (sampler.h).
#pragma once

#include <cstdint>
#include <vector>

#include "sample/penalized_logit.h"
#include "sample/sampling_params.h"

namespace deepinfer {

struct LogitsProcessors {
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::vector<int32_t> masked;        // ids set to −inf first (min_tokens: EOS and stop ids)
  std::vector<int32_t> seen_tokens;   // ascending, unique: prompt ∪ known output tokens
  std::vector<int32_t> seen_counts;   // [seen_tokens] occurrences among the known output tokens
  // Output tokens not known where the row is built (sampled by a step still in flight): indices
  // into the device token buffer the sampler is given; each counts as one more output token.
  std::vector<int32_t> pending;

  bool penalizes() const { return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f; }
  bool active() const { return penalizes() || !masked.empty(); }
};

// Whether a request's next token has processors to apply, given the output tokens before it
// (known or in flight): the condition under which make_logits_processors returns active ones,
// checked first so rows without processors build nothing.
bool has_logits_processors(const SamplingParams& p, int64_t n_output);

// The processors of a request's next token: `prompt` its prompt ids, `output` the output tokens
// known here, `n_pending` more output tokens still in flight (their indices are filled by the
// caller into `pending`); `eos_ids` the model's EOS ids. Precondition: ids < the vocabulary.
LogitsProcessors make_logits_processors(const SamplingParams& p, const std::vector<int32_t>& prompt,
                                        const std::vector<int32_t>& output, int64_t n_pending,
                                        const std::vector<int64_t>& eos_ids);

// Applies `proc` to one row in place; `pending_values[j]` is the token at proc.pending[j]'s index
// (negative: that sample failed, ignored). Row [vocab] F32.
void apply_logits_processors(float* row, int64_t vocab, const LogitsProcessors& proc, const int32_t* pending_values);

}  // namespace deepinfer
