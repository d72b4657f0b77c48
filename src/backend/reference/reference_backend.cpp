#include "backend/reference/reference_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace deepinfer {

float load_float(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return static_cast<const float*>(t.raw_data())[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(t.raw_data())[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(t.raw_data())[i]);
    default: DI_CHECK(false && "float tensor expected");
  }
  return 0.0f;
}

void ReferenceBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.size(0), d = table.size(1);
  DI_CHECK_EQ(out.size(0), n);
  DI_CHECK_EQ(out.size(1), d);
  const int32_t* id = ids.data<int32_t>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < n; ++t) {
    DI_CHECK(id[t] >= 0 && id[t] < table.size(0));
    for (int64_t j = 0; j < d; ++j) o[t * d + j] = load_float(table, id[t] * d + j);
  }
}

void ReferenceBackend::rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) {
  const int64_t n = out.size(0), d = weight.numel(), od = out.size(1);
  DI_CHECK_GE(od, d);
  if (x_stride == 0) x_stride = d;
  const float* xp = static_cast<const float*>(x.raw_data());
  float* o = out.data<float>();
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xp[t * x_stride + j]) * xp[t * x_stride + j];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
    for (int64_t j = 0; j < d; ++j) o[t * od + j] = load_float(weight, j) * (xp[t * x_stride + j] * inv);
  }
}

void ReferenceBackend::add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps,
                                    Tensor& out) {
  const int64_t n = residual.numel();
  DI_CHECK_EQ(delta.numel(), n);
  float* r = residual.data<float>();
  const float* dl = delta.data<float>();
  for (int64_t i = 0; i < n; ++i) r[i] += dl[i];
  rms_norm(residual, 0, weight, eps, out);
}

void ReferenceBackend::matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) {
  const int64_t m = out.size(0), n = w.n_out(), k = w.n_in();
  DI_CHECK_EQ(out.size(1), n);
  if (x_stride == 0) x_stride = k;
  const float* xp = static_cast<const float*>(x.raw_data());
  std::vector<float> row(static_cast<size_t>(k));
  float* o = out.data<float>();
  for (int64_t j = 0; j < n; ++j) {
    w.dequantize(j, 1, 0, k, row.data(), k);
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(xp[i * x_stride + kk]) * row[kk];
      o[i * n + j] = static_cast<float>(acc);
    }
  }
}

void ReferenceBackend::rope(Tensor& x, int64_t offset, const Tensor& positions, const RopeParams& rope) {
  const int64_t n = x.size(0), heads = x.size(1), stride = x.size(2), half = rope.dim() / 2;
  DI_CHECK_LE(offset + rope.dim(), stride);
  float* xp = x.data<float>();
  const int32_t* pos = positions.data<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // fp32 angle like transformers (inv_freq f32 × position f32), cos/sin evaluated in double.
      const float angle = static_cast<float>(pos[t]) * rope.inv_freq[i];
      const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * rope.attention_factor;
      const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * rope.attention_factor;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = xp + (t * heads + h) * stride + offset;
        const int64_t a = rope.interleave ? 2 * i : i;
        const int64_t b = rope.interleave ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x1 * c + x0 * s;
      }
    }
  }
}

void ReferenceBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  const int64_t n = out.size(0), inter = out.size(1);
  DI_CHECK_EQ(gate_up.size(1), 2 * inter);
  const float* g = gate_up.data<float>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      const float a = g[t * 2 * inter + i];
      o[t * inter + i] = a / (1.0f + std::exp(-a)) * g[t * 2 * inter + inter + i];
    }
}

void ReferenceBackend::kv_write(const Tensor& latent, const Tensor& slots, Tensor& cache) {
  const int64_t n = latent.size(0), width = latent.size(1);
  const int64_t block_size = cache.size(1);
  DI_CHECK_EQ(cache.size(2), width);
  const int32_t* s = slots.data<int32_t>();
  const float* src = latent.data<float>();
  float* dst = cache.data<float>();
  for (int64_t t = 0; t < n; ++t) {
    DI_CHECK(s[t] >= 0 && s[t] < cache.size(0) * block_size);
    std::copy(src + t * width, src + (t + 1) * width, dst + static_cast<int64_t>(s[t]) * width);
  }
}

namespace {

// Cached latent row of token `pos` of a sequence.
const float* latent_row(const Tensor& cache, const AttentionBatch& b, int64_t seq, int64_t pos) {
  const int64_t width = cache.size(2);
  const int32_t block = b.block_ids[b.block_indptr[seq] + pos / b.block_size];
  return cache.data<float>() + (static_cast<int64_t>(block) * b.block_size + pos % b.block_size) * width;
}

}  // namespace

