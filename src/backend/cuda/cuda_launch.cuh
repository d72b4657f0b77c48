// Programmatic dependent launch (PDL, sm_90): the decode path's kernels let the stream's next
// kernel start launching while they run, so the gap between two dependent kernels (launch
// processing, block scheduling, prologue) overlaps the previous kernel's tail instead of adding
// to the step's latency — a decode step is a chain of ~16 small kernels per layer.
//
// The contract, per kernel launched with launch_pdl:
//  - pdl_wait() blocks until the previous grid in the stream has completed and its memory is
//    visible. Before it, a kernel only reads data that no kernel writes once the model is
//    placed — weights (placed by host copies; fill_random synchronizes the stream) and the
//    step's host-uploaded inputs (positions, AttentionBatch's device arrays) — and writes only
//    its own shared memory: the dense GEMV's first weight loads, the MLA absorb and W_UV
//    kernels' weight tiles, the split kernel's page lookups, the latent write's RoPE table and
//    (Fp8GemmArgs::w_stable) the dense FP8 wgmma GEMM's first W stages go out there, overlapping
//    the previous kernel's tail. Everything else comes after it, so
//    the kernel sees exactly what a plain launch would (no read-after-write or write-after-read
//    race);
//  - after pdl_wait (never before: a kernel's pre-wait reads rely on every grid before the
//    previous one having completed) it calls pdl_trigger(), allowing the next kernel's blocks to
//    be scheduled (they run their pre-wait part, then wait until this grid completes) — except
//    the GEMMs (small_m_gemm, the FP8 wgmma GEMM of the W8A8 forms), whose dependents would wait
//    beside their last wave; the persistent GEMV triggers once its work is done.
// Measured (V2-Lite decode, run s7-6): bf16 B = 1 3.56 → 3.55 ms per step, FP8 B = 32 15.30 →
// 15.20; triggering in the GEMMs too gave bf16 B = 1 3.49 but FP8 B = 32 16.18. The pre-wait
// loads (run s11-6, same machine, without → with): bf16 B = 1 2.70 → 2.55 ms, FP8 2.85 → 2.71,
// B = 32 −1 %. The GEMV triggering right after its wait instead (s11-7): bf16 B = 1 −0.6 %, FP8
// +2.9 %; not kept.
// Kernels launched the ordinary way (cuBLAS, prefill kernels) keep full stream serialization;
// pdl_wait and pdl_trigger are no-ops in them. Graph capture records the programmatic edges.
// DEEPINFER_CUDA_PDL=0 launches everything the ordinary way (a switch for bisecting).
#pragma once

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_common.h"

namespace deepinfer::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DEEPINFER_CUDA_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// kernel<<<grid, block, smem, s>>>(args...) with programmatic dependent launch allowed. The
// kernel must follow the contract above.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace deepinfer::cuda
