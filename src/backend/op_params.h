// Plain parameter structs shared by every backend's ops: shapes, layouts and algorithm choices
// with no behaviour. Pointers are borrowed for the duration of one op call.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/linear_weight.h"

namespace deepinfer {

enum class ScoringFunc { kSoftmax, kSigmoid };
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

// Rotary embedding of `dim` channels: pair i rotates by position · inv_freq[i], with cos and
// sin both multiplied by attention_factor (transformers' YaRN amplitude; 1 for plain RoPE).
struct RopeParams {
  std::vector<float> inv_freq;  // [dim / 2] f32
  float attention_factor = 1.0f;
  // true: pairs (2i, 2i+1) (DeepSeek's release layout); false: pairs (i, i + dim/2).
  bool interleave = true;
  int64_t dim() const { return static_cast<int64_t>(inv_freq.size()) * 2; }
};

// The sequences of one forward step, in CSR form over the flattened query rows. Query row
// q_indptr[b] + i of sequence b sits at position kv_len[b] - q_len(b) + i; it attends to
// cached positions [0, that position] (causal). The new tokens' KV is written before attention.
struct AttentionBatch {
  const int32_t* q_indptr = nullptr;      // [n_seqs + 1]
  const int32_t* kv_len = nullptr;        // [n_seqs] tokens in the cache after this step's writes
  const int32_t* block_indptr = nullptr;  // [n_seqs + 1]
  const int32_t* block_ids = nullptr;     // [block_indptr[n_seqs]] pages of each sequence, in order
  const uint8_t* seq_mask = nullptr;      // [n_seqs] 1 = attend for this sequence; null = all
  int64_t n_seqs = 0;
  int64_t block_size = 0;  // tokens per page
  int64_t n_rows = 0;      // q_indptr[n_seqs] (query rows of the whole step)

  // The same arrays in the backend's memory (equal to the pointers above on host backends):
  // step inputs, copied from the host, never written by a device kernel (CUDA kernels read them
  // before waiting for the previous kernel, cuda_launch.cuh).
  struct DeviceView {
    const int32_t* q_indptr = nullptr;
    const int32_t* kv_len = nullptr;
    const int32_t* block_indptr = nullptr;
    const int32_t* block_ids = nullptr;
    const uint8_t* seq_mask = nullptr;  // null = all
  } dev;

  bool selected(int64_t seq) const { return seq_mask == nullptr || seq_mask[seq] != 0; }
};

enum class MlaForm {
  kNaive,     // decompress K/V per head through kv_b_proj (MHA form; prefill)
  kAbsorbed,  // attend over the latent with W_UK absorbed into q and W_UV applied after (decode)
};

struct QuantizedRows;  // backend.h

struct MlaParams {
  int64_t n_heads = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t kv_lora_rank = 0;
  float softmax_scale = 0.0f;
  const LinearWeight* kv_b_proj = nullptr;  // [n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  // FP8 checkpoints: the placed FP8 kv_b_proj, where kv_b_proj is its bf16 copy — for a backend
  // that decompresses a prefill's keys on its W8A8 form (the CUDA backend's set_kvb_w8a8). Null:
  // none (kv_b_proj is all there is).
  const LinearWeight* kv_b_proj_fp8 = nullptr;
  // The naive form: buffers from Backend::quantized_rows(T, n_heads·v_head_dim, {o_proj}) for the
  // attention's output as o_proj will read it. A backend may write the rows there instead of into
  // `out` (CUDA: the prefill kernel's epilogue, set_mla_oproj_rows) and then sets out_rows->filled;
  // `out`'s rows are then unspecified and o_proj must read out_rows (matmul_parts). Only where
  // every row o_proj reads is one this call computes (the model: steps without decode rows).
  // Null, or not filled: `out` holds the output, as without it.
  QuantizedRows* out_rows = nullptr;
  // q's rotation left to the attention (Backend::mla_rope_kv_write's `reader`): [T, dr] F32, row t
  // token t's RoPE table — cos of pair i at column i, its sine at dr / 2 + i, attention_factor
  // applied — by which q's rope channels, still unrotated, are to be rotated as they are read (the
  // same values as rotating q first). Undefined: q is rotated. Set by the backend that left them.
  Tensor q_rope;
};

// An MLA attention sublayer without q-LoRA (Backend::mla_decode_sublayer): the placed weights
// and what the ops between them take. Pointers borrowed for the call.
struct MlaSublayerWeights {
  const LinearWeight* q_proj = nullptr;     // [H·(dn + dr), D]
  const LinearWeight* kv_a_proj = nullptr;  // [r + dr, D] kv_a_proj_with_mqa
  const Tensor* kv_a_layernorm = nullptr;   // [r]
  const LinearWeight* o_proj = nullptr;     // [D, H·dv]
  const RopeParams* rope = nullptr;         // over q_pe and k_pe (dr channels)
  float eps = 0;                            // kv_a_layernorm's
  MlaParams mla;                            // dims, softmax scale, kv_b_proj
};

struct RouterParams {
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;
  TopkMethod topk_method = TopkMethod::kNoauxTc;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  const float* correction_bias = nullptr;  // [n_experts] f32 in the backend's memory, selection only; may be null
};

// One SwiGLU MLP: down(silu(gate(x)) * up(x)).
struct MlpWeights {
  LinearWeight gate_proj;  // [intermediate, hidden]
  LinearWeight up_proj;    // [intermediate, hidden]
  LinearWeight down_proj;  // [hidden, intermediate]
};

// A MoE block's shared experts (always active, weight 1), see Backend::moe_ffn.
struct SharedExperts {
  const MlpWeights* mlp = nullptr;                         // one MLP [n_shared · I wide]; null: none
  const std::vector<MlpWeights>* slices = nullptr;         // the same as I-wide experts, or null / empty
};

}  // namespace deepinfer