void ReferenceBackend::mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                                     const AttentionBatch& batch, Tensor& out) {
  const int64_t H = p.n_heads, dn = p.qk_nope_head_dim, dr = p.qk_rope_head_dim, dv = p.v_head_dim;
  const int64_t r = p.kv_lora_rank, dqk = dn + dr;
  DI_CHECK_EQ(q.size(2), dqk);
  DI_CHECK_EQ(cache.size(2), r + dr);
  DI_CHECK(!p.q_rope.defined());  // this backend rotates q in mla_rope_kv_write
  const float* qp = q.data<float>();
  float* op = out.data<float>();
  // kv_b rows: head h owns rows [h*(dn+dv), h*(dn+dv)+dn) = W_UK_h, then dv rows of W_UV_h.
  std::vector<float> kvb(static_cast<size_t>(H * (dn + dv) * r));
  p.kv_b_proj->dequantize(0, H * (dn + dv), 0, r, kvb.data(), r);
  for (int64_t b = 0; b < batch.n_seqs; ++b) {
    if (!batch.selected(b)) continue;
    const int64_t q0 = batch.q_indptr[b], q_len = batch.q_indptr[b + 1] - q0, kv_len = batch.kv_len[b];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t pos = kv_len - q_len + i;
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = qp + ((q0 + i) * H + h) * dqk;
        const float* wuk = kvb.data() + h * (dn + dv) * r;
        const float* wuv = wuk + dn * r;
        std::vector<double> scores(static_cast<size_t>(pos + 1));
        // Absorbed query: q_lat[c] = Σ_j q_nope[j] W_UK[j, c] (only used by the absorbed form).
        std::vector<double> q_lat(static_cast<size_t>(r), 0.0);
        if (form == MlaForm::kAbsorbed)
          for (int64_t j = 0; j < dn; ++j)
            for (int64_t c = 0; c < r; ++c) q_lat[c] += static_cast<double>(qh[j]) * wuk[j * r + c];
        for (int64_t s = 0; s <= pos; ++s) {
          const float* lat = latent_row(cache, batch, b, s);
          double dot = 0;
          if (form == MlaForm::kAbsorbed) {
            for (int64_t c = 0; c < r; ++c) dot += q_lat[c] * lat[c];
          } else {
            for (int64_t j = 0; j < dn; ++j) {
              double k = 0;
              for (int64_t c = 0; c < r; ++c) k += static_cast<double>(wuk[j * r + c]) * lat[c];
              dot += qh[j] * k;
            }
          }
          for (int64_t j = 0; j < dr; ++j) dot += static_cast<double>(qh[dn + j]) * lat[r + j];
          scores[s] = dot * p.softmax_scale;
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (auto& s : scores) sum += (s = std::exp(s - mx));
        // o_lat = Σ p_s c_kv(s); o = W_UV o_lat (identical to Σ p_s v_s in the naive form).
        std::vector<double> o_lat(static_cast<size_t>(r), 0.0);
        for (int64_t s = 0; s <= pos; ++s) {
          const float* lat = latent_row(cache, batch, b, s);
          for (int64_t c = 0; c < r; ++c) o_lat[c] += scores[s] / sum * lat[c];
        }
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < r; ++c) acc += static_cast<double>(wuv[j * r + c]) * o_lat[c];
          op[((q0 + i) * H + h) * dv + j] = static_cast<float>(acc);
        }
      }
    }
  }
}

