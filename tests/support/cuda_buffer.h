// Raw device buffers for kernel-level GPU tests (tests that call cuda:: launchers directly):
// cudaMalloc'd memory freed on scope exit, and blocking copies to and from host vectors.
// Include only under DEEPINFER_HAVE_CUDA.
#pragma once

#include <cstddef>
#include <vector>

#include "backend/cuda/cuda_common.h"

namespace deepinfer::testing {

// A device buffer of `bytes`, freed on scope exit.
class DevBuf {
 public:
  explicit DevBuf(size_t bytes) {
    if (bytes > 0) DI_CUDA_CHECK(cudaMalloc(&p_, bytes));
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

template <typename T>
void upload(const DevBuf& d, const std::vector<T>& h) {
  if (!h.empty()) DI_CUDA_CHECK(cudaMemcpy(d.as<void>(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<T> download(const DevBuf& d, size_t n) {
  std::vector<T> h(n);
  if (n > 0) DI_CUDA_CHECK(cudaMemcpy(h.data(), d.as<void>(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace deepinfer::testing
