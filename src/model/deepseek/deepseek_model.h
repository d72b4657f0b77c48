// DeepseekModel: the DeepSeek-V2/V3 forward as straight-line calls to backend ops, over the
// paged MLA latent cache. Owns the config, weights and RoPE table; borrows the backend.
// Does not schedule, sample or allocate KV pages: callers describe each step in a ForwardBatch.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "kv/paged_kv_cache.h"
#include "model/deepseek/deepseek_config.h"
#include "model/deepseek/deepseek_weights.h"

namespace deepinfer {

// One forward step over several sequences. Sequence b contributes query rows
// [q_indptr[b], q_indptr[b+1]) — its newest tokens — and has kv_len[b] tokens cached once
// they are written. Which attention form its rows take is the MlaPolicy's choice (below).
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [T] each < vocab_size (validated by the caller)
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> slots;         // [T] cache slot for each new token
  std::vector<int32_t> q_indptr;      // [B + 1]
  std::vector<int32_t> kv_len;        // [B]
  std::vector<int32_t> block_indptr;  // [B + 1]
  std::vector<int32_t> block_ids;     // pages of each sequence in order
  std::vector<int32_t> logits_rows;   // rows of T whose logits are returned, in this order
  // [B] 1: sequence b's rows are tokens the model generated (sampled outputs), not
  // prompt tokens. Read by MlaPolicy::kByOrigin only; one entry holds one kind (callers split a
  // sequence's chunk at its prompt's end into two entries over the same pages).
  std::vector<uint8_t> generated;
  // Tokens sampled by a step still in flight, in the backend's memory: token_ids[t] < 0 stands
  // for pending_tokens[−token_ids[t] − 1] (Backend::resolve_tokens). Undefined: none.
  Tensor pending_tokens;

  int64_t n_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t n_seqs() const { return static_cast<int64_t>(kv_len.size()); }
  // Appends one sequence's step: new tokens at positions [kv.n_tokens, kv.n_tokens + n)
  // (kv must already own pages for them); `is_generated`: they are generated tokens (see
  // `generated`). Returns the first new row's index.
  int32_t add_sequence(const KvSequence& kv, const int32_t* tokens, int64_t n, int64_t block_size,
                       bool is_generated = false);
};

// CUDA graphs of decode steps, one per batch size, owned by the caller of forward (a runner).
// A size is run eagerly once (the step arena reaches its size), captured the second time and
// replayed after that; a graph is recaptured when the step arena was rebuilt since.
struct DecodeGraphs {
  struct Entry {
    int64_t uses = 0;
    int64_t graph = -1;
    int64_t generation = -1;  // Backend::step_memory_generation() at capture
    int64_t arena_mark = 0;   // step memory position after the captured body
    int64_t block_cap = 0;    // block_ids slots in the fixed layout (only grows, by powers of two)
    Tensor inputs;            // [fixed layout] I32: the step's index arrays, persistent
    Tensor logits;            // [B, vocab] F32: the graph's output
  };
  std::map<int64_t, Entry> by_batch;
  int64_t n_replays = 0;
};

// How a step's sequences attend (the two forms are the same math and differ by rounding).
// kAuto: one-token steps use the absorbed form, longer ones the naive form (cheaper for long
// prompts): a token's bits depend on how its sequence was chunked. The batch-invariant mode
// needs a form fixed by the token alone:
// - kAbsorbed: every row absorbed.
// - kByOrigin: prompt tokens naive, generated tokens absorbed (ForwardBatch::generated), for
//   backends whose naive form is row-invariant (Backend::naive_mla_batch_invariant). A token's
//   form then survives chunking, batching and preemption (the recompute splits its chunk at the
//   prompt's end), and a prefix-cache page is shared only between sequences that computed it in
//   the same form: pages holding generated tokens are neither hit nor registered
//   (SchedulerConfig::share_prompt_pages_only).
enum class MlaPolicy { kAuto, kAbsorbed, kByOrigin };

// The policy of a run: kAuto by default; in the batch-invariant mode kByOrigin where the
// backend's naive form is row-invariant at the model's dims, else kAbsorbed.
MlaPolicy mla_policy_for(const Backend& backend, const DeepseekConfig& config, bool batch_invariant);
const char* mla_policy_name(MlaPolicy policy);  // "auto" | "absorbed" | "by_origin"

