// bench_floors against scripts/bench/floors.py: the expected numbers below are what floors.py
// prints for the same inputs (python3 -c "import floors; print(repr(floors.decode_bytes(cfg, 32, 525.5)))"
// and so on, run in scripts/bench/), so the C++ and Python floors cannot drift apart silently.
#include <gtest/gtest.h>

#include <string>

#include "io/json_file.h"
#include "model/deepseek/deepseek_cost.h"
#include "tools/bench_floors.h"

namespace deepinfer {
namespace {

DeepseekConfig bench_config(const std::string& name) {
  auto doc = read_json_file(std::string(DEEPINFER_SOURCE_DIR) + "/bench/configs/" + name);
  EXPECT_TRUE(doc.has_value()) << doc.status().to_string();
  auto config = parse_deepseek_config(*doc);
  EXPECT_TRUE(config.has_value()) << config.status().to_string();
  return *config;
}

TEST(BenchFloors, V2LiteDecodeBatchOne) {
  const DeepseekConfig lite = bench_config("deepseek_v2_lite.json");
  const double bytes = decode_weight_bytes(lite, 1, DType::kBF16);
  EXPECT_NEAR(bytes, 4.90e9, 0.01 * 4.90e9);
  EXPECT_DOUBLE_EQ(bytes, 4'902'870'016.0);  // floors.decode_bytes(lite, 1, 0)
  EXPECT_DOUBLE_EQ(bytes, 2.0 * static_cast<double>(deepseek_cost(lite).active_params));
  EXPECT_DOUBLE_EQ(expected_distinct_experts(lite, 1), 6.0);
  EXPECT_EQ(kv_bytes_per_token(lite, 2), 31'104);  // 576 values · 2 bytes · 27 layers
}

TEST(BenchFloors, DecodeAgreesWithFloorsPy) {
  const DeepseekConfig lite = bench_config("deepseek_v2_lite.json");
  const double kv_tokens = mean_kv_tokens(512, 3, 20);
  EXPECT_DOUBLE_EQ(kv_tokens, 525.5);  // torch_peer.mean_kv_tokens(512, 3, 20)
  EXPECT_NEAR(expected_distinct_experts(lite, 32), 61.25768966427967, 1e-12);
  const double bytes = decode_bytes(lite, 32, kv_tokens, DType::kBF16, 2);
  EXPECT_NEAR(bytes, 30282984487.68963, 1e-12 * bytes);
  EXPECT_NEAR(floor_ms(bytes, 4.0e12), 7.570746121922407, 1e-12);  // floors.decode_floor_ms(lite, 32, 525.5, 4e12)

  const DeepseekConfig q1536 = bench_config("deepseek_v2_lite_8l_q1536.json");
  EXPECT_NEAR(decode_bytes(q1536, 128, kv_tokens, DType::kBF16, 2), 9414388207.867027, 1e-12 * 9.4e9);
}

TEST(BenchFloors, PrefillAgreesWithFloorsPy) {
  const DeepseekConfig lite = bench_config("deepseek_v2_lite.json");
  EXPECT_DOUBLE_EQ(prefill_flops(lite, 4096), 22402004156416.0);
  EXPECT_NEAR(floor_ms(prefill_flops(lite, 4096), 7.0e14), 32.00286308059429, 1e-12);
  EXPECT_DOUBLE_EQ(prefill_flops(bench_config("deepseek_v2_lite_8l_q1536.json"), 16384), 39997084270592.0);
}

TEST(BenchFloors, Fp8WeightsHalveTheLinears) {
  // FP8: attention/MLP/expert linears 1 byte per element + an fp32 scale per 128×128 block; norms,
  // router and lm_head stay bf16. 2,665,231,936 is an independent recount of that layout.
  const DeepseekConfig lite = bench_config("deepseek_v2_lite.json");
  EXPECT_DOUBLE_EQ(decode_weight_bytes(lite, 1, DType::kF8E4M3), 2'665'231'936.0);
  // Batches large enough to touch every expert read every weight but the embedding table.
  const DeepseekCost cost = deepseek_cost(lite);
  const double all = 2.0 * static_cast<double>(cost.total_params - lite.vocab_size * lite.hidden_size);
  EXPECT_NEAR(decode_weight_bytes(lite, 4096, DType::kBF16), all, 1e-9 * all);
}

}  // namespace
}  // namespace deepinfer
