#include "model/deepseek/deepseek_placement.h"

#include <cmath>
#include <vector>

namespace deepinfer {
namespace {

// Walks the config once for both modes: `host` set → copy its tensors; null → random ones.
class Placer {
 public:
  Placer(Backend& backend, const DeepseekConfig& c, const DeepseekWeights* host, DType dtype, uint64_t seed)
      : b_(backend), c_(c), host_(host), dtype_(dtype), seed_(seed) {}

  DeepseekWeights run() {
    DeepseekWeights w;
    const DeepseekWeights* h = host_;
    w.embed_tokens = table(h ? &h->embed_tokens : nullptr, c_.vocab_size, c_.hidden_size);
    w.layers.resize(static_cast<size_t>(c_.num_hidden_layers));
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l)
      layer(h ? &h->layers[static_cast<size_t>(l)] : nullptr, l, &w.layers[static_cast<size_t>(l)]);
    w.norm = norm(h ? &h->norm : nullptr, c_.hidden_size);
    w.lm_head = one(h ? &h->lm_head : nullptr, c_.vocab_size, c_.hidden_size, false);  // tied: a second copy
    const size_t n_mtp = h ? h->mtp.size() : static_cast<size_t>(c_.num_nextn_predict_layers);
    for (size_t i = 0; i < n_mtp; ++i) {
      const MtpWeights* hm = h ? &h->mtp[i] : nullptr;
      MtpWeights m;
      m.enorm = norm(hm ? &hm->enorm : nullptr, c_.hidden_size);
      m.hnorm = norm(hm ? &hm->hnorm : nullptr, c_.hidden_size);
      m.eh_proj = one(hm ? &hm->eh_proj : nullptr, c_.hidden_size, 2 * c_.hidden_size, false);
      layer(hm ? &hm->block : nullptr, c_.num_hidden_layers + static_cast<int64_t>(i), &m.block);
      m.shared_head_norm = norm(hm ? &hm->shared_head_norm : nullptr, c_.hidden_size);
      const bool shares = !hm || hm->shared_head_head.weight.raw_data() == h->lm_head.weight.raw_data();
      m.shared_head_head = shares ? w.lm_head : one(&hm->shared_head_head, c_.vocab_size, c_.hidden_size, false);
      w.mtp.push_back(std::move(m));
    }
    return w;
  }

 private:
  uint64_t next_seed() { return seed_ * 0x9E3779B97F4A7C15ull + ++counter_; }
  DType small_dtype() const { return DType::kBF16; }

