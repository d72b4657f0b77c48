// Device sampling against the host sampler (the same semantics, sample/sampler.h): for the same
// logits, parameters, seed and position the GPU must draw the same token, for greedy rows, every
// filter and their combinations, ties, tiny and vocabulary-sized rows; a row with NaN/Inf gives
// −1; log-probabilities agree within 1e-5 (double log-sum-exp on both sides). Exact token
// equality is the contract: probability sums are ordered differently (tree vs sequential) only in
// the last bits of a double, far below what moves a float probability. The same holds with
// logits processors (masks, penalties, tokens of in-flight steps read on the device) and for
// top-n log-probabilities (ids identical, values within 1e-5).
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

TEST(CudaSampling, ProcessorsAndTopLogprobsAsOnTheHost) {
  auto gpu = testing::try_cuda_backend();
  DI_REQUIRE_GPU(gpu);
  ReferenceBackend host;
  std::mt19937 rng(11);
  for (int64_t V : {3, 97, 1000, 102400}) {
    const int64_t R = 40, n_top = 20, P = 6;
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V) - 1);
    // In-flight tokens (one failed sample, −1), by index, on both sides.
    Tensor pending = Tensor::empty_host(DType::kI32, {P});
    for (int64_t j = 0; j < P; ++j) pending.data<int32_t>()[j] = j == 3 ? -1 : tok(rng);
    std::vector<LogitsProcessors> procs(static_cast<size_t>(R));
    std::vector<SampleRow> rows;
    for (int64_t i = 0; i < R; ++i) {
      SamplingParams p;
      p.temperature = i % 4 == 0 ? 0.0f : 0.9f;
      p.top_k = i % 5 == 1 ? 20 : 0;
      p.top_p = i % 3 == 2 ? 0.9f : 1.0f;
      p.repetition_penalty = i % 2 == 0 ? 1.2f : 1.0f;
      p.frequency_penalty = i % 3 == 0 ? 0.5f : 0.0f;
      p.presence_penalty = i % 4 == 1 ? -0.4f : 0.0f;
      p.min_tokens = i % 6 == 0 ? 5 : 0;
      p.stop_token_ids = {tok(rng)};
      std::vector<int32_t> prompt(1 + rng() % 30), output(rng() % 8);
      for (auto& t : prompt) t = tok(rng);
      for (auto& t : output) t = tok(rng);
      const int64_t n_pend = static_cast<int64_t>(rng() % 3);
      procs[static_cast<size_t>(i)] = make_logits_processors(p, prompt, output, n_pend, {0});
      for (int64_t j = 0; j < n_pend; ++j) procs[static_cast<size_t>(i)].pending.push_back(static_cast<int32_t>(rng() % P));
      SampleRow r{p.sampler(), 77 + static_cast<uint64_t>(i), static_cast<uint64_t>(rng() % 1000)};
      r.processors = &procs[static_cast<size_t>(i)];
      r.n_top_logprobs = static_cast<int32_t>(i % 7 == 0 ? 0 : 1 + rng() % n_top);
      rows.push_back(r);
    }
    Tensor logits = Tensor::empty_host(DType::kF32, {R, V});
    std::normal_distribution<float> d(0.0f, 2.0f);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t v = 0; v < V; ++v) logits.data<float>()[i * V + v] = i % 5 == 4 ? std::round(d(rng)) : d(rng);
    logits.data<float>()[7 * V + V / 2] = NAN;  // a failed row stays failed
    SampleExtras hx;
    hx.pending_tokens = pending;
    hx.top_ids = Tensor::empty_host(DType::kI32, {R, n_top});
    hx.top_logprobs = Tensor::empty_host(DType::kF32, {R, n_top});
    Tensor ht = Tensor::empty_host(DType::kI32, {R}), hl = Tensor::empty_host(DType::kF32, {R});
    host.sample(logits, rows, ht, hl, &hx);
    SampleExtras gx;
    gx.pending_tokens = gpu->upload(pending);
    gx.top_ids = gpu->empty(DType::kI32, {R, n_top});
    gx.top_logprobs = gpu->empty(DType::kF32, {R, n_top});
    Tensor dt = gpu->empty(DType::kI32, {R}), dl = gpu->empty(DType::kF32, {R});
    const Tensor dev_logits = gpu->upload(logits);
    gpu->sample(dev_logits, rows, dt, dl, &gx);
    const Tensor gt = gpu->to_host(dt), gl = gpu->to_host(dl);
    const Tensor gi = gpu->to_host(gx.top_ids), gv = gpu->to_host(gx.top_logprobs);
    const Tensor after = gpu->to_host(dev_logits);
    for (int64_t i = 0; i < R * V; ++i) {  // the raw logits are left as they were
      const float a = after.data<float>()[i], b = logits.data<float>()[i];
      ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << i;
    }
    for (int64_t i = 0; i < R; ++i) {
      EXPECT_EQ(gt.data<int32_t>()[i], ht.data<int32_t>()[i]) << "V=" << V << " row " << i;
      EXPECT_NEAR(gl.data<float>()[i], hl.data<float>()[i], 1e-5f) << "V=" << V << " row " << i;
      for (int64_t j = 0; j < n_top; ++j) {
        ASSERT_EQ(gi.data<int32_t>()[i * n_top + j], hx.top_ids.data<int32_t>()[i * n_top + j])
            << "V=" << V << " row " << i << " rank " << j;
        EXPECT_NEAR(gv.data<float>()[i * n_top + j], hx.top_logprobs.data<float>()[i * n_top + j], 1e-5f);
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer
