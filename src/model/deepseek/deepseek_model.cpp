#include "model/deepseek/deepseek_model.h"

#include <algorithm>
#include <cstring>

#include "model/deepseek/deepseek_cost.h"
#include "model/deepseek/deepseek_placement.h"
#include "model/deepseek/deepseek_rope.h"

namespace deepinfer {

namespace {
// The model's MLA dims and softmax scale (kv_b_proj: the caller's, per layer).
MlaParams mla_params(const DeepseekConfig& c) {
  MlaParams p;
  p.n_heads = c.num_attention_heads;
  p.qk_nope_head_dim = c.qk_nope_head_dim;
  p.qk_rope_head_dim = c.qk_rope_head_dim;
  p.v_head_dim = c.v_head_dim;
  p.kv_lora_rank = c.kv_lora_rank;
  p.softmax_scale = static_cast<float>(c.softmax_scale());
  return p;
}
}  // namespace

MlaPolicy mla_policy_for(const Backend& backend, const DeepseekConfig& config, bool batch_invariant) {
  if (!batch_invariant) return MlaPolicy::kAuto;
  return backend.naive_mla_batch_invariant(mla_params(config)) ? MlaPolicy::kByOrigin : MlaPolicy::kAbsorbed;
}

const char* mla_policy_name(MlaPolicy policy) {
  switch (policy) {
    case MlaPolicy::kAuto: return "auto";
    case MlaPolicy::kAbsorbed: return "absorbed";
    case MlaPolicy::kByOrigin: return "by_origin";
  }
  return "?";
}

int32_t ForwardBatch::add_sequence(const KvSequence& kv, const int32_t* tokens, int64_t n, int64_t block_size,
                                   bool is_generated) {
  if (q_indptr.empty()) q_indptr.push_back(0);
  generated.push_back(is_generated ? 1 : 0);
  if (block_indptr.empty()) block_indptr.push_back(0);
  const int32_t first_row = static_cast<int32_t>(token_ids.size());
  DI_CHECK_GE(static_cast<int64_t>(kv.block_ids.size()) * block_size, kv.n_tokens + n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = kv.n_tokens + i;
    token_ids.push_back(tokens[i]);
    positions.push_back(static_cast<int32_t>(pos));
    slots.push_back(kv.slot(pos, block_size));
  }
  q_indptr.push_back(static_cast<int32_t>(token_ids.size()));
  kv_len.push_back(static_cast<int32_t>(kv.n_tokens + n));
  const int64_t n_blocks = (kv.n_tokens + n + block_size - 1) / block_size;
  block_ids.insert(block_ids.end(), kv.block_ids.begin(), kv.block_ids.begin() + n_blocks);
  block_indptr.push_back(static_cast<int32_t>(block_ids.size()));
  return first_row;
}

Expected<std::unique_ptr<DeepseekModel>> DeepseekModel::load(const Checkpoint& checkpoint) {
  auto config = parse_deepseek_config(checkpoint.config());
  if (!config) return config.status().with_context(checkpoint.dir() + "/config.json");
  auto weights = load_deepseek_weights(checkpoint, *config);
  if (!weights) return weights.status().with_context(checkpoint.dir());
  return std::make_unique<DeepseekModel>(std::move(*config), std::move(*weights));
}

DeepseekModel::DeepseekModel(DeepseekConfig config, DeepseekWeights weights, Device placed_on)
    : config_(std::move(config)), weights_(std::move(weights)), rope_(make_rope_params(config_)), placed_on_(placed_on) {}

std::unique_ptr<DeepseekModel> DeepseekModel::dummy(DeepseekConfig config, Backend& backend, DType weight_dtype,
                                                    uint64_t seed) {
  DeepseekWeights w = dummy_deepseek_weights(backend, config, weight_dtype, seed);
  return std::make_unique<DeepseekModel>(std::move(config), std::move(w), backend.device());
}

Status DeepseekModel::place(Backend& backend) {
  if (backend.device() == placed_on_) return Status::ok();
  DI_CHECK(placed_on_ == Device::cpu());
  // Placed size: bf16 weights (FP8 ones at a byte plus a per-row scale per 128 columns), the
  // embedding as loaded (fp32 tables stay fp32), a tied lm_head copied, the shared experts
  // twice (DeepseekLayerWeights::shared_slices), FP8 kv_b_proj also in bf16: within a few percent.
  const DeepseekCost cost = deepseek_cost(config_);
  const double per_param = config_.fp8 ? 1.0 + 4.0 / 128.0 : 2.0;
  const double table_extra = static_cast<double>(weights_.embed_tokens.numel()) *
                             (static_cast<double>(dtype_size(weights_.embed_tokens.dtype())) - per_param);
  int64_t shared_params = 0, kv_b_params = 0;
  for (const DeepseekLayerWeights& l : weights_.layers) {
    if (l.has_shared_experts) shared_params += 3 * config_.hidden_size * l.shared_experts.down_proj.n_in();
    if (config_.fp8) kv_b_params += l.kv_b_proj.weight.numel();  // its bf16 copy (kv_b_proj_bf16)
  }
  const auto need = static_cast<int64_t>(static_cast<double>(cost.total_params + shared_params) * per_param +
                                         2.0 * static_cast<double>(kv_b_params) + std::max(0.0, table_extra));
  const auto [free_bytes, total_bytes] = backend.memory_info();
  if (total_bytes > 0 && need > free_bytes)
    return make_error(StatusCode::kResourceExhausted,
                      "the model's weights need about {:.2f} GiB on device '{}' but {:.2f} GiB of {:.2f} GiB are free",
                      static_cast<double>(need) / (1 << 30), backend.name(), static_cast<double>(free_bytes) / (1 << 30),
                      static_cast<double>(total_bytes) / (1 << 30));
  weights_ = place_deepseek_weights(backend, config_, weights_);
  placed_on_ = backend.device();
  return Status::ok();
}

std::vector<KvLayerSpec> DeepseekModel::kv_layers() const {
  return std::vector<KvLayerSpec>(static_cast<size_t>(config_.num_hidden_layers),
                                  KvLayerSpec{KvKind::kMlaLatent, config_.kv_latent_dim()});
}

void DeepseekModel::attention(Backend& backend, int64_t l, const InputNorm* pre, Tensor& x, QuantizedRows& xq,
                              const Tensor& positions, const Tensor& slots, const AttentionBatch& decode,
                              const AttentionBatch& prefill, Tensor& cache_layer, Tensor& attn_out) const {
  const DeepseekConfig& c = config_;
  const DeepseekLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const int64_t T = x.size(0), H = c.num_attention_heads, dqk = c.qk_head_dim();
  const int64_t width = c.kv_latent_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Steps of decode rows only, without q-LoRA: the whole sublayer as one backend op, which a
  // backend may fuse (the CUDA backend at one token: one kernel for the seven launches below).
  if (c.q_lora_rank == 0 && prefill.n_seqs == 0 && decode.n_seqs > 0) {
    MlaSublayerWeights sw;
    sw.q_proj = &w.q_proj;
    sw.kv_a_proj = &w.kv_a_proj_with_mqa;
    sw.kv_a_layernorm = &w.kv_a_layernorm;
    sw.o_proj = &w.o_proj;
    sw.rope = &rope_;
    sw.eps = eps;
    sw.mla = mla_params(c);
    sw.mla.kv_b_proj = w.kv_b_proj_bf16.defined() ? &w.kv_b_proj_bf16 : &w.kv_b_proj;
    if (pre != nullptr)
      backend.add_rms_norm_mla_decode_sublayer(*pre->residual, *pre->delta, *pre->weight, eps, x, xq, sw, positions,
                                               slots, decode, cache_layer, attn_out);
    else
      backend.mla_decode_sublayer(sw, x, &xq, positions, slots, decode, cache_layer, attn_out);
    return;
  }
  if (pre != nullptr) backend.add_rms_norm_quantized(*pre->residual, *pre->delta, *pre->weight, eps, x, xq);

  // The two linears of x (q_proj or q_a_proj, and kv_a_proj_with_mqa) together: placements
  // stack their rows, so decode steps read them in one launch. (kv is allocated right after the
  // first part's output: at one row the two are then one contiguous row where the first is a
  // whole number of the step arena's alignment steps, which the batch-invariant GEMM uses.)
  Tensor q = backend.empty(DType::kF32, {T, H * dqk});  // [T, H * (dn + dr)]
  Tensor qa;                                            // [T, q_lora_rank] (q_lora_rank > 0)
  if (c.q_lora_rank != 0) qa = backend.empty(DType::kF32, {T, c.q_lora_rank});
  Tensor kv = backend.empty(DType::kF32, {T, width});  // [T, r + dr] = [c_kv | k_pe]
  if (c.q_lora_rank == 0) {
    backend.matmul_parts(x, {&w.q_proj, &w.kv_a_proj_with_mqa}, {&q, &kv}, &xq);
  } else {
    backend.matmul_parts(x, {&w.q_a_proj, &w.kv_a_proj_with_mqa}, {&qa, &kv}, &xq);
    backend.rms_norm(qa, 0, w.q_a_layernorm, eps, qa);
    backend.matmul(qa, 0, w.q_b_proj, q);
  }
  Tensor q3 = q.reshape({T, H, dqk});

  MlaParams p = mla_params(c);
  p.kv_b_proj = w.kv_b_proj_bf16.defined() ? &w.kv_b_proj_bf16 : &w.kv_b_proj;
  if (w.kv_b_proj_bf16.defined()) p.kv_b_proj_fp8 = &w.kv_b_proj;
  // Steps of prefill rows only: one attention call (the naive form) reads q, so the backend may
  // leave q_pe's rotation to it (MlaParams::q_rope), and o_proj's input rows, which the backend
  // may write in the attention's epilogue (MlaParams::out_rows) instead of o.
  const bool prefill_only = decode.n_seqs == 0 && prefill.n_seqs > 0;

  // q_pe rotated (or left to the attention); c_kv normed, k_pe rotated, both cached.
  backend.mla_rope_kv_write(q3, c.qk_nope_head_dim, kv, w.kv_a_layernorm, eps, positions, rope_, slots, cache_layer,
                            prefill_only ? &p : nullptr);

  Tensor o = backend.empty(DType::kF32, {T, H, c.v_head_dim});  // [T, H, dv]
  QuantizedRows oq;
  if (prefill_only) {
    oq = backend.quantized_rows(T, H * c.v_head_dim, {&w.o_proj});
    if (oq.defined()) p.out_rows = &oq;
  }
  if (decode.n_seqs > 0) backend.mla_attention(p, MlaForm::kAbsorbed, q3, cache_layer, decode, o);
  if (prefill.n_seqs > 0) backend.mla_attention(p, MlaForm::kNaive, q3, cache_layer, prefill, o);
  const Tensor o2 = o.reshape({T, H * c.v_head_dim});
  if (oq.filled) backend.matmul_parts(o2, {&w.o_proj}, {&attn_out}, &oq);
  else backend.matmul(o2, 0, w.o_proj, attn_out);
}

bool DeepseekModel::ffn(Backend& backend, const DeepseekLayerWeights& w, Tensor& h, Tensor& delta, Tensor& x,
                        QuantizedRows& xq, const NextNorm& next) const {
  const DeepseekConfig& c = config_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (!w.is_moe) {
    backend.add_rms_norm_quantized(h, delta, w.post_attention_layernorm, eps, x, xq);
    backend.mlp(x, w.mlp, delta);
    return false;
  }
  const int64_t T = x.size(0), k = c.num_experts_per_tok;
  RouterParams rp;
  rp.scoring_func = c.scoring_func;
  rp.topk_method = c.topk_method;
  rp.n_group = c.n_group;
  rp.topk_group = c.topk_group;
  rp.top_k = k;
  rp.norm_topk_prob = c.norm_topk_prob;
  rp.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  rp.correction_bias = w.e_score_correction_bias.defined() ? w.e_score_correction_bias.data<float>() : nullptr;
  Tensor ids = backend.empty(DType::kI32, {T, k});
  Tensor weights = backend.empty(DType::kF32, {T, k});
  // The router's logits in fp32, like the references.
  backend.add_rms_norm_route(h, delta, w.post_attention_layernorm, eps, x, xq, w.gate, rp, ids, weights);
  if (routing_trace_ != nullptr) {
    const Tensor host = backend.to_host(ids);
    Tensor copy = Tensor::empty_host(DType::kI32, host.shape());
    std::copy(host.data<int32_t>(), host.data<int32_t>() + host.numel(), copy.data<int32_t>());
    routing_trace_->push_back(copy);
  }
  SharedExperts shared;
  if (w.has_shared_experts) {
    shared.mlp = &w.shared_experts;
    shared.slices = &w.shared_slices;
  }
  return backend.moe_ffn_norm(x, ids, weights, w.experts, shared, delta, &xq, next);
}

Tensor DeepseekModel::forward(Backend& backend, const ForwardBatch& batch, PagedKvCache& cache, MlaPolicy policy,
                              DecodeGraphs* graphs) const {
  const DeepseekConfig& c = config_;
  const int64_t T = batch.n_tokens(), D = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  DI_CHECK_EQ(static_cast<int64_t>(batch.positions.size()), T);
  DI_CHECK_EQ(static_cast<int64_t>(batch.slots.size()), T);
  DI_CHECK_EQ(static_cast<int64_t>(batch.q_indptr.size()), batch.n_seqs() + 1);
  DI_CHECK_EQ(cache.n_layers(), c.num_hidden_layers);
  DI_CHECK(backend.device() == placed_on_);  // weights live where the backend computes
  for (int32_t t : batch.logits_rows) DI_CHECK(t >= 0 && t < T);
  backend.begin_step();

  // Two views of the batch for the two attention forms: the absorbed ("decode") sequences and
  // the naive ("prefill") ones, as the policy picks them.
  const int64_t B = batch.n_seqs();
  DI_CHECK(batch.generated.empty() || static_cast<int64_t>(batch.generated.size()) == B);
  std::vector<uint8_t> is_decode(static_cast<size_t>(B)), is_prefill(is_decode.size());
  int64_t n_decode = 0, n_one = 0;
  for (int64_t b = 0; b < B; ++b) {
    const bool one = batch.q_indptr[static_cast<size_t>(b) + 1] - batch.q_indptr[static_cast<size_t>(b)] == 1;
    const bool gen = !batch.generated.empty() && batch.generated[static_cast<size_t>(b)] != 0;
    const bool d = policy == MlaPolicy::kAbsorbed || (policy == MlaPolicy::kAuto && one) ||
                   (policy == MlaPolicy::kByOrigin && gen);
    is_decode[static_cast<size_t>(b)] = d;
    is_prefill[static_cast<size_t>(b)] = !d;
    n_decode += d;
    n_one += one;
  }
  const int64_t R = static_cast<int64_t>(batch.logits_rows.size());
  // A decode-only step (one absorbed row per sequence) has the same device work for every step
  // of its batch size: graphable. (Under kByOrigin, one-token prompt chunks are naive: not.)
  const bool graphed = graphs != nullptr && backend.supports_graphs() && routing_trace_ == nullptr && B > 0 &&
                       n_one == B && n_decode == B && T == B && R == B;

  // Every per-step index array in one buffer: ids, positions, slots, q_indptr, kv_len,
  // block_indptr, block_ids, logits rows, then the two masks packed into i32 words. Graphed
  // steps use a fixed layout (block_ids padded to the whole pool) in a persistent buffer.
  const int64_t mask_words = (B + 3) / 4;
  DecodeGraphs::Entry* entry = graphed ? &graphs->by_batch[B] : nullptr;
  // The fixed layout's page-table region only grows, by powers of two (a growth moves the later
  // arrays, so the graph is recaptured): a handful of captures, and no per-step copy of a
  // pool-sized table. (Shared prefix pages are listed once per sequence, so no pool-derived
  // bound holds anyway.)
  int64_t block_cap = static_cast<int64_t>(batch.block_ids.size());
  if (entry != nullptr) {
    int64_t cap = std::max<int64_t>(entry->block_cap, 64);
    while (cap < block_cap) cap *= 2;
    block_cap = cap;
    entry->block_cap = cap;
  }
  std::vector<int32_t> packed;
  std::vector<int64_t> at;
  for (const std::vector<int32_t>* v : {&batch.token_ids, &batch.positions, &batch.slots, &batch.q_indptr, &batch.kv_len,
                                        &batch.block_indptr, &batch.block_ids, &batch.logits_rows}) {
    at.push_back(static_cast<int64_t>(packed.size()));
    packed.insert(packed.end(), v->begin(), v->end());
    if (v == &batch.block_ids) packed.resize(static_cast<size_t>(at.back() + block_cap), 0);
  }
  at.push_back(static_cast<int64_t>(packed.size()));
  packed.resize(packed.size() + 2 * static_cast<size_t>(mask_words), 0);
  std::memcpy(packed.data() + at[8], is_decode.data(), static_cast<size_t>(B));
  std::memcpy(packed.data() + at[8] + mask_words, is_prefill.data(), static_cast<size_t>(B));
  Tensor dev;
  if (entry != nullptr) {
    if (!entry->inputs.defined() || entry->inputs.numel() != static_cast<int64_t>(packed.size())) {
      entry->inputs = backend.allocate(DType::kI32, {static_cast<int64_t>(packed.size())});
      entry->graph = -1;
    }
    backend.copy_from_host(packed.data(), entry->inputs);
    dev = entry->inputs;
  } else {
    Tensor host_packed = Tensor::empty_host(DType::kI32, {static_cast<int64_t>(packed.size())});
    std::copy(packed.begin(), packed.end(), host_packed.data<int32_t>());
    dev = backend.upload(host_packed);
  }
  auto view = [&](int i, int64_t n) { return dev.slice_rows(at[static_cast<size_t>(i)], at[static_cast<size_t>(i)] + n); };
  Tensor ids = view(0, T);
  const Tensor positions = view(1, T), slots = view(2, T), rows = view(7, R);
  if (batch.pending_tokens.defined()) backend.resolve_tokens(ids, batch.pending_tokens);
  const int32_t* dp = dev.data<int32_t>();

  AttentionBatch decode;
  decode.q_indptr = batch.q_indptr.data();
  decode.kv_len = batch.kv_len.data();
  decode.block_indptr = batch.block_indptr.data();
  decode.block_ids = batch.block_ids.data();
  decode.block_size = cache.block_size();
  decode.n_rows = T;
  decode.dev.q_indptr = dp + at[3];
  decode.dev.kv_len = dp + at[4];
  decode.dev.block_indptr = dp + at[5];
  decode.dev.block_ids = dp + at[6];
  AttentionBatch prefill = decode;
  decode.seq_mask = is_decode.data();
  decode.dev.seq_mask = reinterpret_cast<const uint8_t*>(dp + at[8]);
  decode.n_seqs = n_decode > 0 ? B : 0;
  prefill.seq_mask = is_prefill.data();
  prefill.dev.seq_mask = reinterpret_cast<const uint8_t*>(dp + at[8] + mask_words);
  prefill.n_seqs = n_decode < B ? B : 0;

  // The device work of the step: identical for every decode step of a batch size (graphed steps
  // read their host-side AttentionBatch fields only for sizes and the prefill form, not used).
  auto body = [&]() {
    Tensor h = backend.empty(DType::kF32, {T, D});       // [T, hidden] residual stream
    Tensor x = backend.empty(DType::kF32, {T, D});       // [T, hidden] normalized input of a sublayer
    Tensor delta = backend.empty(DType::kF32, {T, D});   // [T, hidden] sublayer output
    // x's rows in the backend's form for its linears (QuantizedRows: FP8 codes or bf16 rows),
    // written by the norms that write x (empty where the backend has no use for them): one
    // buffer, as x, for every sublayer's input; none for layer 0's (rms_norm) or the final norm.
    std::vector<const LinearWeight*> consumers;
    for (const DeepseekLayerWeights& w : weights_.layers)
      for (const LinearWeight* p : {&w.q_proj, &w.q_a_proj, &w.kv_a_proj_with_mqa, &w.mlp.gate_proj,
                                    &w.shared_experts.gate_proj})
        if (p->weight.defined()) consumers.push_back(p);
    for (const DeepseekLayerWeights& w : weights_.layers)
      if (!w.experts.empty()) consumers.push_back(&w.experts[0].gate_proj);
    QuantizedRows xq_buf = backend.quantized_rows(T, D, consumers), none;
    backend.embedding(weights_.embed_tokens, ids, h);
    backend.rms_norm(h, 0, weights_.layers[0].input_layernorm, eps, x);
    bool normed = false;  // the previous layer's FFN op ran this layer's input norm
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const DeepseekLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
      const int64_t layer_mark = backend.step_mark();  // the layer's temporaries die with it
      // Layer 0's x is the embedding's norm; every later layer's comes from the residual stream
      // and the previous layer's output, made by the previous FFN op or by this attention op
      // (either of which a backend may fuse).
      const InputNorm pre{&h, &delta, &w.input_layernorm};
      attention(backend, l, l == 0 || normed ? nullptr : &pre, x, l == 0 ? none : xq_buf, positions, slots, decode,
                prefill, cache.layer(l), delta);
      const bool last = l + 1 == c.num_hidden_layers;
      const NextNorm next{&h, last ? &weights_.norm : &weights_.layers[static_cast<size_t>(l) + 1].input_layernorm,
                          eps, &x, last ? &none : &xq_buf};
      normed = ffn(backend, w, h, delta, x, xq_buf, next);
      if (last && !normed) backend.add_rms_norm_quantized(h, delta, weights_.norm, eps, x, none);
      backend.step_release(layer_mark);
    }
    Tensor last = backend.empty(DType::kF32, {R, D});
    backend.gather_rows(x, rows, last);
    Tensor logits = backend.empty(DType::kF32, {R, c.vocab_size});
    backend.matmul(last, 0, weights_.lm_head, logits);
    return logits;
  };
  if (entry == nullptr) return body();
  if (entry->graph >= 0 && entry->generation == backend.step_memory_generation()) {
    backend.graph_launch(entry->graph);
    backend.step_release(entry->arena_mark);  // step memory past the graph's is free for the caller
    ++graphs->n_replays;
    return entry->logits;
  }
  if (entry->uses++ == 0) return body();  // first use: eager, so step memory reaches its size
  const int64_t generation = backend.step_memory_generation();
  backend.capture_begin();
  Tensor logits = body();
  entry->graph = backend.capture_end();
  entry->generation = generation;
  entry->arena_mark = backend.step_mark();
  entry->logits = logits;
  backend.graph_launch(entry->graph);  // a capture records; this step still has to run
  return logits;
}

}  // namespace deepinfer
