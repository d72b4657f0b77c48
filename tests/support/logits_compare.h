// Shared by the GPU-vs-reference tests: the golden fixture directories, a row's relative L2
// error, and the top-5 near-tie rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace deepinfer::testing {

// tests/fixtures/* holding a golden.json (made by scripts/golden/make_fixtures.py), sorted.
inline std::vector<std::string> fixture_dirs() {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  const fs::path root = fs::path(DEEPINFER_SOURCE_DIR) / "tests" / "fixtures";
  if (!fs::exists(root)) return dirs;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "golden.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// ‖a − ref‖₂ / ‖ref‖₂ over n values (in double); infinite when a holds NaN/Inf.
inline double row_rel_err(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// ‖a − ref‖₂ / ‖ref‖₂ over a whole tensor given row by row (in double); infinite after a NaN/Inf.
struct TensorRelErr {
  double num = 0, den = 0;
  void add(const float* a, const float* ref, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::isfinite(a[i]) ? static_cast<double>(a[i]) - ref[i] : INFINITY;
      num += d * d;
      den += static_cast<double>(ref[i]) * ref[i];
    }
  }
  double value() const { return std::sqrt(num / std::max(den, 1e-30)); }
};

// Whether `tok` is among the row's five largest logits (fewer than five strictly larger).
inline bool in_top5(const float* row, int64_t vocab, int32_t tok) {
  int64_t better = 0;
  for (int64_t v = 0; v < vocab; ++v) better += row[v] > row[tok];
  return better < 5;
}

}  // namespace deepinfer::testing
