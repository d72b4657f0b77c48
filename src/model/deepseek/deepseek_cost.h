// Counting what a DeepSeek step must move and compute, for rooflines: parameters (total and
// touched per token), FLOPs of a prefill, KV bytes. Pure arithmetic on the config.
#pragma once

#include <cstdint>

#include "model/deepseek/deepseek_config.h"

namespace deepinfer {

struct DeepseekCost {
  int64_t total_params = 0;        // every weight of the main model (MTP excluded)
  int64_t active_params = 0;       // weights one token's forward reads: attention, dense or shared +
                                   // top-k experts + router per layer, the final norm and lm_head
                                   // (not the embedding table: one row is read)
  int64_t attention_params = 0;    // per-token attention weights over all layers (part of active)
  int64_t kv_values_per_token = 0; // latent values cached per token over all layers

  // FLOPs of a prefill of n tokens from an empty cache: 2·active params per token (the
  // naive-form kv_b decompression is one matmul per token) plus causal attention
  // (QKᵀ and PV over n²/2 pairs per head).
  double prefill_flops(int64_t n_tokens) const;
  int64_t n_layers = 0, n_heads = 0, qk_head_dim = 0, v_head_dim = 0;
};

DeepseekCost deepseek_cost(const DeepseekConfig& config);

}  // namespace deepinfer
