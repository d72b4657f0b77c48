#include "model/deepseek/deepseek_weights.h"

#include <cmath>
#include <cstring>

#include <fmt/ranges.h>

#include "core/log.h"

namespace deepinfer {
namespace {

class Loader {
 public:
  Loader(const Checkpoint& ckpt, const DeepseekConfig& config) : ckpt_(ckpt), config_(config) {}

  // A 1-D float vector (norm weights): F32 and BF16 kept, F16 widened to F32.
  Status vector(const std::string& name, int64_t n, Tensor* out) {
    DI_ASSIGN_OR_RETURN(Tensor t, ckpt_.get(name));
    if (t.ndim() != 1 || t.size(0) != n)
      return shape_error(name, t, fmt::format("[{}]", n));
    DI_ASSIGN_OR_RETURN(*out, float_tensor(name, t));
    return Status::ok();
  }

  // A 2-D table (embeddings): F32/BF16 kept, F16 widened.
  Status table(const std::string& name, int64_t rows, int64_t cols, Tensor* out) {
    DI_ASSIGN_OR_RETURN(Tensor t, ckpt_.get(name));
    if (t.ndim() != 2 || t.size(0) != rows || t.size(1) != cols)
      return shape_error(name, t, fmt::format("[{}, {}]", rows, cols));
    DI_ASSIGN_OR_RETURN(*out, float_tensor(name, t));
    return Status::ok();
  }

  // `prefix.weight` [n_out, n_in], with `prefix.weight_scale_inv` when FP8.
  Status linear(const std::string& prefix, int64_t n_out, int64_t n_in, LinearWeight* out) {
    const std::string name = prefix + ".weight";
    DI_ASSIGN_OR_RETURN(Tensor t, ckpt_.get(name));
    if (t.ndim() != 2 || t.size(0) != n_out || t.size(1) != n_in)
      return shape_error(name, t, fmt::format("[{}, {}]", n_out, n_in));
    LinearWeight w;
    if (t.dtype() == DType::kF8E4M3) {
      if (!config_.fp8)
        return make_error(StatusCode::kCorrupt,
                          "tensor '{}' is F8_E4M3 but config.json has no fp8 quantization_config", name);
      const std::string scale_name = prefix + ".weight_scale_inv";
      if (!ckpt_.has(scale_name))
        return make_error(StatusCode::kCorrupt, "FP8 tensor '{}' has no scale tensor '{}'", name, scale_name);
      DI_ASSIGN_OR_RETURN(Tensor s, ckpt_.get(scale_name));
      const int64_t bn = config_.fp8->block_n, bk = config_.fp8->block_k;
      const int64_t sr = (n_out + bn - 1) / bn, sc = (n_in + bk - 1) / bk;
      if (s.ndim() != 2 || s.size(0) != sr || s.size(1) != sc)
        return shape_error(scale_name, s, fmt::format("[{}, {}]", sr, sc));
      DI_ASSIGN_OR_RETURN(Tensor s32, to_f32(scale_name, s));
      const float* sp = s32.data<float>();
      for (int64_t i = 0; i < s32.numel(); ++i)
        if (!std::isfinite(sp[i]))
          return make_error(StatusCode::kCorrupt, "tensor '{}' holds a non-finite scale at index {}", scale_name, i);
      w.weight = t;
      w.scale_inv = s32;
      w.block_n = bn;
      w.block_k = bk;
    } else {
      DI_ASSIGN_OR_RETURN(w.weight, float_tensor(name, t));
    }
    *out = w;
    return Status::ok();
  }

  Status mlp(const std::string& prefix, int64_t inter, MlpWeights* out) {
    const int64_t d = config_.hidden_size;
    DI_RETURN_IF_ERROR(linear(prefix + ".gate_proj", inter, d, &out->gate_proj));
    DI_RETURN_IF_ERROR(linear(prefix + ".up_proj", inter, d, &out->up_proj));
    DI_RETURN_IF_ERROR(linear(prefix + ".down_proj", d, inter, &out->down_proj));
    return Status::ok();
  }

