// Text hygiene for file parsers: strict UTF-8 validation and escaping of untrusted text (names,
// parser excerpts) before it goes into an error message. Owns no state; parses no JSON.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer {

// Byte offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or nullopt if all of `text` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// `text` made safe for a one-line, valid-UTF-8 message: control bytes, backslashes and invalid
// UTF-8 become \xNN; text past `max_bytes` is cut at a character boundary and
// "... (N bytes)" appended, so a hostile 50 MB name cannot flood a log line.
std::string escape_text(std::string_view text, size_t max_bytes = 160);

// escape_text(text), single quotes escaped too, in single quotes: how every parser error names
// a tensor, key or file.
std::string quote_text(std::string_view text, size_t max_bytes = 160);

}  // namespace deepinfer
