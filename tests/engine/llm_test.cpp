// The LLM API (engine thread, batch generate, streaming, chat, abort) and text handling
// (tokenized prompts, incremental detokenization, stop strings) on the demo model.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "engine/llm.h"

namespace deepinfer {
namespace {

const std::string kDemo = std::string(DEEPINFER_SOURCE_DIR) + "/models/demo";

std::unique_ptr<LLM> demo_llm() {
  EngineConfig c;
  c.model_dir = kDemo;
  c.n_threads = 2;
  c.num_kv_blocks = 256;
  auto llm = LLM::create(c);
  EXPECT_TRUE(llm.has_value()) << llm.status().to_string();
  return llm.has_value() ? std::move(*llm) : nullptr;
}

TEST(LLM, GenerateTextBatchInInputOrder) {
  auto llm = demo_llm();
  ASSERT_NE(llm, nullptr);
  ASSERT_NE(llm->tokenizer(), nullptr);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 12;
  auto out = llm->generate(std::vector<std::string>{"The man", "It was a", "In the"}, p);
  ASSERT_TRUE(out.has_value()) << out.status().to_string();
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& o = (*out)[i];
    EXPECT_TRUE(o.finished);
    ASSERT_EQ(o.outputs.size(), 1u);
    EXPECT_FALSE(o.outputs[0].token_ids.empty());
    // The text is exactly the detokenization of the generated ids.
    EXPECT_EQ(o.outputs[0].text, llm->tokenizer()->decode(o.outputs[0].token_ids, true)) << i;
  }
  // Same prompt alone gives the same greedy tokens (order and batching do not matter).
  auto alone = llm->generate(std::vector<std::string>{"It was a"}, p);
  ASSERT_TRUE(alone.has_value());
  EXPECT_EQ(alone->front().outputs[0].token_ids, (*out)[1].outputs[0].token_ids);
}

TEST(LLM, StopStringTruncatesText) {
  auto llm = demo_llm();
  ASSERT_NE(llm, nullptr);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 24;
  p.ignore_eos = true;
  auto free_run = llm->generate(std::vector<std::string>{"The house"}, p);
  ASSERT_TRUE(free_run.has_value());
  const std::string text = free_run->front().outputs[0].text;
  ASSERT_GE(text.size(), 8u) << text;
  const std::string stop = text.substr(text.size() / 2, 3);
  p.stop = {stop};
  auto stopped = llm->generate(std::vector<std::string>{"The house"}, p);
  ASSERT_TRUE(stopped.has_value()) << stopped.status().to_string();
  EXPECT_EQ(stopped->front().outputs[0].finish_reason, "stop");
  EXPECT_EQ(stopped->front().outputs[0].text, text.substr(0, text.find(stop)));
}

TEST(LLM, StreamingDeliversGrowingSnapshotsThenFinal) {
  auto llm = demo_llm();
  ASSERT_NE(llm, nullptr);
  EngineRequest r;
  r.prompt = "Once upon";
  r.params.temperature = 0.8f;
  r.params.seq_seed = 5;
  r.params.max_tokens = 10;
  r.params.ignore_eos = true;
  auto s = llm->stream(r);
  ASSERT_TRUE(s.has_value()) << s.status().to_string();
  RequestOutput o;
  size_t last = 0;
  int n = 0;
  bool finished = false;
  while ((*s)->next(&o)) {
    ++n;
    EXPECT_GE(o.outputs[0].token_ids.size(), last);
    last = o.outputs[0].token_ids.size();
    finished = o.finished;
  }
  EXPECT_TRUE(finished);
  EXPECT_EQ(last, 10u);
  EXPECT_GE(n, 2);
}

TEST(LLM, AbortEndsStreamWithAbort) {
  auto llm = demo_llm();
  ASSERT_NE(llm, nullptr);
  EngineRequest r;
  r.prompt = "A long story";
  r.params.max_tokens = 500;
  r.params.ignore_eos = true;
  auto s = llm->stream(r);
  ASSERT_TRUE(s.has_value());
  RequestOutput o;
  ASSERT_TRUE((*s)->next(&o));
  llm->abort((*s)->request_id());
  while ((*s)->next(&o)) {
  }
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.outputs[0].finish_reason, "abort");
  EXPECT_LT(o.outputs[0].token_ids.size(), 500u);
}

TEST(LLM, InvalidBatchFailsWholeCall) {
  auto llm = demo_llm();
  ASSERT_NE(llm, nullptr);
  SamplingParams p;
  p.max_tokens = 4;
  auto out = llm->generate(std::vector<std::vector<int32_t>>{{5, 6}, {5, 999999}}, p);
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.status().message().find("prompt 1"), std::string::npos) << out.status().message();
}

TEST(LLM, ChatProducesText) {
  auto llm = demo_llm();
  ASSERT_NE(llm, nullptr);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 8;
  std::vector<ChatMessage> messages(1);
  messages[0].role = ChatRole::kUser;
  messages[0].content = "Tell me about the city.";
  auto out = llm->chat(messages, p);
  ASSERT_TRUE(out.has_value()) << out.status().to_string();
  EXPECT_FALSE(out->outputs[0].token_ids.empty());
}

TEST(LLM, DestructionWithOpenStreamsAbortsThem) {
  std::shared_ptr<RequestStream> s;
  {
    auto llm = demo_llm();
    ASSERT_NE(llm, nullptr);
    EngineRequest r;
    r.prompt = "Again";
    r.params.max_tokens = 1000;
    r.params.ignore_eos = true;
    s = *llm->stream(r);
  }
  RequestOutput o;
  while (s->next(&o)) {
  }
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.outputs[0].finish_reason, "abort");
}

}  // namespace
}  // namespace deepinfer
