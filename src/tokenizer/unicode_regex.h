// UnicodeRegex: a PCRE2 pattern (UTF + UCP, JIT when available) compiled from the Oniguruma
// syntax Hugging Face tokenizers uses, with the constructs whose meaning differs translated
// (see compile()). Owns the compiled code; per-thread match state lives in RegexScratch.
// Does not know about pre-tokenizer behaviours (pre_tokenizer.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace deepinfer {

// Per-thread PCRE2 match state: match data (one offset pair) and a JIT stack large enough for
// the long whitespace or letter runs that pathological inputs contain. Not thread-safe.
class RegexScratch {
 public:
  RegexScratch();
  ~RegexScratch();
  RegexScratch(const RegexScratch&) = delete;
  RegexScratch& operator=(const RegexScratch&) = delete;

 private:
  friend class UnicodeRegex;
  pcre2_real_match_data_8* match_data_ = nullptr;
  pcre2_real_match_context_8* match_context_ = nullptr;
  pcre2_real_jit_stack_8* jit_stack_ = nullptr;
};

class UnicodeRegex {
 public:
  // Compiles an Oniguruma-syntax pattern (as in tokenizer.json) for PCRE2 with UTF, UCP and
  // MULTILINE (Ruby's ^ and $ are line anchors). Translations, so that matches equal
  // Oniguruma's: \s / \S become the White_Space property (Oniguruma's \s: U+0009..U+000D,
  // U+0020, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000;
  // PCRE2's \s also holds U+180E); \h / \H become hex digits (Oniguruma's meaning, not PCRE2's
  // horizontal space). Nested character classes are rejected (kUnsupported). Syntax errors
  // are kCorrupt with PCRE2's message and offset.
  static Expected<UnicodeRegex> compile(std::string_view pattern);

  // The pattern after translation (for messages and tests).
  const std::string& translated() const { return translated_; }

  // Finds the leftmost match in subject[start, subject.size()), the subject being the whole
  // piece (lookarounds see nothing outside it). Returns true with [*begin, *end) set, false
  // if there is none; kResourceExhausted if PCRE2 gives up (match or JIT stack limit — the
  // limit grows with the subject length, so it means a pathological pattern, not input).
  // Preconditions: subject is valid UTF-8 and start is a character boundary.
  Expected<bool> find(std::string_view subject, size_t start, size_t* begin, size_t* end, RegexScratch& scratch) const;

 private:
  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const;
  };
  std::shared_ptr<pcre2_real_code_8> code_;
  std::string translated_;
  bool jit_ = false;  // JIT-compiled: match through pcre2_jit_match (skips per-call checks)
};

}  // namespace deepinfer
