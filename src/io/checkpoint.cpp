#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>

#include <fmt/format.h>

#include "io/text.h"

namespace deepinfer {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::string_view kIndexFile = "model.safetensors.index.json";

std::string quote_path(const fs::path& path) { return quote_text(path.string(), 4096); }

// An index's shard reference must be a relative path that stays inside the model directory
// lexically: no root, no '..'. Subdirectories are allowed. Symlinks are deliberately not
// resolved, since the Hugging Face cache links every shard to a blob outside the snapshot.
Status check_shard_name(const std::string& index_path, const std::string& tensor, const std::string& shard) {
  const auto reject = [&](std::string_view why) {
    return make_error(StatusCode::kCorrupt, "{}: tensor {} maps to shard {}, which {}", quote_text(index_path, 4096),
                      quote_text(tensor), quote_text(shard), why);
  };
  if (shard.empty()) return reject("is empty");
  if (shard.find('\0') != std::string::npos) return reject("contains a NUL byte");
  const fs::path path(shard);
  if (path.has_root_path()) return reject("is an absolute path outside the model directory");
  for (const fs::path& component : path) {
    if (component == "..") return reject("has a '..' component leading outside the model directory");
  }
  if (!path.has_filename()) return reject("does not name a file");
  return Status::ok();
}

}  // namespace

Status Checkpoint::index_tensors() {
  by_name_.clear();
  total_bytes_ = 0;
  for (size_t f = 0; f < files_.size(); ++f) {
    const auto& entries = files_[f].entries();
    for (size_t e = 0; e < entries.size(); ++e) {
      const auto [it, inserted] = by_name_.emplace(entries[e].name, Location{f, e});
      if (!inserted) {
        return make_error(StatusCode::kCorrupt, "checkpoint {}: tensor {} appears in both {} and {}",
                          quote_text(dir_, 4096), quote_text(entries[e].name),
                          quote_text(files_[it->second.file].path(), 4096), quote_text(files_[f].path(), 4096));
      }
      total_bytes_ += static_cast<int64_t>(entries[e].n_bytes());
    }
  }
  return Status::ok();
}

Expected<Checkpoint> Checkpoint::open(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  const fs::file_status root_status = fs::status(root, ec);
  if (ec && root_status.type() != fs::file_type::not_found) {
    return make_error(StatusCode::kInvalidArgument, "cannot access model directory {}: {}", quote_text(dir, 4096),
                      ec.message());
  }
  if (!fs::exists(root_status)) {
    return make_error(StatusCode::kNotFound, "model directory {} does not exist", quote_text(dir, 4096));
  }
  if (!fs::is_directory(root_status)) {
    return make_error(StatusCode::kInvalidArgument, "model path {} is not a directory", quote_text(dir, 4096));
  }

  Checkpoint checkpoint;
  checkpoint.dir_ = dir;

  const fs::path config_path = root / "config.json";
  auto config = read_json_file(config_path.string());
  if (!config) {
    if (config.status().code() == StatusCode::kNotFound) {
      return make_error(StatusCode::kNotFound, "model directory {} has no config.json ({} not found)",
                        quote_text(dir, 4096), quote_path(config_path));
    }
    return config.status();
  }
  if (!config->is_object()) {
    return make_error(StatusCode::kCorrupt, "{}: must be a JSON object, got {}", quote_path(config_path),
                      config->type_name());
  }
  checkpoint.config_ = std::move(config).value();

  const fs::path index_path = root / kIndexFile;
  if (fs::exists(index_path, ec)) {
    const std::string index_name = index_path.string();
    DI_ASSIGN_OR_RETURN(Json index, read_json_file(index_name));
    const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
    if (!index.is_object() || weight_map == index.end() || !weight_map->is_object()) {
      return make_error(StatusCode::kCorrupt, "{}: field 'weight_map' must be an object of tensor name -> shard file",
                        quote_text(index_name, 4096));
    }
    if (weight_map->empty()) {
      return make_error(StatusCode::kCorrupt, "{}: field 'weight_map' lists no tensors", quote_text(index_name, 4096));
    }
    // shard file -> first tensor naming it (for messages); std::map opens shards in name order.
    std::map<std::string, std::string> shards;
    for (const auto& [tensor, shard] : weight_map->items()) {
      if (!shard.is_string()) {
        return make_error(StatusCode::kCorrupt, "{}: tensor {} maps to a {}, not a shard file name",
                          quote_text(index_name, 4096), quote_text(tensor), shard.type_name());
      }
      const auto& shard_name = shard.get_ref<const std::string&>();
      DI_RETURN_IF_ERROR(check_shard_name(index_name, tensor, shard_name));
      shards.emplace(shard_name, tensor);
    }
    std::map<std::string, size_t> shard_file;  // shard name -> index into files_
    for (const auto& [shard_name, tensor] : shards) {
      const fs::path shard_path = root / shard_name;
      if (!fs::exists(shard_path, ec)) {
        return make_error(StatusCode::kNotFound, "{}: shard {} (holding tensor {}) does not exist",
                          quote_text(index_name, 4096), quote_path(shard_path), quote_text(tensor));
      }
      DI_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(shard_path.string()));
      shard_file.emplace(shard_name, checkpoint.files_.size());
      checkpoint.files_.push_back(std::move(file));
    }
    DI_RETURN_IF_ERROR(checkpoint.index_tensors());
    for (const auto& [tensor, shard] : weight_map->items()) {
      const auto& shard_name = shard.get_ref<const std::string&>();
      const auto it = checkpoint.by_name_.find(tensor);
      if (it == checkpoint.by_name_.end() || it->second.file != shard_file.at(shard_name)) {
        return make_error(StatusCode::kCorrupt, "{}: tensor {} is listed in shard {}, which does not contain it",
                          quote_text(index_name, 4096), quote_text(tensor), quote_text(shard_name));
      }
    }
    return checkpoint;
  }

  std::vector<std::string> names;
  fs::directory_iterator it(root, ec);
  if (ec) {
    return make_error(StatusCode::kInvalidArgument, "cannot list model directory {}: {}", quote_text(dir, 4096),
                      ec.message());
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (name.ends_with(".safetensors") && it->is_regular_file(type_ec)) names.push_back(name);
  }
  if (ec) {
    return make_error(StatusCode::kInvalidArgument, "cannot list model directory {}: {}", quote_text(dir, 4096),
                      ec.message());
  }
  if (names.empty()) {
    return make_error(StatusCode::kNotFound, "model directory {} has no *.safetensors file and no {}",
                      quote_text(dir, 4096), kIndexFile);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    DI_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open((root / name).string()));
    checkpoint.files_.push_back(std::move(file));
  }
  DI_RETURN_IF_ERROR(checkpoint.index_tensors());
  return checkpoint;
}

const SafetensorsEntry* Checkpoint::entry(std::string_view name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  return &files_[it->second.file].entries()[it->second.entry];
}

Expected<Tensor> Checkpoint::get(std::string_view name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return make_error(StatusCode::kNotFound, "tensor {} not found in checkpoint {}", quote_text(name),
                      quote_text(dir_, 4096));
  }
  const SafetensorsFile& file = files_[it->second.file];
  const SafetensorsEntry& e = file.entries()[it->second.entry];
  if (e.shape.size() > static_cast<size_t>(kMaxDims)) {
    return make_error(StatusCode::kUnsupported,
                      "tensor {} in checkpoint {} has {} dimensions; at most {} are supported", quote_text(name),
                      quote_text(dir_, 4096), e.shape.size(), kMaxDims);
  }
  return file.tensor(e);
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, location] : by_name_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace deepinfer
