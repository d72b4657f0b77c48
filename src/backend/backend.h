// Backend: the ops a DeepSeek forward is made of, with explicit shapes, and the memory they run
// on. Implemented by `reference` (naive fp32 loops, the oracle in tests), `cpu` (threaded and
// vectorized) and `cuda` (src/backend/cuda, built with DEEPINFER_CUDA). Ops never allocate their
// outputs: callers pass them, in the backend's memory (`empty`, `allocate`, `upload`).
// Activations are F32 at every op boundary; a backend may compute inside an op in lower
// precision (CUDA: bf16 GEMM operands, fp32 accumulation). Pointers inside parameter structs
// (RouterParams::correction_bias, AttentionBatch::dev) point into the backend's memory.
// Inputs are validated by the model at load; ops check shapes with DI_CHECK.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/op_params.h"
#include "core/status.h"
#include "core/tensor.h"
#include "sample/logits_processors.h"
#include "sample/sampler.h"

namespace deepinfer {

// One row to sample: the sampler parameters, the Philox key (seed, position of the new token),
// the row's logits processors (null: none) and how many top log-probabilities it wants.
struct SampleRow {
  SamplerParams params;
  uint64_t seed = 0;
  uint64_t position = 0;
  const LogitsProcessors* processors = nullptr;  // owned by the caller, alive during sample()
  int32_t n_top_logprobs = 0;                    // ≤ SampleExtras::top_ids.size(1)
};

// Optional inputs and outputs of Backend::sample, in the backend's memory.
struct SampleExtras {
  Tensor pending_tokens;  // [P] I32: the tokens LogitsProcessors::pending indexes (< 0: failed sample)
  Tensor top_ids;         // [R, n_top] I32: each row's best raw logits' ids, best first (lowest id
                          // on ties), −1 past the row's n_top_logprobs
  Tensor top_logprobs;    // [R, n_top] F32: their log-softmax values of the raw row
};

// Rows of an activation in a backend's own low-precision form for its linears — the CUDA
// backend: for FP8 linears each row rounded to bf16, then e4m3 codes per 1×128 group with fp32
// scales, the bits its W8A8 GEMMs would make of those rows themselves; for bf16 linears the rows
// rounded to bf16, as its GEMMs convert them. The model asks for them
// (Backend::quantized_rows) where a producer op can write them beside its fp32 output
// (add_rms_norm_quantized) and passes them to the consumers of the same rows (matmul_parts,
// moe_ffn), which then read them instead of quantizing again: one pass over memory and one
// launch fewer per consumer. Empty (codes undefined): the backend has no use for them.
struct QuantizedRows {
  Tensor codes;   // [T, D] U8 (e4m3 codes), or BF16 (the rows rounded)
  Tensor scales;  // [T, D / 128] F32 (U8 codes), or undefined (BF16)
  // Set by a producer that writes the rows only where it can (mla_attention through
  // MlaParams::out_rows); the producers that always write them (add_rms_norm_quantized) leave it.
  bool filled = false;
  bool defined() const { return codes.defined(); }
};

// The input norm of the sublayer after an op (Backend::moe_ffn_norm): residual += the op's
// output; x = rms_norm(residual) · weight (eps); xq: x's rows for its consumers, as
// add_rms_norm_quantized writes them (may be undefined).
struct NextNorm {
  Tensor* residual = nullptr;       // [T, D] F32
  const Tensor* weight = nullptr;   // [D]
  float eps = 0;
  Tensor* x = nullptr;              // [T, D] F32
  QuantizedRows* xq = nullptr;
};

// Device time spent in one kind of op (Backend::take_op_times).
struct OpTime {
  std::string op;  // e.g. "matmul 2048x2048" (N×K), "mla_attention absorbed", "moe_experts"
  int64_t calls = 0;
  double ms = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- Memory -------------------------------------------------------------------------------
  // Where this backend's tensors live. Host backends read checkpoint bytes in place.
  virtual Device device() const { return Device::cpu(); }
  bool on_host() const { return device().kind == DeviceKind::kCpu; }
  // Step memory: valid until the next begin_step(); contents unspecified.
  virtual Tensor empty(DType dtype, const std::vector<int64_t>& shape) { return Tensor::empty_host(dtype, shape); }
  // Long-lived, zero-filled memory (KV pages, placed weights).
  virtual Tensor allocate(DType dtype, const std::vector<int64_t>& shape) { return Tensor::empty_host(dtype, shape); }
  // Step-memory copy of a host tensor (the tensor itself on host backends).
  virtual Tensor upload(const Tensor& host) { return host; }
  // dst ← host bytes (dst.n_bytes() of them), ordered after the ops already issued.
  virtual void copy_from_host(const void* src, Tensor& dst);
  // A host tensor holding t's values once every op issued so far has finished (t itself on host).
  virtual Tensor to_host(const Tensor& t) { return t; }
  // A new step begins: step memory handed out before may be reused.
  virtual void begin_step() {}
  // Step memory as a stack: what was handed out after step_mark() returned m is taken back by
  // step_release(m) (those tensors must be dead; device backends order the reuse after the ops
  // already issued on their stream). No-ops on host backends.
  virtual int64_t step_mark() { return 0; }
  virtual void step_release(int64_t mark) { (void)mark; }
  // Element type of KV pages (F32 on host backends, BF16 on CUDA).
  virtual DType kv_dtype() const { return DType::kF32; }
  // Device memory {free, total} in bytes; {0, 0} on host backends (sized by kv_cache_bytes).
  virtual std::pair<int64_t, int64_t> memory_info() const { return {0, 0}; }
  // Bytes of step memory held (its high-water mark once steps have run); 0 on host backends.
  virtual int64_t step_memory_bytes() const { return 0; }
  // Waits for every op issued so far (no-op on host backends).
  virtual void synchronize() {}

