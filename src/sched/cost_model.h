// ChunkCostModel: the time of a forward step as a function of its new tokens q and their cached
// prefix c, cost(q, c) = k0 + k1·q + k2·q·c + k3·q² seconds (fixed overhead; per-token weight
// work; attention over the prefix; attention within the chunk). Fitted by least squares to
// measured steps (`deepinfer calibrate`); the scheduler sizes each prefill chunk as the
// largest q whose cost fits what is left of the per-step time budget.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace deepinfer {

struct CostSample {
  double q = 0;        // new tokens
  double c = 0;        // cached prefix tokens
  double seconds = 0;  // measured step time
};

struct ChunkCostModel {
  double k0 = 0, k1 = 0, k2 = 0, k3 = 0;

  double cost(double q, double c) const { return k0 + k1 * q + k2 * q * c + k3 * q * q; }
  // The largest q in [1, cap] with cost(q, c) ≤ budget_s (1 when even one token exceeds it:
  // a prefill always advances). cost is increasing in q for non-negative coefficients.
  int64_t max_chunk(int64_t cached, double budget_s, int64_t cap) const;

  // Least squares over the samples (normal equations, 4×4, solved with partial pivoting);
  // negative coefficients are clamped to 0 so the model stays monotone. Needs ≥ 4 samples
  // with distinct (q, c).
  static Expected<ChunkCostModel> fit(const std::vector<CostSample>& samples);

  nlohmann::json to_json() const;
  // Errors name the missing or invalid field.
  static Expected<ChunkCostModel> from_json(const nlohmann::json& j);
};

}  // namespace deepinfer
