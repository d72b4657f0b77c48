#include "tools/bench_floors.h"

#include <cmath>

#include "model/deepseek/deepseek_cost.h"

namespace deepinfer {
namespace {

// Sums the bytes of the weights a decode step reads, one tensor at a time, so the FP8 layout
// (which tensors are quantized, their scale grids) is spelled out where it is counted.
class WeightBytes {
 public:
  WeightBytes(const DeepseekConfig& c, DType weight_dtype)
      : fp8_(weight_dtype == DType::kF8E4M3), block_(c.fp8.value_or(Fp8Config{})) {}

  // A norm weight or other vector of n values (always bf16).
  void vector(int64_t n, double count = 1.0) { bytes_ += count * 2.0 * static_cast<double>(n); }
  // A Linear [n_out, n_in]; `quantizable`: FP8 when the weights are (router and lm_head never are).
  void linear(int64_t n_out, int64_t n_in, bool quantizable, double count = 1.0) {
    const double elements = static_cast<double>(n_out) * static_cast<double>(n_in);
    if (!(fp8_ && quantizable)) {
      bytes_ += count * 2.0 * elements;
      return;
    }
    const double scales = static_cast<double>(ceil_div(n_out, block_.block_n) * ceil_div(n_in, block_.block_k));
    bytes_ += count * (elements + 4.0 * scales);
  }
  // gate_proj and up_proj [inter, d], down_proj [d, inter].
  void mlp(int64_t d, int64_t inter, double count = 1.0) {
    linear(inter, d, true, count);
    linear(inter, d, true, count);
    linear(d, inter, true, count);
  }
  double bytes() const { return bytes_; }

 private:
  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
  bool fp8_;
  Fp8Config block_;
  double bytes_ = 0.0;
};

}  // namespace

double expected_distinct_experts(const DeepseekConfig& c, int64_t batch) {
  const double e = static_cast<double>(c.n_routed_experts), k = static_cast<double>(c.num_experts_per_tok);
  if (e <= 0.0 || batch <= 0) return 0.0;
  return e * (1.0 - std::pow(1.0 - k / e, static_cast<double>(batch)));
}

double decode_weight_bytes(const DeepseekConfig& c, int64_t batch, DType weight_dtype) {
  WeightBytes w(c, weight_dtype);
  const int64_t d = c.hidden_size, H = c.num_attention_heads;
  const double distinct = expected_distinct_experts(c, batch);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    w.vector(2 * d);  // input_layernorm, post_attention_layernorm
    if (c.q_lora_rank == 0) {
      w.linear(H * c.qk_head_dim(), d, true);  // q_proj
    } else {
      w.linear(c.q_lora_rank, d, true);  // q_a_proj
      w.vector(c.q_lora_rank);           // q_a_layernorm
      w.linear(H * c.qk_head_dim(), c.q_lora_rank, true);  // q_b_proj
    }
    w.linear(c.kv_latent_dim(), d, true);  // kv_a_proj_with_mqa
    w.vector(c.kv_lora_rank);              // kv_a_layernorm
    w.linear(H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, true);  // kv_b_proj
    w.linear(d, H * c.v_head_dim, true);                                     // o_proj
    if (!c.is_moe_layer(l)) {
      w.mlp(d, c.intermediate_size);
      continue;
    }
    w.linear(c.n_routed_experts, d, false);  // router (gate)
    if (c.n_shared_experts > 0) w.mlp(d, c.moe_intermediate_size * c.n_shared_experts);
    w.mlp(d, c.moe_intermediate_size, distinct);
  }
  w.vector(d);                           // final norm
  w.linear(c.vocab_size, d, false);      // lm_head
  return w.bytes();
}

int64_t kv_bytes_per_token(const DeepseekConfig& c, int64_t kv_value_bytes) {
  return c.kv_latent_dim() * kv_value_bytes * c.num_hidden_layers;
}

double mean_kv_tokens(int64_t context, int64_t warmup, int64_t steps) {
  return static_cast<double>(context + warmup) + static_cast<double>(steps - 1) / 2.0 + 1.0;
}

double decode_bytes(const DeepseekConfig& c, int64_t batch, double kv_tokens, DType weight_dtype,
                    int64_t kv_value_bytes) {
  return decode_weight_bytes(c, batch, weight_dtype) +
         static_cast<double>(batch) * kv_tokens * static_cast<double>(kv_bytes_per_token(c, kv_value_bytes));
}

double prefill_flops(const DeepseekConfig& c, int64_t n_tokens) { return deepseek_cost(c).prefill_flops(n_tokens); }

}  // namespace deepinfer
