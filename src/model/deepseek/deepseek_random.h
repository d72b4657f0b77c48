// Random DeepSeek checkpoints: every tensor a config implies, under its Hugging Face name, with
// O(1) activations (linear weights ~ N(0, 1/fan_in), norms ~ U(0.7, 1.3)). For tests and for
// benchmarks on model shapes whose real weights are not at hand (`--load-format dummy`).
// Not a reference: parity fixtures come from transformers (scripts/golden/).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "model/deepseek/deepseek_config.h"

namespace deepinfer {

// weight_dtype: F32 or BF16 for dense weights, or F8E4M3 for block-scaled FP8 linears (the
// config must then carry quantization_config; norms/embeddings/router stay BF16).
std::vector<std::pair<std::string, Tensor>> make_random_deepseek_tensors(const DeepseekConfig& config, uint64_t seed,
                                                                         DType weight_dtype, bool with_mtp);

// Writes config.json and model.safetensors of a random model into `dir` (created if needed).
Status write_random_deepseek_checkpoint(const std::string& dir, const nlohmann::json& config_json, uint64_t seed,
                                        DType weight_dtype, bool with_mtp);

}  // namespace deepinfer
