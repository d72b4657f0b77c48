// End-to-end bad checkpoints through DeepseekModel::load: random tiny checkpoints written to a
// temp directory, then broken one way each (missing tensor, wrong shape, FP8 without scales,
// bad scales, vocab mismatch, partial MTP, unsupported dtype). Every error names the tensor.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/deepseek/deepseek_model.h"
#include "model/deepseek/deepseek_random.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
using Tensors = std::vector<std::pair<std::string, Tensor>>;
namespace fs = std::filesystem;

// A fresh directory named after the running test; removed when the fixture ends.
class CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(::testing::TempDir()) /
            fmt::format("deepinfer_ckpt_err_{}_{}", ::getpid(), info->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static Tensors tensors_for(const json& config_json, DType dtype, bool with_mtp) {
    auto config = parse_deepseek_config(config_json);
    EXPECT_TRUE(config.has_value()) << config.status().to_string();
    return make_random_deepseek_tensors(*config, 7, dtype, with_mtp);
  }

  // Writes config.json + model.safetensors and loads them.
  Expected<std::unique_ptr<DeepseekModel>> load(const json& config_json, const Tensors& tensors) {
    {
      std::ofstream f(dir_ + "/config.json");
      f << config_json.dump(2);
    }
    Status s = write_safetensors(dir_ + "/model.safetensors", tensors);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    auto ckpt = Checkpoint::open(dir_);
    if (!ckpt) return ckpt.status();
    return DeepseekModel::load(*ckpt);
  }

  static void erase(Tensors& t, const std::string& name) {
    const size_t before = t.size();
    std::erase_if(t, [&](const auto& p) { return p.first == name; });
    ASSERT_EQ(t.size() + 1, before) << "no tensor named " << name;
  }
  static Tensor& find(Tensors& t, const std::string& name) {
    for (auto& p : t)
      if (p.first == name) return p.second;
    ADD_FAILURE() << "no tensor named " << name;
    static Tensor none;
    return none;
  }

  std::string dir_;
};

void expect_error(const Expected<std::unique_ptr<DeepseekModel>>& r, StatusCode code,
                  std::initializer_list<std::string> needles) {
  ASSERT_FALSE(r.has_value()) << "loaded a bad checkpoint";
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  for (const std::string& n : needles)
    EXPECT_NE(r.status().message().find(n), std::string::npos) << "expected '" << n << "' in: " << r.status().message();
}

TEST_F(CheckpointErrors, GoodCheckpointsLoad) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto m = load(testing::tiny_v2_config(), tensors_for(testing::tiny_v2_config(), dtype, false));
    ASSERT_TRUE(m.has_value()) << m.status().to_string();
    EXPECT_EQ((*m)->config().vocab_size, 256);
    EXPECT_EQ((*m)->weights().layers.size(), 3u);
    EXPECT_FALSE((*m)->weights().layers[0].is_moe);
    EXPECT_TRUE((*m)->weights().layers[1].is_moe);
  }
  auto fp8 = load(testing::tiny_fp8_config(), tensors_for(testing::tiny_fp8_config(), DType::kF8E4M3, false));
  ASSERT_TRUE(fp8.has_value()) << fp8.status().to_string();
  const LinearWeight& q = (*fp8)->weights().layers[0].q_a_proj;
  EXPECT_EQ(q.dtype(), DType::kF8E4M3);
  EXPECT_EQ(q.scale_inv.shape(), (std::vector<int64_t>{2, 2}));  // [136, 160] in 128x128 blocks
}

TEST_F(CheckpointErrors, MissingTensorIsNamed) {
  const json c = testing::tiny_v3_config();
  Tensors t = tensors_for(c, DType::kF32, false);
  erase(t, "model.layers.1.self_attn.kv_b_proj.weight");
  expect_error(load(c, t), StatusCode::kNotFound, {"model.layers.1.self_attn.kv_b_proj.weight"});

  t = tensors_for(c, DType::kF32, false);
  erase(t, "model.layers.2.mlp.experts.15.down_proj.weight");
  expect_error(load(c, t), StatusCode::kNotFound, {"model.layers.2.mlp.experts.15.down_proj.weight"});

  t = tensors_for(c, DType::kF32, false);
  erase(t, "model.layers.1.mlp.gate.e_score_correction_bias");
  expect_error(load(c, t), StatusCode::kNotFound, {"e_score_correction_bias"});

  t = tensors_for(c, DType::kF32, false);
  erase(t, "lm_head.weight");  // and tie_word_embeddings is false
  expect_error(load(c, t), StatusCode::kNotFound, {"lm_head.weight"});
}

