#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <tuple>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/json_file.h"
#include "io/text.h"

namespace deepinfer {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";

template <typename... Args>
Status corrupt(fmt::format_string<Args...> format, Args&&... args) {
  return make_error(StatusCode::kCorrupt, format, std::forward<Args>(args)...);
}

// "[2, 3]"; long (hostile) shapes are elided after 8 dims.
std::string format_shape(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size() && i < 8; ++i) out += fmt::format("{}{}", i ? ", " : "", shape[i]);
  if (shape.size() > 8) out += fmt::format(", ... ({} dims)", shape.size());
  return out + "]";
}

// A JSON value for an error message: numbers verbatim, anything else by type (never dump() an
// arbitrary value: it may be huge).
std::string describe_json(const Json& value) {
  if (value.is_number()) return value.dump();
  return std::string(value.type_name());
}

// A non-negative JSON integer. "-0" parses as a signed zero; serde accepts it as usize 0.
std::optional<uint64_t> json_to_u64(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  return std::nullopt;
}

uint64_t read_le_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Expected<SafetensorsEntry> parse_entry(const std::string& name, const Json& value) {
  const std::string who = fmt::format("tensor {}", quote_text(name));
  if (!value.is_object()) return corrupt("{}: entry must be an object, got {}", who, value.type_name());
  const auto field = [&](const char* key) -> const Json* {
    const auto it = value.find(key);
    return it == value.end() ? nullptr : &*it;
  };
  SafetensorsEntry entry;
  entry.name = name;

  const Json* dtype = field("dtype");
  if (dtype == nullptr) return corrupt("{}: missing field 'dtype'", who);
  if (!dtype->is_string()) return corrupt("{}: field 'dtype' must be a string, got {}", who, dtype->type_name());
  const auto& dtype_text = dtype->get_ref<const std::string&>();
  const auto parsed_dtype = dtype_from_name(dtype_text);
  if (!parsed_dtype) {
    return make_error(StatusCode::kUnsupported, "{}: field 'dtype' is {}, which DeepInfer does not support", who,
                      quote_text(dtype_text));
  }
  entry.dtype = *parsed_dtype;

  const Json* shape = field("shape");
  if (shape == nullptr) return corrupt("{}: missing field 'shape'", who);
  if (!shape->is_array()) return corrupt("{}: field 'shape' must be an array, got {}", who, shape->type_name());
  entry.shape.reserve(shape->size());
  for (size_t i = 0; i < shape->size(); ++i) {
    const auto dim = json_to_u64((*shape)[i]);
    if (!dim) {
      return corrupt("{}: field 'shape' dimension {} must be a non-negative integer, got {}", who, i,
                     describe_json((*shape)[i]));
    }
    if (*dim > static_cast<uint64_t>(INT64_MAX)) {
      return corrupt("{}: field 'shape' dimension {} is {}, above 2^63 - 1", who, i, *dim);
    }
    entry.shape.push_back(static_cast<int64_t>(*dim));
  }

  const Json* offsets = field("data_offsets");
  if (offsets == nullptr) return corrupt("{}: missing field 'data_offsets'", who);
  const auto begin = offsets->is_array() && offsets->size() == 2 ? json_to_u64((*offsets)[0]) : std::nullopt;
  const auto end = offsets->is_array() && offsets->size() == 2 ? json_to_u64((*offsets)[1]) : std::nullopt;
  if (!begin || !end) {
    return corrupt("{}: field 'data_offsets' must be an array of two non-negative integers", who);
  }
  entry.begin = *begin;
  entry.end = *end;
  if (entry.begin > entry.end) {
    return corrupt("{}: field 'data_offsets' [{}, {}] ends before it begins", who, entry.begin, entry.end);
  }

  // Checked multiplication, in the order the format's reference implementation folds it. Signed:
  // downstream code computes element counts in int64, so even a zero-size tensor must not have a
  // prefix product above 2^63 - 1 (the reference's usize bound is 2^64 - 1).
  int64_t n_bytes = 1;
  for (int64_t dim : entry.shape) {
    if (__builtin_mul_overflow(n_bytes, dim, &n_bytes)) {
      return corrupt("{}: field 'shape' {} overflows a 64-bit element count", who, format_shape(entry.shape));
    }
  }
  if (__builtin_mul_overflow(n_bytes, static_cast<int64_t>(dtype_size(entry.dtype)), &n_bytes)) {
    return corrupt("{}: field 'shape' {} of {} overflows a 64-bit byte count", who, format_shape(entry.shape),
                   dtype_name(entry.dtype));
  }
  if (static_cast<uint64_t>(n_bytes) != entry.n_bytes()) {
    return corrupt("{}: field 'shape' {} of {} needs {} bytes but field 'data_offsets' [{}, {}] spans {}", who,
                   format_shape(entry.shape), dtype_name(entry.dtype), n_bytes, entry.begin, entry.end,
                   entry.n_bytes());
  }
  return entry;
}

