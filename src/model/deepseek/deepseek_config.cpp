#include "model/deepseek/deepseek_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace deepinfer {
namespace {

using json = nlohmann::json;

// Upper bounds that reject absurd values before they become allocation sizes. They are far above
// any released DeepSeek model (V3: hidden 7168, 128 heads, 256 experts, vocab 129280).
constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxExperts = 65536;
constexpr int64_t kMaxVocab = 1 << 26;
constexpr int64_t kMaxPositions = int64_t{1} << 32;

bool is_absent(const json& j, const char* key) { return !j.contains(key) || j.at(key).is_null(); }

Status field_error(const char* key, const std::string& what) {
  return make_error(StatusCode::kInvalidArgument, "config.json field '{}' {}", key, what);
}

// Integer in [lo, hi]; `fallback` when absent (nullopt fallback = required).
Status read_int(const json& j, const char* key, std::optional<int64_t> fallback, int64_t lo, int64_t hi,
                int64_t* out) {
  if (is_absent(j, key)) {
    if (!fallback) return field_error(key, "is required");
    *out = *fallback;
    return Status::ok();
  }
  const json& v = j.at(key);
  int64_t value;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
      return field_error(key, fmt::format("must be at most {}, got {}", hi, v.get<uint64_t>()));
    value = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15) {
    value = static_cast<int64_t>(v.get<double>());
  } else {
    return field_error(key, fmt::format("must be an integer, got {}", v.dump()));
  }
  if (value < lo || value > hi)
    return field_error(key, fmt::format("must be in [{}, {}], got {}", lo, hi, value));
  *out = value;
  return Status::ok();
}

// Finite number in [lo, hi].
Status read_double(const json& j, const char* key, std::optional<double> fallback, double lo, double hi,
                   double* out) {
  if (is_absent(j, key)) {
    if (!fallback) return field_error(key, "is required");
    *out = *fallback;
    return Status::ok();
  }
  const json& v = j.at(key);
  if (!v.is_number()) return field_error(key, fmt::format("must be a number, got {}", v.dump()));
  const double value = v.get<double>();
  if (!std::isfinite(value) || value < lo || value > hi)
    return field_error(key, fmt::format("must be finite and in [{}, {}], got {}", lo, hi, v.dump()));
  *out = value;
  return Status::ok();
}

Status read_bool(const json& j, const char* key, bool fallback, bool* out) {
  if (is_absent(j, key)) {
    *out = fallback;
    return Status::ok();
  }
  if (!j.at(key).is_boolean()) return field_error(key, fmt::format("must be a boolean, got {}", j.at(key).dump()));
  *out = j.at(key).get<bool>();
  return Status::ok();
}

Status read_string(const json& j, const char* key, const std::string& fallback, std::string* out) {
  if (is_absent(j, key)) {
    *out = fallback;
    return Status::ok();
  }
  if (!j.at(key).is_string()) return field_error(key, fmt::format("must be a string, got {}", j.at(key).dump()));
  *out = j.at(key).get<std::string>();
  return Status::ok();
}

