// IncrementalDetokenizer: token ids → text deltas while a sequence is generated. Bytes of a
// UTF-8 character split across tokens are held until it completes, so every delta is valid
// UTF-8, and the concatenated deltas equal Tokenizer::decode of all ids (same U+FFFD rule).
// Does not look for stop strings (stop_string_matcher.h) or tool calls (tool_call_parser.h).
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object. skip_special_tokens drops added tokens marked
  // special (BOS, EOS, pad) as decode() does.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Appends to `out` the text that `id` completes (possibly nothing). Ids out of range are
  // ignored, as decode() ignores them. O(token length).
  void push(int32_t id, std::string& out);
  std::string push(int32_t id) {
    std::string out;
    push(id, out);
    return out;
  }

  // End of the sequence: bytes of an unfinished character become U+FFFD.
  void finish(std::string& out);
  std::string finish() {
    std::string out;
    finish(out);
    return out;
  }

  // Bytes held back (0..3), waiting for the rest of a character.
  size_t n_pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // model-token bytes not yet emitted: an incomplete character
};

}  // namespace deepinfer