TEST_F(CheckpointErrors, TiedEmbeddingsNeedNoLmHead) {
  json c = testing::tiny_v3_config();
  c["tie_word_embeddings"] = true;
  Tensors t = tensors_for(c, DType::kF32, false);
  erase(t, "lm_head.weight");
  auto m = load(c, t);
  ASSERT_TRUE(m.has_value()) << m.status().to_string();
  EXPECT_EQ((*m)->weights().lm_head.weight.raw_data(), (*m)->weights().embed_tokens.raw_data());
}

TEST_F(CheckpointErrors, WrongShapeNamesTensorAndBothShapes) {
  const json c = testing::tiny_v3_config();
  Tensors t = tensors_for(c, DType::kF32, false);
  find(t, "model.layers.0.self_attn.o_proj.weight") = Tensor::empty_host(DType::kF32, {64, 63});
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.layers.0.self_attn.o_proj.weight", "[64, 63]", "[64, 64]"});

  t = tensors_for(c, DType::kF32, false);
  find(t, "model.norm.weight") = Tensor::empty_host(DType::kF32, {64, 1});  // right numel, wrong rank
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.norm.weight", "[64, 1]", "[64]"});

  t = tensors_for(c, DType::kF32, false);
  find(t, "model.layers.1.mlp.gate.weight") = Tensor::empty_host(DType::kF32, {64, 16});  // transposed
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.layers.1.mlp.gate.weight", "[64, 16]", "[16, 64]"});
}

TEST_F(CheckpointErrors, Fp8WeightWithoutScale) {
  const json c = testing::tiny_fp8_config();
  Tensors t = tensors_for(c, DType::kF8E4M3, false);
  erase(t, "model.layers.0.self_attn.q_a_proj.weight_scale_inv");
  expect_error(load(c, t), StatusCode::kCorrupt,
               {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_proj.weight_scale_inv"});
}

TEST_F(CheckpointErrors, Fp8WeightWithoutQuantizationConfig) {
  json c = testing::tiny_fp8_config();
  Tensors t = tensors_for(c, DType::kF8E4M3, false);
  c.erase("quantization_config");
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.layers.0.self_attn.q_a_proj.weight", "quantization_config"});
}

TEST_F(CheckpointErrors, Fp8ScaleWithWrongShape) {
  const json c = testing::tiny_fp8_config();
  Tensors t = tensors_for(c, DType::kF8E4M3, false);
  find(t, "model.layers.0.self_attn.q_a_proj.weight_scale_inv") = Tensor::empty_host(DType::kF32, {1, 2});
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.layers.0.self_attn.q_a_proj.weight_scale_inv", "[1, 2]", "[2, 2]"});
}

TEST_F(CheckpointErrors, Fp8NonFiniteScale) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const json c = testing::tiny_fp8_config();
    Tensors t = tensors_for(c, DType::kF8E4M3, false);
    Tensor& s = find(t, "model.layers.1.self_attn.kv_b_proj.weight_scale_inv");
    ASSERT_EQ(s.dtype(), DType::kF32);
    Tensor copy = Tensor::empty_host(DType::kF32, s.shape());
    std::copy(s.data<float>(), s.data<float>() + s.numel(), copy.data<float>());
    copy.data<float>()[copy.numel() - 1] = bad;
    s = copy;
    expect_error(load(c, t), StatusCode::kCorrupt, {"model.layers.1.self_attn.kv_b_proj.weight_scale_inv", "non-finite"});
  }
}

TEST_F(CheckpointErrors, VocabSizeDisagreesWithEmbeddingRows) {
  json c = testing::tiny_v3_config();
  Tensors t = tensors_for(c, DType::kF32, false);  // 301 rows
  c["vocab_size"] = 300;
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.embed_tokens.weight", "[301, 64]", "[300, 64]"});
  c["vocab_size"] = 302;
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.embed_tokens.weight", "[301, 64]", "[302, 64]"});
}

TEST_F(CheckpointErrors, MtpDeclaredButAbsentLoadsWithoutMtp) {
  const json c = testing::tiny_v3_config();  // num_nextn_predict_layers 1
  auto m = load(c, tensors_for(c, DType::kF32, /*with_mtp=*/false));
  ASSERT_TRUE(m.has_value()) << m.status().to_string();
  EXPECT_FALSE((*m)->has_mtp());
}

