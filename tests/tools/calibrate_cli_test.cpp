// `deepinfer calibrate` end to end: fits and writes the cost model the engine then loads; a
// broken cost model file is refused at engine start-up, naming the file and field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sys/wait.h>

#include "engine/llm_engine.h"
#include "io/json_file.h"
#include "model/deepseek/deepseek_random.h"
#include "sched/cost_model.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

int run_cli(const std::string& args) {
  const std::string cmd = std::string(DEEPINFER_BINARY_DIR) + "/src/tools/deepinfer " + args + " >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CalibrateCli, FitsAndEngineLoadsIt) {
  const std::string dir = fmt::format("{}/calibrate_model_{}", ::testing::TempDir(), ::getpid());
  ASSERT_TRUE(write_random_deepseek_checkpoint(dir, testing::tiny_v3_config(), 5, DType::kBF16, false).is_ok());
  const std::string out = fmt::format("{}/cost_{}.json", ::testing::TempDir(), ::getpid());
  ASSERT_EQ(run_cli("calibrate --model " + dir + " --out " + out + " --max-tokens 128 --threads 1"), 0);
  auto j = read_json_file(out);
  ASSERT_TRUE(j.has_value()) << j.status().to_string();
  auto model = ChunkCostModel::from_json(*j);
  ASSERT_TRUE(model.has_value()) << model.status().to_string();
  EXPECT_GT(model->k1 + model->k3, 0.0);  // longer chunks cost more
  EXPECT_GE(j->at("samples").size(), 4u);

  EngineConfig c;
  c.model_dir = dir;
  c.chunk_cost_model = out;
  c.step_time_budget_ms = 50;
  auto engine = LLMEngine::create(c);
  ASSERT_TRUE(engine.has_value()) << engine.status().to_string();

  std::ofstream(out) << R"({"k0": 0.001, "k1": "fast", "k2": 0, "k3": 0})";
  auto bad = LLMEngine::create(c);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("k1"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("cost_"), std::string::npos) << bad.status().message();
  c.step_time_budget_ms = 0;
  EXPECT_FALSE(LLMEngine::create(c).has_value());  // a cost model without a budget
}

TEST(CalibrateCli, BadArgumentsExitTwo) {
  EXPECT_EQ(run_cli("calibrate --model /nonexistent/model --out /tmp/x.json"), 1);
  EXPECT_EQ(run_cli("calibrate --max-tokens 3"), 2);
}

}  // namespace
}  // namespace deepinfer
