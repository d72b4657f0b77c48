// ToolCallParser: DeepSeek-V3 tool-call output → content + OpenAI-style tool_calls. The result
// must not depend on chunk boundaries (every two-way split and random splits are compared with
// the one-shot parse); malformed output is reported, never a crash, and its text is kept.
#include "tokenizer/tool_call_parser.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace deepinfer {
namespace {

// The aggregate of a whole stream: content, calls rebuilt from deltas, errors.
struct Aggregate {
  std::string content;
  std::vector<ParsedToolCall> calls;  // from deltas
  std::vector<std::string> errors;
  std::vector<ParsedToolCall> completed;

  bool operator==(const Aggregate& o) const {
    const auto same = [](const std::vector<ParsedToolCall>& a, const std::vector<ParsedToolCall>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].id != b[i].id || a[i].type != b[i].type || a[i].name != b[i].name || a[i].arguments != b[i].arguments)
          return false;
      }
      return true;
    };
    return content == o.content && same(calls, o.calls) && errors == o.errors && same(completed, o.completed);
  }
};

void PrintTo(const Aggregate& a, std::ostream* os) {
  const auto q = [](const auto& v) { return nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  *os << "content=" << q(a.content) << " calls=[";
  for (const auto& c : a.calls) *os << "{" << c.id << "," << c.type << "," << c.name << "," << q(c.arguments) << "}";
  *os << "] completed=" << a.completed.size() << " errors=" << q(a.errors);
}

void absorb(Aggregate& a, const ToolCallParseResult& r) {
  a.content += r.content;
  for (const ToolCallDelta& d : r.tool_calls) {
    if (!d.name.empty()) {
      ASSERT_EQ(d.index, static_cast<int32_t>(a.calls.size()));
      a.calls.push_back(ParsedToolCall{d.id, d.type, d.name, ""});
    }
    ASSERT_GE(d.index, 0);
    ASSERT_LT(d.index, static_cast<int32_t>(a.calls.size()));
    a.calls[d.index].arguments += d.arguments;
  }
  a.errors.insert(a.errors.end(), r.errors.begin(), r.errors.end());
}

Aggregate parse_chunks(const std::vector<std::string>& chunks) {
  ToolCallParser p("call_");
  Aggregate a;
  for (const std::string& c : chunks) absorb(a, p.push(c));
  absorb(a, p.finish());
  a.completed = p.tool_calls();
  return a;
}

const std::string kTwoCalls =
    "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    "{\"location\": \"Paris\", \"note\": \"a ``` b\\n```\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
    "<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

TEST(ToolCallParser, ParsesDeepSeekV3Syntax) {
  const Aggregate a = parse_chunks({kTwoCalls});
  EXPECT_EQ(a.content, "Let me check.");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].id, "call_0");
  EXPECT_EQ(a.calls[0].type, "function");
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, "{\"location\": \"Paris\", \"note\": \"a ``` b\\n```\"}");
  EXPECT_EQ(a.calls[1].id, "call_1");
  EXPECT_EQ(a.calls[1].name, "get_time");
  EXPECT_EQ(a.calls[1].arguments, "{\"tz\": \"CET\"}");
  EXPECT_TRUE(a.errors.empty()) << a.errors[0];
  ASSERT_EQ(a.completed.size(), 2u);
  EXPECT_EQ(a.completed[1].arguments, a.calls[1].arguments);
  EXPECT_TRUE(nlohmann::json::accept(a.calls[0].arguments));
}

// Every way to cut the text into two chunks, at byte (not just character) positions.
TEST(ToolCallParser, AnyTwoWaySplitGivesTheSameResult) {
  for (const std::string& text : {kTwoCalls, std::string("plain text <｜tool no call"), std::string("<｜tool▁calls▁begin｜>")}) {
    const Aggregate whole = parse_chunks({text});
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      EXPECT_EQ(parse_chunks({text.substr(0, cut), text.substr(cut)}), whole) << "cut at " << cut;
    }
  }
}

TEST(ToolCallParser, RandomChunkingsGiveTheSameResult) {
  std::mt19937 rng(11);
  const Aggregate whole = parse_chunks({kTwoCalls});
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<std::string> chunks;
    size_t pos = 0;
    while (pos < kTwoCalls.size()) {
      const size_t len = rng() % 9;  // empty chunks too
      chunks.push_back(kTwoCalls.substr(pos, len));
      pos += len;
    }
    ASSERT_EQ(parse_chunks(chunks), whole) << trial;
  }
}

