// Loading tokenizer.json / tokenizer_config.json: a valid synthetic tokenizer loads, and each
// class of malformed file is rejected with the field named (RELIABILITY.md, "Tokenizer and
// chat"): special-token ids past the vocabulary, malformed byte tokens, merges naming missing
// tokens, duplicate ids, bad types, unsupported features, broken JSON.
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;
using testing::tiny_tokenizer_config;
using testing::tiny_tokenizer_json;

Expected<std::unique_ptr<Tokenizer>> load(const json& tok, const json* cfg = nullptr) {
  return Tokenizer::from_json_text(tok.dump(), cfg ? cfg->dump() : std::string());
}

TEST(TokenizerLoader, TinyTokenizerLoads) {
  const json cfg = tiny_tokenizer_config();
  auto t = load(tiny_tokenizer_json(), &cfg);
  ASSERT_TRUE(t) << t.status().to_string();
  EXPECT_EQ((*t)->vocab_size(), 256 + 7 + 4);
  EXPECT_EQ((*t)->bos_id(), 263);
  EXPECT_EQ((*t)->eos_id(), 264);
  EXPECT_EQ((*t)->prefix_ids(), std::vector<int32_t>{263});
  EXPECT_TRUE((*t)->suffix_ids().empty());
  EXPECT_EQ((*t)->token_to_id("Ġthe"), 258);
  EXPECT_EQ((*t)->id_to_token(258), "Ġthe");
  EXPECT_EQ((*t)->token_bytes(258), " the");
  EXPECT_EQ((*t)->token_to_id("<｜User｜>"), 265);
  EXPECT_TRUE((*t)->is_special(265));
  EXPECT_FALSE((*t)->is_added(258));
  EXPECT_EQ((*t)->id_to_token(-1), "");
  EXPECT_EQ((*t)->id_to_token(100000), "");
  auto ids = (*t)->encode(" the aaaa 123");
  ASSERT_TRUE(ids);
  // " the" merges fully; "aaaa" → "aa aa" → "aaaa"; digits split into "12" + "3" by merges.
  EXPECT_EQ((*t)->decode(*ids), " the aaaa 123");
  EXPECT_EQ(ids->front(), 258);
}

TEST(TokenizerLoader, MergesInPairFormEqualStringForm) {
  json a = tiny_tokenizer_json();
  json b = a;
  json pairs = json::array();
  for (const auto& m : a["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    const size_t sp = s.find(' ');
    pairs.push_back({s.substr(0, sp), s.substr(sp + 1)});
  }
  b["model"]["merges"] = pairs;
  b["model"]["merges"].insert(b["model"]["merges"].begin(), "#version: 0.2");  // merges.txt header is skipped
  auto ta = load(a);
  auto tb = load(b);
  ASSERT_TRUE(ta && tb) << (tb ? "" : tb.status().to_string());
  for (const char* text : {" the theme", "aaaaaaa", "12 121212", "\t\n x"}) EXPECT_EQ(*(*ta)->encode(text), *(*tb)->encode(text));
}

TEST(TokenizerLoader, PostProcessorTemplateGivesSpecialIdsWithoutConfig) {
  json j = tiny_tokenizer_json();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<｜end▁of▁sentence｜>", "type_id": 0}}],
      "special_tokens": {"<｜begin▁of▁sentence｜>": {"id": "<｜begin▁of▁sentence｜>", "ids": [263], "tokens": ["<｜begin▁of▁sentence｜>"]},
                         "<｜end▁of▁sentence｜>": {"id": "<｜end▁of▁sentence｜>", "ids": [264], "tokens": ["<｜end▁of▁sentence｜>"]}}})");
  auto t = load(j);
  ASSERT_TRUE(t) << t.status().to_string();
  EncodeOptions o;
  o.add_special_tokens = true;
  EXPECT_EQ(*(*t)->encode("a", o), (std::vector<int32_t>{263, 97, 264}));  // byte b is id b here
  // tokenizer_config.json's add_bos_token / add_eos_token take precedence when present.
  const json cfg = tiny_tokenizer_config();
  auto t2 = load(j, &cfg);
  ASSERT_TRUE(t2);
  EXPECT_EQ(*(*t2)->encode("a", o), (std::vector<int32_t>{263, 97}));
}

