#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "tokenizer/utf8.h"

namespace deepinfer {

void PreTokenizer::add_split(UnicodeRegex regex, SplitBehavior behavior, bool invert) {
  steps_.push_back(Step{std::move(regex), behavior, invert});
}

std::string PreTokenizer::escape_literal(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto b = static_cast<uint8_t>(c);
    const bool plain = b >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!plain) out += '\\';
    out += c;
  }
  return out;
}

Status PreTokenizer::split(std::string_view text, TextPiece range, std::vector<TextPiece>& out,
                           PreTokenizerScratch& scratch) const {
  if (range.begin >= range.end) return Status::ok();
  if (steps_.empty()) {
    out.push_back(range);
    return Status::ok();
  }
  std::vector<TextPiece>* in = &scratch.pieces_a;
  std::vector<TextPiece>* next = &scratch.pieces_b;
  in->clear();
  in->push_back(range);
  for (size_t s = 0; s < steps_.size(); ++s) {
    const bool last = s + 1 == steps_.size();
    std::vector<TextPiece>& dst = last ? out : *next;
    if (!last) dst.clear();
    DI_RETURN_IF_ERROR(apply(steps_[s], text, *in, dst, scratch));
    if (!last) std::swap(in, next);
  }
  return Status::ok();
}

// One HF `Split` over each piece: the matches and the gaps between them cover the piece; the
// behaviour then decides which ranges become pieces (pattern.rs find_matches +
// normalizer.rs split).
Status PreTokenizer::apply(const Step& step, std::string_view text, const std::vector<TextPiece>& in,
                           std::vector<TextPiece>& out, PreTokenizerScratch& scratch) const {
  const auto push = [&out](size_t b, size_t e) {
    if (b < e) out.push_back(TextPiece{b, e});
  };
  for (const TextPiece& piece : in) {
    const std::string_view subject = text.substr(piece.begin, piece.end - piece.begin);
    auto& spans = scratch.spans;
    spans.clear();
    size_t pos = 0;
    size_t gap_begin = 0;
    while (pos < subject.size()) {
      size_t mb = 0, me = 0;
      DI_ASSIGN_OR_RETURN(const bool found, step.regex.find(subject, pos, &mb, &me, scratch.regex));
      if (!found) break;
      if (me == mb) {
        // An empty match splits nothing: step over one character and search again.
        const size_t n = utf8::sequence_length(subject, mb < subject.size() ? mb : subject.size() - 1);
        pos = mb + (n == 0 ? 1 : n);
        continue;
      }
      if (mb > gap_begin) spans.push_back({gap_begin, mb, false});
      spans.push_back({mb, me, true});
      gap_begin = pos = me;
    }
    if (gap_begin < subject.size()) spans.push_back({gap_begin, subject.size(), false});
    if (step.invert) {
      for (auto& sp : spans) sp.is_match = !sp.is_match;
    }
    const size_t base = piece.begin;
    switch (step.behavior) {
      case SplitBehavior::kIsolated:
        for (const auto& sp : spans) push(base + sp.begin, base + sp.end);
        break;
      case SplitBehavior::kRemoved:
        for (const auto& sp : spans) {
          if (!sp.is_match) push(base + sp.begin, base + sp.end);
        }
        break;
      case SplitBehavior::kContiguous:
      case SplitBehavior::kMergedWithPrevious: {
        // Contiguous: runs of equal is_match fuse. MergedWithPrevious: a match joins the
        // piece before it (unless that piece was itself a match).
        const size_t first = out.size();
        bool previous_match = false;
        for (const auto& sp : spans) {
          const bool fuse = step.behavior == SplitBehavior::kContiguous ? sp.is_match == previous_match
                                                                        : sp.is_match && !previous_match;
          if (fuse && out.size() > first) {
            out.back().end = base + sp.end;
          } else {
            out.push_back(TextPiece{base + sp.begin, base + sp.end});
          }
          previous_match = sp.is_match;
        }
        break;
      }
      case SplitBehavior::kMergedWithNext: {
        // Walk backwards: a match joins the piece after it (unless that one was a match).
        const size_t first = out.size();
        bool previous_match = false;
        for (size_t k = spans.size(); k-- > 0;) {
          const auto& sp = spans[k];
          if (sp.is_match && !previous_match && out.size() > first) {
            out.back().begin = base + sp.begin;
          } else {
            out.push_back(TextPiece{base + sp.begin, base + sp.end});
          }
          previous_match = sp.is_match;
        }
        std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
        break;
      }
    }
  }
  return Status::ok();
}

}  // namespace deepinfer