  Tensor norm(const Tensor* h, int64_t n) {
    if (h) return b_.place_tensor(*h);
    Tensor t = b_.allocate(small_dtype(), {n});
    b_.fill_random(t, next_seed(), false, 0.7f, 1.3f);
    return t;
  }
  Tensor table(const Tensor* h, int64_t rows, int64_t cols) {
    if (h) return b_.place_tensor(*h);
    Tensor t = b_.allocate(small_dtype(), {rows, cols});
    b_.fill_random(t, next_seed(), true, 1.0f, 0.0f);
    return t;
  }
  // A random Linear [n_out, n_in] in the backend's layout, ~N(0, std²).
  LinearWeight random_linear(int64_t n_out, int64_t n_in, bool quantizable, float std) {
    const DType dt = quantizable && dtype_ == DType::kF8E4M3 ? DType::kF8E4M3 : small_dtype();
    LinearWeight w = b_.allocate_linear(n_out, n_in, dt);
    if (dt == DType::kF8E4M3) {  // codes ~ N(0, 64²) (|code| ≤ 222 < 448), one scale for all blocks
      b_.fill_random(w.weight, next_seed(), true, 64.0f, 0.0f);
      b_.fill_random(w.scale_inv, next_seed(), false, std / 64.0f, std / 64.0f);
      w.uniform_row_blocks = w.block_n == 1;  // (per-row layouts: every row the same scales)
    } else {
      b_.fill_random(w.weight, next_seed(), true, std, 0.0f);
    }
    return w;
  }
  LinearWeight one(const LinearWeight* h, int64_t n_out, int64_t n_in, bool quantizable) {
    if (h) return b_.place_linear({h});
    return random_linear(n_out, n_in, quantizable, 1.0f / std::sqrt(static_cast<float>(n_in)));
  }
  // Parts stacked by rows into one placed weight; returns each part as a row view.
  std::vector<LinearWeight> stack(const std::vector<const LinearWeight*>& h, const std::vector<int64_t>& n_outs,
                                  int64_t n_in) {
    std::vector<LinearWeight> parts;
    if (b_.on_host()) {  // host layouts stay per tensor
      for (size_t i = 0; i < n_outs.size(); ++i) parts.push_back(one(h.empty() ? nullptr : h[i], n_outs[i], n_in, true));
      return parts;
    }
    int64_t total = 0;
    for (int64_t n : n_outs) total += n;
    const LinearWeight all = h.empty() ? random_linear(total, n_in, true, 1.0f / std::sqrt(static_cast<float>(n_in)))
                                       : b_.place_linear(h);
    int64_t row = 0;
    for (int64_t n : n_outs) {
      parts.push_back(all.rows(row, n));
      row += n;
    }
    return parts;
  }
  void mlp(const MlpWeights* h, int64_t inter, MlpWeights* out) {
    // FP8 with inter % 128 != 0 (V2-Lite's dense layer, 10,944): stacked, up's scale blocks would
    // start mid-block, so neither half kept uniform 128-row blocks (LinearWeight::rows) and the
    // W8A8 GEMM would take its per-row-scale form; each on its own keeps the block form.
    const bool fp8 = h ? h->gate_proj.dtype() == DType::kF8E4M3 : dtype_ == DType::kF8E4M3;
    if (fp8 && inter % 128 != 0) {
      out->gate_proj = one(h ? &h->gate_proj : nullptr, inter, c_.hidden_size, true);
      out->up_proj = one(h ? &h->up_proj : nullptr, inter, c_.hidden_size, true);
    } else {
      auto gu = stack(h ? std::vector<const LinearWeight*>{&h->gate_proj, &h->up_proj}
                        : std::vector<const LinearWeight*>{},
                      {inter, inter}, c_.hidden_size);
      out->gate_proj = gu[0];
      out->up_proj = gu[1];
    }
    out->down_proj = one(h ? &h->down_proj : nullptr, c_.hidden_size, inter, true);
  }
  void layer(const DeepseekLayerWeights* h, int64_t index, DeepseekLayerWeights* out) {
    const int64_t d = c_.hidden_size, H = c_.num_attention_heads;
    out->input_layernorm = norm(h ? &h->input_layernorm : nullptr, d);
    out->post_attention_layernorm = norm(h ? &h->post_attention_layernorm : nullptr, d);
    // q_proj (or q_a_proj) and kv_a_proj_with_mqa stacked: both read the layer's normed input.
    const bool lora = c_.q_lora_rank > 0;
    const LinearWeight* hq = h ? (lora ? &h->q_a_proj : &h->q_proj) : nullptr;
    const int64_t nq = lora ? c_.q_lora_rank : H * c_.qk_head_dim();
    // (A checkpoint may store them in different formats: then each on its own.)
    const LinearWeight* hkv = h ? &h->kv_a_proj_with_mqa : nullptr;
    if (h && (hq->dtype() != hkv->dtype() || (hq->dtype() == DType::kF8E4M3 && hq->block_k != hkv->block_k))) {
      (lora ? out->q_a_proj : out->q_proj) = one(hq, nq, d, true);
      out->kv_a_proj_with_mqa = one(hkv, c_.kv_latent_dim(), d, true);
    } else {
      const std::vector<const LinearWeight*> parts =
          h ? std::vector<const LinearWeight*>{hq, hkv} : std::vector<const LinearWeight*>{};
      const std::vector<LinearWeight> qkv = stack(parts, {nq, c_.kv_latent_dim()}, d);
      (lora ? out->q_a_proj : out->q_proj) = qkv[0];
      out->kv_a_proj_with_mqa = qkv[1];
    }
    if (lora) {
      out->q_a_layernorm = norm(h ? &h->q_a_layernorm : nullptr, c_.q_lora_rank);
      out->q_b_proj = one(h ? &h->q_b_proj : nullptr, H * c_.qk_head_dim(), c_.q_lora_rank, true);
    }
    out->kv_a_layernorm = norm(h ? &h->kv_a_layernorm : nullptr, c_.kv_lora_rank);
    out->kv_b_proj = one(h ? &h->kv_b_proj : nullptr, H * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank, true);
    if (!b_.on_host() && out->kv_b_proj.dtype() == DType::kF8E4M3)
      out->kv_b_proj_bf16 = dequantized_bf16(h ? h->kv_b_proj : to_host(out->kv_b_proj));
    out->o_proj = one(h ? &h->o_proj : nullptr, d, H * c_.v_head_dim, true);
    out->is_moe = h ? h->is_moe : (index >= c_.num_hidden_layers ? c_.n_routed_experts > 0 : c_.is_moe_layer(index));
    if (!out->is_moe) {
      mlp(h ? &h->mlp : nullptr, c_.intermediate_size, &out->mlp);
      return;
    }
    const int64_t E = c_.n_routed_experts, I = c_.moe_intermediate_size;
    if (h) {
      out->gate = b_.place_linear_fp32(h->gate);
    } else if (!b_.on_host()) {  // bf16 values, as the checkpoints store their routers (V2, V3)
      LinearWeight g = b_.allocate_linear(E, d, DType::kBF16);
      b_.fill_random(g.weight, next_seed(), true, 2.0f / std::sqrt(static_cast<float>(d)), 0.0f);
      out->gate = b_.place_linear_fp32(to_host(g));
    } else {
      out->gate = b_.allocate_linear(E, d, DType::kF32);
      b_.fill_random(out->gate.weight, next_seed(), true, 2.0f / std::sqrt(static_cast<float>(d)), 0.0f);
    }
    if (h && h->e_score_correction_bias.defined()) {
      out->e_score_correction_bias = b_.place_tensor(h->e_score_correction_bias);
    } else if (!h && c_.topk_method == TopkMethod::kNoauxTc) {
      out->e_score_correction_bias = b_.allocate(DType::kF32, {E});
      b_.fill_random(out->e_score_correction_bias, next_seed(), false, 0.0f, 0.2f);
    }
    // Device placements stack the shared MLP a second time, as S = n_shared_experts experts of
    // width I after the routed ones (shared_slices: decode steps run them in the routed
    // experts' launch), where FP8 blocks allow the cut. Loaded weights: the slices are cut from
    // the host tensors. Random ones: the slices are drawn with the routed experts and the shared
    // MLP is assembled from them (below), so both hold the same weights.
    const int64_t S = c_.n_shared_experts;
    out->has_shared_experts = h ? h->has_shared_experts : S > 0;
    const bool slice = out->has_shared_experts && !b_.on_host() && slices_fit(h ? &h->shared_experts : nullptr, I);
    std::vector<LinearWeight> cut;  // host slices of loaded weights: gate_s, up_s, down_s per s
    std::vector<const LinearWeight*> gu, down;
    std::vector<int64_t> gu_rows, down_rows;
    for (int64_t e = 0; e < E + (slice ? S : 0); ++e) {
      if (h && e < E) {
        gu.push_back(&h->experts[static_cast<size_t>(e)].gate_proj);
        gu.push_back(&h->experts[static_cast<size_t>(e)].up_proj);
        down.push_back(&h->experts[static_cast<size_t>(e)].down_proj);
      }
      gu_rows.insert(gu_rows.end(), {I, I});
      down_rows.push_back(d);
    }
    if (h && slice) {
      cut.reserve(static_cast<size_t>(3 * S));  // no reallocation: gu and down point into it
      for (int64_t s = 0; s < S; ++s) {
        cut.push_back(h->shared_experts.gate_proj.rows(s * I, I));
        cut.push_back(h->shared_experts.up_proj.rows(s * I, I));
        cut.push_back(h->shared_experts.down_proj.columns(s * I, I));
        gu.insert(gu.end(), {&cut[cut.size() - 3], &cut[cut.size() - 2]});
        down.push_back(&cut.back());
      }
    }
    const std::vector<LinearWeight> gu_parts = stack(gu, gu_rows, d), down_parts = stack(down, down_rows, I);
    out->experts.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E + (slice ? S : 0); ++e) {
      MlpWeights& m = e < E ? out->experts[static_cast<size_t>(e)] : out->shared_slices.emplace_back();
      m.gate_proj = gu_parts[static_cast<size_t>(2 * e)];
      m.up_proj = gu_parts[static_cast<size_t>(2 * e + 1)];
      m.down_proj = down_parts[static_cast<size_t>(e)];
    }
    if (!out->has_shared_experts) return;
    if (h || !slice) {
      mlp(h ? &h->shared_experts : nullptr, I * S, &out->shared_experts);
      return;
    }
    // Random: the shared MLP from its slices' bytes ([gate_0 … gate_S−1 ; up_0 … up_S−1] stacked,
    // down = [down_0 | … | down_S−1]).
    std::vector<LinearWeight> host;  // gate_s, up_s, down_s per s
    for (const MlpWeights& m : out->shared_slices)
      for (const LinearWeight* w : {&m.gate_proj, &m.up_proj, &m.down_proj}) host.push_back(to_host(*w));
    std::vector<const LinearWeight*> parts, downs;
    for (int half = 0; half < 2; ++half)
      for (int64_t s = 0; s < S; ++s) parts.push_back(&host[static_cast<size_t>(3 * s + half)]);
    for (int64_t s = 0; s < S; ++s) downs.push_back(&host[static_cast<size_t>(3 * s + 2)]);
    const LinearWeight all = b_.place_linear(parts), down_all = concat_columns(downs);
    out->shared_experts.gate_proj = all.rows(0, S * I);
    out->shared_experts.up_proj = all.rows(S * I, S * I);
    out->shared_experts.down_proj = b_.place_linear({&down_all});
  }

