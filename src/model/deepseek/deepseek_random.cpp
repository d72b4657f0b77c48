#include "model/deepseek/deepseek_random.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/safetensors.h"

namespace deepinfer {
namespace {

// splitmix64: fast enough for billion-parameter benchmark models, deterministic per seed.
class RandomSource {
 public:
  explicit RandomSource(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Approximately N(0, 1): the centred sum of four 16-bit uniforms (Irwin-Hall), bounded by ±3.46.
  float normal() {
    const uint64_t r = next();
    const float s = static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
    return (s / 65536.0f - 2.0f) * 1.7320508f;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

 private:
  uint64_t state_;
};

Tensor make_float(DType dtype, const std::vector<int64_t>& shape, RandomSource& rng, float lo, float hi, bool normal,
                  float std) {
  Tensor t = Tensor::empty_host(dtype, shape);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = normal ? rng.normal() * std : rng.uniform(lo, hi);
    if (dtype == DType::kF32) t.data<float>()[i] = v;
    else t.data<uint16_t>()[i] = f32_to_bf16(v);
  }
  return t;
}

// Block-scaled FP8: per block amax / 448 scales, like DeepSeek's release.
std::pair<Tensor, Tensor> quantize_fp8(const Tensor& w32, int64_t bn, int64_t bk) {
  const int64_t n = w32.size(0), k = w32.size(1);
  const int64_t sr = (n + bn - 1) / bn, sc = (k + bk - 1) / bk;
  Tensor q = Tensor::empty_host(DType::kF8E4M3, {n, k});
  Tensor s = Tensor::empty_host(DType::kF32, {sr, sc});
  const float* w = w32.data<float>();
  for (int64_t bi = 0; bi < sr; ++bi)
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 1e-4f;
      for (int64_t i = bi * bn; i < std::min(n, (bi + 1) * bn); ++i)
        for (int64_t j = bj * bk; j < std::min(k, (bj + 1) * bk); ++j) amax = std::max(amax, std::fabs(w[i * k + j]));
      const float scale = amax / 448.0f;
      s.data<float>()[bi * sc + bj] = scale;
      for (int64_t i = bi * bn; i < std::min(n, (bi + 1) * bn); ++i)
        for (int64_t j = bj * bk; j < std::min(k, (bj + 1) * bk); ++j)
          q.data<uint8_t>()[i * k + j] = f32_to_e4m3(w[i * k + j] / scale);
    }
  return {q, s};
}

class Builder {
 public:
  Builder(const DeepseekConfig& c, uint64_t seed, DType dtype) : c_(c), rng_(seed), dtype_(dtype) {}

  void norm(const std::string& name, int64_t n) {
    out_.emplace_back(name, make_float(small_dtype(), {n}, rng_, 0.7f, 1.3f, false, 0));
  }
  void linear(const std::string& prefix, int64_t n_out, int64_t n_in, bool quantizable = true) {
    const float std = 1.0f / std::sqrt(static_cast<float>(n_in));
    if (dtype_ == DType::kF8E4M3 && quantizable) {
      Tensor w32 = make_float(DType::kF32, {n_out, n_in}, rng_, 0, 0, true, std);
      auto [q, s] = quantize_fp8(w32, c_.fp8->block_n, c_.fp8->block_k);
      out_.emplace_back(prefix + ".weight", q);
      out_.emplace_back(prefix + ".weight_scale_inv", s);
    } else {
      out_.emplace_back(prefix + ".weight", make_float(small_dtype(), {n_out, n_in}, rng_, 0, 0, true, std));
    }
  }
  void mlp(const std::string& p, int64_t inter) {
    linear(p + ".gate_proj", inter, c_.hidden_size);
    linear(p + ".up_proj", inter, c_.hidden_size);
    linear(p + ".down_proj", c_.hidden_size, inter);
  }
  void layer(int64_t index, bool moe) {
    const std::string p = "model.layers." + std::to_string(index) + ".";
    const int64_t d = c_.hidden_size, H = c_.num_attention_heads;
    norm(p + "input_layernorm.weight", d);
    norm(p + "post_attention_layernorm.weight", d);
    if (c_.q_lora_rank == 0) {
      linear(p + "self_attn.q_proj", H * c_.qk_head_dim(), d);
    } else {
      linear(p + "self_attn.q_a_proj", c_.q_lora_rank, d);
      norm(p + "self_attn.q_a_layernorm.weight", c_.q_lora_rank);
      linear(p + "self_attn.q_b_proj", H * c_.qk_head_dim(), c_.q_lora_rank);
    }
    linear(p + "self_attn.kv_a_proj_with_mqa", c_.kv_latent_dim(), d);
    norm(p + "self_attn.kv_a_layernorm.weight", c_.kv_lora_rank);
    linear(p + "self_attn.kv_b_proj", H * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank);
    linear(p + "self_attn.o_proj", d, H * c_.v_head_dim);
    if (!moe) {
      mlp(p + "mlp", c_.intermediate_size);
      return;
    }
    Tensor gate = make_float(small_dtype(), {c_.n_routed_experts, d}, rng_, 0, 0, true, 2.0f / std::sqrt(static_cast<float>(d)));
    out_.emplace_back(p + "mlp.gate.weight", gate);
    if (c_.topk_method == TopkMethod::kNoauxTc)
      out_.emplace_back(p + "mlp.gate.e_score_correction_bias",
                        make_float(DType::kF32, {c_.n_routed_experts}, rng_, 0.0f, 0.2f, false, 0));
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) mlp(p + "mlp.experts." + std::to_string(e), c_.moe_intermediate_size);
    if (c_.n_shared_experts > 0) mlp(p + "mlp.shared_experts", c_.moe_intermediate_size * c_.n_shared_experts);
  }