struct BadCase {
  const char* name;
  std::function<void(json&, json&)> mutate;  // (tokenizer.json, tokenizer_config.json)
  StatusCode code;
  const char* message_part;  // the field (and detail) the error must name
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class TokenizerLoaderBad : public ::testing::TestWithParam<BadCase> {};

TEST_P(TokenizerLoaderBad, RejectedWithFieldNamed) {
  const BadCase& c = GetParam();
  json tok = tiny_tokenizer_json();
  json cfg = tiny_tokenizer_config();
  c.mutate(tok, cfg);
  auto t = load(tok, &cfg);
  ASSERT_FALSE(t) << c.name << " loaded";
  EXPECT_EQ(t.status().code(), c.code) << t.status().to_string();
  EXPECT_NE(t.status().message().find(c.message_part), std::string::npos)
      << c.name << ": '" << t.status().message() << "' does not name '" << c.message_part << "'";
}

const BadCase kBadCases[] = {
    {"special id past vocab", [](json& t, json&) { t["added_tokens"][1]["id"] = 100000; }, StatusCode::kCorrupt,
     "added_tokens[1].id: 100000"},
    {"special id negative", [](json& t, json&) { t["added_tokens"][0]["id"] = -1; }, StatusCode::kCorrupt,
     "added_tokens[0].id"},
    {"special id not an integer", [](json& t, json&) { t["added_tokens"][0]["id"] = "7"; }, StatusCode::kCorrupt,
     "added_tokens[0].id"},
    {"special id collides with a model token", [](json& t, json&) { t["added_tokens"][2]["id"] = 5; },
     StatusCode::kCorrupt, "added_tokens[2].id: 5 is already the model token"},
    {"duplicate added content", [](json& t, json&) { t["added_tokens"][3]["content"] = "<｜User｜>"; },
     StatusCode::kCorrupt, "added_tokens[3].content"},
    {"empty added content", [](json& t, json&) { t["added_tokens"][3]["content"] = ""; }, StatusCode::kCorrupt,
     "added_tokens[3].content: is empty"},
    {"added flag not boolean", [](json& t, json&) { t["added_tokens"][0]["special"] = 1; }, StatusCode::kCorrupt,
     "added_tokens[0].special"},
    {"single_word unsupported", [](json& t, json&) { t["added_tokens"][0]["single_word"] = true; },
     StatusCode::kUnsupported, "added_tokens[0].single_word"},
    {"missing byte token", [](json& t, json&) { t["model"]["vocab"].erase("Ā"); t["model"]["vocab"]["x_y"] = 0; },
     StatusCode::kCorrupt, "no token for byte 0x00"},
    {"vocab token outside the byte alphabet",
     [](json& t, json&) {
       t["model"]["vocab"].erase("Ġt");
       t["model"]["vocab"]["☃"] = 256;
       t["model"]["merges"] = json::array();
     },
     StatusCode::kCorrupt, "is not a byte-level string"},
    {"vocab id past its size", [](json& t, json&) { t["model"]["vocab"]["a"] = 5000; }, StatusCode::kCorrupt,
     "model.vocab: 'a' has id 5000"},
    {"vocab id duplicated", [](json& t, json&) { t["model"]["vocab"]["a"] = 65; }, StatusCode::kCorrupt,
     "model.vocab: id 65 is given to both"},
    {"vocab id not an integer", [](json& t, json&) { t["model"]["vocab"]["a"] = 1.5; }, StatusCode::kCorrupt,
     "model.vocab"},
    {"vocab missing", [](json& t, json&) { t["model"].erase("vocab"); }, StatusCode::kCorrupt, "model.vocab"},
    {"merge left missing", [](json& t, json&) { t["model"]["merges"][2] = "Ġtx he"; }, StatusCode::kCorrupt,
     "model.merges[2]: 'Ġtx' is not in model.vocab"},
    {"merge right missing", [](json& t, json&) { t["model"]["merges"][1] = "h zz"; }, StatusCode::kCorrupt,
     "model.merges[1]: 'zz' is not in model.vocab"},
    {"merge result missing", [](json& t, json&) { t["model"]["merges"].push_back("q q"); }, StatusCode::kCorrupt,
     "model.merges[7]: the merged token 'qq'"},
    {"merge not two tokens", [](json& t, json&) { t["model"]["merges"][0] = "a b c"; }, StatusCode::kCorrupt,
     "model.merges[0]"},
    {"merge pair of three", [](json& t, json&) { t["model"]["merges"][0] = json::array({"a", "b", "c"}); },
     StatusCode::kCorrupt, "model.merges[0]"},
    {"merges not an array", [](json& t, json&) { t["model"]["merges"] = "a b"; }, StatusCode::kCorrupt,
     "model.merges"},
    {"model type", [](json& t, json&) { t["model"]["type"] = "WordPiece"; }, StatusCode::kUnsupported, "model.type"},
    {"dropout", [](json& t, json&) { t["model"]["dropout"] = 0.1; }, StatusCode::kUnsupported, "model.dropout"},
    {"byte_fallback", [](json& t, json&) { t["model"]["byte_fallback"] = true; }, StatusCode::kUnsupported,
     "model.byte_fallback"},
    {"subword prefix", [](json& t, json&) { t["model"]["continuing_subword_prefix"] = "##"; },
     StatusCode::kUnsupported, "model.continuing_subword_prefix"},
    {"normalizer", [](json& t, json&) { t["normalizer"] = {{"type", "NFC"}}; }, StatusCode::kUnsupported,
     "normalizer"},
    {"pre-tokenizer type", [](json& t, json&) { t["pre_tokenizer"]["pretokenizers"][0]["type"] = "Digits"; },
     StatusCode::kUnsupported, "pre_tokenizer.pretokenizers[0].type"},
    {"no ByteLevel step", [](json& t, json&) { t["pre_tokenizer"]["pretokenizers"].erase(1); },
     StatusCode::kUnsupported, "no ByteLevel step"},
    {"bad regex", [](json& t, json&) { t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{N}"; },
     StatusCode::kCorrupt, "pre_tokenizer.pretokenizers[0].pattern"},
    {"unknown split behavior", [](json& t, json&) { t["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
     StatusCode::kCorrupt, "pre_tokenizer.pretokenizers[0].behavior"},
    {"add_prefix_space", [](json& t, json&) { t["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
     StatusCode::kUnsupported, "add_prefix_space"},
    {"decoder", [](json& t, json&) { t["decoder"] = {{"type", "WordPiece"}}; }, StatusCode::kUnsupported,
     "decoder.type"},
    {"post-processor special id past vocab",
     [](json& t, json&) {
       t["post_processor"] = {{"type", "TemplateProcessing"},
                              {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                              {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {99999}}, {"tokens", {"<s>"}}}}}}};
     },
     StatusCode::kCorrupt, "post_processor.special_tokens['<s>'].ids"},
    {"bos not in vocab", [](json&, json& c) { c["bos_token"]["content"] = "<s>"; }, StatusCode::kCorrupt,
     "tokenizer_config.json.bos_token: '<s>' is not in the vocabulary"},
    {"eos wrong type", [](json&, json& c) { c["eos_token"] = 5; }, StatusCode::kCorrupt,
     "tokenizer_config.json.eos_token"},
    {"add_bos without bos", [](json&, json& c) { c.erase("bos_token"); }, StatusCode::kCorrupt,
     "tokenizer_config.json.add_bos_token"},
    {"add_bos not boolean", [](json&, json& c) { c["add_bos_token"] = "yes"; }, StatusCode::kCorrupt,
     "tokenizer_config.json.add_bos_token"},
    {"chat_template wrong type", [](json&, json& c) { c["chat_template"] = 3; }, StatusCode::kCorrupt,
     "tokenizer_config.json.chat_template"},
    {"root not an object", [](json& t, json&) { t = json::array(); }, StatusCode::kCorrupt, "tokenizer.json"},
    {"model missing", [](json& t, json&) { t.erase("model"); }, StatusCode::kCorrupt, "model: is missing"},
};

INSTANTIATE_TEST_SUITE_P(Cases, TokenizerLoaderBad, ::testing::ValuesIn(kBadCases),
                         [](const ::testing::TestParamInfo<BadCase>& param_info) {
                           std::string n = param_info.param.name;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

TEST(TokenizerLoader, BrokenJsonIsRejectedWithTheFileNamed) {
  const std::string good = tiny_tokenizer_json().dump();
  for (const std::string& text : {good.substr(0, good.size() / 2), std::string("{\"model\": 1, \"model\": 2}"),
                                  std::string("{\"a\": \"\xff\"}"), std::string("")}) {
    auto t = Tokenizer::from_json_text(text);
    ASSERT_FALSE(t);
    EXPECT_EQ(t.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos) << t.status().message();
  }
  auto t = Tokenizer::from_json_text(good, "{\"bos_token\": ");
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos);
}

TEST(TokenizerLoader, MissingDirectoryIsNotFound) {
  auto t = Tokenizer::load("/nonexistent/deepinfer/tokenizer");
  ASSERT_FALSE(t);
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoader, DeepSeekTokenizerTables) {
  const Tokenizer* t = testing::deepseek_tokenizer();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 128815);
  EXPECT_EQ(t->token_to_id("<｜User｜>"), 128803);
  EXPECT_FALSE(t->is_special(128803));  // non-special added token: kept by skip_special_tokens
  EXPECT_TRUE(t->is_added(128803));
  EXPECT_TRUE(t->is_special(0));
  EXPECT_TRUE(t->is_special(128805));  // <|EOT|>
  EXPECT_EQ(t->token_to_id("Ġthe"), 270);
  EXPECT_EQ(t->token_bytes(270), " the");
  EXPECT_FALSE(t->chat_template().empty());
  EXPECT_EQ(t->prefix_ids(), std::vector<int32_t>{0});
}

}  // namespace
}  // namespace deepinfer