void route_one_token(const float* logits, int64_t n_experts, const RouterParams& p, int32_t* ids, float* weights,
                     float* scratch) {
  // scratch: [2 * n_experts + n_group] floats: scores, choice scores, group scores.
  float* scores = scratch;
  float* choice = scratch + n_experts;
  float* group_score = scratch + 2 * n_experts;
  if (p.scoring_func == ScoringFunc::kSoftmax) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < n_experts; ++e) mx = std::max(mx, logits[e]);
    float sum = 0;
    for (int64_t e = 0; e < n_experts; ++e) sum += (scores[e] = std::exp(logits[e] - mx));
    for (int64_t e = 0; e < n_experts; ++e) scores[e] /= sum;
  } else {
    for (int64_t e = 0; e < n_experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  }
  for (int64_t e = 0; e < n_experts; ++e)
    choice[e] = scores[e] + (p.correction_bias != nullptr ? p.correction_bias[e] : 0.0f);

  if (p.topk_method != TopkMethod::kGreedy && p.n_group > 1) {
    const int64_t per_group = n_experts / p.n_group;
    for (int64_t g = 0; g < p.n_group; ++g) {
      const float* c = choice + g * per_group;
      if (p.topk_method == TopkMethod::kGroupLimitedGreedy) {  // V2: max of the group
        group_score[g] = *std::max_element(c, c + per_group);
      } else {  // V3 noaux_tc: sum of the group's top two
        float a = -std::numeric_limits<float>::infinity(), b2 = a;
        for (int64_t e = 0; e < per_group; ++e) {
          if (c[e] > a) { b2 = a; a = c[e]; } else if (c[e] > b2) { b2 = c[e]; }
        }
        group_score[g] = a + b2;
      }
    }
    // Keep the topk_group best groups (ties to the lower group id); mask the rest with -inf
    // (DeepSeek's rule; transformers fills 0.0, which differs only for negative biased scores).
    std::vector<int64_t> order(static_cast<size_t>(p.n_group));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
    for (int64_t gi = p.topk_group; gi < p.n_group; ++gi) {
      const int64_t g = order[gi];
      for (int64_t e = 0; e < per_group; ++e) choice[g * per_group + e] = -std::numeric_limits<float>::infinity();
    }
  }
  // Top-k by choice score, descending; ties to the lower expert id. k ≤ E is small: selection by scan.
  for (int64_t j = 0; j < p.top_k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= ids[i] == e;
      if (taken) continue;
      if (best < 0 || choice[e] > choice[best]) best = e;
    }
    ids[j] = static_cast<int32_t>(best);
    weights[j] = scores[best];
  }
  if (p.norm_topk_prob) {
    float sum = 0;
    for (int64_t j = 0; j < p.top_k; ++j) sum += weights[j];
    sum += 1e-20f;
    for (int64_t j = 0; j < p.top_k; ++j) weights[j] /= sum;
  }
  for (int64_t j = 0; j < p.top_k; ++j) weights[j] *= p.routed_scaling_factor;
}

void ReferenceBackend::moe_route(const Tensor& logits, const RouterParams& p, Tensor& ids, Tensor& weights) {
  const int64_t n = logits.size(0), e = logits.size(1);
  std::vector<float> scratch(static_cast<size_t>(2 * e + p.n_group));
  for (int64_t t = 0; t < n; ++t)
    route_one_token(logits.data<float>() + t * e, e, p, ids.data<int32_t>() + t * p.top_k,
                    weights.data<float>() + t * p.top_k, scratch.data());
}

void ReferenceBackend::mlp(const Tensor& x, const MlpWeights& w, Tensor& out) {
  const int64_t n = x.size(0), inter = w.gate_proj.n_out();
  Tensor gate_up = Tensor::empty_host(DType::kF32, {n, 2 * inter});
  Tensor g = Tensor::empty_host(DType::kF32, {n, inter});
  Tensor u = Tensor::empty_host(DType::kF32, {n, inter});
  matmul(x, 0, w.gate_proj, g);
  matmul(x, 0, w.up_proj, u);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < inter; ++i) {
      gate_up.data<float>()[t * 2 * inter + i] = g.data<float>()[t * inter + i];
      gate_up.data<float>()[t * 2 * inter + inter + i] = u.data<float>()[t * inter + i];
    }
  Tensor act = Tensor::empty_host(DType::kF32, {n, inter});
  silu_mul(gate_up, act);
  matmul(act, 0, w.down_proj, out);
}

void ReferenceBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  const int64_t r = rows.numel(), d = x.size(1);
  DI_CHECK_EQ(out.size(0), r);
  DI_CHECK_EQ(out.size(1), d);
  for (int64_t i = 0; i < r; ++i) {
    const int32_t t = rows.data<int32_t>()[i];
    DI_CHECK(t >= 0 && t < x.size(0));
    std::copy(x.data<float>() + t * d, x.data<float>() + (t + 1) * d, out.data<float>() + i * d);
  }
}

void ReferenceBackend::add(Tensor& out, const Tensor& x) {
  DI_CHECK_EQ(out.numel(), x.numel());
  float* o = out.data<float>();
  const float* a = x.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] += a[i];
}

void ReferenceBackend::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                   const std::vector<MlpWeights>& experts, Tensor& out) {
  const int64_t n = x.size(0), d = x.size(1), k = ids.size(1);
  float* o = out.data<float>();
  std::fill(o, o + n * d, 0.0f);
  Tensor y = Tensor::empty_host(DType::kF32, {1, d});
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.data<int32_t>()[t * k + j];
      DI_CHECK(e >= 0 && e < static_cast<int64_t>(experts.size()));
      mlp(x.slice_rows(t, t + 1), experts[static_cast<size_t>(e)], y);
      const float w = weights.data<float>()[t * k + j];
      for (int64_t c = 0; c < d; ++c) o[t * d + c] += w * y.data<float>()[c];
    }
  }
}

}  // namespace deepinfer