TEST_F(CheckpointErrors, MtpPresentLoads) {
  const json c = testing::tiny_v3_config();
  auto m = load(c, tensors_for(c, DType::kF32, /*with_mtp=*/true));
  ASSERT_TRUE(m.has_value()) << m.status().to_string();
  EXPECT_TRUE((*m)->has_mtp());
  ASSERT_EQ((*m)->weights().mtp.size(), 1u);
  EXPECT_TRUE((*m)->weights().mtp[0].block.is_moe);
  // No shared_head.head in the file: it aliases lm_head.
  EXPECT_EQ((*m)->weights().mtp[0].shared_head_head.weight.raw_data(), (*m)->weights().lm_head.weight.raw_data());
  // MTP layers do not add KV layers.
  EXPECT_EQ((*m)->kv_layers().size(), 3u);
}

TEST_F(CheckpointErrors, MtpPartiallyPresentIsAnError) {
  const json c = testing::tiny_v3_config();
  Tensors t = tensors_for(c, DType::kF32, true);
  erase(t, "model.layers.3.hnorm.weight");
  expect_error(load(c, t), StatusCode::kNotFound, {"model.layers.3.hnorm.weight"});

  t = tensors_for(c, DType::kF32, true);
  erase(t, "model.layers.3.mlp.experts.3.up_proj.weight");
  expect_error(load(c, t), StatusCode::kNotFound, {"model.layers.3.mlp.experts.3.up_proj.weight"});

  t = tensors_for(c, DType::kF32, true);
  erase(t, "model.layers.3.eh_proj.weight");  // enorm and the block are still there
  expect_error(load(c, t), StatusCode::kNotFound, {"model.layers.3.eh_proj.weight"});
}

TEST_F(CheckpointErrors, UnsupportedWeightDtype) {
  const json c = testing::tiny_v3_config();
  Tensors t = tensors_for(c, DType::kF32, false);
  find(t, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight") = Tensor::empty_host(DType::kI32, {40, 64});
  expect_error(load(c, t), StatusCode::kUnsupported, {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "I32"});

  t = tensors_for(c, DType::kF32, false);
  find(t, "model.norm.weight") = Tensor::empty_host(DType::kI32, {64});
  expect_error(load(c, t), StatusCode::kUnsupported, {"model.norm.weight", "I32"});

  t = tensors_for(c, DType::kF32, false);
  find(t, "model.embed_tokens.weight") = Tensor::empty_host(DType::kF64, {301, 64});
  expect_error(load(c, t), StatusCode::kUnsupported, {"model.embed_tokens.weight", "F64"});

  // FP8 where the config allows it but the router must stay high precision.
  const json f = testing::tiny_fp8_config();
  t = tensors_for(f, DType::kF8E4M3, false);
  find(t, "model.layers.1.mlp.gate.weight") = Tensor::empty_host(DType::kF8E4M3, {8, 160});
  t.emplace_back("model.layers.1.mlp.gate.weight_scale_inv", Tensor::empty_host(DType::kF32, {1, 2}));
  expect_error(load(f, t), StatusCode::kCorrupt, {"model.layers.1.mlp.gate.weight"});
}

TEST_F(CheckpointErrors, NonFiniteRouterBias) {
  const json c = testing::tiny_v3_config();
  Tensors t = tensors_for(c, DType::kF32, false);
  Tensor bias = Tensor::empty_host(DType::kF32, {16});
  bias.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  find(t, "model.layers.2.mlp.gate.e_score_correction_bias") = bias;
  expect_error(load(c, t), StatusCode::kCorrupt, {"model.layers.2.mlp.gate.e_score_correction_bias"});
}

TEST_F(CheckpointErrors, F16WeightsAreWidened) {
  const json c = testing::tiny_v2_config();
  Tensors t = tensors_for(c, DType::kF32, false);
  Tensor& w = find(t, "model.layers.0.self_attn.o_proj.weight");
  Tensor h = Tensor::empty_host(DType::kF16, w.shape());
  for (int64_t i = 0; i < w.numel(); ++i) h.data<uint16_t>()[i] = f32_to_f16(w.data<float>()[i]);
  w = h;
  auto m = load(c, t);
  ASSERT_TRUE(m.has_value()) << m.status().to_string();
  const Tensor& o = (*m)->weights().layers[0].o_proj.weight;
  EXPECT_EQ(o.dtype(), DType::kF32);
  EXPECT_EQ(o.data<float>()[3], f16_to_f32(h.data<uint16_t>()[3]));
}

TEST_F(CheckpointErrors, BadConfigIsReportedWithThePath) {
  json c = testing::tiny_v3_config();
  Tensors t = tensors_for(c, DType::kF32, false);
  c["num_attention_heads"] = 0;
  auto r = load(c, t);
  expect_error(r, StatusCode::kInvalidArgument, {"config.json", "num_attention_heads"});
}

}  // namespace
}  // namespace deepinfer
