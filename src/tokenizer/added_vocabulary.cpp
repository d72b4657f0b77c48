#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace deepinfer {

namespace {

// Rust's char::is_whitespace: the White_Space property.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Start of the whitespace run that ends at `end` (not before `floor`).
size_t whitespace_run_start(std::string_view text, size_t floor, size_t end) {
  size_t pos = end;
  while (pos > floor) {
    size_t b = pos - 1;
    while (b > floor && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
    const size_t n = utf8::sequence_length(text, b);
    if (n == 0 || b + n != pos || !is_white_space(utf8::decode(text, b, n))) break;
    pos = b;
  }
  return pos;
}

// End of the whitespace run that starts at `begin` (not after `limit`).
size_t whitespace_run_end(std::string_view text, size_t begin, size_t limit) {
  size_t pos = begin;
  while (pos < limit) {
    const size_t n = utf8::sequence_length(text, pos);
    if (n == 0 || pos + n > limit || !is_white_space(utf8::decode(text, pos, n))) break;
    pos += n;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view key, int32_t token) {
  int32_t node = 0;
  for (char c : key) {
    const auto b = static_cast<uint8_t>(c);
    auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1}));
    if (it != children.end() && it->first == b) {
      node = it->second;
      continue;
    }
    const auto child = static_cast<int32_t>(nodes.size());
    children.insert(it, {b, child});
    nodes.emplace_back();  // may reallocate: `children` is not used past this point
    node = child;
  }
  nodes[node].token = token;
  first_byte[static_cast<uint8_t>(key[0])] = true;
  empty = false;
}

int32_t AddedVocabulary::Trie::longest_at(std::string_view text, size_t pos, size_t end, size_t* length) const {
  int32_t node = 0;
  int32_t best = -1;
  for (size_t i = pos; i < end; ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    const auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1}));
    if (it == children.end() || it->first != b) break;
    node = it->second;
    if (nodes[node].token >= 0) {
      best = nodes[node].token;
      *length = i + 1 - pos;
    }
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    (tokens_[i].normalized ? normalized_ : raw_).insert(tokens_[i].content, static_cast<int32_t>(i));
  }
}

void AddedVocabulary::split(std::string_view text, TextPiece range, std::vector<TextSegment>& out) const {
  if (range.begin >= range.end) return;
  if (normalized_.empty) {
    split_pass(raw_, text, range, out);
    return;
  }
  // Pass 1 (raw tokens) over the whole range, then pass 2 inside each plain gap.
  std::vector<TextSegment> first;
  split_pass(raw_, text, range, first);
  for (const TextSegment& seg : first) {
    if (seg.id >= 0) {
      out.push_back(seg);
    } else {
      split_pass(normalized_, text, TextPiece{seg.begin, seg.end}, out);
    }
  }
}

// Leftmost-longest, non-overlapping matches (aho-corasick MatchKind::LeftmostLongest), then
// HF's lstrip / rstrip widening (find_matches in added_vocabulary.rs).
void AddedVocabulary::split_pass(const Trie& trie, std::string_view text, TextPiece range,
                                 std::vector<TextSegment>& out) const {
  size_t plain_begin = range.begin;  // start of the pending plain run
  size_t pos = range.begin;
  while (pos < range.end) {
    if (trie.empty) break;
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    const int32_t t = trie.longest_at(text, pos, range.end, &length);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[t];
    size_t begin = pos;
    size_t end = pos + length;
    if (token.lstrip) begin = whitespace_run_start(text, plain_begin, begin);
    if (token.rstrip) end = whitespace_run_end(text, end, range.end);
    if (begin > plain_begin) out.push_back(TextSegment{plain_begin, begin, -1});
    out.push_back(TextSegment{begin, end, token.id});
    plain_begin = pos = end;
  }
  if (plain_begin < range.end) out.push_back(TextSegment{plain_begin, range.end, -1});
}

}  // namespace deepinfer
