// Parity with Hugging Face tokenizers on DeepSeek-V3's real vocabulary: the 12,199-text corpus
// (scripts/golden/make_tokenizer_corpus.py) against golden ids made by
// scripts/golden/make_tokenizer_golden.py with tokenizers 0.23.2: every id identical,
// decode(encode(x)) == x, plain-text encoding (no added token recognised) identical to a copy
// of the tokenizer without added tokens, decode of hostile id sequences identical (U+FFFD
// placement, skipped specials, ids past the vocabulary), and parallel encoding identical.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/text.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

using testing::deepseek_tokenizer;
using testing::tokenizer_fixture;

struct Golden {
  nlohmann::json meta;
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
};

const Golden& golden() {
  static const Golden loaded = [] {
    Golden g;
    g.texts = testing::corpus_texts();
    auto lines = testing::read_jsonl(tokenizer_fixture("golden_encode.jsonl"));
    g.meta = lines.at(0);
    for (size_t i = 1; i < lines.size(); ++i) g.ids.push_back(lines[i].get<std::vector<int32_t>>());
    return g;
  }();
  return loaded;
}

std::string show(const std::string& text) { return quote_text(text, 200); }

TEST(TokenizerParity, GoldenFilesMatchCorpus) {
  const Golden& g = golden();
  ASSERT_EQ(g.meta.at("format"), "deepinfer-tokenizer-golden");
  ASSERT_EQ(g.texts.size(), g.ids.size());
  EXPECT_GE(g.texts.size(), 10000u + 150u);
  EXPECT_EQ(g.meta.at("n").get<size_t>(), g.texts.size());
}

TEST(TokenizerParity, EveryCorpusTextEncodesToGoldenIds) {
  const Tokenizer* t = deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const Golden& g = golden();
  size_t n_mismatch = 0, n_ids = 0;
  for (size_t i = 0; i < g.texts.size(); ++i) {
    auto ids = t->encode(g.texts[i]);
    ASSERT_TRUE(ids) << i << ": " << ids.status().to_string();
    n_ids += ids->size();
    if (*ids != g.ids[i]) {
      if (++n_mismatch <= 10) ADD_FAILURE() << "corpus text " << i << " " << show(g.texts[i]) << ": ids differ";
    }
  }
  EXPECT_EQ(n_mismatch, 0u) << "of " << g.texts.size();
  EXPECT_EQ(n_ids, g.meta.at("n_ids").get<size_t>());
}

TEST(TokenizerParity, DecodeOfEncodeIsIdentity) {
  const Tokenizer* t = deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const Golden& g = golden();
  for (size_t i = 0; i < g.texts.size(); ++i) {
    ASSERT_EQ(t->decode(g.ids[i]), g.texts[i]) << i;
    EncodeOptions plain;
    plain.split_special_tokens = false;
    auto ids = t->encode(g.texts[i], plain);
    ASSERT_TRUE(ids);
    ASSERT_EQ(t->decode(*ids), g.texts[i]) << i;
  }
}

TEST(TokenizerParity, PlainTextEncodingMatchesTokenizerWithoutAddedTokens) {
  const Tokenizer* t = deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const Golden& g = golden();
  const nlohmann::json extra = nlohmann::json::parse(testing::read_file(tokenizer_fixture("golden_extra.json")));
  const nlohmann::json& plain = extra.at("plain");
  EXPECT_GT(plain.size(), 100u);  // the corpus spells control tokens often
  EncodeOptions options;
  options.split_special_tokens = false;
  size_t n_mismatch = 0;
  for (size_t i = 0; i < g.texts.size(); ++i) {
    auto ids = t->encode(g.texts[i], options);
    ASSERT_TRUE(ids);
    auto it = plain.find(std::to_string(i));
    const std::vector<int32_t> expected = it == plain.end() ? g.ids[i] : it->get<std::vector<int32_t>>();
    if (*ids != expected && ++n_mismatch <= 10) ADD_FAILURE() << "plain encoding of " << i << " " << show(g.texts[i]);
    for (int32_t id : *ids) ASSERT_FALSE(t->is_added(id)) << "plain text produced added token " << id;
  }
  EXPECT_EQ(n_mismatch, 0u);
}

