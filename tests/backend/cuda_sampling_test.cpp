// Device sampling against the host sampler (the same semantics, sample/sampler.h): for the same
// logits, parameters, seed and position the GPU must draw the same token, for greedy rows, every
// filter and their combinations, ties, tiny and vocabulary-sized rows; a row with NaN/Inf gives
// −1; log-probabilities agree within 1e-5 (double log-sum-exp on both sides). Exact token
// equality is the contract: probability sums are ordered differently (tree vs sequential) only in
// the last bits of a double, far below what moves a float probability.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/reference/reference_backend.h"
#include "support/cuda_available.h"

namespace deepinfer {
namespace {

TEST(CudaSampling, SameTokensAsTheHostSampler) {
  auto gpu = testing::try_cuda_backend();
  DI_REQUIRE_GPU(gpu);
  ReferenceBackend host;
  std::mt19937 rng(7);
  for (int64_t V : {1, 2, 97, 1000, 102400}) {
    std::vector<SampleRow> rows;
    std::vector<SamplerParams> variants = {
        {0.0f, 0, 1.0f, 0.0f},   {1.0f, 0, 1.0f, 0.0f},  {0.7f, 50, 1.0f, 0.0f}, {1.0f, 0, 0.9f, 0.0f},
        {1.3f, 0, 1.0f, 0.05f},  {0.8f, 40, 0.95f, 0.02f}, {1.0f, 1, 1.0f, 0.0f}, {2.0f, 0, 0.5f, 0.0f},
        {1e-6f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 1.0f}};
    for (size_t k = 0; k < 4; ++k)
      for (const SamplerParams& p : variants) rows.push_back({p, 1000 + rng(), static_cast<uint64_t>(rng() % 5000)});
    const int64_t R = static_cast<int64_t>(rows.size());
    Tensor logits = Tensor::empty_host(DType::kF32, {R, V});
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t v = 0; v < V; ++v) {
        float x = d(rng);
        if (i % 7 == 3) x = std::round(x);  // many exact ties
        logits.data<float>()[i * V + v] = x;
      }
    if (V > 2) {
      logits.data<float>()[5 * V + 1] = NAN;        // non-finite rows fail
      logits.data<float>()[6 * V + 2] = INFINITY;
    }
    Tensor ht = Tensor::empty_host(DType::kI32, {R}), hl = Tensor::empty_host(DType::kF32, {R});
    host.sample(logits, rows, ht, hl);
    Tensor dt = gpu->empty(DType::kI32, {R}), dl = gpu->empty(DType::kF32, {R});
    gpu->sample(gpu->upload(logits), rows, dt, dl);
    const Tensor gt = gpu->to_host(dt), gl = gpu->to_host(dl);
    for (int64_t i = 0; i < R; ++i) {
      EXPECT_EQ(gt.data<int32_t>()[i], ht.data<int32_t>()[i]) << "V=" << V << " row " << i;
      if (ht.data<int32_t>()[i] >= 0) {
        EXPECT_NEAR(gl.data<float>()[i], hl.data<float>()[i], 1e-5f) << "V=" << V << " row " << i;
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
