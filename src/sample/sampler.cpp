#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "sample/philox.h"

namespace deepinfer {

Status validate_sampler_params(const SamplerParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f)
    return make_error(StatusCode::kInvalidArgument, "temperature must be finite and >= 0, got {}", p.temperature);
  if (!std::isfinite(p.top_p) || p.top_p <= 0.0f || p.top_p > 1.0f)
    return make_error(StatusCode::kInvalidArgument, "top_p must be in (0, 1], got {}", p.top_p);
  if (!std::isfinite(p.min_p) || p.min_p < 0.0f || p.min_p > 1.0f)
    return make_error(StatusCode::kInvalidArgument, "min_p must be in [0, 1], got {}", p.min_p);
  return Status::ok();
}

int32_t argmax_token(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i]))) best = i;
  return static_cast<int32_t>(best);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplerParams& p, uint64_t seed, uint64_t position,
                     std::vector<float>* scratch) {
  // Temperatures below kGreedyTemperature are greedy: 1/T would overflow the scaled logits.
  if (p.temperature < kGreedyTemperature) return argmax_token(logits, vocab);
  // Candidate ids sorted by descending logit, ties to the lower id: a deterministic order that
  // top-k, top-p and the final inverse-CDF walk all share.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  int64_t n = vocab;
  // NaN ranks below every number (never sampled unless nothing else is left).
  auto key = [&](int32_t a) { return std::isnan(logits[a]) ? -std::numeric_limits<float>::infinity() : logits[a]; };
  auto better = [&](int32_t a, int32_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); };
  if (p.top_k > 0 && p.top_k < vocab) {
    n = p.top_k;
    std::partial_sort(order.begin(), order.begin() + n, order.end(), better);
  } else {
    std::sort(order.begin(), order.end(), better);
  }
  std::vector<float>& probs = *scratch;
  probs.resize(static_cast<size_t>(n));
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double top = key(order[0]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = static_cast<double>(key(order[i])) - top;  // ≤ 0; -inf for masked tokens
    sum += (probs[i] = diff == 0.0 ? 1.0f : static_cast<float>(std::exp(diff * inv_t)));
  }
  for (int64_t i = 0; i < n; ++i) probs[i] = static_cast<float>(probs[i] / sum);
  // top-p: the shortest prefix whose mass reaches top_p (at least one token).
  if (p.top_p < 1.0f) {
    double cum = 0;
    int64_t keep = 0;
    while (keep < n) {
      cum += probs[keep++];
      if (cum >= p.top_p) break;
    }
    n = keep;
  }
  // min-p: drop tokens below min_p × the most likely token's probability.
  if (p.min_p > 0.0f) {
    const float floor = p.min_p * probs[0];
    int64_t keep = 1;
    while (keep < n && probs[keep] >= floor) ++keep;
    n = keep;
  }
  double mass = 0;
  for (int64_t i = 0; i < n; ++i) mass += probs[i];
  const double u = static_cast<double>(philox_uniform(seed, position, RngPurpose::kSample)) * mass;
  double cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += probs[i];
    if (u < cum) return order[i];
  }
  return order[n - 1];
}

}  // namespace deepinfer