TEST(TokenizerParity, DecodeOfRandomIdSequencesMatchesHf) {
  const Tokenizer* t = deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const nlohmann::json extra = nlohmann::json::parse(testing::read_file(tokenizer_fixture("golden_extra.json")));
  const nlohmann::json& seqs = extra.at("decode");
  ASSERT_GE(seqs.size(), 500u);
  size_t n_replacement = 0;
  for (size_t k = 0; k < seqs.size(); ++k) {
    const auto ids = seqs[k].at("ids").get<std::vector<int32_t>>();
    ASSERT_TRUE(seqs[k].contains("text")) << "HF failed on sequence " << k;
    const std::string text = t->decode(ids);
    EXPECT_EQ(text, seqs[k]["text"].get<std::string>()) << "sequence " << k;
    EXPECT_EQ(t->decode(ids, /*skip_special_tokens=*/true), seqs[k]["text_skip"].get<std::string>()) << "sequence " << k;
    EXPECT_TRUE(utf8::is_valid(text));
    n_replacement += text.find(utf8::kReplacement) != std::string::npos;
  }
  EXPECT_GT(n_replacement, 50u);  // the sequences do exercise the lossy path
}

TEST(TokenizerParity, AddSpecialTokensPrependsBosAsTokenizerConfigSays) {
  const Tokenizer* t = deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->bos_id(), 0);
  ASSERT_EQ(t->eos_id(), 1);
  const Golden& g = golden();
  // tokenizer_config.json: add_bos_token true, add_eos_token false (transformers' LlamaTokenizerFast
  // semantics; tokenizer.json's own post_processor adds nothing).
  EncodeOptions options;
  options.add_special_tokens = true;
  for (size_t i = 0; i < 50; ++i) {
    auto ids = t->encode(g.texts[i], options);
    ASSERT_TRUE(ids);
    std::vector<int32_t> expected = {0};
    expected.insert(expected.end(), g.ids[i].begin(), g.ids[i].end());
    EXPECT_EQ(*ids, expected);
  }
}

TEST(TokenizerParity, ParallelEncodingOfALongDocumentIsIdentical) {
  const Tokenizer* t = deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const Golden& g = golden();
  std::string doc;
  std::vector<int32_t> expected;
  for (size_t i = 0; i < g.texts.size(); ++i) {
    doc += g.texts[i];
    doc += "<｜end▁of▁sentence｜>";
  }
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    auto serial = t->encode(doc);
    auto parallel = t->encode_parallel(doc, pool);
    ASSERT_TRUE(serial && parallel);
    EXPECT_EQ(*parallel, *serial) << threads << " threads";
  }
  // Without special-token splitting the document is one segment: only pieces are parallel.
  EncodeOptions plain;
  plain.split_special_tokens = false;
  ThreadPool pool(3);
  auto serial = t->encode(doc, plain);
  auto parallel = t->encode_parallel(doc, pool, plain);
  ASSERT_TRUE(serial && parallel);
  EXPECT_EQ(*parallel, *serial);
}

TEST(TokenizerParity, ConcurrentEncodingFromManyThreadsIsIdentical) {
  const Tokenizer* t = deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  const Golden& g = golden();
  ThreadPool pool(4);
  std::vector<int> bad(g.texts.size(), 0);
  pool.parallel_for(static_cast<int64_t>(g.texts.size()), 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      auto ids = t->encode(g.texts[i]);
      bad[i] = !ids || *ids != g.ids[i];
    }
  });
  EXPECT_EQ(std::count(bad.begin(), bad.end(), 1), 0);
}

}  // namespace
}  // namespace deepinfer
