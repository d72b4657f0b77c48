// LinearWeight: one nn.Linear weight as stored (fp32, bf16, or FP8 e4m3 with 128x128 block
// scales), computing y = x · Wᵀ. Owns nothing but tensor shares; the bytes usually live in a
// memory-mapped checkpoint. Dequantization helpers here are the single definition of the FP8
// block-scale rule: W[n,k] = float(q[n,k]) · scale_inv[n / block_n, k / block_k].
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

struct LinearWeight {
  Tensor weight;     // [n_out, n_in] F32 | BF16 | F8E4M3
  Tensor scale_inv;  // [ceil(n_out / block_n), ceil(n_in / block_k)] F32; F8E4M3 only
  int64_t block_n = 0;
  int64_t block_k = 0;
  // block_n = 1 (one scale row per output row, as the CUDA placement stores FP8): whether every
  // aligned 128-row block [128·i, 128·i + 128) shares one scale row (placed from 128-row
  // checkpoint blocks at block-aligned offsets), so the FP8 wgmma GEMM may read one per block.
  bool uniform_row_blocks = false;
  // A backend's derived copies of the weight in layouts its kernels read; empty where there are
  // none. The CUDA placement's fp32 router keeps its bf16 split image in `derived`
  // (cuda/router_split.h: [tiles × chunks, parts, 4096] BF16) and, where its values are bf16
  // values, [W | W] in `derived2` ([n_out, 2·n_in] BF16: the GEMM operand for x's rows as two bf16
  // parts, CudaBackend::set_router_parts). Row and column views drop them.
  Tensor derived, derived2;

  bool defined() const { return weight.defined(); }
  int64_t n_out() const { return weight.size(0); }
  int64_t n_in() const { return weight.size(1); }
  DType dtype() const { return weight.dtype(); }

  // out[r, k] = W[n0 + r, k0 + k] for r < n_rows, k < n_cols, as fp32 (row stride ld_out).
  // Precondition: the ranges lie inside the weight.
  void dequantize(int64_t n0, int64_t n_rows, int64_t k0, int64_t n_cols, float* out, int64_t ld_out) const;

  // Rows [n0, n0 + n_rows) as a LinearWeight view (FP8: n0 and, unless it ends the tensor,
  // n_rows must be multiples of block_n, so scale rows stay aligned; uniform_row_blocks kept
  // where n0 % 128 == 0).
  LinearWeight rows(int64_t n0, int64_t n_rows) const;

  // Columns [k0, k0 + n_cols) as a copy in host memory (the bytes must be readable here; FP8: k0
  // and, unless they end the tensor, n_cols multiples of block_k, so scale columns stay aligned).
  LinearWeight columns(int64_t k0, int64_t n_cols) const;
};

// The parts side by side, [n_out, Σ n_in], as a copy in host memory: the inverse of columns().
// Preconditions: equal n_out, dtype and block shape; FP8: every part but the last n_in a
// multiple of block_k.
LinearWeight concat_columns(const std::vector<const LinearWeight*>& parts);

}  // namespace deepinfer
