#include "tokenizer/utf8.h"

namespace deepinfer::utf8 {

namespace {

// Bytes a lead byte needs after itself (0: not a lead byte of a multi-byte sequence), and the
// allowed range of the first continuation byte (narrowed for E0, ED, F0, F4 to exclude overlong
// forms, surrogates and code points above U+10FFFF).
struct LeadInfo {
  int n_continuation = 0;
  uint8_t lo = 0x80, hi = 0xBF;
};

LeadInfo lead_info(uint8_t b0) {
  if (b0 >= 0xC2 && b0 <= 0xDF) return {1, 0x80, 0xBF};
  if (b0 == 0xE0) return {2, 0xA0, 0xBF};
  if (b0 == 0xED) return {2, 0x80, 0x9F};
  if (b0 >= 0xE1 && b0 <= 0xEF) return {2, 0x80, 0xBF};
  if (b0 == 0xF0) return {3, 0x90, 0xBF};
  if (b0 >= 0xF1 && b0 <= 0xF3) return {3, 0x80, 0xBF};
  if (b0 == 0xF4) return {3, 0x80, 0x8F};
  return {};
}

// Number of bytes from bytes[i] that are a prefix of a well-formed sequence (≥ 1 if the lead
// byte is valid), capped at the sequence's full length.
size_t valid_prefix_length(std::string_view bytes, size_t i) {
  const auto b0 = static_cast<uint8_t>(bytes[i]);
  if (b0 < 0x80) return 1;
  const LeadInfo info = lead_info(b0);
  if (info.n_continuation == 0) return 0;
  size_t k = 1;
  for (int c = 0; c < info.n_continuation && i + k < bytes.size(); ++c) {
    const auto b = static_cast<uint8_t>(bytes[i + k]);
    const uint8_t lo = c == 0 ? info.lo : 0x80;
    const uint8_t hi = c == 0 ? info.hi : 0xBF;
    if (b < lo || b > hi) break;
    ++k;
  }
  return k;
}

}  // namespace

size_t sequence_length(std::string_view bytes, size_t i) {
  const auto b0 = static_cast<uint8_t>(bytes[i]);
  if (b0 < 0x80) return 1;
  const LeadInfo info = lead_info(b0);
  if (info.n_continuation == 0) return 0;
  const size_t k = valid_prefix_length(bytes, i);
  return k == static_cast<size_t>(info.n_continuation) + 1 ? k : 0;
}

uint32_t decode(std::string_view bytes, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + k])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void append_codepoint(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

void append_lossy(std::string& out, std::string_view bytes) {
  size_t i = 0;
  size_t run_begin = 0;  // start of the current run of well-formed bytes, copied in one append
  while (i < bytes.size()) {
    const size_t n = sequence_length(bytes, i);
    if (n > 0) {
      i += n;
      continue;
    }
    out.append(bytes.substr(run_begin, i - run_begin));
    const size_t k = valid_prefix_length(bytes, i);
    out.append(kReplacement);
    i += k == 0 ? 1 : k;  // the maximal subpart, or the single invalid byte
    run_begin = i;
  }
  out.append(bytes.substr(run_begin));
}

size_t incomplete_suffix_length(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const auto b0 = static_cast<uint8_t>(bytes[i]);
    if (b0 < 0x80) return 0;
    const LeadInfo info = lead_info(b0);
    if (info.n_continuation == 0) continue;  // a continuation (or invalid) byte: look further back
    // A lead byte: the tail is incomplete iff it is a valid prefix shorter than the sequence.
    return valid_prefix_length(bytes, i) == back && back < static_cast<size_t>(info.n_continuation) + 1 ? back : 0;
  }
  return 0;
}

bool is_valid(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // ASCII fast path: 8 bytes at a time.
    while (i + 8 <= text.size()) {
      uint64_t word;
      __builtin_memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const size_t n = sequence_length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace deepinfer::utf8