Status parse_rope(const json& config, int64_t max_positions, RopeConfig* rope) {
  // transformers 5 writes `rope_parameters` (rope_theta folded in); original checkpoints have
  // `rope_theta` + `rope_scaling`. A `rope_parameters` dict wins when both exist.
  const json* params = nullptr;
  const char* where = "rope_parameters";
  if (!is_absent(config, "rope_parameters")) {
    params = &config.at("rope_parameters");
  } else if (!is_absent(config, "rope_scaling")) {
    params = &config.at("rope_scaling");
    where = "rope_scaling";
  }
  if (params != nullptr && !params->is_object())
    return field_error(where, fmt::format("must be an object, got {}", params->dump()));

  double theta_default = 10000.0;
  DI_RETURN_IF_ERROR(read_double(config, "rope_theta", 10000.0, 1e-6, 1e18, &theta_default));
  rope->rope_theta = theta_default;
  if (params == nullptr) return Status::ok();

  const json& p = *params;
  std::string type = "default";
  if (!is_absent(p, "rope_type")) {
    DI_RETURN_IF_ERROR(read_string(p, "rope_type", "default", &type).with_context(where));
  } else if (!is_absent(p, "type")) {
    DI_RETURN_IF_ERROR(read_string(p, "type", "default", &type).with_context(where));
  }
  DI_RETURN_IF_ERROR(read_double(p, "rope_theta", theta_default, 1e-6, 1e18, &rope->rope_theta).with_context(where));
  if (type == "default") {
    rope->rope_type = RopeType::kDefault;
    return Status::ok();
  }
  if (type != "yarn")
    return make_error(StatusCode::kUnsupported, "config.json field '{}.rope_type' is '{}': only 'default' and 'yarn' are supported",
                      where, type);
  rope->rope_type = RopeType::kYarn;
  DI_RETURN_IF_ERROR(read_int(p, "original_max_position_embeddings", std::nullopt, 1, kMaxPositions,
                              &rope->original_max_position_embeddings).with_context(where));
  // transformers: a missing factor means max_position_embeddings / original_max_position_embeddings.
  const double derived_factor =
      static_cast<double>(max_positions) / static_cast<double>(rope->original_max_position_embeddings);
  DI_RETURN_IF_ERROR(read_double(p, "factor", derived_factor, 1e-6, 1e9, &rope->factor).with_context(where));
  // transformers treats 0/null beta as the default (`get("beta_fast") or 32`).
  DI_RETURN_IF_ERROR(read_double(p, "beta_fast", 32.0, 0.0, 1e9, &rope->beta_fast).with_context(where));
  DI_RETURN_IF_ERROR(read_double(p, "beta_slow", 1.0, 0.0, 1e9, &rope->beta_slow).with_context(where));
  if (rope->beta_fast == 0.0) rope->beta_fast = 32.0;
  if (rope->beta_slow == 0.0) rope->beta_slow = 1.0;
  DI_RETURN_IF_ERROR(read_double(p, "mscale", 0.0, -1e6, 1e6, &rope->mscale).with_context(where));
  DI_RETURN_IF_ERROR(read_double(p, "mscale_all_dim", 0.0, -1e6, 1e6, &rope->mscale_all_dim).with_context(where));
  if (!is_absent(p, "attention_factor")) {
    double af = 0;
    DI_RETURN_IF_ERROR(read_double(p, "attention_factor", std::nullopt, 0.0, 1e6, &af).with_context(where));
    rope->attention_factor = af;
  }
  DI_RETURN_IF_ERROR(read_bool(p, "truncate", true, &rope->truncate).with_context(where));
  return Status::ok();
}

Status parse_quantization(const json& config, std::optional<Fp8Config>* fp8) {
  if (is_absent(config, "quantization_config")) return Status::ok();
  const json& q = config.at("quantization_config");
  if (!q.is_object()) return field_error("quantization_config", "must be an object");
  std::string method;
  DI_RETURN_IF_ERROR(read_string(q, "quant_method", "", &method).with_context("quantization_config"));
  if (method != "fp8")
    return make_error(StatusCode::kUnsupported,
                      "config.json field 'quantization_config.quant_method' is '{}': only 'fp8' is supported", method);
  std::string fmt_name;
  DI_RETURN_IF_ERROR(read_string(q, "fmt", "e4m3", &fmt_name).with_context("quantization_config"));
  if (fmt_name != "e4m3")
    return make_error(StatusCode::kUnsupported,
                      "config.json field 'quantization_config.fmt' is '{}': only 'e4m3' is supported", fmt_name);
  std::string activation;
  DI_RETURN_IF_ERROR(read_string(q, "activation_scheme", "dynamic", &activation).with_context("quantization_config"));
  if (activation != "dynamic")
    return make_error(StatusCode::kUnsupported,
                      "config.json field 'quantization_config.activation_scheme' is '{}': only 'dynamic' is supported",
                      activation);
  Fp8Config out;
  if (is_absent(q, "weight_block_size")) return field_error("quantization_config.weight_block_size", "is required");
  const json& block = q.at("weight_block_size");
  if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer())
    return field_error("quantization_config.weight_block_size", fmt::format("must be [n, k] integers, got {}", block.dump()));
  out.block_n = block[0].get<int64_t>();
  out.block_k = block[1].get<int64_t>();
  if (out.block_n < 1 || out.block_n > 4096 || out.block_k < 1 || out.block_k > 4096)
    return field_error("quantization_config.weight_block_size", fmt::format("must be in [1, 4096], got {}", block.dump()));
  std::string scale_fmt;
  DI_RETURN_IF_ERROR(read_string(q, "scale_fmt", "", &scale_fmt).with_context("quantization_config"));
  if (!scale_fmt.empty() && scale_fmt != "ue8m0")
    return make_error(StatusCode::kUnsupported,
                      "config.json field 'quantization_config.scale_fmt' is '{}': only 'ue8m0' is known", scale_fmt);
  out.scale_ue8m0 = scale_fmt == "ue8m0";
  *fp8 = out;
  return Status::ok();
}

}  // namespace

bool DeepseekConfig::is_moe_layer(int64_t layer) const {
  return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

double DeepseekConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  // DeepSeek's reference and transformers' V3 (not transformers' V2, see docs/DESIGN.md) scale
  // the softmax by mscale^2 under YaRN, with mscale taken from mscale_all_dim.
  if (rope.rope_type == RopeType::kYarn && rope.mscale_all_dim != 0.0 && rope.factor > 1.0) {
    const double m = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= m * m;
  }
  return scale;
}

