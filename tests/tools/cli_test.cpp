// Black-box tests of the built `deepinfer` binary: JSON output, logits, exit codes for bad
// input (2) and load failures (non-zero, no crash), and seeded determinism. Assumes the whole
// project was built (`cmake --build build`), so the binary sits next to this test binary.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/deepseek/deepseek_random.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kVocab = 301;  // tiny_v3_config
const char* const kBinary = DEEPINFER_BINARY_DIR "/src/tools/deepinfer";

struct RunResult {
  bool exited = false;  // false: killed by a signal (a crash)
  int code = -1;
  std::string out;
  std::string err;
};

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string((fs::path(::testing::TempDir()) / fmt::format("deepinfer_cli_{}", ::getpid())).string());
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    Status s = write_random_deepseek_checkpoint(model_dir(), testing::tiny_v3_config(), 3, DType::kF32, false);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kBinary)) << kBinary << " is missing: build the whole project (cmake --build build)";
  }

  static std::string model_dir() { return *root_ + "/model"; }

  // Runs the binary with `args` (already shell-quoted where needed) and a clean DEEPINFER_* env.
  static RunResult run(const std::string& args, const std::string& env = "") {
    const std::string err_path = *root_ + "/stderr.txt";
    const std::string cmd = fmt::format(
        "env -u DEEPINFER_HF_MODEL_DIR -u DEEPINFER_NUM_THREADS -u DEEPINFER_KV_BLOCK_SIZE -u DEEPINFER_DEVICE "
        "-u DEEPINFER_MAX_MODEL_LEN {} '{}' {} 2>'{}'",
        env, kBinary, args, err_path);
    RunResult r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) {
      ADD_FAILURE() << "popen failed: " << cmd;
      return r;
    }
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = ::pclose(p);
    // `env` execs the binary, so a signal shows up as a 128+N exit of the shell or a signal.
    r.exited = WIFEXITED(status) && WEXITSTATUS(status) < 128;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream e(err_path);
    std::stringstream ss;
    ss << e.rdbuf();
    r.err = ss.str();
    return r;
  }

  static std::string gen(const std::string& extra) {
    return fmt::format("generate --model '{}' --threads 2 {}", model_dir(), extra);
  }

  static std::string* root_;
};

std::string* CliTest::root_ = nullptr;

json parse_single_json(const RunResult& r) {
  // Exactly one line holding one JSON object.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_object()) << r.out;
  return j;
}