  // ---- Asynchronous execution (device backends; host backends run everything at once) -------
  // Host memory a device can copy into asynchronously (pinned on CUDA), zero-filled.
  virtual Tensor allocate_staging(DType dtype, const std::vector<int64_t>& shape) {
    return Tensor::empty_host(dtype, shape);
  }
  // host_dst ← src once the ops issued so far have run (same byte size); complete after a
  // wait_fence on a later fence.
  virtual void copy_to_host_async(const Tensor& src, Tensor& host_dst);
  // A point in the op stream: record_fence() after the issued ops; wait_fence blocks until they
  // have run; fence_elapsed_ms is the device time between two completed fences (0 on host).
  virtual int64_t record_fence() { return 0; }
  virtual void wait_fence(int64_t fence) { (void)fence; }
  virtual double fence_elapsed_ms(int64_t from, int64_t to) {
    (void)from;
    (void)to;
    return 0.0;
  }
  // Releases a fence's resources (after its last use).
  virtual void release_fence(int64_t fence) { (void)fence; }

  // ---- Graphs (CUDA graphs; host backends have none) ------------------------------------------
  // Ops issued between capture_begin and capture_end are recorded, not run; graph_launch runs
  // the recording again on the same memory. Step memory addresses recorded in a graph stay valid
  // while step_memory_generation() is unchanged (it changes when the step arena is rebuilt).
  virtual bool supports_graphs() const { return false; }
  // Op timing, a diagnostic for benchmarks: while on, every op is bracketed by device events
  // (and graphs are not captured, so each op runs as launched). take_op_times waits for the
  // device and returns the time per op kind since the last call. Host backends time nothing.
  virtual void set_op_timing(bool on) { (void)on; }
  // Batch-invariant kernels (DEEPINFER_BATCH_INVARIANT=1): while on, every op computes a row's
  // result with a tiling and reduction order that do not depend on the other rows of the step
  // (how many, which, chunked or not), so a token's logits are bitwise the same in any batch.
  // Host backends are invariant always; device backends trade some speed for it. Set it before
  // the first step: CUDA graphs already captured keep the kernels they were captured with.
  virtual void set_batch_invariant(bool on) { (void)on; }
  // Whether, in the batch-invariant mode, the naive MLA form (MlaForm::kNaive) computes each
  // row with arithmetic fixed by the row and its keys alone — not by the step's other rows, the
  // chunk the row is in, or the launch's key count — so MlaPolicy::kByOrigin may run prompt
  // tokens on it. Host backends: always (one thread per output element, keys in order).
  // `p`: the model's dims (kv_b_proj not read).
  virtual bool naive_mla_batch_invariant(const MlaParams& p) const {
    (void)p;
    return on_host();
  }
  virtual std::vector<OpTime> take_op_times() { return {}; }
  virtual void capture_begin() { DI_CHECK(false && "no graphs on this backend"); }
  virtual int64_t capture_end() { return -1; }
  virtual void graph_launch(int64_t graph) { (void)graph; }
  virtual int64_t step_memory_generation() const { return 0; }
  // Weight placement for device backends: one LinearWeight holding `parts` stacked by rows in
  // this backend's memory and preferred layout (row views give the parts back, see
  // LinearWeight::rows; part boundaries keep FP8 scale rows aligned). Host backends return the
  // single part unchanged. Vectors (norm weights, tables, biases) keep their dtype; F16 → F32.
  virtual LinearWeight place_linear(const std::vector<const LinearWeight*>& parts);
  virtual Tensor place_tensor(const Tensor& host) { return host; }
  // A Linear kept in fp32 whatever the backend's GEMM precision: the MoE router, whose scores
  // choose experts (a bf16 router flips choices at near-ties that fp32 references resolve).
  virtual LinearWeight place_linear_fp32(const LinearWeight& host) { return place_linear({&host}); }
  // An uninitialized Linear [n_out, n_in] of `dtype` (F32 | BF16 | F8E4M3) in this backend's
  // layout (FP8: its scale grid, block_k = 128; the host keeps 128×128 blocks).
  virtual LinearWeight allocate_linear(int64_t n_out, int64_t n_in, DType dtype);
  // t ← N(0, std²) (`normal`) or U(lo, hi) values of t's dtype, deterministic in seed; FP8
  // tensors get e4m3 codes of N(0, std²). For dummy weights (`--load-format dummy`).
  virtual void fill_random(Tensor& t, uint64_t seed, bool normal, float a, float b);

