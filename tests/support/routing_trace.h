// Routing comparison for GPU-vs-reference tests. bf16 compute perturbs the router's input by
// ~1e-3 relative; where two experts' scores are closer than that (a routing near-tie) the GPU may
// choose differently from an fp32 reference, and everything downstream of that token changes
// discontinuously (like a greedy near-tie). These helpers find, per request, the first position
// whose expert set differs, so a test can hold logits to the bf16 bound before it and only to
// the near-tie rule after it — and report how often it happens.
#pragma once

#include <algorithm>
#include <climits>
#include <vector>

#include "core/tensor.h"
#include "engine/generator.h"

namespace deepinfer::testing {

// Traces from DeepseekModel::set_routing_trace over one Generator::generate call with
// ignore_eos (step 0: all prompts; decode step s ≥ 1: requests with s < max_tokens, in order).
// Returns per request the first position routed differently in any MoE layer, or INT64_MAX.
inline std::vector<int64_t> first_routing_mismatch(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                                                   int64_t n_moe_layers, const std::vector<int64_t>& prompt_lens,
                                                   const std::vector<int64_t>& max_tokens) {
  const size_t n = prompt_lens.size();
  std::vector<int64_t> first(n, INT64_MAX);
  if (n_moe_layers == 0) return first;
  const size_t steps = std::min(a.size(), b.size()) / static_cast<size_t>(n_moe_layers);
  auto same_set = [](const int32_t* x, const int32_t* y, int64_t k) {
    std::vector<int32_t> p(x, x + k), q(y, y + k);
    std::sort(p.begin(), p.end());
    std::sort(q.begin(), q.end());
    return p == q;
  };
  for (size_t s = 0; s < steps; ++s) {
    // Rows of this step: (request, position).
    std::vector<std::pair<size_t, int64_t>> rows;
    for (size_t i = 0; i < n; ++i) {
      if (s == 0) {
        for (int64_t p = 0; p < prompt_lens[i]; ++p) rows.emplace_back(i, p);
      } else if (static_cast<int64_t>(s) < max_tokens[i]) {
        rows.emplace_back(i, prompt_lens[i] + static_cast<int64_t>(s) - 1);
      }
    }
    for (int64_t l = 0; l < n_moe_layers; ++l) {
      const Tensor& x = a[s * static_cast<size_t>(n_moe_layers) + static_cast<size_t>(l)];
      const Tensor& y = b[s * static_cast<size_t>(n_moe_layers) + static_cast<size_t>(l)];
      const int64_t k = x.size(1);
      for (size_t r = 0; r < rows.size() && static_cast<int64_t>(r) < x.size(0); ++r)
        if (!same_set(x.data<int32_t>() + static_cast<int64_t>(r) * k, y.data<int32_t>() + static_cast<int64_t>(r) * k, k))
          first[rows[r].first] = std::min(first[rows[r].first], rows[r].second);
    }
  }
  return first;
}

// The same for two traces of one Generator::generate(requests) call on two backends.
inline std::vector<int64_t> first_routing_mismatch(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                                                   const DeepseekModel& model,
                                                   const std::vector<GenerateRequest>& requests) {
  int64_t n_moe = 0;
  for (const auto& l : model.weights().layers) n_moe += l.is_moe;
  std::vector<int64_t> lens, max_tokens;
  for (const auto& r : requests) {
    lens.push_back(static_cast<int64_t>(r.prompt_ids.size()));
    max_tokens.push_back(r.max_tokens);
  }
  return first_routing_mismatch(a, b, n_moe, lens, max_tokens);
}

}  // namespace deepinfer::testing