Status parse_metadata(const Json& value, std::map<std::string, std::string>& out) {
  if (!value.is_object()) return corrupt("'__metadata__' must be an object of strings, got {}", value.type_name());
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return corrupt("'__metadata__' entry {} must be a string, got {}", quote_text(key), item.type_name());
    }
    out.emplace(key, item.get<std::string>());
  }
  return Status::ok();
}

// The format's offset rule: sorted by offset, the tensors cover [0, data_bytes) exactly, each
// beginning where the previous one ended (zero-size tensors may share an offset).
Status check_tiling(const std::vector<SafetensorsEntry>& entries, uint64_t data_bytes) {
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(entries[a].begin, entries[a].end, a) < std::tie(entries[b].begin, entries[b].end, b);
  });
  uint64_t expected = 0;
  const SafetensorsEntry* previous = nullptr;
  for (size_t i : order) {
    const SafetensorsEntry& e = entries[i];
    if (e.begin > expected) {
      return corrupt("tensor {}: field 'data_offsets' [{}, {}] leaves a gap: {} at byte {}", quote_text(e.name),
                     e.begin, e.end,
                     previous ? fmt::format("the previous tensor {} ends", quote_text(previous->name))
                              : std::string("the data section starts"),
                     expected);
    }
    if (e.begin < expected) {
      return corrupt("tensor {}: field 'data_offsets' [{}, {}] overlaps tensor {}, which ends at byte {}",
                     quote_text(e.name), e.begin, e.end, quote_text(previous->name), expected);
    }
    expected = e.end;
    previous = &e;
  }
  if (expected > data_bytes) {
    return corrupt(
        "tensor {}: field 'data_offsets' [{}, {}] runs past the end of the file (the data section is {} bytes)",
        quote_text(previous->name), previous->begin, previous->end, data_bytes);
  }
  if (expected < data_bytes) {
    if (previous == nullptr) return corrupt("the header lists no tensors but the data section is {} bytes", data_bytes);
    return corrupt("the tensors end at byte {} but the data section is {} bytes: the file has trailing bytes", expected,
                   data_bytes);
  }
  return Status::ok();
}

// A JSON string literal. Precondition: `text` is valid UTF-8 (dump() throws otherwise).
std::string json_string(std::string_view text) { return Json(text).dump(); }

}  // namespace

Expected<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, size_t size) {
  DI_CHECK(data != nullptr || size == 0);
  if (size < 8) {
    return corrupt("file is {} bytes; a safetensors file starts with an 8-byte header length", size);
  }
  const uint64_t n_header = read_le_u64(data);
  if (n_header > kMaxSafetensorsHeaderBytes) {
    return corrupt("header length {} exceeds the format's limit of {} bytes", n_header, kMaxSafetensorsHeaderBytes);
  }
  if (n_header > size - 8) {
    return corrupt("header length {} runs past the end of the file ({} bytes follow the length field)", n_header,
                   size - 8);
  }
  const std::string_view text(reinterpret_cast<const char*>(data + 8), static_cast<size_t>(n_header));
  std::vector<std::string> keys;  // parse_json_strict sorts object keys; this keeps file order
  auto json = parse_json_strict(text, &keys);
  if (!json) return json.status().with_context("header");
  // The reference implementation also insists on '{' as the very first byte.
  if (!json->is_object() || text.front() != '{') {
    return corrupt("header must be a JSON object with '{{' as its first byte (got {})", json->type_name());
  }

  SafetensorsHeader header;
  header.data_offset = 8 + n_header;
  header.data_bytes = size - header.data_offset;
  header.entries.reserve(keys.size());
  for (const std::string& key : keys) {
    const auto entry_it = json->find(key);  // named: gcc 13 flags a reference through a temporary iterator
    const Json& value = entry_it.value();
    if (key == kMetadataKey) {
      DI_RETURN_IF_ERROR(parse_metadata(value, header.metadata));
      continue;
    }
    DI_ASSIGN_OR_RETURN(SafetensorsEntry entry, parse_entry(key, value));
    header.entries.push_back(std::move(entry));
  }
  DI_RETURN_IF_ERROR(check_tiling(header.entries, header.data_bytes));
  return header;
}

