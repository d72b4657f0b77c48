// Tokenizer: a Hugging Face byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json)
// that produces the ids HF `tokenizers` produces. Owns the vocabulary tables, the added tokens,
// the pre-tokenizer chain and the BPE model; encode is split at added tokens, pre-tokenized,
// then merged piece by piece. Loading validates every field it uses and names the field in
// errors (tokenizer_loader.cpp). Chat formatting, streaming detokenization and tool-call parsing
// live beside it (chat_encoder.h, detokenizer.h, tool_call_parser.h).
//
// Invalid UTF-8: encode() rejects it (kInvalidArgument with the byte offset); it never reaches
// the regexes. decode() always returns valid UTF-8: bytes that do not form UTF-8 become U+FFFD
// exactly as HF's decode (Rust from_utf8_lossy per run of non-added tokens).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/thread_pool.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/pre_tokenizer.h"

namespace deepinfer {

struct EncodeOptions {
  // Add the BOS/EOS that tokenizer_config.json asks for (add_bos_token / add_eos_token), or, if
  // it says nothing, what the post_processor's TemplateProcessing adds. HF: add_special_tokens.
  bool add_special_tokens = false;
  // Recognise added tokens (special or not) spelled in the text, as HF does. false encodes the
  // text as plain text: "<｜User｜>" becomes ordinary BPE pieces, never a control id. The chat
  // encoder uses false for every message's content.
  bool split_special_tokens = true;
  // Inputs longer than this are rejected (kOutOfRange) before any work.
  size_t max_bytes = size_t{64} << 20;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json (required) and DIR/tokenizer_config.json (optional).
  static Expected<std::unique_ptr<Tokenizer>> load(const std::string& dir);
  // From parsed documents; `config` may be null. Errors name the offending field.
  static Expected<std::unique_ptr<Tokenizer>> from_json(const nlohmann::json& tokenizer, const nlohmann::json* config);
  // From JSON text (strict: UTF-8, no duplicate keys); `config_json` empty means none.
  static Expected<std::unique_ptr<Tokenizer>> from_json_text(std::string_view tokenizer_json,
                                                             std::string_view config_json = {});

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Text → ids. Errors: kInvalidArgument (not UTF-8: the byte offset is named), kOutOfRange
  // (longer than options.max_bytes), kResourceExhausted (a regex gave up: a pathological
  // pattern). Thread-safe; near-linear time in the input (O(n log n) for one long piece).
  Expected<std::vector<int32_t>> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Appends the ids of `text` (no BOS/EOS) to `out`; same checks as encode().
  Status encode_append(std::string_view text, bool split_special_tokens, std::vector<int32_t>& out,
                       size_t max_bytes = EncodeOptions{}.max_bytes) const;
  // The same ids as encode(), computed on `pool`: segments between added tokens are
  // pre-tokenized in parallel, then pieces are merged in parallel chunks. For long inputs.
  Expected<std::vector<int32_t>> encode_parallel(std::string_view text, ThreadPool& pool,
                                                 const EncodeOptions& options = {}) const;

  // Ids → text, as HF decode: ids outside [0, vocab_size()) are skipped; with
  // skip_special_tokens, added tokens marked special are skipped. Always valid UTF-8.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Number of ids: every id in [0, vocab_size()) is a token.
  int32_t vocab_size() const { return static_cast<int32_t>(kinds_.size()); }
  // An added token's content or a vocabulary string (byte-level form, e.g. "Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The inverse; empty for ids out of range.
  std::string_view id_to_token(int32_t id) const;
  // What an id stands for in text: an added token's content, or a vocabulary entry's bytes
  // (which may be part of a UTF-8 sequence). Empty for ids out of range.
  std::string_view token_bytes(int32_t id) const;
  bool is_added(int32_t id) const { return in_range(id) && kinds_[id] != Kind::kModel; }
  bool is_special(int32_t id) const { return in_range(id) && kinds_[id] == Kind::kSpecial; }

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // The ids EncodeOptions::add_special_tokens puts before and after the text.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }
  // tokenizer_config.json's chat_template, kept for reference; it is never executed.
  const std::string& chat_template() const { return chat_template_; }
  const AddedVocabulary& added_vocabulary() const { return added_; }

 private:
  friend class TokenizerLoader;
  enum class Kind : uint8_t { kModel, kAdded, kSpecial };

  Tokenizer();
  bool in_range(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < kinds_.size(); }
  Status check_input(std::string_view text, size_t max_bytes) const;
  // Encodes one plain segment (no added tokens inside) into out.
  Status encode_segment(std::string_view text, TextPiece range, std::vector<int32_t>& out) const;

  uint64_t serial_;  // unique per instance: keys the per-thread scratch and cache
  BpeModel bpe_;
  PreTokenizer pre_tokenizer_;
  AddedVocabulary added_;
  std::vector<Kind> kinds_;                 // [vocab_size]
  std::vector<std::string> strings_;        // [vocab_size] vocabulary string or added content
  std::string bytes_arena_;                 // token_bytes of every id, concatenated
  std::vector<uint64_t> bytes_offsets_;     // [vocab_size + 1] into bytes_arena_
  // Transparent hashing: lookups by string_view without building a std::string.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_by_string_;  // vocabulary strings, then added contents
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
  std::string chat_template_;
};

}  // namespace deepinfer
