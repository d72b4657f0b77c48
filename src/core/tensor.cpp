#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace deepinfer {

std::shared_ptr<Buffer> Buffer::allocate_host(size_t n_bytes) {
  const size_t rounded = ((n_bytes + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  DI_CHECK(p != nullptr);
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  return std::make_shared<Buffer>(p, n_bytes, Device::cpu(),
                                  [](void* data, void*) { std::free(data); }, nullptr);
}

std::shared_ptr<Buffer> Buffer::wrap(void* data, size_t n_bytes, Device device,
                                     std::shared_ptr<void> keep_alive) {
  auto* holder = new std::shared_ptr<void>(std::move(keep_alive));
  return std::make_shared<Buffer>(
      data, n_bytes, device,
      [](void*, void* context) { delete static_cast<std::shared_ptr<void>*>(context); }, holder);
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, size_t offset_bytes, DType dtype,
               std::initializer_list<int64_t> shape)
    : buffer_(std::move(buffer)), offset_bytes_(offset_bytes), dtype_(dtype) {
  set_shape(shape.begin(), shape.size());
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, size_t offset_bytes, DType dtype,
               const std::vector<int64_t>& shape)
    : buffer_(std::move(buffer)), offset_bytes_(offset_bytes), dtype_(dtype) {
  set_shape(shape.data(), shape.size());
}

void Tensor::set_shape(const int64_t* dims, size_t n) {
  DI_CHECK_LE(n, static_cast<size_t>(kMaxDims));
  ndim_ = static_cast<int>(n);
  for (size_t i = 0; i < n; ++i) {
    DI_CHECK_GE(dims[i], 0);
    shape_[i] = dims[i];
  }
  if (buffer_) DI_CHECK_LE(offset_bytes_ + n_bytes(), buffer_->n_bytes());
}

Tensor Tensor::empty_host(DType dtype, std::initializer_list<int64_t> shape) {
  return empty_host(dtype, std::vector<int64_t>(shape));
}

Tensor Tensor::empty_host(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor(Buffer::allocate_host(static_cast<size_t>(n) * dtype_size(dtype)), 0, dtype, shape);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return n;
}

std::string Tensor::describe() const {
  return fmt::format("[{}] {}", fmt::join(shape(), ", "), dtype_name(dtype_));
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  DI_CHECK_GE(ndim_, 1);
  DI_CHECK(0 <= begin && begin <= end && end <= shape_[0]);
  const size_t row_bytes = n_bytes() / (shape_[0] == 0 ? 1 : static_cast<size_t>(shape_[0]));
  Tensor t = *this;
  t.offset_bytes_ = offset_bytes_ + static_cast<size_t>(begin) * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> shape) const {
  return reshape(std::vector<int64_t>(shape));
}

Tensor Tensor::reshape(const std::vector<int64_t>& shape) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  DI_CHECK_EQ(n, numel());
  Tensor t = *this;
  t.set_shape(shape.data(), shape.size());
  return t;
}

}  // namespace deepinfer
