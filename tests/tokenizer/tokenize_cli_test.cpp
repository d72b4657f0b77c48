// The command contract, black-box: `deepinfer tokenize --tokenizer DIR --texts-file FILE.json
// --json` prints a JSON array of id arrays equal to HF's (no BOS unless --add-special), bad
// inputs exit 2 with a message, and `deepinfer generate --prompt TEXT [--chat]` runs the demo
// model (which ships a tokenizer) and prints text. Needs the whole project built.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_encoder.h"
#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* const kBinary = DEEPINFER_BINARY_DIR "/src/tools/deepinfer";
const std::string kDemoModel = std::string(DEEPINFER_SOURCE_DIR) + "/models/demo";

struct RunResult {
  bool exited = false;
  int code = -1;
  std::string out, err;
};

class TokenizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kBinary)) << kBinary << " is missing: build the whole project (cmake --build build)";
    dir_ = (fs::path(::testing::TempDir()) / fmt::format("deepinfer_tok_cli_{}_{}", ::getpid(),
                                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  RunResult run(const std::string& args) {
    const std::string err_path = dir_ + "/stderr.txt";
    const std::string cmd = fmt::format("env -u DEEPINFER_HF_MODEL_DIR -u DEEPINFER_NUM_THREADS '{}' {} 2>'{}'", kBinary, args, err_path);
    RunResult r;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = ::pclose(p);
    r.exited = WIFEXITED(status) && WEXITSTATUS(status) < 128;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = testing::read_file(err_path);
    return r;
  }

  std::string dir_;
};

TEST_F(TokenizeCliTest, TextsFileGivesHfIds) {
  const std::string tok_dir = testing::deepseek_tokenizer_dir();
  ASSERT_NE(testing::deepseek_tokenizer(), nullptr);
  const auto texts = testing::corpus_texts();
  const auto golden = testing::read_jsonl(testing::tokenizer_fixture("golden_encode.jsonl"));
  json input = json::array();
  json expected = json::array();
  for (size_t i = 0; i < texts.size(); i += 41) {
    input.push_back(texts[i]);
    expected.push_back(golden[i + 1]);
  }
  const std::string file = write("texts.json", input.dump());
  RunResult r = run(fmt::format("tokenize --tokenizer '{}' --texts-file '{}' --json", tok_dir, file));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out), expected);

  r = run(fmt::format("tokenize --tokenizer '{}' --texts-file '{}' --json --add-special", tok_dir, file));
  ASSERT_EQ(r.code, 0) << r.err;
  const json with_bos = json::parse(r.out);
  ASSERT_EQ(with_bos.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    json e = json::array({0});
    for (const auto& id : expected[i]) e.push_back(id);
    EXPECT_EQ(with_bos[i], e);
  }

  r = run(fmt::format("tokenize --tokenizer '{}' --text 'Hello world' --text ''", tok_dir));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "19923,2058\n\n");
}

TEST_F(TokenizeCliTest, BadInputsExitTwoWithAMessage) {
  const std::string tok_dir = testing::deepseek_tokenizer_dir();
  ASSERT_NE(testing::deepseek_tokenizer(), nullptr);
  for (const std::string& content : {std::string("{\"a\": 1}"), std::string("[\"ok\", 5]"), std::string("[\"unterminated"),
                                     std::string("[\"\\udc80\"]"), std::string("[\"\xFF\"]")}) {
    const std::string file = write("bad.json", content);
    const RunResult r = run(fmt::format("tokenize --tokenizer '{}' --texts-file '{}' --json", tok_dir, file));
    EXPECT_TRUE(r.exited);
    EXPECT_EQ(r.code, 2) << content << ": " << r.err;
    EXPECT_NE(r.err.find("--texts-file"), std::string::npos) << r.err;
  }
  RunResult r = run(fmt::format("tokenize --tokenizer '{}' --text \"$(printf 'bad \\377')\"", tok_dir));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("not valid UTF-8"), std::string::npos) << r.err;
  r = run(fmt::format("tokenize --tokenizer '{}' --texts-file /nonexistent.json", tok_dir));
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(fmt::format("tokenize --tokenizer '{}' --text x", dir_));  // no tokenizer.json there
  EXPECT_TRUE(r.exited);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("tokenizer.json"), std::string::npos) << r.err;
  write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
  r = run(fmt::format("tokenize --tokenizer '{}' --text x", dir_));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("model.vocab"), std::string::npos) << r.err;
}

TEST_F(TokenizeCliTest, GenerateFromPromptTextWithTheDemoModel) {
  if (!fs::exists(kDemoModel + "/tokenizer.json")) GTEST_SKIP() << "no demo model at " << kDemoModel;
  auto tokenizer = Tokenizer::load(kDemoModel);
  ASSERT_TRUE(tokenizer) << tokenizer.status().to_string();
  const std::string prompt = "The history of the city";
  RunResult r = run(fmt::format("generate --model '{}' --prompt '{}' --max-tokens 8 --temperature 0 --json", kDemoModel, prompt));
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EncodeOptions o;
  o.add_special_tokens = true;
  EXPECT_EQ(j.at("prompt_tokens").get<size_t>(), (*tokenizer)->encode(prompt, o)->size());
  const auto ids = j.at("token_ids").get<std::vector<int32_t>>();
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(j.at("text").get<std::string>(), (*tokenizer)->decode(ids, true));
  // Same run without --json prints the text.
  r = run(fmt::format("generate --model '{}' --prompt '{}' --max-tokens 8 --temperature 0", kDemoModel, prompt));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, j.at("text").get<std::string>() + "\n");

  // --chat wraps the prompt as a user turn: <BOS><｜User｜>prompt<｜Assistant｜>.
  r = run(fmt::format("generate --model '{}' --prompt '{}' --chat --max-tokens 4 --temperature 0 --json", kDemoModel, prompt));
  ASSERT_EQ(r.code, 0) << r.err;
  auto encoder = ChatEncoder::create(**tokenizer);
  ASSERT_TRUE(encoder) << encoder.status().to_string();
  ChatMessage user;
  user.content = prompt;
  EXPECT_EQ(json::parse(r.out).at("prompt_tokens").get<size_t>(), encoder->encode(std::vector<ChatMessage>{user})->size());
}

TEST_F(TokenizeCliTest, GenerateFromPromptNeedsATokenizerAndOneKindOfPrompt) {
  if (!fs::exists(kDemoModel + "/config.json")) GTEST_SKIP() << "no demo model at " << kDemoModel;
  // A model directory without tokenizer.json: --prompt fails cleanly, --prompt-ids still works.
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kDemoModel + "/" + f, dir_ + "/" + f);
  RunResult r = run(fmt::format("generate --model '{}' --prompt hi --max-tokens 2", dir_));
  EXPECT_TRUE(r.exited);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("tokenizer"), std::string::npos) << r.err;
  r = run(fmt::format("generate --model '{}' --prompt-ids 5,6 --max-tokens 2 --temperature 0 --json", dir_));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(json::parse(r.out).contains("text"));
  r = run(fmt::format("generate --model '{}' --prompt hi --prompt-ids 1 --max-tokens 2", kDemoModel));
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(fmt::format("generate --model '{}' --chat --prompt-ids 1 --max-tokens 2", kDemoModel));
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(fmt::format("generate --model '{}' --prompt \"$(printf '\\377')\" --max-tokens 2", kDemoModel));
  EXPECT_EQ(r.code, 2) << r.err;
}

}  // namespace
}  // namespace deepinfer
