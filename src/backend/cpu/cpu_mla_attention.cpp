// CPU multi-head latent attention over the paged latent cache, in both forms.
// Naive (prefill): per sequence, the cached latents [S, r] go through kv_b_proj once to give
//   per-head k_nope and v; then each (head, query row) is an exact two-pass softmax.
// Absorbed (decode): per head, W_UK_h and W_UV_h are dequantized once; each query becomes
//   q̃ = [W_UK_hᵀ q_nope ; q_pe] (r + dr wide), scored against whole cache rows, and the
//   latent-space output is mapped back by W_UV_h.
// Work is split by (head) or (head, row); each output's reduction order depends only on its
// own sequence, so the result is batch-invariant.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"

namespace deepinfer {
namespace {

const float* latent_row(const float* cache, int64_t width, const AttentionBatch& b, int64_t seq, int64_t pos) {
  const int32_t block = b.block_ids[b.block_indptr[seq] + pos / b.block_size];
  return cache + (static_cast<int64_t>(block) * b.block_size + pos % b.block_size) * width;
}

// Softmax over scores[0, n) in place (max-subtracted, fp32).
void softmax_inplace(float* scores, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < n; ++s) mx = std::max(mx, scores[s]);
  float sum = 0;
  for (int64_t s = 0; s < n; ++s) sum += (scores[s] = std::exp(scores[s] - mx));
  const float inv = 1.0f / sum;
  for (int64_t s = 0; s < n; ++s) scores[s] *= inv;
}

}  // namespace

void CpuBackend::mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                               const AttentionBatch& batch, Tensor& out) {
  const int64_t H = p.n_heads, dn = p.qk_nope_head_dim, dr = p.qk_rope_head_dim, dv = p.v_head_dim;
  const int64_t r = p.kv_lora_rank, dqk = dn + dr, width = r + dr, head_rows = dn + dv;
  DI_CHECK_EQ(q.size(2), dqk);
  DI_CHECK_EQ(cache.size(2), width);
  DI_CHECK(!p.q_rope.defined());  // this backend rotates q in mla_rope_kv_write
  const float* qp = q.data<float>();
  const float* cp = cache.data<float>();
  float* op = out.data<float>();
  const float scale = p.softmax_scale;

  if (form == MlaForm::kNaive) {
    for (int64_t b = 0; b < batch.n_seqs; ++b) {
      const int64_t q0 = batch.q_indptr[b], q_len = batch.q_indptr[b + 1] - q0, S = batch.kv_len[b];
      if (q_len == 0 || !batch.selected(b)) continue;
      Tensor lat = Tensor::empty_host(DType::kF32, {S, width});  // [S, r + dr] gathered pages
      for (int64_t s = 0; s < S; ++s) {
        const float* row = latent_row(cp, width, batch, b, s);
        std::copy(row, row + width, lat.data<float>() + s * width);
      }
      Tensor kvb = Tensor::empty_host(DType::kF32, {S, H * head_rows});  // [S, H, dn + dv]
      matmul(lat, width, *p.kv_b_proj, kvb);
      const float* kv = kvb.data<float>();
      const float* lp = lat.data<float>();
      pool_.parallel_for(H * q_len, 1, [&](int64_t w0, int64_t w1) {
        std::vector<float> scores(static_cast<size_t>(S));
        for (int64_t w = w0; w < w1; ++w) {
          const int64_t h = w / q_len, i = w % q_len, pos = S - q_len + i;
          const float* qh = qp + ((q0 + i) * H + h) * dqk;
          for (int64_t s = 0; s <= pos; ++s) {
            const float nope = simd::dot(qh, kv + s * H * head_rows + h * head_rows, dn);
            const float rope = simd::dot(qh + dn, lp + s * width + r, dr);
            scores[s] = (nope + rope) * scale;
          }
          softmax_inplace(scores.data(), pos + 1);
          float* oh = op + ((q0 + i) * H + h) * dv;
          std::fill(oh, oh + dv, 0.0f);
          for (int64_t s = 0; s <= pos; ++s) simd::axpy(scores[s], kv + s * H * head_rows + h * head_rows + dn, oh, dv);
        }
      });
    }
    return;
  }

  // Absorbed form: one work item per head.
  pool_.parallel_for(H, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> wuk(static_cast<size_t>(dn * r)), wuv(static_cast<size_t>(dv * r));
    std::vector<float> q_t(static_cast<size_t>(width)), o_lat(static_cast<size_t>(r));
    std::vector<float> scores;
    for (int64_t h = h0; h < h1; ++h) {
      p.kv_b_proj->dequantize(h * head_rows, dn, 0, r, wuk.data(), r);       // W_UK_h [dn, r]
      p.kv_b_proj->dequantize(h * head_rows + dn, dv, 0, r, wuv.data(), r);  // W_UV_h [dv, r]
      for (int64_t b = 0; b < batch.n_seqs; ++b) {
        if (!batch.selected(b)) continue;
        const int64_t q0 = batch.q_indptr[b], q_len = batch.q_indptr[b + 1] - q0, S = batch.kv_len[b];
        scores.resize(static_cast<size_t>(S));
        for (int64_t i = 0; i < q_len; ++i) {
          const int64_t pos = S - q_len + i;
          const float* qh = qp + ((q0 + i) * H + h) * dqk;
          // q̃ = [W_UK_hᵀ q_nope ; q_pe]
          std::fill(q_t.begin(), q_t.begin() + r, 0.0f);
          for (int64_t j = 0; j < dn; ++j) simd::axpy(qh[j], wuk.data() + j * r, q_t.data(), r);
          std::copy(qh + dn, qh + dqk, q_t.data() + r);
          for (int64_t s = 0; s <= pos; ++s)
            scores[s] = simd::dot(q_t.data(), latent_row(cp, width, batch, b, s), width) * scale;
          softmax_inplace(scores.data(), pos + 1);
          std::fill(o_lat.begin(), o_lat.end(), 0.0f);
          for (int64_t s = 0; s <= pos; ++s) simd::axpy(scores[s], latent_row(cp, width, batch, b, s), o_lat.data(), r);
          float* oh = op + ((q0 + i) * H + h) * dv;
          for (int64_t j = 0; j < dv; ++j) oh[j] = simd::dot(wuv.data() + j * r, o_lat.data(), r);
        }
      }
    }
  });
}

}  // namespace deepinfer