  // Whether the shared MLP (host weights, or null: random ones in this placement's layout)
  // can be cut into experts of width I: FP8 block rows and columns must not straddle a cut.
  bool slices_fit(const MlpWeights* h, int64_t I) const {
    if (h == nullptr) return dtype_ != DType::kF8E4M3 || I % 128 == 0;  // allocate_linear's 128-wide K blocks
    if (h->gate_proj.dtype() != DType::kF8E4M3) return true;
    return I % h->gate_proj.block_n == 0 && I % h->up_proj.block_n == 0 && I % h->down_proj.block_k == 0;
  }
  // A host FP8 Linear as a placed bf16 one: bf16(q · scale) per element.
  LinearWeight dequantized_bf16(const LinearWeight& host) {
    const int64_t n = host.n_out(), k = host.n_in();
    std::vector<float> f(static_cast<size_t>(n * k));
    host.dequantize(0, n, 0, k, f.data(), k);
    LinearWeight w;
    w.weight = Tensor::empty_host(DType::kBF16, {n, k});
    for (size_t i = 0; i < f.size(); ++i) w.weight.data<uint16_t>()[i] = f32_to_bf16(f[i]);
    return b_.place_linear({&w});
  }
  LinearWeight to_host(const LinearWeight& w) {
    LinearWeight out = w;
    out.weight = b_.to_host(w.weight);
    if (w.scale_inv.defined()) out.scale_inv = b_.to_host(w.scale_inv);
    return out;
  }

  Backend& b_;
  const DeepseekConfig& c_;
  const DeepseekWeights* host_;
  DType dtype_;
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace

DeepseekWeights place_deepseek_weights(Backend& backend, const DeepseekConfig& config, const DeepseekWeights& host) {
  if (backend.on_host()) return host;
  return Placer(backend, config, &host, DType::kBF16, 0).run();
}

DeepseekWeights dummy_deepseek_weights(Backend& backend, const DeepseekConfig& config, DType weight_dtype,
                                       uint64_t seed) {
  DI_CHECK(weight_dtype == DType::kBF16 || (weight_dtype == DType::kF8E4M3 && config.fp8.has_value()));
  return Placer(backend, config, nullptr, weight_dtype, seed).run();
}

}  // namespace deepinfer