TEST(ToolCallParser, ArgumentsStreamAsTheyArrive) {
  ToolCallParser p;
  auto r = p.push("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": ");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": ");
  r = p.push("1}\n``");  // the possible closing fence is held back
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "1}");
  EXPECT_TRUE(r.tool_calls[0].name.empty());
  r = p.push("`<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_TRUE(r.tool_calls.empty());
  r = p.finish();
  EXPECT_TRUE(r.errors.empty());
  ASSERT_EQ(p.tool_calls().size(), 1u);
  EXPECT_EQ(p.tool_calls()[0].arguments, "{\"a\": 1}");
}

TEST(ToolCallParser, ContentWithoutCallsPassesThrough) {
  const Aggregate a = parse_chunks({"Hello <｜ world ", "<｜tool", " not a marker"});
  EXPECT_EQ(a.content, "Hello <｜ world <｜tool not a marker");
  EXPECT_TRUE(a.calls.empty());
  EXPECT_TRUE(a.errors.empty());
}

TEST(ToolCallParser, MalformedOutputIsReportedAndKeptAsContent) {
  struct Case {
    std::string text;
    std::string error_part;
  };
  const std::string begin = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>";
  const std::vector<Case> cases = {
      {begin + "function get_weather\n```json\n{}", "no <｜tool▁sep｜>"},
      {begin + "function<｜tool▁sep｜>get weather", "does not end with a newline"},
      {begin + "function<｜tool▁sep｜>\n```json\n{}", "bad function name"},
      {begin + "function<｜tool▁sep｜>f\n{\"a\": 1}<｜tool▁call▁end｜>", "expected ```json"},
      {begin + "function<｜tool▁sep｜>f\n```json\n{\"a\": 1", "output ended inside tool call 0"},
      {begin + "function<｜tool▁sep｜>f\n```json\n{\"a\": }\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "arguments are not valid JSON"},
      {begin + "function<｜tool▁sep｜>f\n```json\n{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "not closed by ```"},
      {begin + "function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>garbage", "expected <｜tool▁call▁begin｜>"},
      {"<｜tool▁calls▁begin｜>", "none was written"},
      {begin + std::string(200, 'x') + "<｜tool▁sep｜>f\n", "no <｜tool▁sep｜>"},
      {begin + "function<｜tool▁sep｜>" + std::string(300, 'n') + "\n", "does not end with a newline"},
  };
  for (const Case& c : cases) {
    const Aggregate whole = parse_chunks({c.text});
    ASSERT_FALSE(whole.errors.empty()) << c.text;
    EXPECT_NE(whole.errors[0].find(c.error_part), std::string::npos) << whole.errors[0] << " for " << c.text;
    // Chunked the same.
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.emplace_back(1, ch);
    EXPECT_EQ(parse_chunks(bytes), whole) << c.text;
  }
  // After a failure the rest of the text is content.
  const Aggregate a = parse_chunks({begin + "function<｜tool▁sep｜>f\n{oops} tail"});
  EXPECT_NE(a.content.find("{oops} tail"), std::string::npos);
}

TEST(ToolCallParser, BareCallBeginOpensCalls) {
  const Aggregate a = parse_chunks(
      {"<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>after"});
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "f");
  EXPECT_EQ(a.content, "after");
  EXPECT_TRUE(a.errors.empty());
}

TEST(ToolCallParser, RandomBytesNeverCrash) {
  std::mt19937 rng(3);
  const std::vector<std::string> atoms = {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                                          "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "\n", "```json\n", "\n```",
                                          "function", "f", "{", "}", "\"", " ", "<｜", "\xFF", "x"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    std::vector<std::string> chunks;
    for (size_t pos = 0; pos < text.size();) {
      const size_t len = 1 + rng() % 7;
      chunks.push_back(text.substr(pos, len));
      pos += len;
    }
    EXPECT_EQ(parse_chunks(chunks), parse_chunks({text})) << trial;
  }
}

}  // namespace
}  // namespace deepinfer
