#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace deepinfer::byte_level {

namespace {

struct Tables {
  std::array<uint32_t, 256> cp_of_byte{};
  std::array<int16_t, 0x144> byte_of_cp{};  // every alphabet code point is < U+0144
};

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes keep their code point; the rest, in
// byte order, take U+0100 onwards.
Tables make_tables() {
  Tables t;
  t.byte_of_cp.fill(-1);
  uint32_t next = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? b : next++;
    t.cp_of_byte[b] = cp;
    t.byte_of_cp[cp] = static_cast<int16_t>(b);
  }
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

}  // namespace

uint32_t codepoint_of_byte(uint8_t b) { return tables().cp_of_byte[b]; }

int byte_of_codepoint(uint32_t cp) { return cp < 0x144 ? tables().byte_of_cp[cp] : -1; }

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append_codepoint(out, codepoint_of_byte(static_cast<uint8_t>(c)));
  return out;
}

std::optional<std::string> decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const size_t n = utf8::sequence_length(token, i);
    if (n == 0) return std::nullopt;
    const int b = byte_of_codepoint(utf8::decode(token, i, n));
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
    i += n;
  }
  return out;
}

}  // namespace deepinfer::byte_level
