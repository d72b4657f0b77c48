#include "io/text.h"

#include <cstdint>

#include <fmt/format.h>

namespace deepinfer {

namespace {

// Length of the well-formed UTF-8 sequence starting at text[i], or 0 if there is none.
size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const auto cont = [&](size_t k, uint8_t lo, uint8_t hi) { return k < text.size() && byte(k) >= lo && byte(k) <= hi; };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(i + 1, 0x80, 0xBF) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    // E0 needs A0..BF (no overlong forms); ED needs 80..9F (no UTF-16 surrogates).
    const uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80;
    const uint8_t hi = b0 == 0xED ? 0x9F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2, 0x80, 0xBF) ? 3 : 0;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    // F0 needs 90..BF (no overlong forms); F4 needs 80..8F (nothing above U+10FFFF).
    const uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80;
    const uint8_t hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

// Appends the escaped prefix of `text` to `out`; returns the number of input bytes consumed.
size_t append_escaped(std::string& out, std::string_view text, size_t max_bytes, bool escape_quote) {
  size_t i = 0;
  while (i < text.size() && i < max_bytes) {
    const size_t n = utf8_sequence_length(text, i);
    const auto b = static_cast<uint8_t>(text[i]);
    if (n == 0 || (n == 1 && (b < 0x20 || b == 0x7F || b == '\\' || (escape_quote && b == '\'')))) {
      out += fmt::format("\\x{:02X}", b);
      i += 1;
    } else {
      if (i + n > max_bytes) break;  // never cut a character in half
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return i;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = utf8_sequence_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

std::string escape_text(std::string_view text, size_t max_bytes) {
  std::string out;
  const size_t consumed = append_escaped(out, text, max_bytes, /*escape_quote=*/false);
  if (consumed < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

std::string quote_text(std::string_view text, size_t max_bytes) {
  std::string out = "'";
  const size_t consumed = append_escaped(out, text, max_bytes, /*escape_quote=*/true);
  out += '\'';
  if (consumed < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

}  // namespace deepinfer
