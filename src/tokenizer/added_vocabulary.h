// AddedVocabulary: HF's added tokens (special or not) and how they are found in text — two
// leftmost-longest passes as in tokenizers' added_vocabulary.rs: first the tokens with
// normalized = false, then, in the gaps, those with normalized = true (this layer supports only
// the identity normalizer, so both see the same bytes). Owns the tokens and a byte trie; does
// not encode the text between them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pre_tokenizer.h"

namespace deepinfer {

struct AddedToken {
  int32_t id = 0;
  std::string content;       // non-empty, valid UTF-8
  bool special = false;      // dropped by decode(skip_special_tokens)
  bool normalized = false;   // matched in the second pass
  bool lstrip = false;       // the match absorbs whitespace on its left
  bool rstrip = false;       // ... and on its right
};

// A run of plain text (id < 0) or one added token (id ≥ 0), as a byte range of the input.
struct TextSegment {
  size_t begin = 0;
  size_t end = 0;
  int32_t id = -1;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // Preconditions (checked by the loader): unique non-empty contents, unique ids.
  explicit AddedVocabulary(std::vector<AddedToken> tokens);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

  // Appends the segments of text[range] to `out`: added tokens where they match, plain runs in
  // between (never empty). O(n · longest token) worst case. Thread-safe.
  void split(std::string_view text, TextPiece range, std::vector<TextSegment>& out) const;

 private:
  // A byte trie over one pass's token contents. Node 0 is the root.
  struct Trie {
    struct Node {
      int32_t token = -1;                           // index into tokens_ ending here
      std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    };
    std::vector<Node> nodes{Node{}};
    std::array<bool, 256> first_byte{};  // bytes some token starts with
    bool empty = true;

    void insert(std::string_view key, int32_t token);
    // The token index of the longest key that starts at text[pos] (within end), and its length.
    int32_t longest_at(std::string_view text, size_t pos, size_t end, size_t* length) const;
  };

  void split_pass(const Trie& trie, std::string_view text, TextPiece range, std::vector<TextSegment>& out) const;

  std::vector<AddedToken> tokens_;
  Trie raw_;         // normalized = false
  Trie normalized_;  // normalized = true
};

}  // namespace deepinfer
