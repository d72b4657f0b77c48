// ReferenceBackend: every op as the plainest fp32 loop, single-threaded. The oracle that the
// optimized backends are tested against; never used for speed.
#pragma once

#include "backend/backend.h"

namespace deepinfer {

class ReferenceBackend : public Backend {
 public:
  std::string name() const override { return "reference"; }
  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) override;
  void matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) override;
  void rope(Tensor& x, int64_t offset, const Tensor& positions, const RopeParams& rope) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void kv_write(const Tensor& latent, const Tensor& slots, Tensor& cache) override;
  void mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                     const AttentionBatch& batch, Tensor& out) override;
  void moe_route(const Tensor& logits, const RouterParams& p, Tensor& ids, Tensor& weights) override;
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const std::vector<MlpWeights>& experts, Tensor& out) override;
  void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void add(Tensor& out, const Tensor& x) override;
};

// Reads element i of a float-typed vector tensor (F32, BF16 or F16) as fp32.
float load_float(const Tensor& t, int64_t i);

// The router's selection rule, shared by all CPU-side backends (it is O(E) per token and its
// tie-breaking must be identical everywhere). scores_out [E] receives the unbiased scores.
void route_one_token(const float* logits, int64_t n_experts, const RouterParams& p, int32_t* ids,
                     float* weights, float* scratch);

}  // namespace deepinfer
