// Token sampling from one row of logits: greedy, or temperature → top-k → top-p → min-p →
// a Philox draw keyed by (seed, position). Pure functions of their inputs: the same logits,
// parameters, seed and position always give the same token. Host-side; the CUDA backend will
// mirror these semantics on the device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace deepinfer {

// Temperatures below this sample greedily (as vLLM's sampling epsilon).
inline constexpr float kGreedyTemperature = 1e-5f;

struct SamplerParams {
  float temperature = 1.0f;  // < kGreedyTemperature (e.g. 0) = greedy (argmax, lowest id on ties)
  int64_t top_k = 0;         // ≤ 0 = off
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]
};

// Rejects NaN/Inf and out-of-range values, naming the parameter.
Status validate_sampler_params(const SamplerParams& p);

// Argmax with the lowest id winning ties. NaN logits are never chosen unless all are NaN.
int32_t argmax_token(const float* logits, int64_t vocab);

// Samples one token. `scratch` is reused across calls to avoid allocation.
int32_t sample_token(const float* logits, int64_t vocab, const SamplerParams& p, uint64_t seed, uint64_t position,
                     std::vector<float>* scratch);

}  // namespace deepinfer
