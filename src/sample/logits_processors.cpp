#include "sample/logits_processors.h"

#include <algorithm>
#include <limits>

namespace deepinfer {

bool has_logits_processors(const SamplingParams& p, int64_t n_output) {
  const bool masks = n_output < p.min_tokens && (!p.ignore_eos || !p.stop_token_ids.empty());
  return masks || p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

LogitsProcessors make_logits_processors(const SamplingParams& p, const std::vector<int32_t>& prompt,
                                        const std::vector<int32_t>& output, int64_t n_pending,
                                        const std::vector<int64_t>& eos_ids) {
  LogitsProcessors proc;
  if (static_cast<int64_t>(output.size()) + n_pending < p.min_tokens) {
    if (!p.ignore_eos)
      for (int64_t e : eos_ids) proc.masked.push_back(static_cast<int32_t>(e));
    proc.masked.insert(proc.masked.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  }
  proc.repetition_penalty = p.repetition_penalty;
  proc.frequency_penalty = p.frequency_penalty;
  proc.presence_penalty = p.presence_penalty;
  if (!proc.penalizes()) return proc;
  // (token, is_output) pairs sorted by token: one pass yields each token once with its count.
  std::vector<int64_t> keys;
  keys.reserve(prompt.size() + output.size());
  for (int32_t t : prompt) keys.push_back(static_cast<int64_t>(t) * 2);
  for (int32_t t : output) keys.push_back(static_cast<int64_t>(t) * 2 + 1);
  std::sort(keys.begin(), keys.end());
  for (int64_t k : keys) {
    const auto t = static_cast<int32_t>(k / 2);
    if (proc.seen_tokens.empty() || proc.seen_tokens.back() != t) {
      proc.seen_tokens.push_back(t);
      proc.seen_counts.push_back(0);
    }
    proc.seen_counts.back() += static_cast<int32_t>(k & 1);
  }
  return proc;
}

void apply_logits_processors(float* row, int64_t vocab, const LogitsProcessors& proc, const int32_t* pending_values) {
  for (int32_t t : proc.masked) row[t] = -std::numeric_limits<float>::infinity();
  if (!proc.penalizes()) return;
  const size_t n_pending = proc.pending.size();
  auto pending_count = [&](int32_t t) {
    int32_t c = 0;
    for (size_t j = 0; j < n_pending; ++j) c += pending_values[j] == t;
    return c;
  };
  const float rp = proc.repetition_penalty, fp = proc.frequency_penalty, pp = proc.presence_penalty;
  for (size_t i = 0; i < proc.seen_tokens.size(); ++i) {
    const int32_t t = proc.seen_tokens[i];
    row[t] = penalized_logit(row[t], rp, fp, pp, proc.seen_counts[i] + pending_count(t));
  }
  for (size_t j = 0; j < n_pending; ++j) {  // in-flight tokens not seen before, once each
    const int32_t t = pending_values[j];
    if (t < 0 || t >= vocab || std::binary_search(proc.seen_tokens.begin(), proc.seen_tokens.end(), t)) continue;
    bool first = true;
    for (size_t i = 0; i < j; ++i) first &= pending_values[i] != t;
    if (first) row[t] = penalized_logit(row[t], rp, fp, pp, pending_count(t));
  }
}

}  // namespace deepinfer
