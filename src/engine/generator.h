// Generator: loads a model and runs whole requests to completion — batched prefill, then
// batched decode steps over the paged latent cache — with greedy or seeded sampling and stops
// at EOS or max_tokens. The synchronous foundation the serving runtime (continuous batching,
// preemption, prefix caching) builds on; it does not schedule or interleave arrivals.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "model/deepseek/deepseek_model.h"
#include "sample/sampler.h"

namespace deepinfer {

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;
  int64_t max_tokens = 16;               // ≥ 1
  SamplerParams sampler;
  std::optional<uint64_t> seed;          // random when unset
  bool ignore_eos = false;
  bool return_prompt_logits = false;     // every prompt position's logits
  bool return_step_logits = false;       // the logits behind each generated token
};

struct GenerateResult {
  std::vector<int32_t> token_ids;
  std::string finish_reason;             // "stop" (EOS) | "length" | "error" (non-finite logits)
  uint64_t seed = 0;                     // the seed actually used
  std::vector<float> prompt_logits;      // [n_prompt, vocab] when requested
  std::vector<float> step_logits;        // [n_generated, vocab] when requested
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

class Generator {
 public:
  static Expected<std::unique_ptr<Generator>> create(const EngineConfig& config);
  Generator(EngineConfig config, std::unique_ptr<DeepseekModel> model, std::unique_ptr<Backend> backend);

  const DeepseekModel& model() const { return *model_; }
  const EngineConfig& config() const { return config_; }
  int64_t max_model_len() const;

  // Validates every request (ids in range, context length, sampling parameters) before any
  // work; then prefills all prompts in one step and decodes them together until each stops.
  Expected<std::vector<GenerateResult>> generate(const std::vector<GenerateRequest>& requests);
  Status validate(const GenerateRequest& request) const;

 private:
  EngineConfig config_;
  std::unique_ptr<DeepseekModel> model_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace deepinfer
