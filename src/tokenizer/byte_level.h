// The GPT-2 byte-level alphabet (HF `ByteLevel`): each of the 256 byte values is written as one
// printable code point, so vocabulary strings are text. Owns the two fixed tables; knows nothing
// about vocabularies or merges.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer::byte_level {

// The code point that stands for byte `b` ('!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves;
// the other 68 bytes map to U+0100..U+0143 in byte order).
uint32_t codepoint_of_byte(uint8_t b);

// The byte that code point `cp` stands for, or -1 if cp is not in the alphabet.
int byte_of_codepoint(uint32_t cp);

// `bytes` written in the alphabet (what a vocabulary entry looks like).
std::string encode(std::string_view bytes);

// The bytes a vocabulary string stands for, or nullopt if it is not valid UTF-8 or holds a code
// point outside the alphabet.
std::optional<std::string> decode(std::string_view token);

}  // namespace deepinfer::byte_level