  Status layer(int64_t index, DeepseekLayerWeights* out) {
    const DeepseekConfig& c = config_;
    const std::string p = fmt::format("model.layers.{}.", index);
    const int64_t d = c.hidden_size, H = c.num_attention_heads;
    DI_RETURN_IF_ERROR(vector(p + "input_layernorm.weight", d, &out->input_layernorm));
    DI_RETURN_IF_ERROR(vector(p + "post_attention_layernorm.weight", d, &out->post_attention_layernorm));
    if (c.q_lora_rank == 0) {
      DI_RETURN_IF_ERROR(linear(p + "self_attn.q_proj", H * c.qk_head_dim(), d, &out->q_proj));
    } else {
      DI_RETURN_IF_ERROR(linear(p + "self_attn.q_a_proj", c.q_lora_rank, d, &out->q_a_proj));
      DI_RETURN_IF_ERROR(vector(p + "self_attn.q_a_layernorm.weight", c.q_lora_rank, &out->q_a_layernorm));
      DI_RETURN_IF_ERROR(linear(p + "self_attn.q_b_proj", H * c.qk_head_dim(), c.q_lora_rank, &out->q_b_proj));
    }
    DI_RETURN_IF_ERROR(linear(p + "self_attn.kv_a_proj_with_mqa", c.kv_latent_dim(), d, &out->kv_a_proj_with_mqa));
    DI_RETURN_IF_ERROR(vector(p + "self_attn.kv_a_layernorm.weight", c.kv_lora_rank, &out->kv_a_layernorm));
    DI_RETURN_IF_ERROR(linear(p + "self_attn.kv_b_proj", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
                              &out->kv_b_proj));
    DI_RETURN_IF_ERROR(linear(p + "self_attn.o_proj", d, H * c.v_head_dim, &out->o_proj));

    // MTP blocks are MoE whenever the model has experts (their index is past first_k_dense_replace).
    out->is_moe = index >= c.num_hidden_layers ? c.n_routed_experts > 0 : c.is_moe_layer(index);
    if (!out->is_moe) return mlp(p + "mlp", c.intermediate_size, &out->mlp);
    DI_RETURN_IF_ERROR(linear(p + "mlp.gate", c.n_routed_experts, d, &out->gate));
    if (out->gate.dtype() == DType::kF8E4M3)
      return make_error(StatusCode::kCorrupt, "router '{}mlp.gate.weight' must not be FP8", p);
    if (c.topk_method == TopkMethod::kNoauxTc) {
      Tensor bias;
      DI_RETURN_IF_ERROR(vector(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts, &bias));
      out->e_score_correction_bias = Tensor::empty_host(DType::kF32, {c.n_routed_experts});
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        const float v = bias.dtype() == DType::kF32 ? bias.data<float>()[e] : bf16_to_f32(bias.data<uint16_t>()[e]);
        if (!std::isfinite(v))
          return make_error(StatusCode::kCorrupt, "tensor '{}mlp.gate.e_score_correction_bias' is not finite at {}", p, e);
        out->e_score_correction_bias.data<float>()[e] = v;
      }
    }
    out->experts.resize(static_cast<size_t>(c.n_routed_experts));
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      DI_RETURN_IF_ERROR(mlp(fmt::format("{}mlp.experts.{}", p, e), c.moe_intermediate_size,
                             &out->experts[static_cast<size_t>(e)]));
    out->has_shared_experts = c.n_shared_experts > 0;
    if (out->has_shared_experts)
      DI_RETURN_IF_ERROR(mlp(p + "mlp.shared_experts", c.moe_intermediate_size * c.n_shared_experts,
                             &out->shared_experts));
    return Status::ok();
  }

 private:
  static Status shape_error(const std::string& name, const Tensor& t, const std::string& expected) {
    return make_error(StatusCode::kCorrupt, "tensor '{}' has shape {} but the config implies {}", name,
                      t.describe(), expected);
  }

  // safetensors only orders offsets; a file mixing dtypes can place a tensor at an address
  // that is not a multiple of its element size. Such tensors are copied once to aligned memory.
  static Tensor aligned(const Tensor& t) {
    if (reinterpret_cast<uintptr_t>(t.raw_data()) % dtype_size(t.dtype()) == 0) return t;
    Tensor copy = Tensor::empty_host(t.dtype(), t.shape());
    std::memcpy(copy.raw_data(), t.raw_data(), t.n_bytes());
    return copy;
  }