SafetensorsFile::SafetensorsFile(std::string path, std::shared_ptr<MappedFile> mapping, SafetensorsHeader header)
    : path_(std::move(path)), mapping_(std::move(mapping)), header_(std::move(header)) {
  by_name_.reserve(header_.entries.size());
  for (size_t i = 0; i < header_.entries.size(); ++i) by_name_.emplace(header_.entries[i].name, i);
}

Expected<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  DI_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> mapping, MappedFile::open(path));
  auto header = parse_safetensors_header(mapping->data(), mapping->size());
  if (!header) return header.status().with_context(fmt::format("safetensors file {}", quote_text(path, 4096)));
  return SafetensorsFile(path, std::move(mapping), std::move(header).value());
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.entries[it->second];
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& entry) const {
  const std::less<const SafetensorsEntry*> before;
  const SafetensorsEntry* first = header_.entries.data();
  DI_CHECK(!before(&entry, first) && before(&entry, first + header_.entries.size()));
  DI_CHECK_LE(entry.shape.size(), static_cast<size_t>(kMaxDims));
  // The mapping is PROT_READ; Buffer's API is non-const, and writes through it fault.
  auto* bytes = const_cast<uint8_t*>(mapping_->data()) + header_.data_offset + entry.begin;
  auto buffer = Buffer::wrap(bytes, static_cast<size_t>(entry.n_bytes()), Device::cpu(), mapping_);
  return Tensor(std::move(buffer), 0, entry.dtype, entry.shape);
}

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  const auto invalid = [&](const std::string& what) {
    return make_error(StatusCode::kInvalidArgument, "cannot write safetensors file {}: {}", quote_text(path, 4096),
                      what);
  };
  std::string header = "{";
  if (!metadata.empty()) {
    header += json_string(kMetadataKey) + ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (find_invalid_utf8(key) || find_invalid_utf8(value)) {
        return invalid(fmt::format("metadata entry {} is not valid UTF-8", quote_text(key)));
      }
      header += fmt::format("{}{}:{}", first ? "" : ",", json_string(key), json_string(value));
      first = false;
    }
    header += "}";
  }
  std::unordered_set<std::string_view> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (find_invalid_utf8(name)) return invalid(fmt::format("tensor name {} is not valid UTF-8", quote_text(name)));
    if (name == kMetadataKey) return invalid("'__metadata__' is reserved and cannot name a tensor");
    if (!seen.insert(name).second) return invalid(fmt::format("tensor {} appears twice", quote_text(name)));
    if (!tensor.defined()) return invalid(fmt::format("tensor {} is undefined", quote_text(name)));
    if (tensor.device().kind != DeviceKind::kCpu) {
      return invalid(fmt::format("tensor {} is not in host memory", quote_text(name)));
    }
    const uint64_t n_bytes = tensor.n_bytes();
    header += fmt::format("{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          header.size() > 1 ? "," : "", json_string(name), dtype_name(tensor.dtype()),
                          fmt::join(tensor.shape(), ","), offset, offset + n_bytes);
    offset += n_bytes;
  }
  header += "}";
  // Pad with spaces (JSON whitespace) so the data section starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > kMaxSafetensorsHeaderBytes) {
    return invalid(fmt::format("the header would be {} bytes, above the format's limit", header.size()));
  }

  const std::string tmp_path = path + ".tmp";
  std::FILE* file = std::fopen(tmp_path.c_str(), "wb");
  if (file == nullptr)
    return invalid(fmt::format("cannot create {}: {}", quote_text(tmp_path, 4096), std::strerror(errno)));
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  bool ok = std::fwrite(length, 1, 8, file) == 8 && std::fwrite(header.data(), 1, header.size(), file) == header.size();
  for (size_t i = 0; ok && i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].second;
    if (t.n_bytes() > 0) ok = std::fwrite(t.raw_data(), 1, t.n_bytes(), file) == t.n_bytes();
  }
  const int write_errno = errno;
  ok = std::fclose(file) == 0 && ok;
  if (!ok) {
    std::remove(tmp_path.c_str());
    return invalid(fmt::format("write to {} failed: {}", quote_text(tmp_path, 4096), std::strerror(write_errno)));
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_path.c_str());
    return invalid(fmt::format("cannot rename {} into place: {}", quote_text(tmp_path, 4096), std::strerror(err)));
  }
  return Status::ok();
}

}  // namespace deepinfer