Expected<DeepseekConfig> parse_deepseek_config(const json& j) {
  if (!j.is_object()) return make_error(StatusCode::kInvalidArgument, "config.json must hold a JSON object");
  DeepseekConfig c;

  // Architecture: `architectures[0]`, else `model_type`.
  std::string model_type;
  DI_RETURN_IF_ERROR(read_string(j, "model_type", "", &model_type));
  if (!is_absent(j, "architectures")) {
    const json& a = j.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      return field_error("architectures", "must be a non-empty array of strings");
    c.architecture = a[0].get<std::string>();
  }
  if (c.architecture == "DeepseekV3ForCausalLM" || (c.architecture.empty() && model_type == "deepseek_v3")) {
    c.family = DeepseekFamily::kV3;
    c.architecture = "DeepseekV3ForCausalLM";
  } else if (c.architecture == "DeepseekV2ForCausalLM" || (c.architecture.empty() && model_type == "deepseek_v2")) {
    c.family = DeepseekFamily::kV2;
    c.architecture = "DeepseekV2ForCausalLM";
  } else {
    return make_error(StatusCode::kUnsupported,
                      "config.json field 'architectures' names '{}' (model_type '{}'): supported are "
                      "DeepseekV2ForCausalLM and DeepseekV3ForCausalLM",
                      c.architecture, model_type);
  }
  const bool v3 = c.family == DeepseekFamily::kV3;

  DI_RETURN_IF_ERROR(read_int(j, "vocab_size", std::nullopt, 1, kMaxVocab, &c.vocab_size));
  DI_RETURN_IF_ERROR(read_int(j, "hidden_size", std::nullopt, 1, kMaxDim, &c.hidden_size));
  DI_RETURN_IF_ERROR(read_int(j, "num_hidden_layers", std::nullopt, 1, kMaxLayers, &c.num_hidden_layers));
  DI_RETURN_IF_ERROR(read_int(j, "num_attention_heads", std::nullopt, 1, kMaxHeads, &c.num_attention_heads));
  DI_RETURN_IF_ERROR(read_int(j, "kv_lora_rank", std::nullopt, 1, kMaxDim, &c.kv_lora_rank));
  DI_RETURN_IF_ERROR(read_int(j, "qk_nope_head_dim", std::nullopt, 0, kMaxDim, &c.qk_nope_head_dim));
  DI_RETURN_IF_ERROR(read_int(j, "qk_rope_head_dim", std::nullopt, 2, kMaxDim, &c.qk_rope_head_dim));
  DI_RETURN_IF_ERROR(read_int(j, "v_head_dim", std::nullopt, 1, kMaxDim, &c.v_head_dim));
  if (c.qk_rope_head_dim % 2 != 0)
    return field_error("qk_rope_head_dim", fmt::format("must be even, got {}", c.qk_rope_head_dim));
  DI_RETURN_IF_ERROR(read_int(j, "q_lora_rank", int64_t{0}, 0, kMaxDim, &c.q_lora_rank));
  if (!is_absent(j, "q_lora_rank") && c.q_lora_rank == 0)
    return field_error("q_lora_rank", "must be null or positive, got 0");

  // MoE.
  DI_RETURN_IF_ERROR(read_int(j, "n_routed_experts", int64_t{0}, 0, kMaxExperts, &c.n_routed_experts));
  DI_RETURN_IF_ERROR(read_int(j, "intermediate_size", std::nullopt, 1, kMaxDim, &c.intermediate_size));
  if (c.n_routed_experts > 0) {
    DI_RETURN_IF_ERROR(read_int(j, "moe_intermediate_size", std::nullopt, 1, kMaxDim, &c.moe_intermediate_size));
    // At most 32 picks per token: the GPU router keeps one per lane of a warp.
    DI_RETURN_IF_ERROR(read_int(j, "num_experts_per_tok", std::nullopt, 1, std::min<int64_t>(c.n_routed_experts, 32),
                                &c.num_experts_per_tok));
    DI_RETURN_IF_ERROR(read_int(j, "n_shared_experts", int64_t{0}, 0, kMaxExperts, &c.n_shared_experts));
    DI_RETURN_IF_ERROR(read_int(j, "n_group", int64_t{1}, 1, c.n_routed_experts, &c.n_group));
    DI_RETURN_IF_ERROR(read_int(j, "topk_group", c.n_group, 1, c.n_group, &c.topk_group));
    if (c.n_routed_experts % c.n_group != 0)
      return field_error("n_group", fmt::format("must divide n_routed_experts ({}), got {}", c.n_routed_experts, c.n_group));
    std::string scoring, method;
    DI_RETURN_IF_ERROR(read_string(j, "scoring_func", v3 ? "sigmoid" : "softmax", &scoring));
    DI_RETURN_IF_ERROR(read_string(j, "topk_method", v3 ? "noaux_tc" : "greedy", &method));
    if (scoring == "softmax") c.scoring_func = ScoringFunc::kSoftmax;
    else if (scoring == "sigmoid") c.scoring_func = ScoringFunc::kSigmoid;
    else return make_error(StatusCode::kUnsupported, "config.json field 'scoring_func' is '{}': expected softmax or sigmoid", scoring);
    if (method == "greedy") c.topk_method = TopkMethod::kGreedy;
    else if (method == "group_limited_greedy") c.topk_method = TopkMethod::kGroupLimitedGreedy;
    else if (method == "noaux_tc") c.topk_method = TopkMethod::kNoauxTc;
    else return make_error(StatusCode::kUnsupported,
                           "config.json field 'topk_method' is '{}': expected greedy, group_limited_greedy or noaux_tc", method);
    if (c.topk_method == TopkMethod::kGreedy) {
      c.n_group = 1;  // greedy ignores groups
      c.topk_group = 1;
    }
    const int64_t per_group = c.n_routed_experts / c.n_group;
    if (c.num_experts_per_tok > c.topk_group * per_group)
      return field_error("num_experts_per_tok",
                         fmt::format("({}) exceeds the experts reachable in topk_group ({}) groups of {}",
                                     c.num_experts_per_tok, c.topk_group, per_group));
    if (c.topk_method == TopkMethod::kNoauxTc && per_group < 2 && c.n_group > 1)
      return field_error("n_group", "noaux_tc scores each group by its top-2 experts: groups need >= 2 experts");
    DI_RETURN_IF_ERROR(read_bool(j, "norm_topk_prob", v3, &c.norm_topk_prob));
    DI_RETURN_IF_ERROR(read_double(j, "routed_scaling_factor", 1.0, 1e-9, 1e9, &c.routed_scaling_factor));
    DI_RETURN_IF_ERROR(read_int(j, "first_k_dense_replace", int64_t{0}, 0, kMaxLayers, &c.first_k_dense_replace));
    DI_RETURN_IF_ERROR(read_int(j, "moe_layer_freq", int64_t{1}, 1, kMaxLayers, &c.moe_layer_freq));
  }

  std::string act;
  DI_RETURN_IF_ERROR(read_string(j, "hidden_act", "silu", &act));
  if (act != "silu") return make_error(StatusCode::kUnsupported, "config.json field 'hidden_act' is '{}': only silu", act);
  bool attention_bias = false;
  DI_RETURN_IF_ERROR(read_bool(j, "attention_bias", false, &attention_bias));
  if (attention_bias) return make_error(StatusCode::kUnsupported, "config.json field 'attention_bias' true is not supported");

  DI_RETURN_IF_ERROR(read_double(j, "rms_norm_eps", 1e-6, 0.0, 1.0, &c.rms_norm_eps));
  DI_RETURN_IF_ERROR(read_int(j, "max_position_embeddings", int64_t{4096}, 1, kMaxPositions, &c.max_position_embeddings));
  DI_RETURN_IF_ERROR(parse_rope(j, c.max_position_embeddings, &c.rope));
  DI_RETURN_IF_ERROR(read_bool(j, "rope_interleave", true, &c.rope_interleave));
  DI_RETURN_IF_ERROR(read_int(j, "num_nextn_predict_layers", int64_t{0}, 0, 64, &c.num_nextn_predict_layers));
  DI_RETURN_IF_ERROR(read_bool(j, "tie_word_embeddings", false, &c.tie_word_embeddings));
  if (!is_absent(j, "bos_token_id")) {
    int64_t bos = 0;
    DI_RETURN_IF_ERROR(read_int(j, "bos_token_id", std::nullopt, 0, c.vocab_size - 1, &bos));
    c.bos_token_id = bos;
  }
  if (!is_absent(j, "eos_token_id")) {
    const json& e = j.at("eos_token_id");
    if (e.is_array()) {
      for (const json& v : e) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.vocab_size)
          return field_error("eos_token_id", fmt::format("entries must be token ids below vocab_size {}, got {}",
                                                         c.vocab_size, v.dump()));
        c.eos_token_ids.push_back(v.get<int64_t>());
      }
    } else {
      int64_t eos = 0;
      DI_RETURN_IF_ERROR(read_int(j, "eos_token_id", std::nullopt, 0, c.vocab_size - 1, &eos));
      c.eos_token_ids.push_back(eos);
    }
  }
  DI_RETURN_IF_ERROR(parse_quantization(j, &c.fp8));
  return c;
}

}  // namespace deepinfer
