// Tensor: a dtype, a row-major contiguous shape and a reference to device-agnostic bytes.
// Owns nothing but a share of its Buffer; views (row slices, reshapes) share the same Buffer.
// Deliberately not a framework tensor: no strides beyond row-major, no autograd, no ops.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace deepinfer {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  static Device cpu() { return {}; }
};

// A span of bytes on one device, released by its owner's deleter when the last share goes.
class Buffer {
 public:
  using Deleter = void (*)(void* data, void* context);
  Buffer(void* data, size_t n_bytes, Device device, Deleter deleter, void* context)
      : data_(data), n_bytes_(n_bytes), device_(device), deleter_(deleter), context_(context) {}
  ~Buffer() {
    if (deleter_) deleter_(data_, context_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t n_bytes() const { return n_bytes_; }
  Device device() const { return device_; }

  // 64-byte-aligned host memory, zero-initialized.
  static std::shared_ptr<Buffer> allocate_host(size_t n_bytes);
  // Wraps memory owned elsewhere; `keep_alive` is held until the Buffer dies (e.g. an mmap).
  static std::shared_ptr<Buffer> wrap(void* data, size_t n_bytes, Device device,
                                      std::shared_ptr<void> keep_alive);

 private:
  void* data_;
  size_t n_bytes_;
  Device device_;
  Deleter deleter_;
  void* context_;
};

inline constexpr int kMaxDims = 4;

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, size_t offset_bytes, DType dtype,
         std::initializer_list<int64_t> shape);
  Tensor(std::shared_ptr<Buffer> buffer, size_t offset_bytes, DType dtype,
         const std::vector<int64_t>& shape);

  // Zero-filled host tensor.
  static Tensor empty_host(DType dtype, std::initializer_list<int64_t> shape);
  static Tensor empty_host(DType dtype, const std::vector<int64_t>& shape);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_ ? buffer_->device() : Device::cpu(); }
  int ndim() const { return ndim_; }
  int64_t size(int dim) const {
    DI_CHECK(dim >= 0 && dim < ndim_);
    return shape_[dim];
  }
  std::vector<int64_t> shape() const { return {shape_.begin(), shape_.begin() + ndim_}; }
  int64_t numel() const;
  size_t n_bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  // "[2, 3] BF16"
  std::string describe() const;

  void* raw_data() const {
    DI_CHECK(buffer_ != nullptr);
    return static_cast<char*>(buffer_->data()) + offset_bytes_;
  }
  template <typename T>
  T* data() const {
    DI_CHECK_EQ(sizeof(T), dtype_size(dtype_));
    return static_cast<T*>(raw_data());
  }

  // Rows [begin, end) of dim 0, sharing the buffer.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same bytes, new shape (numel must match).
  Tensor reshape(std::initializer_list<int64_t> shape) const;
  Tensor reshape(const std::vector<int64_t>& shape) const;
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }

 private:
  void set_shape(const int64_t* dims, size_t n);

  std::shared_ptr<Buffer> buffer_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::kF32;
  std::array<int64_t, kMaxDims> shape_{};
  int ndim_ = 0;
};

}  // namespace deepinfer
