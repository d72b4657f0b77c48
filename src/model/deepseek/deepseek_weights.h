// DeepseekWeights: every tensor of a DeepSeek-V2/V3 checkpoint, looked up by its Hugging Face
// name, shape-checked against the config and kept in the layout the CPU backends read
// (fp32/bf16 in place from the memory map, fp16 widened to fp32, FP8 kept with its scales).
// Owns shares of the mapped files; the forward pass lives in deepseek_model.h.
#pragma once

#include <string>
#include <vector>

#include "backend/op_params.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "model/deepseek/deepseek_config.h"

namespace deepinfer {

struct DeepseekLayerWeights {
  Tensor input_layernorm;           // [hidden]
  Tensor post_attention_layernorm;  // [hidden]
  // Query path: q_proj when q_lora_rank is null, else q_a_proj → q_a_layernorm → q_b_proj.
  LinearWeight q_proj;              // [H * qk_head_dim, hidden]
  LinearWeight q_a_proj;            // [q_lora_rank, hidden]
  Tensor q_a_layernorm;             // [q_lora_rank]
  LinearWeight q_b_proj;            // [H * qk_head_dim, q_lora_rank]
  LinearWeight kv_a_proj_with_mqa;  // [kv_lora_rank + qk_rope_head_dim, hidden]
  Tensor kv_a_layernorm;            // [kv_lora_rank]
  LinearWeight kv_b_proj;           // [H * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  // Device placements of FP8 checkpoints: kv_b_proj dequantized to bf16 once (the attention
  // kernels read W_UK and W_UV as bf16 every step; bf16(q · scale), the rounding of a per-step
  // dequantization). Undefined otherwise.
  LinearWeight kv_b_proj_bf16;
  LinearWeight o_proj;              // [hidden, H * v_head_dim]

  bool is_moe = false;
  MlpWeights mlp;                       // dense layers: [intermediate_size] wide
  LinearWeight gate;                    // MoE router [n_routed_experts, hidden]
  Tensor e_score_correction_bias;       // [n_routed_experts] F32 (noaux_tc only; else undefined)
  std::vector<MlpWeights> experts;      // [n_routed_experts], each moe_intermediate_size wide
  bool has_shared_experts = false;
  MlpWeights shared_experts;            // moe_intermediate_size * n_shared_experts wide
  // Device placements: shared_experts again, cut into n_shared_experts experts of
  // moe_intermediate_size, stacked right after `experts` (Backend::moe_ffn runs them in the
  // routed experts' launch at decode sizes). Empty on the host.
  std::vector<MlpWeights> shared_slices;
};

// One multi-token-prediction module (layer index num_hidden_layers + i in the checkpoint).
struct MtpWeights {
  Tensor enorm;                     // [hidden]
  Tensor hnorm;                     // [hidden]
  LinearWeight eh_proj;             // [hidden, 2 * hidden] on [enorm(emb) ; hnorm(h)]
  DeepseekLayerWeights block;
  Tensor shared_head_norm;          // [hidden]
  LinearWeight shared_head_head;    // [vocab, hidden] (aliases lm_head when absent)
};

struct DeepseekWeights {
  Tensor embed_tokens;              // [vocab, hidden]
  std::vector<DeepseekLayerWeights> layers;
  Tensor norm;                      // [hidden]
  LinearWeight lm_head;             // [vocab, hidden]
  std::vector<MtpWeights> mtp;      // empty when the checkpoint carries no MTP tensors
};

// Loads and validates. Errors name the tensor (missing, wrong shape or dtype, FP8 without
// scales). MTP layers declared by the config but absent from the files disable MTP with a
// notice; partially present ones are an error.
Expected<DeepseekWeights> load_deepseek_weights(const Checkpoint& checkpoint, const DeepseekConfig& config);

}  // namespace deepinfer
