// parse_deepseek_config: the tiny test configs, RoPE normalization across config spellings,
// derived quantities (softmax scale, YaRN tables, MoE layer placement) and one rejection per
// class of bad config.json, each naming the field.
#include "model/deepseek/deepseek_config.h"

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "model/deepseek/deepseek_rope.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
using testing::tiny_fp8_config;
using testing::tiny_v2_config;
using testing::tiny_v3_config;

DeepseekConfig parse_ok(const json& j) {
  auto c = parse_deepseek_config(j);
  EXPECT_TRUE(c.has_value()) << c.status().to_string();
  if (!c.has_value()) return {};
  return *c;
}

// Asserts the config is rejected with `code` and the message names `field` (and `extra`).
void expect_rejected(const json& j, StatusCode code, const std::string& field, const std::string& extra = "") {
  auto c = parse_deepseek_config(j);
  ASSERT_FALSE(c.has_value()) << "accepted a config with bad '" << field << "': " << j.dump();
  EXPECT_EQ(c.status().code(), code) << c.status().to_string();
  EXPECT_NE(c.status().message().find(field), std::string::npos)
      << "message does not name '" << field << "': " << c.status().message();
  if (!extra.empty()) {
    EXPECT_NE(c.status().message().find(extra), std::string::npos)
        << "message does not contain '" << extra << "': " << c.status().message();
  }
}

void expect_same_rope(const RopeConfig& a, const RopeConfig& b) {
  EXPECT_EQ(a.rope_type, b.rope_type);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.factor, b.factor);
  EXPECT_EQ(a.original_max_position_embeddings, b.original_max_position_embeddings);
  EXPECT_EQ(a.beta_fast, b.beta_fast);
  EXPECT_EQ(a.beta_slow, b.beta_slow);
  EXPECT_EQ(a.mscale, b.mscale);
  EXPECT_EQ(a.mscale_all_dim, b.mscale_all_dim);
  EXPECT_EQ(a.attention_factor, b.attention_factor);
  EXPECT_EQ(a.truncate, b.truncate);
}

// DeepSeek-V3's real attention and RoPE dimensions on top of the tiny config.
json v3_real_rope_config() {
  json j = tiny_v3_config();
  j["qk_nope_head_dim"] = 128;
  j["qk_rope_head_dim"] = 64;
  j["v_head_dim"] = 128;
  j["max_position_embeddings"] = 163840;
  j["rope_theta"] = 10000;
  j["rope_scaling"] = {{"type", "yarn"},        {"factor", 40},       {"original_max_position_embeddings", 4096},
                       {"beta_fast", 32},       {"beta_slow", 1},     {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}};
  return j;
}

// ---------------------------------------------------------------------------------------------
// Accepted configs

TEST(DeepseekConfig, ParsesTinyV3) {
  const DeepseekConfig c = parse_ok(tiny_v3_config());
  EXPECT_EQ(c.family, DeepseekFamily::kV3);
  EXPECT_EQ(c.architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c.vocab_size, 301);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.moe_intermediate_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 24);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 16);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 16);
  EXPECT_EQ(c.qk_head_dim(), 24);
  EXPECT_EQ(c.kv_latent_dim(), 40);
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_EQ(c.rope.rope_type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_FALSE(c.rope.attention_factor.has_value());
  EXPECT_TRUE(c.rope_interleave);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  ASSERT_TRUE(c.bos_token_id.has_value());
  EXPECT_EQ(*c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_FALSE(c.fp8.has_value());
}

TEST(DeepseekConfig, ParsesTinyV2) {
  const DeepseekConfig c = parse_ok(tiny_v2_config());
  EXPECT_EQ(c.family, DeepseekFamily::kV2);
  EXPECT_EQ(c.architecture, "DeepseekV2ForCausalLM");
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.hidden_size, 48);
  EXPECT_EQ(c.q_lora_rank, 0);  // null: one q_proj
  EXPECT_EQ(c.num_attention_heads, 3);
  EXPECT_EQ(c.v_head_dim, 12);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.rope.rope_type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.rope_theta, 10000.0);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_FALSE(c.fp8.has_value());
}

