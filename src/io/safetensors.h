// safetensors: a header validator exactly as strict as the format's reference implementation,
// a zero-copy reader over an mmap, and a writer for tests and tools.
// Owns the parsing and validation of one file; multi-file checkpoints (index.json, sharding) are
// checkpoint.h's business, and nothing here converts dtypes or copies tensor data.
//
// File layout: [u64 little-endian N][N bytes of UTF-8 JSON header][data section]. The header maps
// tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data
// section) plus an optional "__metadata__" object of strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace deepinfer {

// The reference implementation's cap on the header length.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // any rank, every dim >= 0; empty = scalar
  uint64_t begin = 0;          // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
  uint64_t n_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;        // in header (file) order
  std::map<std::string, std::string> metadata;  // "__metadata__", empty if absent
  uint64_t data_offset = 0;                     // = 8 + N: where the data section starts
  uint64_t data_bytes = 0;                      // = file size - data_offset
};

// Parses and validates a whole safetensors file held in memory (`data` points to `size` bytes;
// `data` may be null only if size == 0). Pure: no I/O, no allocation sized by untrusted fields
// before they are checked against `size`. On success the entries tile the data section exactly.
// Errors: kCorrupt for any violation of the format, kUnsupported for a dtype DeepInfer does not
// handle (e.g. F8_E5M2, U16); the message names the tensor and field at fault but not the file
// (callers add it) and never contains addresses. Thread-safe.
Expected<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, size_t size);

// Heterogeneous-lookup hash so maps keyed by std::string can be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// One validated safetensors file, memory-mapped read-only. Cheap to copy (the mapping is
// shared) and immutable after open(): all methods are safe to call from any thread.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors name the file: kNotFound / kInvalidArgument from the
  // mapping, kCorrupt / kUnsupported from parse_safetensors_header.
  static Expected<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t data_offset() const { return header_.data_offset; }

  // The entry named `name`, or nullptr. The pointer lives as long as this object (or a copy).
  const SafetensorsEntry* find(std::string_view name) const;

  // A zero-copy CPU view of the entry's bytes; its Buffer covers exactly those bytes and keeps
  // the mapping alive after this object is gone. The memory is read-only (writes fault) and
  // only as aligned as the file's offsets make it: data_offset is a multiple of 8 for files
  // written by write_safetensors, but a tensor's begin need not be a multiple of its dtype size.
  // Preconditions: `entry` is an element of entries(); entry.shape.size() <= kMaxDims.
  Tensor tensor(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile(std::string path, std::shared_ptr<MappedFile> mapping, SafetensorsHeader header);

  std::string path_;
  std::shared_ptr<MappedFile> mapping_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> by_name_;  // -> entries index
};

// Writes `tensors` (CPU, defined) in the given order with data offsets in that order, and
// `metadata` as "__metadata__" (omitted when empty). The header is padded with spaces to a
// multiple of 8 bytes. Writes `path`.tmp, then renames it over `path`, so readers never see a
// partial file. To keep every tensor aligned to its dtype size, order tensors by decreasing
// dtype size. Errors: kInvalidArgument for duplicate, "__metadata__" or non-UTF-8 names, an
// undefined or non-CPU tensor, or an I/O failure (naming the path).
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace deepinfer