class DeepseekModel {
 public:
  // Parses config.json, loads and validates every tensor. Errors name the file/field/tensor.
  static Expected<std::unique_ptr<DeepseekModel>> load(const Checkpoint& checkpoint);
  // Builds a model from an already parsed config and loaded weights (tests, dummy weights).
  // `placed_on`: where the weights live (host for loaded checkpoints).
  DeepseekModel(DeepseekConfig config, DeepseekWeights weights, Device placed_on = Device::cpu());
  // Random weights created directly in `backend`'s memory (`--load-format dummy`); see
  // dummy_deepseek_weights. weight_dtype BF16 or F8E4M3 (needs config.fp8).
  static std::unique_ptr<DeepseekModel> dummy(DeepseekConfig config, Backend& backend, DType weight_dtype,
                                              uint64_t seed);

  // Moves the weights into `backend`'s memory and layout (no-op for host backends); forward
  // then requires a backend on that device. The host copies are released. An error, before any
  // copy, when the device's free memory cannot hold the placed weights.
  Status place(Backend& backend);
  Device placed_on() const { return placed_on_; }

  // Debugging/tests: when set, every MoE layer of every forward appends a host copy of its
  // routing decision (ids [T, top_k] I32, layers in order). Synchronizes on device backends.
  void set_routing_trace(std::vector<Tensor>* trace) const { routing_trace_ = trace; }

  const DeepseekConfig& config() const { return config_; }
  const DeepseekWeights& weights() const { return weights_; }
  bool has_mtp() const { return !weights_.mtp.empty(); }
  // What each main layer caches per token (the MLA latent).
  std::vector<KvLayerSpec> kv_layers() const;

  // Runs the step, writing the new tokens' KV into `cache`; returns logits
  // [batch.logits_rows.size(), vocab_size] F32. Preconditions: batch consistent with cache.
  // With `graphs` on a backend that has them, decode-only steps (one new token per sequence,
  // one logits row each) run through a CUDA graph of their batch size.
  Tensor forward(Backend& backend, const ForwardBatch& batch, PagedKvCache& cache,
                 MlaPolicy policy = MlaPolicy::kAuto, DecodeGraphs* graphs = nullptr) const;

 private:
  // The residual stream's update and norm that make a layer's input x: residual += delta, x =
  // RMSNorm(residual) · weight (add_rms_norm_quantized), left to the layer's attention so a
  // backend can fold it into its first kernel.
  struct InputNorm {
    Tensor* residual;
    const Tensor* delta;
    const Tensor* weight;
  };
  // attn_out [T, hidden] = MLA(x [T, hidden]) for layer l; writes the layer's KV. pre: null (x
  // given), or the norm that makes x first (attn_out may be its delta). xq: x's rows quantized
  // by the norm that wrote x (QuantizedRows, backend.h; may be empty).
  void attention(Backend& backend, int64_t l, const InputNorm* pre, Tensor& x, QuantizedRows& xq,
                 const Tensor& positions, const Tensor& slots, const AttentionBatch& decode,
                 const AttentionBatch& prefill, Tensor& cache_layer, Tensor& attn_out) const;
  // The FFN half of a layer: h [T, hidden] += delta (the attention's output), x = post-attention
  // RMSNorm of h (its rows quantized into xq where the backend makes them), then delta = dense
  // MLP or MoE (+ shared experts) of x. A MoE layer's norm, router and routing go to the backend
  // as one op (add_rms_norm_route), which it may fuse. A MoE layer also hands the backend the
  // next sublayer's input norm (next: h += delta, x = that norm of h, its rows into next.xq),
  // which it may run in the experts' last launch (moe_ffn_norm); returns whether it did (delta
  // then spent, x the next sublayer's input), else the caller norms h + delta.
  bool ffn(Backend& backend, const DeepseekLayerWeights& w, Tensor& h, Tensor& delta, Tensor& x, QuantizedRows& xq,
           const NextNorm& next) const;

  DeepseekConfig config_;
  DeepseekWeights weights_;
  RopeParams rope_;
  Device placed_on_;
  mutable std::vector<Tensor>* routing_trace_ = nullptr;
};

}  // namespace deepinfer
