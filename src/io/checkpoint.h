// Checkpoint: a Hugging Face model directory (config.json + one or more safetensors shards,
// optionally listed by model.safetensors.index.json), opened, validated and memory-mapped.
// Owns the shard mappings and the parsed config JSON; it does not interpret config values or
// check tensor shapes against them (the model loader does that), and never copies tensor data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"
#include "io/json_file.h"
#include "io/safetensors.h"

namespace deepinfer {

class Checkpoint {
 public:
  // Opens the model directory `dir`. Requires `dir`/config.json (a JSON object). If
  // `dir`/model.safetensors.index.json exists, loads exactly the shards its "weight_map" names;
  // otherwise every `dir`/*.safetensors, in name order. Errors (all naming the file, shard or
  // tensor at fault):
  //   kNotFound    dir, config.json or an indexed shard missing; no *.safetensors file at all;
  //   kCorrupt     malformed JSON; an index entry that is not a plain relative file name inside
  //                dir (absolute, '..'); a tensor listed in the index but absent from its shard;
  //                a tensor present in two files; any shard failing safetensors validation;
  //   kUnsupported a shard tensor with a dtype DeepInfer does not handle.
  // Symlinked shards (the Hugging Face cache layout) are followed.
  static Expected<Checkpoint> open(const std::string& dir);

  // The directory as passed to open().
  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }

  bool has(std::string_view name) const { return by_name_.find(name) != by_name_.end(); }
  // The tensor's dtype, shape and byte range without touching its data, or nullptr. The pointer
  // lives as long as this Checkpoint.
  const SafetensorsEntry* entry(std::string_view name) const;
  // A zero-copy, read-only CPU view of the tensor (see SafetensorsFile::tensor); it keeps its
  // shard mapped after this Checkpoint is gone. kNotFound naming the tensor and the directory;
  // kUnsupported for a tensor of more than kMaxDims dimensions.
  Expected<Tensor> get(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;
  // Sum of all tensors' data bytes.
  int64_t total_bytes() const { return total_bytes_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // Immutable after open(): every method is safe to call from any thread.

 private:
  struct Location {
    size_t file;   // index into files_
    size_t entry;  // index into files_[file].entries()
  };

  Checkpoint() = default;
  // Maps every tensor of files_ to its location; kCorrupt if a name occurs in two files.
  Status index_tensors();

  std::string dir_;
  nlohmann::json config_;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, Location, StringHash, std::equal_to<>> by_name_;
  int64_t total_bytes_ = 0;
};

}  // namespace deepinfer