  // ---- Ops ----------------------------------------------------------------------------------

  // out[t, :] = table[ids[t], :] as f32. table [V, D] F32|BF16|F16; ids [T] I32 (< V); out [T, D] F32.
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;

  // out[t, :D] = weight ⊙ x[t, :D] / sqrt(mean(x[t, :D]²) + eps); statistics in fp32.
  // weight [D] F32|BF16|F16; x [T, ≥D] F32 (row stride `x_stride` elements, ≥ D; 0 = D);
  // out [T, W ≥ D] F32: only its first D columns are written (out may alias x).
  virtual void rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) = 0;

  // residual += delta; out = rms_norm(residual). residual, delta, out [T, D] F32.
  virtual void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) = 0;

  // Buffers for the quantized form of T rows of width D that the linears `consumers` will all
  // read (QuantizedRows): allocated (step memory, like `empty`) where this backend would quantize
  // those rows for at least one of them at this size, else empty. Default: empty.
  virtual QuantizedRows quantized_rows(int64_t T, int64_t D, const std::vector<const LinearWeight*>& consumers) {
    (void)T, (void)D, (void)consumers;
    return {};
  }

  // add_rms_norm, and xq (from quantized_rows for out's shape, or empty) filled with out's rows
  // quantized. Default: add_rms_norm; xq must be empty (the default quantized_rows).
  virtual void add_rms_norm_quantized(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps,
                                      Tensor& out, QuantizedRows& xq);

  // out[M, N] = x[M, K] · Wᵀ (fp32 accumulation). x F32 with row stride `x_stride` (0 = K).
  virtual void matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) = 0;

  // out[i][M, N_i] = x[M, K] · w[i]ᵀ for linears that read the same x (q_proj or q_a_proj, and
  // kv_a_proj_with_mqa). A backend may run them as one GEMM where the placement stacked their
  // rows in one buffer (deepseek_placement.h); the values are matmul's up to rounding order.
  // Default: one matmul each. x F32 [M, K] contiguous; out[i] F32 [M, N_i]. xq: null, or x's
  // rows quantized (add_rms_norm_quantized wrote them with x; may be empty), for a backend to
  // read instead of quantizing x again — the same values either way.
  virtual void matmul_parts(const Tensor& x, const std::vector<const LinearWeight*>& w,
                            const std::vector<Tensor*>& out, const QuantizedRows* xq = nullptr);

  // Rotates channels [offset, offset + rope.dim()) of every head in place.
  // x [T, n_heads, head_stride] F32; positions [T] I32, a step input copied from the host (as
  // AttentionBatch's device arrays, and in mla_kv_write / mla_rope_kv_write too).
  virtual void rope(Tensor& x, int64_t offset, const Tensor& positions, const RopeParams& rope) = 0;

  // out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i]. gate_up [T, 2I] F32; out [T, I] F32.
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;

  // Writes latent rows into the paged cache: cache[slot / block_size][slot % block_size] = latent[t].
  // latent [T, L] F32; slots [T] I32; cache [n_blocks, block_size, L] F32.
  virtual void kv_write(const Tensor& latent, const Tensor& slots, Tensor& cache) = 0;

  // A layer's new MLA latents, finished and cached: c_kv = rms_norm(kv[t, :r]) with `norm`
  // (r = norm.numel()), k_pe = rope(kv[t, r:]) (one head at offset r, `positions`), both in
  // place, then kv_write(kv, slots, cache). kv [T, r + dr] F32. Default: those three ops.
  virtual void mla_kv_write(Tensor& kv, const Tensor& norm, float eps, const Tensor& positions, const RopeParams& rope,
                            const Tensor& slots, Tensor& cache);

  // The step's queries rotated, rope(q, q_offset, positions, rope), and the layer's new latents
  // finished and cached, mla_kv_write(kv, norm, eps, positions, rope, slots, cache): one op, so a
  // backend can share the positions' rotation table and the launch. q [T, n_heads, head_stride]
  // F32, kv [T, r + dr] F32. `reader`: null, or the parameters of the one mla_attention call that
  // will read q (the model: the naive form of a step without decode rows) — a backend may then
  // leave q's rope channels unrotated and set reader->q_rope for that call to rotate them as it
  // reads q (CUDA: the prefill kernel, set_mla_q_rope), the same values. Default: those two ops
  // (reader left as it is).
  virtual void mla_rope_kv_write(Tensor& q, int64_t q_offset, Tensor& kv, const Tensor& norm, float eps,
                                 const Tensor& positions, const RopeParams& rope, const Tensor& slots, Tensor& cache,
                                 MlaParams* reader);

  // Multi-head latent attention over the paged latent cache.
  // q [T, H, dn + dr] F32 (RoPE applied, or rotated by p.q_rope as it is read); cache [n_blocks,
  // block_size, r + dr] F32 holding [c_kv (post-norm) | k_pe (post-RoPE)]; out [T, H, dv] F32.
  virtual void mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                             const AttentionBatch& batch, Tensor& out) = 0;

  // An MLA attention sublayer (no q-LoRA) of a step whose rows are all decode rows of `decode`
  // (n_rows = T; its new tokens' latents not yet cached): q, kv = matmul_parts(x, {q_proj,
  // kv_a_proj}, xq); mla_rope_kv_write(q, dn, kv, kv_a_layernorm, …, slots, cache);
  // o = mla_attention(mla, kAbsorbed, q, cache, decode); out = o · o_projᵀ. The default runs those
  // ops; a backend may fuse them (CUDA: one kernel at one token, cuda_mla_sublayer.cu), the same
  // values up to rounding order. x [T, D] F32; positions, slots [T] I32; cache [n_blocks,
  // block_size, r + dr]; out [T, D] F32.
  virtual void mla_decode_sublayer(const MlaSublayerWeights& w, const Tensor& x, const QuantizedRows* xq,
                                   const Tensor& positions, const Tensor& slots, const AttentionBatch& decode,
                                   Tensor& cache, Tensor& out);

  // A layer's input norm and its attention sublayer as one op: add_rms_norm_quantized(residual,
  // delta, norm, eps, x, xq), then mla_decode_sublayer(w, x, &xq, positions, slots, decode, cache,
  // out). out may be delta (read first). A backend may fold the norm into the sublayer (CUDA, at
  // one token: the sublayer kernel's blocks norm the row themselves); residual and x are written
  // either way, xq only where the backend's sublayer reads it. Default: the two ops.
  virtual void add_rms_norm_mla_decode_sublayer(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps,
                                                Tensor& x, QuantizedRows& xq, const MlaSublayerWeights& w,
                                                const Tensor& positions, const Tensor& slots,
                                                const AttentionBatch& decode, Tensor& cache, Tensor& out);

  // Router: logits [T, E] F32 → ids [T, top_k] I32 (by descending biased score, ties to the
  // lower id) and weights [T, top_k] F32 (unbiased scores, optionally renormalized, × scale).
  virtual void moe_route(const Tensor& logits, const RouterParams& p, Tensor& ids, Tensor& weights) = 0;

  // A MoE layer's input: add_rms_norm_quantized(residual, delta, norm, eps, out, xq), then the
  // router's logits = out · routerᵀ (matmul; router F32 [E, D]) and moe_route(logits, p, ids,
  // weights). A backend may run the three as one launch (the CUDA backend at one token, in the
  // batch-invariant mode's arithmetic). Default: the three ops.
  virtual void add_rms_norm_route(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps, Tensor& out,
                                  QuantizedRows& xq, const LinearWeight& router, const RouterParams& p, Tensor& ids,
                                  Tensor& weights);

  // out[t] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]), summed in j order.
  // x [T, D] F32; ids/weights [T, k]; out [T, D] F32.
  virtual void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                           const std::vector<MlpWeights>& experts, Tensor& out) = 0;

  // A MoE block's experts: out = moe_experts(x, ids, weights, experts) + mlp(x, *shared.mlp),
  // the shared term absent when shared.mlp is null. shared.slices, when not empty, hold the same
  // shared weights cut into experts of the routed width, stacked right after `experts` (device
  // placements, see deepseek_placement.h): a backend may run them in the routed experts' launch
  // as extra slots of weight 1 (the same sum up to rounding order). Default: the three ops.
  // xq: as matmul_parts's (x's rows quantized, or null).
  virtual void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
                       const SharedExperts& shared, Tensor& out, const QuantizedRows* xq = nullptr);

  // A MoE block's experts, then the next sublayer's input norm on their output: moe_ffn(x, ids,
  // weights, experts, shared, out, xq), then add_rms_norm_quantized(*next.residual, out,
  // *next.weight, next.eps, *next.x, *next.xq). next.x may be x and next.xq may be xq (written
  // after the experts have read them). A backend may fold the norm into the experts' combine (the
  // CUDA backend at prefill sizes: one pass over the token rows where there were three; out is then
  // not written). Returns whether the norm ran here; false: only moe_ffn ran, for the caller to
  // norm (the CUDA backend at decode sizes, where the next attention op norms — at one token inside
  // its sublayer kernel).
  // Default: moe_ffn, false.
  virtual bool moe_ffn_norm(const Tensor& x, const Tensor& ids, const Tensor& weights,
                            const std::vector<MlpWeights>& experts, const SharedExperts& shared, Tensor& out,
                            const QuantizedRows* xq, const NextNorm& next);

  // out = down(silu(gate(x)) * up(x)). x [T, D] F32; out [T, D] F32.
  virtual void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) = 0;

  // Tokens not yet known on the host (sampled by a step still in flight): ids[t] < 0 stands for
  // pending[−ids[t] − 1] (0 if that sample failed). ids [T] I32, pending [P] I32, both here.
  virtual void resolve_tokens(Tensor& ids, const Tensor& pending);

  // out[i, :] = x[rows[i], :]. x [T, D] F32; rows [R] I32 (each < T); out [R, D] F32.
  virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;

  // out += x elementwise. out, x [T, D] F32.
  virtual void add(Tensor& out, const Tensor& x) = 0;

  // Sampling with sample/sampler.h's semantics, one token per row: the row's logits processors
  // (logits_processors.h) applied to a copy, then the sampler. logits [R, V] F32 raw, unchanged;
  // rows [R] on the host; tokens [R] I32 (−1 where the raw row holds NaN or ±Inf); logprobs [R]
  // F32 = log-softmax of the raw row at the token; extras (null when no row has pending tokens
  // or wants top log-probabilities) as SampleExtras says. Device backends run it without
  // synchronizing; copy `tokens` back to use it.
  virtual void sample(const Tensor& logits, const std::vector<SampleRow>& rows, Tensor& tokens, Tensor& logprobs,
                      SampleExtras* extras = nullptr);
};

// "reference" | "cpu" | "cuda" (when built with DEEPINFER_CUDA); n_threads applies to "cpu"
// (0 = all cores). Unknown names, or "cuda" without a usable GPU: an error naming the cause.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, int n_threads = 0);

// True when this build has the CUDA backend compiled in (the GPU may still be absent).
bool cuda_backend_built();

}  // namespace deepinfer
