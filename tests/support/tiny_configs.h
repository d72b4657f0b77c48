// Tiny DeepSeek configs covering the config variations, for tests that build random checkpoints.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace deepinfer::testing {

// V3-style: q-LoRA, sigmoid noaux_tc, 2 of 4 groups, YaRN, one dense layer, MTP declared.
inline nlohmann::json tiny_v3_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 301, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false
  })");
}

// V2-Lite-style: no q-LoRA, softmax greedy routing, two shared experts, default RoPE.
inline nlohmann::json tiny_v2_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
    "vocab_size": 256, "hidden_size": 48, "intermediate_size": 80, "moe_intermediate_size": 24,
    "num_hidden_layers": 3, "num_attention_heads": 3,
    "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
    "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": false, "routed_scaling_factor": 1.0,
    "first_k_dense_replace": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "bos_token_id": 0, "eos_token_id": 1
  })");
}

// FP8 block-scaled V3 with dimensions that give several and partial 128x128 blocks.
inline nlohmann::json tiny_fp8_config() {
  nlohmann::json c = tiny_v3_config();
  c["hidden_size"] = 160;
  c["q_lora_rank"] = 136;
  c["kv_lora_rank"] = 136;
  c["intermediate_size"] = 272;
  c["moe_intermediate_size"] = 144;
  c["n_routed_experts"] = 8;
  c["num_experts_per_tok"] = 2;
  c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                              {"weight_block_size", {128, 128}}};
  return c;
}

}  // namespace deepinfer::testing