TEST(DeepseekConfig, ParsesTinyFp8) {
  const DeepseekConfig c = parse_ok(tiny_fp8_config());
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_EQ(c.fp8->block_n, 128);
  EXPECT_EQ(c.fp8->block_k, 128);
  EXPECT_FALSE(c.fp8->scale_ue8m0);
  EXPECT_EQ(c.hidden_size, 160);
  EXPECT_EQ(c.q_lora_rank, 136);
  EXPECT_EQ(c.n_routed_experts, 8);

  json j = tiny_fp8_config();
  j["quantization_config"]["scale_fmt"] = "ue8m0";
  EXPECT_TRUE(parse_ok(j).fp8->scale_ue8m0);
}

TEST(DeepseekConfig, ArchitectureFallsBackToModelType) {
  json j = tiny_v2_config();
  j.erase("architectures");
  EXPECT_EQ(parse_ok(j).family, DeepseekFamily::kV2);
  j["model_type"] = "deepseek_v3";
  EXPECT_EQ(parse_ok(j).family, DeepseekFamily::kV3);
}

TEST(DeepseekConfig, EosTokenIdMayBeAList) {
  json j = tiny_v3_config();
  j["eos_token_id"] = {1, 7, 300};
  EXPECT_EQ(parse_ok(j).eos_token_ids, (std::vector<int64_t>{1, 7, 300}));
  j.erase("eos_token_id");
  EXPECT_TRUE(parse_ok(j).eos_token_ids.empty());
}

// ---------------------------------------------------------------------------------------------
// RoPE spellings

