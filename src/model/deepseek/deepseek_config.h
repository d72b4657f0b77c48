// DeepseekConfig: the hyper-parameters of a DeepSeek-V2/V3 checkpoint, parsed from config.json
// and validated once at load. Field names are the config.json names verbatim (grep-ability).
// Owns parsing and validation only; derived quantities (softmax scale, YaRN tables) live with
// their users (rope.h) but are computed from this struct alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/op_params.h"
#include "core/status.h"

namespace deepinfer {

enum class DeepseekFamily { kV2, kV3 };
enum class RopeType { kDefault, kYarn };

// RoPE parameters, normalized from either `rope_parameters` (transformers 5) or
// `rope_theta` + `rope_scaling` (original DeepSeek configs; `type` or `rope_type`).
struct RopeConfig {
  RopeType rope_type = RopeType::kDefault;
  double rope_theta = 10000.0;
  // YaRN only:
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0 = absent
  double mscale_all_dim = 0.0;  // 0 = absent
  std::optional<double> attention_factor;  // explicit cos/sin amplitude, when given
  bool truncate = true;
};

// FP8 block-scaled weights (DeepSeek-V3's release format).
struct Fp8Config {
  int64_t block_n = 128;  // weight_block_size[0]: rows (output features) per scale
  int64_t block_k = 128;  // weight_block_size[1]: columns (input features) per scale
  bool scale_ue8m0 = false;  // scale_fmt == "ue8m0" (V3.1+): scales are powers of two
};

struct DeepseekConfig {
  DeepseekFamily family = DeepseekFamily::kV3;
  std::string architecture;  // "DeepseekV3ForCausalLM" ...

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense FFN width
  int64_t moe_intermediate_size = 0;  // one routed expert's width
  int64_t num_hidden_layers = 0;      // main layers; MTP layers not counted
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: null (one q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  int64_t n_routed_experts = 0;  // 0: null (dense model)
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;
  TopkMethod topk_method = TopkMethod::kNoauxTc;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;

  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  RopeConfig rope;
  // true: the rope dims of q_pe / k_pe are (x0,x1),(x2,x3)... pairs (DeepSeek's release);
  // false: half-split (x_i, x_{i+d/2}) pairs, i.e. rows already permuted.
  bool rope_interleave = true;

  int64_t num_nextn_predict_layers = 0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::optional<Fp8Config> fp8;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Latent KV values per token per layer: kv_lora_rank + qk_rope_head_dim (576 for V3).
  int64_t kv_latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const;
  // 1/sqrt(qk_head_dim), times mscale(factor, mscale_all_dim)^2 under YaRN with mscale_all_dim.
  double softmax_scale() const;
};

// Parses and validates; every error names the offending config.json field.
Expected<DeepseekConfig> parse_deepseek_config(const nlohmann::json& config);

}  // namespace deepinfer