  // F32/BF16 in place; F16 widened to F32 (the CPU kernels read fp32 or bf16).
  static Expected<Tensor> float_tensor(const std::string& name, const Tensor& t) {
    if (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16) return aligned(t);
    if (t.dtype() == DType::kF16) return to_f32(name, t);
    return make_error(StatusCode::kUnsupported, "tensor '{}' has dtype {}: expected F32, BF16 or F16", name,
                      dtype_name(t.dtype()));
  }

  static Expected<Tensor> to_f32(const std::string& name, const Tensor& t_in) {
    const Tensor t = aligned(t_in);
    if (t.dtype() == DType::kF32) return t;
    Tensor out = Tensor::empty_host(DType::kF32, t.shape());
    float* o = out.data<float>();
    const int64_t n = t.numel();
    if (t.dtype() == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(t.data<uint16_t>()[i]);
    } else if (t.dtype() == DType::kF16) {
      for (int64_t i = 0; i < n; ++i) o[i] = f16_to_f32(t.data<uint16_t>()[i]);
    } else {
      return make_error(StatusCode::kUnsupported, "tensor '{}' has dtype {}: expected a float type", name,
                        dtype_name(t.dtype()));
    }
    return out;
  }

  const Checkpoint& ckpt_;
  const DeepseekConfig& config_;
};

}  // namespace

Expected<DeepseekWeights> load_deepseek_weights(const Checkpoint& ckpt, const DeepseekConfig& c) {
  Loader loader(ckpt, c);
  DeepseekWeights w;
  DI_RETURN_IF_ERROR(loader.table("model.embed_tokens.weight", c.vocab_size, c.hidden_size, &w.embed_tokens));
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) DI_RETURN_IF_ERROR(loader.layer(l, &w.layers[static_cast<size_t>(l)]));
  DI_RETURN_IF_ERROR(loader.vector("model.norm.weight", c.hidden_size, &w.norm));
  if (ckpt.has("lm_head.weight")) {
    DI_RETURN_IF_ERROR(loader.linear("lm_head", c.vocab_size, c.hidden_size, &w.lm_head));
  } else if (c.tie_word_embeddings) {
    w.lm_head.weight = w.embed_tokens;
  } else {
    return make_error(StatusCode::kNotFound, "tensor 'lm_head.weight' is missing (and tie_word_embeddings is false)");
  }

  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int64_t index = c.num_hidden_layers + i;
    const std::string p = fmt::format("model.layers.{}.", index);
    if (!ckpt.has(p + "eh_proj.weight") && !ckpt.has(p + "enorm.weight") && !ckpt.has(p + "input_layernorm.weight")) {
      log_info("config.json declares {} MTP layer(s) but the checkpoint has no '{}*' tensors: MTP disabled",
               c.num_nextn_predict_layers, p);
      w.mtp.clear();
      break;
    }
    MtpWeights m;
    DI_RETURN_IF_ERROR(loader.vector(p + "enorm.weight", c.hidden_size, &m.enorm));
    DI_RETURN_IF_ERROR(loader.vector(p + "hnorm.weight", c.hidden_size, &m.hnorm));
    DI_RETURN_IF_ERROR(loader.linear(p + "eh_proj", c.hidden_size, 2 * c.hidden_size, &m.eh_proj));
    DI_RETURN_IF_ERROR(loader.layer(index, &m.block));
    DI_RETURN_IF_ERROR(loader.vector(p + "shared_head.norm.weight", c.hidden_size, &m.shared_head_norm));
    if (ckpt.has(p + "shared_head.head.weight")) {
      DI_RETURN_IF_ERROR(loader.linear(p + "shared_head.head", c.vocab_size, c.hidden_size, &m.shared_head_head));
    } else {
      m.shared_head_head = w.lm_head;
    }
    w.mtp.push_back(std::move(m));
  }
  return w;
}

}  // namespace deepinfer
