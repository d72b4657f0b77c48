// Backend: the ops a DeepSeek forward is made of, with explicit shapes. Implemented by
// `reference` (naive fp32 loops, the oracle in tests), `cpu` (threaded and vectorized) and,
// later, `cuda`. Ops never allocate their outputs: callers pass them. Activations are fp32 on
// the CPU backends. Inputs are validated by the model at load; ops check shapes with DI_CHECK.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/op_params.h"
#include "core/tensor.h"

namespace deepinfer {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // out[t, :] = table[ids[t], :] as f32. table [V, D] F32|BF16|F16; ids [T] I32 (< V); out [T, D] F32.
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;

  // out[t] = weight ⊙ x[t] / sqrt(mean(x[t]²) + eps); statistics in fp32.
  // x [T, D] F32 (row stride `x_stride` elements, ≥ D; 0 = D); weight [D] F32|BF16|F16; out [T, D] F32 (may alias x).
  virtual void rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) = 0;

  // residual += delta; out = rms_norm(residual). residual, delta, out [T, D] F32.
  virtual void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) = 0;

  // out[M, N] = x[M, K] · Wᵀ (fp32 accumulation). x F32 with row stride `x_stride` (0 = K).
  virtual void matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) = 0;

  // Rotates channels [offset, offset + rope.dim()) of every head in place.
  // x [T, n_heads, head_stride] F32; positions [T] I32.
  virtual void rope(Tensor& x, int64_t offset, const Tensor& positions, const RopeParams& rope) = 0;

  // out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]. gate_up [T, 2I] F32; out [T, I] F32.
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;

  // Writes latent rows into the paged cache: cache[slot / block_size][slot % block_size] = latent[t].
  // latent [T, L] F32; slots [T] I32; cache [n_blocks, block_size, L] F32.
  virtual void kv_write(const Tensor& latent, const Tensor& slots, Tensor& cache) = 0;

  // Multi-head latent attention over the paged latent cache.
  // q [T, H, dn + dr] F32 (RoPE applied); cache [n_blocks, block_size, r + dr] F32 holding
  // [c_kv (post-norm) | k_pe (post-RoPE)]; out [T, H, dv] F32.
  virtual void mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                             const AttentionBatch& batch, Tensor& out) = 0;

  // Router: logits [T, E] F32 → ids [T, top_k] I32 (by descending biased score, ties to the
  // lower id) and weights [T, top_k] F32 (unbiased scores, optionally renormalized, × scale).
  virtual void moe_route(const Tensor& logits, const RouterParams& p, Tensor& ids, Tensor& weights) = 0;

  // out[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]), summed in j order.
  // x [T, D] F32; ids/weights [T, k]; out [T, D] F32.
  virtual void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                           const std::vector<MlpWeights>& experts, Tensor& out) = 0;

  // out = down(silu(gate(x)) * up(x)). x [T, D] F32; out [T, D] F32.
  virtual void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) = 0;
};

// "reference" | "cpu"; n_threads applies to "cpu" (0 = all cores).
std::unique_ptr<Backend> make_backend(const std::string& name, int n_threads = 0);

}  // namespace deepinfer
