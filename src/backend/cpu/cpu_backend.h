// CpuBackend: threaded, vectorized fp32 ops for the CPU (CI's path). Each output element is
// computed by one thread with a reduction order fixed by its own row, never by the batch size
// or thread count, so results are batch-invariant and run-to-run identical.
// Ops it does not specialize (router, embedding, rope, kv_write) come from ReferenceBackend.
#pragma once

#include <memory>

#include "backend/reference/reference_backend.h"
#include "core/thread_pool.h"

namespace deepinfer {

class CpuBackend : public ReferenceBackend {
 public:
  explicit CpuBackend(int n_threads);
  std::string name() const override { return "cpu"; }
  ThreadPool& pool() { return pool_; }

  void rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) override;
  void matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                     const AttentionBatch& batch, Tensor& out) override;
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const std::vector<MlpWeights>& experts, Tensor& out) override;
  void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) override;

 private:
  ThreadPool pool_;
};

// out[M, N] = x[M, K] · Wᵀ on the calling thread only, for output columns [n0, n1).
// The kernel behind CpuBackend::matmul, exposed for ops that parallelize at a coarser level.
void cpu_matmul_columns(const float* x, int64_t x_stride, int64_t m, const LinearWeight& w, int64_t n0,
                        int64_t n1, float* out, int64_t out_stride);

}  // namespace deepinfer
