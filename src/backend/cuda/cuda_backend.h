// CudaBackend: the Backend ops on one NVIDIA GPU (sm_90a; compiled for sm_100a too). Weights,
// activations and KV pages live in device memory; every op is issued on the backend's stream
// without host synchronization (to_host synchronizes; so does moe_experts on prefill-sized steps
// outside graph captures, which reads the per-expert row counts back for cuBLAS), so a decode step can be
// enqueued while the previous one runs.
//
// Numerics: activations are F32 at op boundaries; GEMM operands are rounded to bf16 and
// accumulated in fp32 (cuBLAS; the decode GEMV and small_m_gemm at decode sizes); FP8 weights
// are read as FP8 by those two and dequantized to bf16 for cuBLAS otherwise (per-row scales,
// block_k = 128). KV pages are BF16.
// Softmax, norms, RoPE and routing run in fp32. Tolerances against the reference: docs/DESIGN.md.
//
// Memory: `allocate` = cudaMalloc (weights, KV pages); `empty`/`upload` = a step arena (bump
// allocation, reset by begin_step, grown to the high-water mark), so steady-state steps make
// no allocation and reuse the same addresses.
//
// This header is plain C++ (no CUDA includes): the engine includes it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace deepinfer {
namespace cuda {
enum class Elem : int;  // cuda_common.h
struct MlaQRope;        // cuda_common.h
struct MlaSublayerArgs;  // cuda_common.h
}  // namespace cuda

