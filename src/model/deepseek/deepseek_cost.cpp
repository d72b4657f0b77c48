#include "model/deepseek/deepseek_cost.h"

namespace deepinfer {

double DeepseekCost::prefill_flops(int64_t n) const {
  const double nn = static_cast<double>(n);
  const double pairs = nn * (nn + 1) / 2.0;
  return 2.0 * static_cast<double>(active_params) * nn +
         2.0 * pairs * static_cast<double>(n_layers * n_heads * (qk_head_dim + v_head_dim));
}

DeepseekCost deepseek_cost(const DeepseekConfig& c) {
  DeepseekCost k;
  const int64_t d = c.hidden_size, H = c.num_attention_heads;
  int64_t attn = 0;
  if (c.q_lora_rank == 0) {
    attn += H * c.qk_head_dim() * d;
  } else {
    attn += c.q_lora_rank * d + c.q_lora_rank + H * c.qk_head_dim() * c.q_lora_rank;
  }
  attn += c.kv_latent_dim() * d + c.kv_lora_rank + H * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank;
  attn += d * H * c.v_head_dim + 2 * d;  // o_proj and the two layer norms
  const int64_t dense = 3 * d * c.intermediate_size;
  const int64_t expert = 3 * d * c.moe_intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    k.total_params += attn;
    k.active_params += attn;
    k.attention_params += attn;
    if (c.is_moe_layer(l)) {
      const int64_t router = c.n_routed_experts * d;
      const int64_t shared = c.n_shared_experts * expert;
      k.total_params += router + c.n_routed_experts * expert + shared;
      k.active_params += router + c.num_experts_per_tok * expert + shared;
    } else {
      k.total_params += dense;
      k.active_params += dense;
    }
  }
  const int64_t head = c.vocab_size * d + d;
  k.total_params += head + c.vocab_size * d;  // lm_head + final norm + embedding table
  k.active_params += head;
  k.kv_values_per_token = c.num_hidden_layers * c.kv_latent_dim();
  k.n_layers = c.num_hidden_layers;
  k.n_heads = H;
  k.qk_head_dim = c.qk_head_dim();
  k.v_head_dim = c.v_head_dim;
  return k;
}

}  // namespace deepinfer
