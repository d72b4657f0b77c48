// PreTokenizer: HF's pre-tokenizer chain (`Sequence` of `Split` and `ByteLevel` steps) as byte
// ranges over the input, each step applied to every piece of the previous one with the piece as
// the whole regex subject. The byte-level alphabet itself is applied later, by BpeModel, on
// bytes. Does not handle added tokens (added_vocabulary.h) or merges.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/unicode_regex.h"

namespace deepinfer {

// HF `SplitDelimiterBehavior`.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A byte range [begin, end) of the text being encoded. 64-bit: inputs may exceed 4 GiB in
// principle (the Tokenizer caps them far lower).
struct TextPiece {
  size_t begin = 0;
  size_t end = 0;
};

// Per-thread buffers for PreTokenizer::split.
struct PreTokenizerScratch {
  RegexScratch regex;
  std::vector<TextPiece> pieces_a;
  std::vector<TextPiece> pieces_b;
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
};

class PreTokenizer {
 public:
  // GPT-2's pattern, which `ByteLevel` with use_regex = true splits by.
  static constexpr std::string_view kGpt2Pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

  void add_split(UnicodeRegex regex, SplitBehavior behavior, bool invert);
  size_t n_steps() const { return steps_.size(); }

  // Appends to `out` the non-empty pieces of text[range] (offsets are into `text`), in order.
  // Errors only if a regex gives up (UnicodeRegex::find). Preconditions: `text` is valid UTF-8
  // and the range starts and ends on character boundaries. Thread-safe with one scratch per
  // thread.
  Status split(std::string_view text, TextPiece range, std::vector<TextPiece>& out, PreTokenizerScratch& scratch) const;

  // A regex pattern matching `literal` exactly (HF `Split` with a String pattern).
  static std::string escape_literal(std::string_view literal);

 private:
  struct Step {
    UnicodeRegex regex;
    SplitBehavior behavior;
    bool invert;
  };
  Status apply(const Step& step, std::string_view text, const std::vector<TextPiece>& in, std::vector<TextPiece>& out,
               PreTokenizerScratch& scratch) const;

  std::vector<Step> steps_;
};

}  // namespace deepinfer
