// IncrementalDetokenizer and StopStringMatcher: streamed deltas are valid UTF-8 and concatenate
// to Tokenizer::decode (HF's golden decode of hostile id sequences included); stop strings are
// found across any delta boundaries and nothing after them is released.
#include "tokenizer/detokenizer.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/stop_string_matcher.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

std::string stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip, std::vector<std::string>* deltas = nullptr) {
  IncrementalDetokenizer d(t, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string delta = d.push(id);
    EXPECT_TRUE(utf8::is_valid(delta));
    EXPECT_LE(d.n_pending_bytes(), 3u);
    if (deltas) deltas->push_back(delta);
    all += delta;
  }
  const std::string tail = d.finish();
  EXPECT_TRUE(utf8::is_valid(tail));
  if (deltas) deltas->push_back(tail);
  return all + tail;
}

TEST(IncrementalDetokenizer, MatchesHfDecodeOnHostileSequences) {
  const Tokenizer* t = testing::deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const json extra = json::parse(testing::read_file(testing::tokenizer_fixture("golden_extra.json")));
  for (const json& seq : extra.at("decode")) {
    const auto ids = seq.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(stream(*t, ids, false), seq.at("text").get<std::string>());
    EXPECT_EQ(stream(*t, ids, true), seq.at("text_skip").get<std::string>());
  }
}

TEST(IncrementalDetokenizer, CorpusStreamsBackToItsText) {
  const Tokenizer* t = testing::deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const auto texts = testing::corpus_texts();
  for (size_t i = 0; i < texts.size(); i += 3) {
    auto ids = t->encode(texts[i]);
    ASSERT_TRUE(ids);
    EXPECT_EQ(stream(*t, *ids, false), texts[i]) << i;
  }
}

TEST(IncrementalDetokenizer, HoldsSplitCharactersUntilComplete) {
  const Tokenizer* t = testing::deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  // "😀" as its four byte tokens: nothing is released until the last one.
  std::vector<int32_t> ids;
  for (unsigned char b : std::string("😀")) {
    ids.push_back(*t->token_to_id(byte_level::encode(std::string(1, static_cast<char>(b)))));
  }
  std::vector<std::string> deltas;
  EXPECT_EQ(stream(*t, ids, true, &deltas), "😀");
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "", "", "😀", ""}));
  // A special token in the middle ends the byte run: the partial character becomes U+FFFD.
  deltas.clear();
  EXPECT_EQ(stream(*t, {ids[0], ids[1], *t->token_to_id("<｜User｜>"), ids[2], ids[3]}, true, &deltas),
            std::string(utf8::kReplacement) + "<｜User｜>" + std::string(utf8::kReplacement) + std::string(utf8::kReplacement));
}

// Reference: the first occurrence (by end, then longest) of any stop in the whole text.
std::string reference_stop(const std::string& text, const std::vector<std::string>& stops, bool* stopped) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = 0;
    for (const auto& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) best = std::max(best, s.size());
    }
    if (best > 0) {
      *stopped = true;
      return text.substr(0, end - best);
    }
  }
  *stopped = false;
  return text;
}

TEST(StopStringMatcher, FindsStopsAcrossAnyDeltaBoundaries) {
  std::mt19937 rng(5);
  const std::vector<std::vector<std::string>> stop_sets = {
      {"</s>"}, {"\n\n", "END"}, {"aab", "ab"}, {"abcabd"}, {"你好", "好啊"}, {"x"}, {"<｜end▁of▁sentence｜>", "stop here"}};
  const std::string alphabet[] = {"a", "b", "c", "d", "\n", "<", "/", "s", ">", "E", "N", "D", "你", "好", "啊", "x", " "};
  for (int trial = 0; trial < 3000; ++trial) {
    const auto& stops = stop_sets[trial % stop_sets.size()];
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % std::size(alphabet)];
    if (trial % 5 == 0) {
      size_t at = rng() % (text.size() + 1);
      while (at < text.size() && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80) ++at;  // a character boundary
      text.insert(at, stops[rng() % stops.size()]);
    }
    // Split into random deltas at character boundaries.
    std::vector<std::string> deltas;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t len = 1 + rng() % 6;
      size_t end = std::min(text.size(), pos + len);
      while (end < text.size() && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) ++end;
      deltas.push_back(text.substr(pos, end - pos));
      pos = end;
    }
    auto m = StopStringMatcher::create(stops);
    ASSERT_TRUE(m);
    std::string out;
    for (const auto& d : deltas) {
      m->push(d, out);
      ASSERT_TRUE(utf8::is_valid(out));
      if (m->stopped()) break;
    }
    m->finish(out);
    bool stopped = false;
    EXPECT_EQ(out, reference_stop(text, stops, &stopped)) << "text '" << text << "'";
    EXPECT_EQ(m->stopped(), stopped);
    EXPECT_LE(m->n_held_bytes(), 1024u);
  }
}

TEST(StopStringMatcher, RejectsBadStopLists) {
  EXPECT_FALSE(StopStringMatcher::create({""}));
  EXPECT_FALSE(StopStringMatcher::create({std::string(StopStringMatcher::kMaxStopBytes + 1, 'a')}));
  EXPECT_FALSE(StopStringMatcher::create({"\xFF"}));
  EXPECT_FALSE(StopStringMatcher::create(std::vector<std::string>(StopStringMatcher::kMaxStopStrings + 1, "a")));
  auto none = StopStringMatcher::create({});
  ASSERT_TRUE(none);
  std::string out;
  none->push("abc", out);
  EXPECT_EQ(out, "abc");
  EXPECT_EQ(none->n_held_bytes(), 0u);
}

TEST(StopStringMatcher, IgnoresInputAfterTheStop) {
  auto m = StopStringMatcher::create({"STOP"});
  ASSERT_TRUE(m);
  std::string out;
  m->push("hello ST", out);
  EXPECT_EQ(out, "hello ");
  m->push("OP and more", out);
  EXPECT_TRUE(m->stopped());
  EXPECT_EQ(m->matched(), 0u);
  m->push("ignored", out);
  m->finish(out);
  EXPECT_EQ(out, "hello ");
}

}  // namespace
}  // namespace deepinfer
