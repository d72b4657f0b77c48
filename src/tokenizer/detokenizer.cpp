#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace deepinfer {

void IncrementalDetokenizer::push(int32_t id, std::string& out) {
  if (id < 0 || id >= tokenizer_->vocab_size()) return;
  if (!tokenizer_->is_added(id)) {
    pending_.append(tokenizer_->token_bytes(id));
    // Emit all but a tail that a later token could still complete. Converting the emitted
    // prefix on its own gives the same characters and U+FFFDs as converting the whole stream:
    // the prefix ends where no maximal subpart can continue.
    const size_t keep = utf8::incomplete_suffix_length(pending_);
    const size_t n_emit = pending_.size() - keep;
    if (n_emit > 0) {
      utf8::append_lossy(out, std::string_view(pending_).substr(0, n_emit));
      pending_.erase(0, n_emit);
    }
    return;
  }
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return;  // does not end a byte run (as decode)
  finish(out);
  out.append(tokenizer_->token_bytes(id));
}

void IncrementalDetokenizer::finish(std::string& out) {
  utf8::append_lossy(out, pending_);
  pending_.clear();
}

}  // namespace deepinfer
