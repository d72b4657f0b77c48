// MappedFile: a read-only memory map of a whole file (checkpoint shards are never copied).
// Owns the mapping; tensors borrow it through Buffer::wrap with a shared_ptr keep-alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace deepinfer {

class MappedFile {
 public:
  // Maps `path` read-only. Errors name the path (kNotFound, kInvalidArgument for directories).
  static Expected<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace deepinfer
