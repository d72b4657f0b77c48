// Strict JSON reading for checkpoint metadata (config.json, index files, safetensors headers):
// valid UTF-8 only, no duplicate object keys (nlohmann would silently keep the last one), bounded
// nesting and a size cap on files. Owns no state; knows nothing about what the JSON means.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace deepinfer {

// serde_json's default recursion limit; the deepest legitimate document we read nests 4 levels.
inline constexpr size_t kMaxJsonDepth = 128;
// config.json and index files are kilobytes; a bigger one is not a model directory's.
inline constexpr size_t kMaxJsonFileBytes = size_t{64} << 20;

// Parses `text` as exactly one JSON value (surrounding whitespace allowed). Rejects, as
// kCorrupt: invalid UTF-8 (byte offset named), syntax errors (line, column and byte named),
// a key repeated within one object (key and enclosing key named), nesting deeper than
// kMaxJsonDepth. If `top_level_keys` is non-null and the root is an object, it receives the
// root's keys in document order (nlohmann::json itself sorts them). Messages do not name the
// source; callers add it. Thread-safe (no shared state).
Expected<nlohmann::json> parse_json_strict(std::string_view text, std::vector<std::string>* top_level_keys = nullptr);

// Reads and parses the JSON file at `path` with parse_json_strict. Errors name the file:
// kNotFound if it does not exist, kInvalidArgument if it cannot be read or is not a regular
// file, kCorrupt if it is larger than kMaxJsonFileBytes or is not valid strict JSON.
Expected<nlohmann::json> read_json_file(const std::string& path);

}  // namespace deepinfer
