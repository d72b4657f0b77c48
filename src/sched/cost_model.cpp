#include "sched/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace deepinfer {

int64_t ChunkCostModel::max_chunk(int64_t cached, double budget_s, int64_t cap) const {
  if (cap < 1) return 1;
  const double c = static_cast<double>(cached);
  if (cost(1, c) > budget_s) return 1;
  int64_t lo = 1, hi = cap;  // invariant: cost(lo) ≤ budget
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (cost(static_cast<double>(mid), c) <= budget_s) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

Expected<ChunkCostModel> ChunkCostModel::fit(const std::vector<CostSample>& samples) {
  if (samples.size() < 4)
    return make_error(StatusCode::kInvalidArgument, "fitting the cost model needs at least 4 samples, got {}", samples.size());
  // Normal equations AᵀA k = Aᵀy with rows [1, q, q·c, q²]; columns are scaled to unit
  // magnitude first so the 4×4 system is well conditioned.
  std::array<double, 4> scale{1, 1, 1, 1};
  for (const auto& s : samples) {
    const std::array<double, 4> row{1, s.q, s.q * s.c, s.q * s.q};
    for (int i = 0; i < 4; ++i) scale[i] = std::max(scale[i], std::fabs(row[i]));
  }
  std::array<std::array<double, 5>, 4> m{};
  for (const auto& s : samples) {
    if (!std::isfinite(s.q) || !std::isfinite(s.c) || !std::isfinite(s.seconds))
      return make_error(StatusCode::kInvalidArgument, "cost sample has a non-finite value");
    const std::array<double, 4> row{1 / scale[0], s.q / scale[1], s.q * s.c / scale[2], s.q * s.q / scale[3]};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) m[i][j] += row[i] * row[j];
      m[i][4] += row[i] * s.seconds;
    }
  }
  for (int col = 0; col < 4; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 4; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[pivot][col])) pivot = r;
    if (std::fabs(m[pivot][col]) < 1e-12)
      return make_error(StatusCode::kInvalidArgument, "cost samples do not determine the model (vary q and c)");
    std::swap(m[col], m[pivot]);
    for (int r = 0; r < 4; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int j = col; j < 5; ++j) m[r][j] -= f * m[col][j];
    }
  }
  ChunkCostModel k;
  std::array<double*, 4> out{&k.k0, &k.k1, &k.k2, &k.k3};
  for (int i = 0; i < 4; ++i) *out[i] = std::max(0.0, m[i][4] / m[i][i] / scale[i]);
  return k;
}

nlohmann::json ChunkCostModel::to_json() const {
  return {{"formula", "k0 + k1*q + k2*q*c + k3*q^2 seconds"}, {"k0", k0}, {"k1", k1}, {"k2", k2}, {"k3", k3}};
}

Expected<ChunkCostModel> ChunkCostModel::from_json(const nlohmann::json& j) {
  ChunkCostModel k;
  std::array<std::pair<const char*, double*>, 4> fields{{{"k0", &k.k0}, {"k1", &k.k1}, {"k2", &k.k2}, {"k3", &k.k3}}};
  if (!j.is_object()) return make_error(StatusCode::kInvalidArgument, "cost model must be a JSON object");
  for (auto& [name, dst] : fields) {
    if (!j.contains(name) || !j.at(name).is_number())
      return make_error(StatusCode::kInvalidArgument, "cost model field '{}' must be a number", name);
    *dst = j.at(name).get<double>();
    if (!std::isfinite(*dst) || *dst < 0)
      return make_error(StatusCode::kInvalidArgument, "cost model field '{}' must be finite and >= 0", name);
  }
  return k;
}

}  // namespace deepinfer