struct CudaState;  // stream, cuBLAS handle, arena (cuda_backend.cu)

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }

  Device device() const override { return {DeviceKind::kCuda, device_index_}; }
  Tensor empty(DType dtype, const std::vector<int64_t>& shape) override;
  Tensor allocate(DType dtype, const std::vector<int64_t>& shape) override;
  Tensor upload(const Tensor& host) override;
  void copy_from_host(const void* src, Tensor& dst) override;
  Tensor to_host(const Tensor& t) override;
  void begin_step() override;
  int64_t step_mark() override;
  void step_release(int64_t mark) override;
  DType kv_dtype() const override { return DType::kBF16; }
  LinearWeight place_linear(const std::vector<const LinearWeight*>& parts) override;
  Tensor place_tensor(const Tensor& host) override;
  // Also builds router_gemm's bf16 image of the weight (LinearWeight::derived; router_split.h)
  // where n_in % 64 == 0: one part where the values are bf16 (the checkpoints' routers), else three.
  LinearWeight place_linear_fp32(const LinearWeight& host) override;
  LinearWeight allocate_linear(int64_t n_out, int64_t n_in, DType dtype) override;
  void fill_random(Tensor& t, uint64_t seed, bool normal, float a, float b) override;

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) override;
  // e4m3 rows where some consumer is an FP8 linear that takes the W8A8 form at T rows and
  // D % 128 == 0; else bf16 rows where some consumer is a bf16 linear past the GEMV's rows (or
  // any, in the batch-invariant mode); the norm then writes them in its own launch.
  QuantizedRows quantized_rows(int64_t T, int64_t D, const std::vector<const LinearWeight*>& consumers) override;
  void add_rms_norm_quantized(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out,
                              QuantizedRows& xq) override;
  void matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) override;
  // Two row-stacked linears at GEMV sizes: one GEMV launch writing the two outputs. The W8A8
  // forms read xq (when given and defined) instead of quantizing x.
  void matmul_parts(const Tensor& x, const std::vector<const LinearWeight*>& w, const std::vector<Tensor*>& out,
                    const QuantizedRows* xq = nullptr) override;
  void rope(Tensor& x, int64_t offset, const Tensor& positions, const RopeParams& rope) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void kv_write(const Tensor& latent, const Tensor& slots, Tensor& cache) override;
  void mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                     const AttentionBatch& batch, Tensor& out) override;
  void mla_kv_write(Tensor& kv, const Tensor& norm, float eps, const Tensor& positions, const RopeParams& rope,
                    const Tensor& slots, Tensor& cache) override;
  // One launch: the queries' RoPE shares the latent write's rotation table (the same bits as
  // rope then mla_kv_write); or, for a reader the prefill kernel will serve (q_rope_in_prefill),
  // the tables stored for it (reader->q_rope) and q left unrotated.
  void mla_rope_kv_write(Tensor& q, int64_t q_offset, Tensor& kv, const Tensor& norm, float eps,
                         const Tensor& positions, const RopeParams& rope, const Tensor& slots, Tensor& cache,
                         MlaParams* reader) override;
  // One token of one sequence (bf16 weights, DeepSeek's MLA dims at H = 16, sm_90a): one
  // persistent kernel (cuda::mla_sublayer; in the batch-invariant mode its invariant form, the
  // op-by-op path's bits); otherwise Backend's ops.
  void mla_decode_sublayer(const MlaSublayerWeights& w, const Tensor& x, const QuantizedRows* xq,
                           const Tensor& positions, const Tensor& slots, const AttentionBatch& decode, Tensor& cache,
                           Tensor& out) override;
  // Where that kernel runs, set_sublayer_norm_fused picks the fold and the row fits it (D ≤
  // kMlaSublayerNormMaxD, aligned rows: add_rms_norm's vectorized kernel), the norm in the same launch (xq left unwritten: the
  // kernel reads x's rows itself); otherwise add_rms_norm_quantized, then mla_decode_sublayer.
  void add_rms_norm_mla_decode_sublayer(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps, Tensor& x,
                                        QuantizedRows& xq, const MlaSublayerWeights& w, const Tensor& positions,
                                        const Tensor& slots, const AttentionBatch& decode, Tensor& cache,
                                        Tensor& out) override;
  void moe_route(const Tensor& logits, const RouterParams& p, Tensor& ids, Tensor& weights) override;
  // One token (T = 1, F32 router, shapes cuda::norm_route_ok takes) where set_norm_route_fused
  // picks it: cuda::norm_route's one launch, the batch-invariant mode's bits in both modes; else
  // the three ops.
  void add_rms_norm_route(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps, Tensor& out,
                          QuantizedRows& xq, const LinearWeight& router, const RouterParams& p, Tensor& ids,
                          Tensor& weights) override;
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const std::vector<MlpWeights>& experts, Tensor& out) override;
  // The W8A8 forms (the shared MLP's, the routed experts' form 5) read xq when given and defined.
  void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
               const SharedExperts& shared, Tensor& out, const QuantizedRows* xq = nullptr) override;
  // From kMoeNormFoldMinTokens (512) tokens, with set_moe_norm_fold on: the norm in the routed
  // combine's launch where its shapes allow (cuda::MoeArgs::norm), else after it
  // (add_rms_norm_quantized); true. Fewer tokens: moe_ffn, false (the next attention op norms —
  // at one token inside the sublayer kernel: add_rms_norm_mla_decode_sublayer).
  bool moe_ffn_norm(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
                    const SharedExperts& shared, Tensor& out, const QuantizedRows* xq, const NextNorm& next) override;
  void mlp(const Tensor& x, const MlpWeights& w, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void add(Tensor& out, const Tensor& x) override;
  void sample(const Tensor& logits, const std::vector<SampleRow>& rows, Tensor& tokens, Tensor& logprobs,
              SampleExtras* extras = nullptr) override;

  void synchronize() override;
  Tensor allocate_staging(DType dtype, const std::vector<int64_t>& shape) override;
  void copy_to_host_async(const Tensor& src, Tensor& host_dst) override;
  int64_t record_fence() override;
  void wait_fence(int64_t fence) override;
  double fence_elapsed_ms(int64_t from, int64_t to) override;
  void release_fence(int64_t fence) override;
  void resolve_tokens(Tensor& ids, const Tensor& pending) override;
  bool supports_graphs() const override;
  void set_op_timing(bool on) override;
  // Batch-invariant mode: dense and expert GEMMs on the fixed-fold WMMA kernels (small_m_gemm for
  // ≤ 64 rows, the tiled kernel beyond: bitwise equal), the router on gemm_f32_ordered, MLA decode
  // with the per-row split rule (kMlaInvariantSplitKeys keys per split, at most
  // kMlaInvariantMaxSplits). No cuBLAS, no decode GEMV.
  void set_batch_invariant(bool on) override;
  std::vector<OpTime> take_op_times() override;
  void capture_begin() override;
  int64_t capture_end() override;
  void graph_launch(int64_t graph) override;
  int64_t step_memory_generation() const override;
  std::pair<int64_t, int64_t> memory_info() const override;  // cudaMemGetInfo
  int64_t step_memory_bytes() const override;                 // the arena's capacity
  // The MoE grouped-GEMM form (tests and benchmarks): −1 by the step's size and mode (the
  // default: FP8 weights on sm_90 the GEMV at one token and W8A8 beyond — in the batch-invariant
  // mode W8A8 at every size; otherwise the GEMV up to 2 tokens, small_m_gemm up to 512 routed
  // rows, beyond the bf16 wgmma form, else tiled, or per-expert cuBLAS from 64 rows per expert
  // outside graph captures), 0 the tiled WMMA kernel, 1 the decode GEMV (where its sizes
  // allow), 2 a cuBLAS GEMM per expert (one host synchronization; never while capturing), 3
  // small_m_gemm (bitwise equal to 0; the batch-invariant mode's bf16 form up to 512 routed
  // rows), 4 the bf16 wgmma grouped GEMM (bf16 weights on sm_90), 5 W8A8 with the FP8 wgmma GEMM
  // (FP8 weights on sm_90). A form the sizes do not fit falls back to 0.
  // DEEPINFER_CUDA_MOE_FORM=0…5 sets it at construction (a lab knob: every step then takes that
  // form, whatever the mode).
  void set_moe_gemm(int form);
  // Dense linears with FP8 weights above 2 rows (DEEPINFER_CUDA_FP8_W8A8_ROWS): W8A8 (the rows
  // quantized per 1×128 group, then the FP8 wgmma GEMM; linear_w8a8) instead of bf16 weights and
  // small_m_gemm or cuBLAS. mode −1 (the default):
  // where the weight's scales are uniform over 128-row blocks (LinearWeight::uniform_row_blocks,
  // every checkpoint-placed stack: the GEMM's block form); 1: every FP8 weight; 0: never.
  // DEEPINFER_CUDA_FP8_W8A8=0|1 sets it at construction. The batch-invariant mode never takes it.
  void set_dense_fp8_w8a8(int mode);
  // The naive (prefill) MLA attention on the wgmma kernel (cuda::mla_prefill_wgmma) where it
  // takes the head dims and GPU — the default — or always on the mma.sync kernel (false).
  // DEEPINFER_CUDA_MLA_WGMMA=0|1 sets it at construction.
  void set_mla_prefill_wgmma(bool on);
  // Whether mla_decode_sublayer may run its fused kernel (cuda::mla_sublayer) where it applies —
  // the default — or always the op-by-op path (false). DEEPINFER_CUDA_MLA_SUBLAYER=0|1 sets it at
  // construction (DEEPINFER_CUDA_MLA_SUBLAYER_FP8=0: FP8 attention linears keep the op path).
  void set_mla_sublayer_fused(bool on);
  // Whether moe_ffn may run a one-token step's experts as one persistent kernel (cuda::moe_one;
  // bf16 weights, sizes moe_one_fits takes; in the batch-invariant mode its chain form, with the
  // one-chain structure on) — the default — or always the grouped GEMVs (false).
  // DEEPINFER_CUDA_MOE_ONE=0|1 sets it at construction.
  void set_moe_one_fused(bool on);
  // Whether that kernel also takes FP8 experts in the default mode (e4m3 with per-row scales; its
  // tensor-core form runs at 0.41 of the copy rate, slower than the grouped tensor-core GEMVs:
  // docs/perf.md, version 24). Default false; DEEPINFER_CUDA_MOE_ONE_FP8=0|1.
  void set_moe_one_fp8(bool on);
  // Where FP8 experts at one token take the kernel's W8A8 form (cuda::moe_one_w8a8: the MoE's
  // W8A8 form's bits, one launch): -1 (the default) in the batch-invariant mode only, whose FP8
  // MoE is that form at every size; 1 in both modes (the default mode's one-token step then
  // quantizes x and h as its larger steps do); 0 never. DEEPINFER_CUDA_MOE_ONE_W8A8=0|1.
  void set_moe_one_w8a8(int mode);
  // Where add_rms_norm_route runs a one-token step as one launch (cuda::norm_route) instead of
  // its three ops: -1 (the default) where x's rows are FP8 codes (the batch-invariant mode's FP8
  // steps) or right after the FP8 sublayer kernel (the default mode's FP8 steps) — faster there,
  // slower after the bf16 sublayer, beside which its blocks do not fit (docs/perf.md, versions
  // 29 and 32) —, 1 always, 0 never.
  // DEEPINFER_CUDA_NORM_ROUTE=0|1 sets it at construction.
  void set_norm_route_fused(int mode);
  // Where add_rms_norm_mla_decode_sublayer folds the norm into the sublayer kernel: -1 (the
  // default) in the default mode (the invariant forms measured slower with it), 1 always, 0
  // never. DEEPINFER_CUDA_SUBLAYER_NORM=0|1 sets it at construction.
  void set_sublayer_norm_fused(int mode);
  // The batch-invariant mode's naive MLA form (the kv_b decompression on invariant_gemm, then
  // the flash kernel, whose rows do not depend on their chunk): whether MlaPolicy::kByOrigin may
  // run prompt tokens on it (naive_mla_batch_invariant). On by default since the GPU suite proved
  // its bits (docs/perf.md, version 15); off, every row takes the absorbed form (kAbsorbed: 2.3×
  // the invariant prefill's time). DEEPINFER_CUDA_INVARIANT_NAIVE=0|1 sets it at construction.
  void set_invariant_naive_mla(bool on);
  // The MoE's W8A8 form with SiLU·mul and the down GEMM's quantizer in the gate|up GEMM's
  // epilogue (cuda::fp8_wgmma_glu_quantize, where it applies: sm_90, I % 128 == 0, checkpoint
  // scale blocks) — the same codes as the separate kernels, without their bf16 [rows, 2I] round
  // trip — and the dense W8A8 MLP likewise (its separate kernels also round gate and up to bf16:
  // the same bits either way). Off by default: slower (run s18-1, V2-Lite FP8 ms: prefill 4K 43.59 → 43.83, 16K
  // 199.2 → 201.6, B = 32 8.27 → 8.75, B = 256 11.68 → 12.77) — its epilogue (an expf and two
  // divisions per value) runs while the tensor cores idle, which costs more than the separate
  // pass saves; DEEPINFER_CUDA_FP8_GLU=0|1 sets it at construction.
  void set_fp8_glu_fused(bool on);
  // The dense W8A8 linears' FP8 wgmma GEMM fetching each block's first W stages before its PDL
  // wait (cuda::Fp8GemmArgs::w_stable: the weights are placed, no kernel writes them), under the
  // quantizer's tail — at decode sizes a W8A8 GEMM streams each weight tile through one SM, so
  // its start is on the step's critical path. The same bits. Off: no faster in the model (run
  // s19-1, V2-Lite FP8 decode B = 1 / 8 / 32 / 256 within 0.01 ms, invariant B = 1 3.23 either
  // way); DEEPINFER_CUDA_W8A8_EARLY_W=0|1 sets it at construction.
  void set_w8a8_early_weights(bool on);
  // Two row-stacked FP8 linears of one input (q_proj | kv_a_proj) on the W8A8 form as one GEMM
  // over the stack, each part's columns into its own output (matmul_parts; cuda::Fp8GemmArgs::
  // c2) — where the first part is a whole number of 128-row tiles. The same bits as two GEMMs.
  // On by default; DEEPINFER_CUDA_W8A8_STACK=0|1 sets it at construction (a lab knob).
  void set_w8a8_stack(bool on);
  // The dense FP8 decode GEMV's tensor-core form from `units` 8-row units (0: its own bound, 4
  // per SM); DEEPINFER_CUDA_GEMV_TC_MIN_UNITS=n sets it at construction. A lab knob: V2-Lite's
  // q | kv_a (456 units) and o_proj (256) on it at one row were slower (run s19-1, FP8 B = 1
  // 2.41 → 2.46 ms at 64 units).
  void set_gemv_tc_min_units(int64_t units);
  // FP8 GEMVs at one row per pass on the ring-fed form (cuda_gemv_fp8_ring.cu: a producer warp's
  // bulk copies into a shared-memory ring, 16-row units on f16 MMAs) where it applies. Off by
  // default: the model's FP8 B = 1 step 2.09 → 2.14 ms with it (run s36-2); its dot, not its
  // streaming, is the bound (perf.md, version 33). DEEPINFER_CUDA_GEMV_RING=0|1 sets it at
  // construction.
  void set_gemv_ring(bool on);
  // moe_ffn_norm folds the norm into the routed combine's launch (default on); off: moe_ffn_norm
  // is moe_ffn and leaves the norm to the caller. DEEPINFER_CUDA_MOE_NORM_FOLD=0|1, a lab knob.
  void set_moe_norm_fold(bool on);
  // The batch-invariant mode's fp32 router GEMM from min_rows rows (> 16, where the parallel-chunk
  // form ends) on the register-tiled kernel (cuda::gemm_f32_ordered's `tiled`: the same
  // arithmetic, so the same bits, ~3× fewer loads and shuffles per product). Off by default: no
  // faster in the model (run s18-2, invariant 4K prefill bf16 64.05 → 64.52 ms, FP8 50.16 →
  // 50.41; 16K −1 % / −3 %, within the runs' spread); DEEPINFER_CUDA_ROUTER_TILED=0|1 sets it at
  // construction, from kRouterTiledMinRows.
  void set_router_tiled(bool on, int64_t min_rows = kRouterTiledMinRows);
  // The default mode's fp32 router GEMMs past the GEMV's rows on the split-bf16 tensor cores
  // (cuda::router_gemm: X split into three bf16 parts in the kernel, W read from the bf16 image
  // place_linear_fp32 builds; fp32-level error, not cuBLAS's bits) instead of cuBLAS's SGEMM.
  // Off by default: measured (run s42-1) 29.6 µs against cuBLAS's 34.5 at V2-Lite's 4,096 rows,
  // no gain in the model's FP8 4K prefill (perf.md, version 39); weights without an image
  // (not placed by place_linear_fp32, or K % 64 ≠ 0) keep cuBLAS. DEEPINFER_CUDA_ROUTER_SPLIT=0|1
  // sets it at construction.
  void set_router_split(bool on);
  // The default mode's FFN input norm and router from min_rows rows (add_rms_norm_route): the norm
  // also writes x's rows as two bf16 parts [RN(x) | RN(x − RN(x))] (cuda::add_rms_norm_parts; x,
  // the residual and x's rows for the experts the same bits as without), and the router's logits
  // are one bf16 cuBLAS GEMM of those parts against [W | W] (LinearWeight::derived2, placed where
  // W's values are bf16 values — every checkpoint's router) with fp32 accumulation, instead of
  // cuBLAS's fp32 SGEMM on the CUDA cores (~40 µs a V2-Lite layer at 4,096 rows, s37-1): the
  // products exact, the parts within 2^-17·|x| of x — error ≤ 7.6e-6 of Σ|x·w| at worst against
  // SGEMM's ~3e-8, ~500× below a router on bf16 rows (as peers route). Off by default until timed
  // (written in session 43 without a device; perf.md version 40); DEEPINFER_CUDA_ROUTER_PARTS=0|1
  // sets it at construction, DEEPINFER_CUDA_ROUTER_PARTS_ROWS=n its min_rows. [W | W] is placed
  // only while it is on (for routers placed after it is set): V3's would hold 425 MB.
  void set_router_parts(bool on, int64_t min_rows = kRouterPartsMinRows);
  // The MoE's W8A8 gate|up GEMM (form 5, k > 1, not the GLU form) reading each slot's row from
  // the tokens' quantized rows through the routing permutation — its loader warpgroup copies the
  // rows into the stages (cuda::Fp8GemmArgs::a_rows) — instead of a gather pass writing them
  // first (~25 µs a V2-Lite layer at 4,096 tokens, run s37-1's trace). The same bits. Off by
  // default: the gathered GEMM ran 4.6 % (128 × 192) to 15 % (128 × 128) slower at 4K, which ate
  // the pass it saves (runs s42-1, s42-2; perf.md, version 39); DEEPINFER_CUDA_FP8_GATHER_A=0|1
  // sets it at construction.
  void set_fp8_gather_a(bool on);
  // An FP8 checkpoint's prefill decompresses its keys' latents through kv_b_proj on the W8A8 form
  // (each key's c_kv quantized per 1×128 group, the FP8 wgmma GEMM, bf16 out; MlaParams::
  // kv_b_proj_fp8) instead of the bf16 copy on cuBLAS — the FP8 GEMM path of DeepSeek's reference
  // (gemm_impl "fp8") for wkv_b outside absorption, as the other linears' W8A8 form: not the bf16
  // path's bits (K and V carry
  // the activations' ~2^-4 relative rounding). The batch-invariant mode keeps its own path. Off
  // by default until timed in the model (its kernel test passed on the device, 3.6e-2 worst row,
  // run s42-1; perf.md, versions 38, 39); DEEPINFER_CUDA_KVB_W8A8=0|1
  // sets it at construction.
  void set_kvb_w8a8(bool on);
  // The prefill attention's wgmma kernel writes o_proj's input rows in its epilogue
  // (MlaParams::out_rows: e4m3 codes and scales per head — quantize_fp8_rows_bf16's bits — or
  // bf16 rows) instead of its fp32 output, which o_proj's W8A8 / bf16 GEMM converted again; the
  // same bits, one pass over [T, H·dv] and a launch fewer a layer. Version 26 (session 29) tried
  // it with IEEE divisions and lost (its kernel 176 → 189 µs); the quantizers now divide through
  // the scale's reciprocal (version 34). Default mode only. On by default since run s42-2 (FP8 4K
  // prefill 35.49 → 34.89 ms, three rounds; perf.md version 39); DEEPINFER_CUDA_MLA_OPROJ_ROWS=0|1
  // sets it at construction.
  void set_mla_oproj_rows(bool on);
  // A step's q_pe rotated by the prefill attention's wgmma kernel as it reads q (two float4 loads
  // of the row's rotation table a pe chunk, four pairs rotated before the bf16 rounding) instead
  // of by the latent write, which then stores each token's table (MlaParams::q_rope): the same
  // bits (rope_from_table's arithmetic on rope_table's entries), and the latent write no longer
  // reads and writes q's [T, H, dr] fp32 channels (~34 MB a V2-Lite layer at 4K). Only where the
  // model hands mla_rope_kv_write the attention's parameters (steps of prefill rows only), the
  // pairs are interleaved and the wgmma kernel takes the dims; mla_attention rotates a copy of q
  // by the table on any path that does not take it. Off by default until timed (written in
  // session 43 without a device; perf.md version 40); DEEPINFER_CUDA_MLA_Q_ROPE=0|1 sets it at
  // construction.
  void set_mla_q_rope(bool on);
  // The tiled router's blocks hold 16 rows × 16 columns: at V2-Lite's 64 experts a step of M rows
  // gets M / 4 warps, a quarter of the one-chain kernel's — enough once they fill the GPU, too
  // few at decode sizes to hide the chains' latency (B = 32 with it from 17 rows: ~+0.9 ms per
  // step, run s18-1).
  static constexpr int64_t kRouterTiledMinRows = 1024;
  // Rows from which set_router_parts's router runs by default: prefill sizes (decode steps keep
  // the GEMV and norm_route forms tuned for them).
  static constexpr int64_t kRouterPartsMinRows = 512;
  // The routed rows (tokens × top-k) from which the MoE's grouped FP8 GEMMs stagger their
  // warpgroups by default (Fp8GemmArgs::stagger, the same bits): V2-Lite 4K prefill −0.6 / −0.4
  // ms (runs s23-3, s23-4; the down GEMM −6 %, gate|up unchanged), decode steps left as they were.
  static constexpr int64_t kStaggerMinRows = 4096;
  // The routed rows below which the MoE's grouped FP8 GEMMs run their tiles of ≤ 64 rows on both
  // warpgroups split by columns (Fp8GemmArgs::narrow_tails, the same bits): decode B = 32 −0.23
  // ms a step in both modes (7.29 → 7.06, invariant 7.65 → 7.41), while the 4K prefill was
  // 0.2–0.36 ms slower with it in each of three rounds (run s38-3: there an expert's tail tile
  // costs its loads, not its rows — docs/perf.md version 35).
  static constexpr int64_t kNarrowTailsMaxRows = 4096;
  // The routed rows from which the MoE's grouped FP8 GEMMs take 128 × 192 tiles
  // (Fp8GemmArgs::n192, the same bits): V2-Lite FP8 prefill 4K 36.29 → 35.75 ms (five rounds,
  // each faster), 16K 175.05 → 173.19 (two); slower at 1K (6,144 rows: 11.76 → 12.09) and at
  // decode steps (B = 32 7.02 → 7.21, B = 256 10.01 → 10.38) — runs s38-5, s38-6; between 6,144
  // and 24,576 rows not measured.
  static constexpr int64_t kN192MinRows = 16384;
  // The batch-invariant mode's bf16 MoE with all of K in one chain (MoeArgs::one_chain, the
  // default): its small-M form with one K split, so the default mode's wgmma (128 × 256 tiles)
  // and tiled kernels serve its larger steps as they are, instead of the invariant K
  // structure's (128 × 128 wgmma tiles). Run s18-2, V2-Lite bf16 invariant, ms: prefill 4K
  // 64.05 → 57.17, 16K 281.1 → 257.7, B = 1 3.33 → 3.16, B = 32 11.35 → 11.70, B = 256
  // 15.86 → 15.26. DEEPINFER_CUDA_INVARIANT_MOE_CHAIN=0|1 sets it at construction.
  void set_invariant_moe_one_chain(bool on);
  bool naive_mla_batch_invariant(const MlaParams& p) const override;
  // The cudaStream_t all ops are issued on, as an opaque pointer.
  void* stream() const;

 private:
  // x's rows quantized once for several W8A8 consumers (defined in cuda_backend.cpp).
  struct RowsFp8Once;
  // x's rows quantized once (x [T, D] fp32, D % 128 == 0): xq's when it holds them (ready), else
  // buffers in the caller's step-memory scope for the first ensure() to fill.
  RowsFp8Once rows_fp8(const Tensor& x, const QuantizedRows* xq);
  // A one-token step's experts (+ the shared slices, or null) as one persistent kernel
  // (cuda::moe_one, or for FP8 in the W8A8 arithmetic cuda::moe_one_w8a8), where it applies
  // (set_moe_one_fused, set_moe_one_fp8, set_moe_one_w8a8); false: nothing launched.
  bool moe_one(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
               const std::vector<MlpWeights>* shared_slices, Tensor& out);
  // moe_experts over `experts`, plus (non-null) the shared slices stacked after them as extra
  // experts of weight 1 in every token's last slots (cuda::MoeArgs::n_shared); addend (non-null,
  // [T, D] fp32) is added to every token's combined row (cuda::MoeArgs::addend); xq (non-null):
  // x's quantized rows, for form 5.
  // next (non-null): the norm after the combine, which the combine may run (cuda::MoeArgs::norm);
  // returns whether it did (out then not written).
  bool run_moe(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
               const std::vector<MlpWeights>* shared_slices, Tensor& out, const Tensor* addend = nullptr,
               RowsFp8Once* xq = nullptr, const NextNorm* next = nullptr);
  // moe_ffn, handing next (non-null) to the routed launch's combine; returns whether the norm ran.
  bool moe_ffn_impl(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
                    const SharedExperts& shared, Tensor& out, const QuantizedRows* xq_in, const NextNorm* next);
  // matmul_parts in the batch-invariant mode at one row, as one GEMM where the parts' outputs
  // are adjacent (cuda_backend.cpp); false: not taken.
  bool invariant_parts_one_row(const Tensor& x, const std::vector<const LinearWeight*>& w,
                               const std::vector<Tensor*>& out, const QuantizedRows* xq);
  // xq's codes and scales when xq is non-null and defined (checked to be [M, K]), else nulls.
  std::pair<const uint8_t*, const float*> quantized_of(const QuantizedRows* xq, int64_t M, int64_t K) const;
  // xq's bf16 rows when xq is non-null, defined and bf16 (checked to be [M, K]), else null.
  const void* bf16_rows_of(const QuantizedRows* xq, int64_t M, int64_t K) const;
  // mlp, its W8A8 form taking x's quantized rows from xq (non-null).
  void mlp_impl(const Tensor& x, const MlpWeights& w, Tensor& out, RowsFp8Once* xq);
  // Weight w as a bf16 [n_out, n_in] device pointer: the weight itself, or (FP8) a step-memory
  // dequantized copy.
  const void* bf16_weight(const LinearWeight& w);
  // out[M, N] (row stride ldc) F32 = xb[M, K] BF16 · wᵀ: the decode GEMV at ≤ 2 rows (default
  // mode), else cuBLAS on bf16 weights; FP8 weights small_m_gemm up to 64 rows, else a
  // dequantized copy and cuBLAS.
  void linear(const void* xb, int64_t M, const LinearWeight& w, float* out, int64_t ldc);
  // The decode GEMV (cuda_gemv.cu) for out[M, n_rows] (row stride ldc) = a · w's first n_rows
  // rows (n_rows > w.n_out(): the rows stacked after w in its buffer), when it applies
  // (gemv_fits). With out2, the n2 rows stacked after those too, into out2[M, n2] (the GEMV's
  // split output). Returns whether it ran.
  bool try_gemv(const void* a, cuda::Elem a_elem, int64_t lda, int64_t M, const LinearWeight& w, int64_t n_rows,
                float* out, int64_t ldc, float* out2 = nullptr, int64_t n2 = 0);
  // The attention sublayer kernel (cuda::mla_sublayer) for mla_decode_sublayer's arguments where
  // it takes them; with `in_norm` (its residual, delta and norm filled), the input norm folded in
  // (MlaSublayerArgs::residual). Returns whether it ran.
  bool sublayer_kernel(const MlaSublayerWeights& w, const Tensor& x, const Tensor& positions, const Tensor& slots,
                       const AttentionBatch& decode, Tensor& cache, Tensor& out, const cuda::MlaSublayerArgs* in_norm);
  // Whether the GEMV takes these operands: the default mode, M ≤ kGemvMaxRows, gemv_ok, FP8 with
  // per-row scales, 16-byte aligned weights.
  bool gemv_fits(const void* a, cuda::Elem a_elem, int64_t lda, int64_t M, const LinearWeight& w) const;
  // The dense W8A8 form (set_dense_fp8_w8a8): whether it takes these rows and weights, and
  // out[M, n_rows] (row stride ldc) = xb[M, K] bf16 quantized per 1×128 group · Wᵀ on the FP8
  // GEMM, W the n_rows ≥ w.n_out() rows from w's first (rows stacked after w in its buffer;
  // uniform: their scales uniform over 128-row blocks). partial_k: K % 16 == 0 suffices (the
  // input's last 1×128 group and the GEMM's last K block narrower; its quantizer must write
  // [M, ceil(K / 128)] scales: the gated MLP's down projection), else K % 128 == 0.
  bool dense_w8a8_fits(int64_t M, const LinearWeight& w, bool partial_k = false) const;
  void linear_w8a8(const void* xb, int64_t M, const LinearWeight& w, int64_t n_rows, bool uniform, float* out,
                   int64_t ldc);
  // Whether a linear of M fp32 rows x (row pitch ldx) takes the W8A8 form straight from fp32.
  bool w8a8_from_f32(const Tensor& x, int64_t ldx, int64_t M, const LinearWeight& w) const;
  // The GEMM of linear_w8a8 on rows already quantized: q [M, K] e4m3, sq [M, K / 128]. out2:
  // rows n_split.. of the (stacked) weight go to out2 [M, ldc2] instead (cuda::Fp8GemmArgs::c2).
  void fp8_gemm_w8a8(const uint8_t* q, const float* sq, int64_t M, const LinearWeight& w, int64_t n_rows, bool uniform,
                     float* out, int64_t ldc, float* out2 = nullptr, int64_t ldc2 = 0, int64_t n_split = 0);
  // Batch-invariant out[M, N] (row stride ldc) = xb[M, K] BF16 · wᵀ (w bf16, or FP8 with per
  // (row, block_k) scales): small_m_gemm or the tiled kernel by M (bitwise-equal folds).
  void invariant_gemm(const void* xb, int64_t M, const void* w, const float* scale, bool fp8, int64_t block_k,
                      int64_t N, int64_t K, float* out, int64_t ldc);
  // Marks the step arena's first bytes as the stream's L2-persisting window (once per arena
  // chunk; DEEPINFER_CUDA_L2_PERSIST_MB=0 turns it off). Called by begin_step.
  void keep_step_memory_in_l2();
  // mla_kv_write's kernel, with the queries' RoPE (q.q non-null) or without.
  // add_rms_norm_route on set_router_parts's form where it takes the step (returns false, doing
  // nothing, where it does not).
  bool norm_route_parts(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps, Tensor& out,
                        QuantizedRows& xq, const LinearWeight& router, const RouterParams& p, Tensor& ids,
                        Tensor& weights);
  // Whether mla_rope_kv_write leaves q's rotation to the naive mla_attention of p (set_mla_q_rope,
  // the wgmma prefill kernel takes p's dims, interleaved pairs, q [T, H, dn + dr] rotated at dn).
  bool q_rope_in_prefill(const MlaParams& p, const Tensor& q, int64_t q_offset, const RopeParams& rope) const;
  // Whether the naive mla_attention of p runs the wgmma prefill kernel (set_mla_prefill_wgmma, the
  // dims mla_prefill takes and its wgmma form too, an sm_90 GPU).
  bool prefill_on_wgmma(const MlaParams& p) const;
  void latent_write(Tensor& kv, const Tensor& norm, float eps, const Tensor& positions, const RopeParams& rope,
                    const Tensor& slots, Tensor& cache, const cuda::MlaQRope& q);
  // Op timing: brackets one op with events when timing is on (no-op otherwise).
  class OpTimer {
   public:
    OpTimer(CudaBackend& b, const char* op, int64_t n = -1, int64_t k = -1);
    ~OpTimer();
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

   private:
    CudaBackend& b_;
    int64_t slot_ = -1;
  };

  int device_index_;
  std::unique_ptr<CudaState> s_;
};

// A CudaBackend on GPU `device_index`, or an error naming why not (no driver, no device,
// compute capability below 9.0 for this sm_90a build).
Expected<std::unique_ptr<Backend>> make_cuda_backend(int device_index);

}  // namespace deepinfer
