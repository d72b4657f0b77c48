// Measured ceilings of one GPU, the denominators of `deepinfer bench`'s roofline floors:
// device-to-device copy bandwidth and the dense bf16 GEMM rate, measured as
// scripts/bench/torch_peer.py measures them so both engines' floors mean the same thing, and the
// dense FP8 GEMM rate (cuBLASLt), the denominator of FP8 checkpoints' linear layers.
// Host code (no kernels of its own); the engine never calls it.
#pragma once

#include <string>

#include "backend/backend.h"

namespace deepinfer {

struct DeviceLimits {
  double copy_bytes_per_s = 0.0;  // 2 GiB cudaMemcpyAsync device → device, bytes read + written per
                                  // second: 2 · 2 GiB / median time of 20 reps after 3 warm-ups
  double bf16_flops_per_s = 0.0;  // 2 · 8192³ / median time of 20 bf16 cublasGemmEx (fp32 accumulation,
                                  // bf16 output) after 3 warm-ups
  double fp8_flops_per_s = 0.0;   // 2 · 8192³ / median time of 20 e4m3 × e4m3 → bf16 cublasLtMatmul
                                  // (fp32 accumulation, unit scales, "TN" as FP8 requires) after 3
                                  // warm-ups; 0 where cuBLASLt has no FP8 kernel for the GPU
  std::string gpu_name;           // cudaDeviceProp::name
};

// Measures on `cuda_backend`'s stream (CUDA events). Precondition: cuda_backend is the
// CudaBackend from make_backend("cuda"); about 4.5 GiB of device memory free. Blocks for a few
// seconds, synchronizes the stream, frees everything it allocated. Engine thread only (it uses
// the backend's stream). A failed CUDA or cuBLAS call aborts, naming it.
DeviceLimits measure_device_limits(Backend& cuda_backend);

}  // namespace deepinfer
