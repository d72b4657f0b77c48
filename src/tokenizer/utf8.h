// UTF-8 helpers for the tokenizer layer: sequence lengths, code point encoding, and the exact
// lossy conversion Hugging Face tokenizers applies to decoded bytes (Rust's
// String::from_utf8_lossy). Pure functions over bytes; no Unicode property data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence starting at bytes[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 if the bytes there do not form one.
// Precondition: i < bytes.size().
size_t sequence_length(std::string_view bytes, size_t i);

// Decodes the well-formed sequence of `n` bytes at bytes[i] (n from sequence_length, > 0).
uint32_t decode(std::string_view bytes, size_t i, size_t n);

// Appends the UTF-8 form of `cp`. Precondition: cp ≤ 0x10FFFF and not a surrogate.
void append_codepoint(std::string& out, uint32_t cp);

// Appends `bytes`, each maximal ill-formed subsequence replaced by one U+FFFD ("substitution of
// maximal subparts", Unicode §3.9; what Rust's from_utf8_lossy and HF decode do).
void append_lossy(std::string& out, std::string_view bytes);

// Length (0..3) of the longest suffix of `bytes` that is a proper prefix of some well-formed
// sequence, i.e. bytes that a later byte could still complete. 0 if the end is a boundary.
size_t incomplete_suffix_length(std::string_view bytes);

// True if every byte of `text` is part of a well-formed sequence.
bool is_valid(std::string_view text);

}  // namespace deepinfer::utf8