TEST(DeepseekConfig, RopeSpellingsNormalizeIdentically) {
  // Original DeepSeek: rope_theta + rope_scaling with "type".
  json a = tiny_v3_config();
  // Same with "rope_type".
  json b = tiny_v3_config();
  b["rope_scaling"].erase("type");
  b["rope_scaling"]["rope_type"] = "yarn";
  // transformers 5: rope_parameters with rope_theta folded in, no top-level rope_theta.
  json c = tiny_v3_config();
  c["rope_parameters"] = c["rope_scaling"];
  c["rope_parameters"].erase("type");
  c["rope_parameters"]["rope_type"] = "yarn";
  c["rope_parameters"]["rope_theta"] = 10000.0;
  c.erase("rope_scaling");
  c.erase("rope_theta");
  // rope_parameters wins over a stale rope_scaling.
  json d = c;
  d["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};

  const RopeConfig ra = parse_ok(a).rope;
  EXPECT_EQ(ra.rope_type, RopeType::kYarn);
  expect_same_rope(ra, parse_ok(b).rope);
  expect_same_rope(ra, parse_ok(c).rope);
  expect_same_rope(ra, parse_ok(d).rope);

  // Default RoPE, both spellings, non-default theta.
  json e = tiny_v2_config();
  e["rope_parameters"]["rope_theta"] = 50000.0;
  json f = tiny_v2_config();
  f.erase("rope_parameters");
  f["rope_theta"] = 50000.0;
  json g = f;
  g["rope_scaling"] = nullptr;
  const RopeConfig re = parse_ok(e).rope;
  EXPECT_EQ(re.rope_type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(re.rope_theta, 50000.0);
  expect_same_rope(re, parse_ok(f).rope);
  expect_same_rope(re, parse_ok(g).rope);
}

TEST(DeepseekConfig, YarnFactorDerivedFromPositionsWhenAbsent) {
  json j = tiny_v3_config();
  j["rope_scaling"].erase("factor");
  j["max_position_embeddings"] = 1000;
  j["rope_scaling"]["original_max_position_embeddings"] = 250;
  EXPECT_DOUBLE_EQ(parse_ok(j).rope.factor, 4.0);
  j["max_position_embeddings"] = 163840;
  j["rope_scaling"]["original_max_position_embeddings"] = 4096;
  EXPECT_DOUBLE_EQ(parse_ok(j).rope.factor, 40.0);
}

TEST(DeepseekConfig, YarnZeroOrNullBetasMeanDefaults) {
  json j = tiny_v3_config();
  j["rope_scaling"]["beta_fast"] = 0;
  j["rope_scaling"]["beta_slow"] = nullptr;
  const RopeConfig r = parse_ok(j).rope;
  EXPECT_DOUBLE_EQ(r.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(r.beta_slow, 1.0);
}

// ---------------------------------------------------------------------------------------------
// Derived quantities

TEST(DeepseekConfig, SoftmaxScaleV3AndV2Lite) {
  json v3 = v3_real_rope_config();
  EXPECT_NEAR(parse_ok(v3).softmax_scale(), 0.1352338, 1e-6);

  json v2 = v3_real_rope_config();
  v2["rope_scaling"]["mscale"] = 0.707;
  v2["rope_scaling"]["mscale_all_dim"] = 0.707;
  EXPECT_NEAR(parse_ok(v2).softmax_scale(), 0.1147214, 1e-6);

  // Without YaRN (or without mscale_all_dim) it is plain 1/sqrt(qk_head_dim).
  json plain = v3_real_rope_config();
  plain.erase("rope_scaling");
  EXPECT_DOUBLE_EQ(parse_ok(plain).softmax_scale(), 1.0 / std::sqrt(192.0));
  json no_all_dim = v3_real_rope_config();
  no_all_dim["rope_scaling"].erase("mscale_all_dim");
  EXPECT_DOUBLE_EQ(parse_ok(no_all_dim).softmax_scale(), 1.0 / std::sqrt(192.0));
}

TEST(DeepseekRope, V3YarnInverseFrequencies) {
  const DeepseekConfig c = parse_ok(v3_real_rope_config());
  const RopeParams p = make_rope_params(c);
  ASSERT_EQ(p.inv_freq.size(), 32u);
  EXPECT_EQ(p.dim(), 64);
  EXPECT_TRUE(p.interleave);
  for (int i = 0; i < 32; ++i) {
    const double original = std::pow(10000.0, -2.0 * i / 64.0);
    const double got = p.inv_freq[static_cast<size_t>(i)];
    if (i <= 10) {
      EXPECT_NEAR(got, original, 1e-6 * original) << "dim " << i;
    } else if (i >= 23) {
      EXPECT_NEAR(got, original / 40.0, 1e-6 * original / 40.0) << "dim " << i;
    } else {  // blended: strictly between the two
      EXPECT_LT(got, original * (1 - 1e-6)) << "dim " << i;
      EXPECT_GT(got, original / 40.0 * (1 + 1e-6)) << "dim " << i;
    }
  }
  // i = 16 sits at ramp (16 - 10) / 13 between extrapolation and interpolation.
  const double g = 6.0 / 13.0, o16 = std::pow(10000.0, -0.5);
  EXPECT_NEAR(p.inv_freq[16], o16 * (1 - g) + o16 / 40.0 * g, 1e-6 * o16);
  // mscale == mscale_all_dim: the cos/sin amplitude is exactly 1.
  EXPECT_EQ(p.attention_factor, 1.0f);
}

TEST(DeepseekRope, AttentionFactorRules) {
  json none = v3_real_rope_config();
  none["rope_scaling"].erase("mscale");
  none["rope_scaling"].erase("mscale_all_dim");
  EXPECT_NEAR(make_rope_params(parse_ok(none)).attention_factor, 0.1 * std::log(40.0) + 1.0, 1e-6);

  json v2 = v3_real_rope_config();
  v2["rope_scaling"]["mscale"] = 0.707;
  v2["rope_scaling"]["mscale_all_dim"] = 0.707;
  EXPECT_EQ(make_rope_params(parse_ok(v2)).attention_factor, 1.0f);

  json uneven = v3_real_rope_config();
  uneven["rope_scaling"]["mscale"] = 1.0;
  uneven["rope_scaling"]["mscale_all_dim"] = 0.5;
  const double l = std::log(40.0);
  EXPECT_NEAR(make_rope_params(parse_ok(uneven)).attention_factor, (0.1 * l + 1) / (0.05 * l + 1), 1e-6);

  json explicit_af = v3_real_rope_config();
  explicit_af["rope_scaling"]["attention_factor"] = 0.75;
  EXPECT_EQ(make_rope_params(parse_ok(explicit_af)).attention_factor, 0.75f);
}

TEST(DeepseekRope, DefaultRopeIsPlainInverseFrequencies) {
  const DeepseekConfig c = parse_ok(tiny_v2_config());
  const RopeParams p = make_rope_params(c);
  ASSERT_EQ(p.inv_freq.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const double want = std::pow(10000.0, -2.0 * i / 8.0);
    EXPECT_NEAR(p.inv_freq[static_cast<size_t>(i)], want, 1e-6 * want);
  }
  EXPECT_EQ(p.attention_factor, 1.0f);
  EXPECT_TRUE(p.interleave);  // V2 is always interleaved
  json v3 = tiny_v3_config();
  v3["rope_interleave"] = false;
  EXPECT_FALSE(make_rope_params(parse_ok(v3)).interleave);
}

// Every config the parser accepts yields finite RoPE tables (a NaN here would poison every
// attention score silently).
TEST(DeepseekRope, AcceptedYarnConfigsGiveFiniteTables) {
  for (double theta : {2.0, 1.0, 0.5, 1e-3, 1e12}) {
    json j = tiny_v3_config();
    j["rope_theta"] = theta;
    auto c = parse_deepseek_config(j);
    if (!c.has_value()) continue;  // rejecting is fine too
    const RopeParams p = make_rope_params(*c);
    for (size_t i = 0; i < p.inv_freq.size(); ++i)
      EXPECT_TRUE(std::isfinite(p.inv_freq[i])) << "rope_theta " << theta << " inv_freq[" << i << "] = " << p.inv_freq[i];
    EXPECT_TRUE(std::isfinite(p.attention_factor)) << "rope_theta " << theta;
  }
}

TEST(DeepseekConfig, IsMoeLayer) {
  json j = tiny_v3_config();
  j["num_hidden_layers"] = 6;
  DeepseekConfig c = parse_ok(j);
  EXPECT_FALSE(c.is_moe_layer(0));
  for (int l = 1; l < 6; ++l) EXPECT_TRUE(c.is_moe_layer(l)) << l;

  j["first_k_dense_replace"] = 3;
  c = parse_ok(j);
  for (int l = 0; l < 3; ++l) EXPECT_FALSE(c.is_moe_layer(l)) << l;
  for (int l = 3; l < 6; ++l) EXPECT_TRUE(c.is_moe_layer(l)) << l;

  j["first_k_dense_replace"] = 1;
  j["moe_layer_freq"] = 2;  // transformers: layer >= first_k_dense_replace and layer % freq == 0
  c = parse_ok(j);
  const bool want[] = {false, false, true, false, true, false};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(c.is_moe_layer(l), want[l]) << l;

  j.erase("n_routed_experts");  // dense model
  c = parse_ok(j);
  EXPECT_EQ(c.n_routed_experts, 0);
  for (int l = 0; l < 6; ++l) EXPECT_FALSE(c.is_moe_layer(l)) << l;
}

// ---------------------------------------------------------------------------------------------
// Rejections: one per class of bad config, each naming the field.

TEST(DeepseekConfigErrors, MissingRequiredField) {
  for (const char* key : {"hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                          "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size",
                          "num_experts_per_tok"}) {
    json j = tiny_v3_config();
    j.erase(key);
    expect_rejected(j, StatusCode::kInvalidArgument, key, "required");
  }
  json j = tiny_v3_config();
  j["hidden_size"] = nullptr;  // null is as good as absent
  expect_rejected(j, StatusCode::kInvalidArgument, "hidden_size", "required");
}

TEST(DeepseekConfigErrors, ZeroNegativeOrHugeSizes) {
  const json bad_values[] = {0, -1, -4096, int64_t{1} << 40, json::parse("18446744073709551615")};
  for (const char* key : {"num_attention_heads", "num_hidden_layers", "kv_lora_rank", "q_lora_rank",
                          "n_routed_experts", "vocab_size", "hidden_size", "intermediate_size",
                          "moe_intermediate_size", "qk_rope_head_dim", "v_head_dim", "max_position_embeddings"}) {
    for (const json& v : bad_values) {
      if (std::string(key) == "n_routed_experts" && v == 0) continue;  // 0 = dense, valid
      json j = tiny_v3_config();
      j[key] = v;
      SCOPED_TRACE(std::string(key) + " = " + v.dump());
      expect_rejected(j, StatusCode::kInvalidArgument, key);
    }
  }
  // Just past each documented cap.
  json j = tiny_v3_config();
  j["num_attention_heads"] = 4097;
  expect_rejected(j, StatusCode::kInvalidArgument, "num_attention_heads");
  j = tiny_v3_config();
  j["num_hidden_layers"] = 4097;
  expect_rejected(j, StatusCode::kInvalidArgument, "num_hidden_layers");
  j = tiny_v3_config();
  j["n_routed_experts"] = 65537;
  expect_rejected(j, StatusCode::kInvalidArgument, "n_routed_experts");
  j = tiny_v3_config();
  j["vocab_size"] = (1 << 26) + 1;
  expect_rejected(j, StatusCode::kInvalidArgument, "vocab_size");
}

TEST(DeepseekConfigErrors, NonIntegerSizes) {
  for (const json& v : {json(64.5), json("64"), json(true), json::array({64}), json::object()}) {
    json j = tiny_v3_config();
    j["hidden_size"] = v;
    SCOPED_TRACE(v.dump());
    expect_rejected(j, StatusCode::kInvalidArgument, "hidden_size");
  }
  json j = tiny_v3_config();
  j["hidden_size"] = 64.0;  // an integral float is accepted
  EXPECT_EQ(parse_ok(j).hidden_size, 64);
}

TEST(DeepseekConfigErrors, ExpertsPerTokenAboveRoutedExperts) {
  json j = tiny_v3_config();
  j["num_experts_per_tok"] = 17;  // of 16
  expect_rejected(j, StatusCode::kInvalidArgument, "num_experts_per_tok");
  j["num_experts_per_tok"] = 0;
  expect_rejected(j, StatusCode::kInvalidArgument, "num_experts_per_tok");
  // Reachable experts: topk_group (2) groups of 4 = 8 < 9.
  j["num_experts_per_tok"] = 9;
  expect_rejected(j, StatusCode::kInvalidArgument, "num_experts_per_tok");
  // More than 32 picks (the GPU router's lanes), with enough experts to reach them.
  j["n_routed_experts"] = 64;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 33;
  expect_rejected(j, StatusCode::kInvalidArgument, "num_experts_per_tok");
  j["num_experts_per_tok"] = 32;
  EXPECT_EQ(parse_ok(j).num_experts_per_tok, 32);
}

TEST(DeepseekConfigErrors, GroupCountMustDivideExperts) {
  json j = tiny_v3_config();
  j["n_group"] = 3;  // 16 % 3 != 0
  expect_rejected(j, StatusCode::kInvalidArgument, "n_group");
  j["n_group"] = 0;
  expect_rejected(j, StatusCode::kInvalidArgument, "n_group");
  j["n_group"] = 32;  // more groups than experts
  expect_rejected(j, StatusCode::kInvalidArgument, "n_group");
}

TEST(DeepseekConfigErrors, TopkGroupAboveGroupCount) {
  json j = tiny_v3_config();
  j["topk_group"] = 5;  // of 4 groups
  expect_rejected(j, StatusCode::kInvalidArgument, "topk_group");
  j["topk_group"] = 0;
  expect_rejected(j, StatusCode::kInvalidArgument, "topk_group");
}

TEST(DeepseekConfigErrors, BadRopeTheta) {
  json j = tiny_v3_config();
  j["rope_theta"] = -10000.0;
  expect_rejected(j, StatusCode::kInvalidArgument, "rope_theta");
  j["rope_theta"] = "abc";
  expect_rejected(j, StatusCode::kInvalidArgument, "rope_theta");
  j["rope_theta"] = 0;
  expect_rejected(j, StatusCode::kInvalidArgument, "rope_theta");
  // Strict JSON cannot spell NaN/Inf, but a json value built in code can hold them.
  j["rope_theta"] = std::numeric_limits<double>::quiet_NaN();
  expect_rejected(j, StatusCode::kInvalidArgument, "rope_theta");
  j["rope_theta"] = std::numeric_limits<double>::infinity();
  expect_rejected(j, StatusCode::kInvalidArgument, "rope_theta");
  // Inside rope_parameters / rope_scaling too.
  json p = tiny_v2_config();
  p["rope_parameters"]["rope_theta"] = -1.0;
  expect_rejected(p, StatusCode::kInvalidArgument, "rope_theta");
  json s = tiny_v3_config();
  s["rope_scaling"]["factor"] = std::numeric_limits<double>::quiet_NaN();
  expect_rejected(s, StatusCode::kInvalidArgument, "factor");
  s = tiny_v3_config();
  s["rope_scaling"]["factor"] = -4.0;
  expect_rejected(s, StatusCode::kInvalidArgument, "factor");
  s = tiny_v3_config();
  s["rope_scaling"].erase("original_max_position_embeddings");
  expect_rejected(s, StatusCode::kInvalidArgument, "original_max_position_embeddings");
  s = tiny_v3_config();
  s["rope_scaling"] = "yarn";
  expect_rejected(s, StatusCode::kInvalidArgument, "rope_scaling");
}

TEST(DeepseekConfigErrors, UnknownArchitecture) {
  json j = tiny_v3_config();
  j["architectures"] = {"LlamaForCausalLM"};
  expect_rejected(j, StatusCode::kUnsupported, "architectures", "LlamaForCausalLM");
  j.erase("architectures");
  j["model_type"] = "llama";
  expect_rejected(j, StatusCode::kUnsupported, "architectures", "llama");
  j = tiny_v3_config();
  j["architectures"] = json::array();
  expect_rejected(j, StatusCode::kInvalidArgument, "architectures");
  j["architectures"] = "DeepseekV3ForCausalLM";  // not an array
  expect_rejected(j, StatusCode::kInvalidArgument, "architectures");
}

TEST(DeepseekConfigErrors, UnknownRopeType) {
  json j = tiny_v3_config();
  j["rope_scaling"]["type"] = "dynamic";
  expect_rejected(j, StatusCode::kUnsupported, "rope_type", "dynamic");
  json p = tiny_v2_config();
  p["rope_parameters"]["rope_type"] = "dynamic";
  expect_rejected(p, StatusCode::kUnsupported, "rope_type", "dynamic");
}

TEST(DeepseekConfigErrors, BadQuantizationConfig) {
  json j = tiny_fp8_config();
  j["quantization_config"]["quant_method"] = "gptq";
  expect_rejected(j, StatusCode::kUnsupported, "quant_method", "gptq");

  j = tiny_fp8_config();
  j["quantization_config"]["weight_block_size"] = {0, 128};
  expect_rejected(j, StatusCode::kInvalidArgument, "weight_block_size");
  j["quantization_config"]["weight_block_size"] = {128, -1};
  expect_rejected(j, StatusCode::kInvalidArgument, "weight_block_size");
  j["quantization_config"]["weight_block_size"] = {128};
  expect_rejected(j, StatusCode::kInvalidArgument, "weight_block_size");
  j["quantization_config"]["weight_block_size"] = {128.5, 128};
  expect_rejected(j, StatusCode::kInvalidArgument, "weight_block_size");

  j = tiny_fp8_config();
  j["quantization_config"].erase("weight_block_size");
  expect_rejected(j, StatusCode::kInvalidArgument, "weight_block_size", "required");

  j = tiny_fp8_config();
  j["quantization_config"]["fmt"] = "e5m2";
  expect_rejected(j, StatusCode::kUnsupported, "fmt", "e5m2");
  j = tiny_fp8_config();
  j["quantization_config"]["activation_scheme"] = "static";
  expect_rejected(j, StatusCode::kUnsupported, "activation_scheme");
  j = tiny_fp8_config();
  j["quantization_config"] = "fp8";
  expect_rejected(j, StatusCode::kInvalidArgument, "quantization_config");
}

TEST(DeepseekConfigErrors, OddRopeHeadDim) {
  json j = tiny_v3_config();
  j["qk_rope_head_dim"] = 7;
  expect_rejected(j, StatusCode::kInvalidArgument, "qk_rope_head_dim", "even");
}

TEST(DeepseekConfigErrors, EosTokenIdOutOfVocab) {
  json j = tiny_v3_config();
  j["eos_token_id"] = 301;  // == vocab_size
  expect_rejected(j, StatusCode::kInvalidArgument, "eos_token_id");
  j["eos_token_id"] = -1;
  expect_rejected(j, StatusCode::kInvalidArgument, "eos_token_id");
  j["eos_token_id"] = {1, 301};
  expect_rejected(j, StatusCode::kInvalidArgument, "eos_token_id");
  j["eos_token_id"] = {1, "2"};
  expect_rejected(j, StatusCode::kInvalidArgument, "eos_token_id");
  j = tiny_v3_config();
  j["bos_token_id"] = 301;
  expect_rejected(j, StatusCode::kInvalidArgument, "bos_token_id");
}

TEST(DeepseekConfigErrors, NonObjectConfig) {
  for (const json& j : {json::array({1, 2}), json("config"), json(nullptr), json(3)}) {
    auto c = parse_deepseek_config(j);
    ASSERT_FALSE(c.has_value()) << j.dump();
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("config.json"), std::string::npos) << c.status().message();
  }
}

TEST(DeepseekConfigErrors, UnsupportedFeatureFlags) {
  json j = tiny_v3_config();
  j["hidden_act"] = "gelu";
  expect_rejected(j, StatusCode::kUnsupported, "hidden_act");
  j = tiny_v3_config();
  j["attention_bias"] = true;
  expect_rejected(j, StatusCode::kUnsupported, "attention_bias");
  j = tiny_v3_config();
  j["scoring_func"] = "relu";
  expect_rejected(j, StatusCode::kUnsupported, "scoring_func");
  j = tiny_v3_config();
  j["topk_method"] = "random";
  expect_rejected(j, StatusCode::kUnsupported, "topk_method");
  j = tiny_v3_config();
  j["tie_word_embeddings"] = "yes";
  expect_rejected(j, StatusCode::kInvalidArgument, "tie_word_embeddings");
  j = tiny_v3_config();
  j["q_lora_rank"] = 0;
  expect_rejected(j, StatusCode::kInvalidArgument, "q_lora_rank");
}

}  // namespace
}  // namespace deepinfer