TEST_F(CliTest, GenerateJsonPrintsTokenIds) {
  const RunResult r = run(gen("--prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --ignore-eos --json"));
  ASSERT_TRUE(r.exited) << r.err;
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = parse_single_json(r);
  ASSERT_TRUE(j.contains("token_ids")) << r.out;
  ASSERT_EQ(j["token_ids"].size(), 4u) << r.out;
  for (const json& t : j["token_ids"]) {
    ASSERT_TRUE(t.is_number_integer());
    EXPECT_GE(t.get<int64_t>(), 0);
    EXPECT_LT(t.get<int64_t>(), kVocab);
  }
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["prompt_tokens"], 3);

  // Without --ignore-eos: up to 4 tokens, and fewer only by stopping at EOS (id 1).
  const RunResult s = run(gen("--prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --json"));
  ASSERT_EQ(s.code, 0) << s.err;
  const json k = parse_single_json(s);
  ASSERT_GE(k["token_ids"].size(), 1u);
  ASSERT_LE(k["token_ids"].size(), 4u);
  if (k["token_ids"].size() < 4) {
    EXPECT_EQ(k["token_ids"].back(), 1);
    EXPECT_EQ(k["finish_reason"], "stop");
  }

  // Plain output is the same ids, comma-separated.
  const RunResult plain = run(gen("--prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --ignore-eos"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  std::string want;
  for (size_t i = 0; i < j["token_ids"].size(); ++i) {
    if (i > 0) want.push_back(',');
    want.append(j["token_ids"][i].dump());
  }
  EXPECT_EQ(plain.out, want + "\n");
}

TEST_F(CliTest, LogitsArgmaxIsFirstGreedyToken) {
  const RunResult r = run(gen("--prompt-ids 5,6,7,8 --max-tokens 2 --temperature 0 --ignore-eos --json --logits"));
  ASSERT_TRUE(r.exited) << r.err;
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = parse_single_json(r);
  ASSERT_TRUE(j.contains("prompt_logits_last")) << r.out;
  const json& l = j["prompt_logits_last"];
  ASSERT_EQ(l.size(), static_cast<size_t>(kVocab));
  std::vector<double> v;
  for (const json& x : l) {
    ASSERT_TRUE(x.is_number()) << "non-finite logit printed as " << x.dump();
    v.push_back(x.get<double>());
  }
  const auto best = std::max_element(v.begin(), v.end()) - v.begin();
  EXPECT_EQ(j["token_ids"][0].get<int64_t>(), best);
}

TEST_F(CliTest, BadPromptIdsExitTwoNamingTheFlag) {
  for (const char* ids : {"1,x", "", "1,,2", "1.5", "99999999999", "1;2"}) {
    const RunResult r = run(gen(fmt::format("--prompt-ids '{}' --max-tokens 2", ids)));
    EXPECT_TRUE(r.exited) << ids;
    EXPECT_EQ(r.code, 2) << "--prompt-ids '" << ids << "' stderr: " << r.err;
    EXPECT_NE(r.err.find("--prompt-ids"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST_F(CliTest, OutOfRangeIdExitsTwo) {
  RunResult r = run(gen("--prompt-ids 1,301 --max-tokens 2"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("301"), std::string::npos) << r.err;
  r = run(gen("--prompt-ids -1 --max-tokens 2"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("-1"), std::string::npos) << r.err;
}

TEST_F(CliTest, BadRequestValuesExitTwo) {
  RunResult r = run(gen("--prompt-ids 1,2 --max-tokens 1000"));  // > max_position_embeddings 256
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("maximum context length is"), std::string::npos) << r.err;
  r = run(gen("--prompt-ids 1,2 --max-tokens 0"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("max_tokens"), std::string::npos) << r.err;
  r = run(gen("--prompt-ids 1,2 --temperature -1"));
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(gen("--prompt-ids 1,2 --top-p 0"));
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(gen("--prompt-ids 1,2 --temperature nan"));
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(gen("--max-tokens 2"));  // --prompt-ids is required
  EXPECT_EQ(r.code, 2) << r.err;
  r = run("");  // no subcommand
  EXPECT_EQ(r.code, 2) << r.err;
}

// Where no GPU (or no CUDA build) is available, --device cuda is a clean error naming the cause
// (exit 1); on the GPU machine the same command generates. An unknown device is a usage error (2).
TEST_F(CliTest, DeviceCudaWorksOrFailsCleanly) {
  const RunResult r = run(gen("--device cuda --prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --ignore-eos --json"));
  ASSERT_TRUE(r.exited) << "crashed: " << r.err;
  if (r.code == 0) {
    const json j = parse_single_json(r);
    EXPECT_EQ(j.at("token_ids").size(), 4u);
  } else {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("device 'cuda'"), std::string::npos) << r.err;
  }
  const RunResult bad = run(gen("--device tpu --prompt-ids 1,2 --max-tokens 2"));
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("tpu"), std::string::npos) << bad.err;
}

TEST_F(CliTest, MissingModelDirFailsCleanly) {
  const std::string missing = *root_ + "/no-such-model";
  const RunResult r = run(fmt::format("generate --model '{}' --prompt-ids 1,2 --max-tokens 2", missing));
  EXPECT_TRUE(r.exited) << "crashed: " << r.err;
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(CliTest, NoModelGivenFailsCleanly) {
  // Unset, the variable falls back to the demo model (models/demo); set but empty means no model.
  const RunResult r = run("generate --prompt-ids 1,2 --max-tokens 2", "DEEPINFER_HF_MODEL_DIR=");
  EXPECT_TRUE(r.exited) << r.err;
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("DEEPINFER_HF_MODEL_DIR"), std::string::npos) << r.err;
}

TEST_F(CliTest, MalformedConfigFailsNamingConfigJson) {
  const std::string dir = *root_ + "/bad-config";
  fs::create_directories(dir);
  fs::copy_file(model_dir() + "/model.safetensors", dir + "/model.safetensors", fs::copy_options::overwrite_existing);
  for (const char* text : {"{\"vocab_size\": 301,", "[1, 2]", "{\"architectures\": [\"DeepseekV3ForCausalLM\"]}"}) {
    {
      std::ofstream f(dir + "/config.json", std::ios::trunc);
      f << text;
    }
    const RunResult r = run(fmt::format("generate --model '{}' --prompt-ids 1,2 --max-tokens 2", dir));
    EXPECT_TRUE(r.exited) << "crashed on config " << text << ": " << r.err;
    EXPECT_NE(r.code, 0) << text;
    EXPECT_NE(r.err.find("config.json"), std::string::npos) << "config " << text << " stderr: " << r.err;
  }
}

TEST_F(CliTest, BadEnvironmentExitsTwoNamingTheVariable) {
  const RunResult r = run(gen("--prompt-ids 1,2 --max-tokens 2"), "DEEPINFER_KV_BLOCK_SIZE=abc");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("DEEPINFER_KV_BLOCK_SIZE"), std::string::npos) << r.err;
}

TEST_F(CliTest, ModelFromEnvironment) {
  const RunResult r = run("generate --prompt-ids 1,2,3 --max-tokens 3 --temperature 0 --ignore-eos --json",
                          fmt::format("DEEPINFER_HF_MODEL_DIR='{}' DEEPINFER_NUM_THREADS=2", model_dir()));
  ASSERT_EQ(r.code, 0) << r.err;
  const RunResult flag = run(gen("--prompt-ids 1,2,3 --max-tokens 3 --temperature 0 --ignore-eos --json"));
  ASSERT_EQ(flag.code, 0) << flag.err;
  EXPECT_EQ(parse_single_json(r)["token_ids"], parse_single_json(flag)["token_ids"]);
}

TEST_F(CliTest, SeededSamplingIsDeterministic) {
  const std::string args = gen("--prompt-ids 1,2,3 --max-tokens 6 --temperature 0.8 --seed 7 --ignore-eos --json");
  const RunResult a = run(args);
  const RunResult b = run(args);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const json ja = parse_single_json(a), jb = parse_single_json(b);
  EXPECT_EQ(ja["token_ids"].size(), 6u);
  EXPECT_EQ(ja["token_ids"], jb["token_ids"]);
  EXPECT_EQ(ja["seed"], 7);
}

// `deepinfer bench --serve` runs the serving loop synchronous, then overlapped, on the same
// engine: every request finishes with all its tokens in both, and the JSON says so.
TEST_F(CliTest, BenchServePhaseRunsBothLoops) {
  const std::string json_path = *root_ + "/bench.json";
  const RunResult r = run(fmt::format("bench --config '{}/config.json' --device cpu --threads 2 --prefill 16 "
                                      "--decode-batch 2 --context 12 --steps 5 --warmup 1 --prefill-reps 1 "
                                      "--block-size 8 --serve 6 --json '{}'",
                                      model_dir(), json_path));
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream f(json_path);
  const json doc = json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(doc.is_object());
  EXPECT_TRUE(doc["finished"].get<bool>());
  const json& serve = doc["results"].back();
  ASSERT_EQ(serve["phase"], "serve") << serve.dump();
  for (const char* loop : {"synchronous", "overlapped"}) {
    ASSERT_TRUE(serve.contains(loop)) << serve.dump();
    EXPECT_EQ(serve[loop]["output_tokens"].get<int64_t>(), 6 * 5) << loop;
    EXPECT_GT(serve[loop]["output_tok_s"].get<double>(), 0.0) << loop;
  }
  EXPECT_EQ(run(fmt::format("bench --config '{}/config.json' --device cpu --serve -1", model_dir())).code, 2);
}

}  // namespace
}  // namespace deepinfer