  std::vector<std::pair<std::string, Tensor>> build(bool with_mtp) {
    out_.emplace_back("model.embed_tokens.weight",
                      make_float(small_dtype(), {c_.vocab_size, c_.hidden_size}, rng_, 0, 0, true, 1.0f));
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) layer(l, c_.is_moe_layer(l));
    norm("model.norm.weight", c_.hidden_size);
    linear("lm_head", c_.vocab_size, c_.hidden_size, false);
    if (with_mtp) {
      for (int64_t i = 0; i < c_.num_nextn_predict_layers; ++i) {
        const int64_t index = c_.num_hidden_layers + i;
        const std::string p = "model.layers." + std::to_string(index) + ".";
        norm(p + "enorm.weight", c_.hidden_size);
        norm(p + "hnorm.weight", c_.hidden_size);
        linear(p + "eh_proj", c_.hidden_size, 2 * c_.hidden_size, false);
        layer(index, c_.n_routed_experts > 0);
        norm(p + "shared_head.norm.weight", c_.hidden_size);
      }
    }
    return std::move(out_);
  }

 private:
  DType small_dtype() const { return dtype_ == DType::kF32 ? DType::kF32 : DType::kBF16; }
  const DeepseekConfig& c_;
  RandomSource rng_;
  DType dtype_;
  std::vector<std::pair<std::string, Tensor>> out_;
};

}  // namespace

std::vector<std::pair<std::string, Tensor>> make_random_deepseek_tensors(const DeepseekConfig& config, uint64_t seed,
                                                                         DType weight_dtype, bool with_mtp) {
  DI_CHECK(weight_dtype == DType::kF32 || weight_dtype == DType::kBF16 ||
           (weight_dtype == DType::kF8E4M3 && config.fp8.has_value()));
  return Builder(config, seed, weight_dtype).build(with_mtp);
}

Status write_random_deepseek_checkpoint(const std::string& dir, const nlohmann::json& config_json, uint64_t seed,
                                        DType weight_dtype, bool with_mtp) {
  DI_ASSIGN_OR_RETURN(DeepseekConfig config, parse_deepseek_config(config_json));
  if (weight_dtype == DType::kF8E4M3 && !config.fp8)
    return make_error(StatusCode::kInvalidArgument, "FP8 weights need quantization_config in the config");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(StatusCode::kInvalidArgument, "cannot create '{}': {}", dir, ec.message());
  {
    std::ofstream f(dir + "/config.json");
    f << config_json.dump(2) << "\n";
    if (!f) return make_error(StatusCode::kInvalidArgument, "cannot write '{}/config.json'", dir);
  }
  // Widest elements first, so every tensor starts at a multiple of its element size.
  auto tensors = make_random_deepseek_tensors(config, seed, weight_dtype, with_mtp);
  std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second.dtype()) > dtype_size(b.second.dtype());
  });
  return write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace deepinfer
