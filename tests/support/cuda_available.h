// GPU tests skip (GTEST_SKIP) where this build has no CUDA backend or the machine no GPU, so the
// same suite runs in CI (compile + skip) and on the GPU machine (run).
#pragma once

#include <gtest/gtest.h>

#include "backend/backend.h"

namespace deepinfer::testing {

// A CUDA backend on GPU 0, or null when none can be made (the reason is printed once).
inline std::unique_ptr<Backend> try_cuda_backend() {
  auto b = make_backend("cuda");
  if (!b) return nullptr;
  return std::move(*b);
}

}  // namespace deepinfer::testing

#define DI_REQUIRE_GPU(backend_ptr)                                                    \
  do {                                                                                 \
    if (!(backend_ptr)) GTEST_SKIP() << "no CUDA backend/GPU here (runs on the GPU machine)"; \
  } while (0)
