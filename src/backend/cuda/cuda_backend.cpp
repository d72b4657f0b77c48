#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_moe_form.h"
#include "backend/cuda/router_split.h"
#include "core/env_switch.h"
#include "core/log.h"
#include "sample/philox.h"

namespace deepinfer {

void cuda::check_failed(const char* file, int line, const char* what, const char* info) {
  detail::check_failed(file, line, *info ? fmt::format("{}: {}", what, info) : std::string(what));
}

using cuda::bf16;
using cuda::Elem;

// ---- State and memory --------------------------------------------------------------------------

// Step memory: a bump allocator over chunks of device memory, used as a stack within a step
// (mark/release). When a step needs more than the first chunk, chunks are added; at the next
// begin_step they are merged into one chunk of the high-water mark, so the steady state is one
// chunk and stable addresses.
class StepArena {
 public:
  ~StepArena() { release_all(); }
  void* alloc(size_t bytes) {
    bytes = (bytes + 255) / 256 * 256;
    for (;;) {
      if (current_ < chunks_.size() && offset_ + bytes <= chunks_[current_].second) {
        void* p = static_cast<char*>(chunks_[current_].first) + offset_;
        offset_ += bytes;
        high_water_ = std::max(high_water_, in_use());
        return p;
      }
      if (current_ + 1 < chunks_.size()) {  // a later chunk kept from earlier growth
        ++current_;
        offset_ = 0;
        continue;
      }
      const size_t size = std::max<size_t>(bytes, size_t{256} << 20);
      void* p = nullptr;
      DI_CUDA_CHECK(cudaMalloc(&p, size));
      chunks_.emplace_back(p, size);
      current_ = chunks_.size() - 1;
      offset_ = 0;
    }
  }
  // (chunk, offset) packed: offsets stay below 2^40 bytes.
  int64_t mark() const { return static_cast<int64_t>(current_) << 40 | static_cast<int64_t>(offset_); }
  void release(int64_t m) {
    current_ = static_cast<size_t>(m >> 40);
    offset_ = static_cast<size_t>(m & ((int64_t{1} << 40) - 1));
  }
  // Merging frees memory the GPU may still read: the caller synchronizes first when merge_needed().
  bool merge_needed() const { return chunks_.size() > 1; }
  void reset() {
    if (chunks_.size() > 1) {
      ++generation_;  // addresses change: graphs recorded on the old chunks are stale
      release_all();
      void* p = nullptr;
      const size_t size = high_water_ + high_water_ / 8;
      DI_CUDA_CHECK(cudaMalloc(&p, size));
      chunks_.emplace_back(p, size);
    }
    current_ = 0;
    offset_ = 0;
  }
  size_t capacity() const {
    size_t n = 0;
    for (const auto& c : chunks_) n += c.second;
    return n;
  }
  int64_t generation() const { return generation_; }
  // The chunk allocations start from (every step's first bytes), or {null, 0} before any.
  std::pair<void*, size_t> first_chunk() const { return chunks_.empty() ? std::pair<void*, size_t>{} : chunks_[0]; }

 private:
  // Bytes below the current position, counting whole earlier chunks (an upper bound).
  size_t in_use() const {
    size_t n = offset_;
    for (size_t i = 0; i < current_; ++i) n += chunks_[i].second;
    return n;
  }
  void release_all() {
    for (auto& c : chunks_) cudaFree(c.first);
    chunks_.clear();
  }
  std::vector<std::pair<void*, size_t>> chunks_;
  size_t current_ = 0, offset_ = 0, high_water_ = 0;
  int64_t generation_ = 0;
};

struct CudaState {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  StepArena arena;
  std::vector<cudaEvent_t> events;     // fence id → event (timing enabled: fences time steps)
  std::vector<int64_t> free_events;    // released fence ids
  std::vector<cudaGraphExec_t> graphs;
  void* blas_workspace = nullptr;      // fixed cuBLAS workspace (graph capture needs one)
  struct L2Window {                    // the stream's L2-persisting window (keep_step_memory_in_l2)
    bool configured = false;
    size_t bytes = 0;                  // the set-aside (0: off)
    void* base = nullptr;              // the window set on the stream, if any
    size_t window = 0;
  } l2_window;
  // Pinned staging for small host → device copies, one per step, alternating: a copy from
  // pageable memory would wait for the stream (the previous step) and serialize the overlap.
  struct Staging {
    char* data = nullptr;
    size_t capacity = 0, used = 0;
    int64_t fence = -1;  // after the last step that copied from it
  } staging[2];
  int current_staging = 0;
  // Op timing (set_op_timing): pairs of events per timed op, recycled after take_op_times.
  bool op_timing = false;
  struct TimedOp {
    std::string name;
    cudaEvent_t start, end;
  };
  std::vector<TimedOp> timed_ops;
  std::vector<cudaEvent_t> timing_events;  // spare events
  bool capturing = false;
  int moe_gemm = -1;  // set_moe_gemm
  int dense_w8a8 = -1;  // set_dense_fp8_w8a8; DEEPINFER_CUDA_FP8_W8A8=0|1
  // The dense W8A8 form above this many rows (dense_w8a8_fits; the constructor sets
  // kGemvMaxRows); DEEPINFER_CUDA_FP8_W8A8_ROWS=n.
  int64_t dense_w8a8_rows = 0;
  bool mla_wgmma = true;  // set_mla_prefill_wgmma; DEEPINFER_CUDA_MLA_WGMMA=0|1
  bool mla_sublayer = true;  // set_mla_sublayer_fused; DEEPINFER_CUDA_MLA_SUBLAYER=0|1
  // The sublayer kernel's FP8 forms for FP8 attention linears (both modes); DEEPINFER_CUDA_MLA_SUBLAYER_FP8=0|1.
  bool mla_sublayer_fp8 = true;
  bool moe_one = true;       // set_moe_one_fused; DEEPINFER_CUDA_MOE_ONE=0|1
  bool moe_one_fp8 = false;  // set_moe_one_fp8; DEEPINFER_CUDA_MOE_ONE_FP8=0|1
  int moe_one_w8a8 = -1;     // set_moe_one_w8a8; DEEPINFER_CUDA_MOE_ONE_W8A8=0|1
  // A MoE layer's input at one token in one launch (set_norm_route_fused: −1 where x's rows are
  // FP8 codes or the FP8 sublayer kernel ran just before, 0 never, 1 always);
  // DEEPINFER_CUDA_NORM_ROUTE=0|1. after_fp8_sublayer: the last attention launch was the FP8
  // sublayer kernel (set there, taken by add_rms_norm_route).
  int norm_route = -1;
  bool after_fp8_sublayer = false;
  // The layer's input norm folded into the sublayer kernel (set_sublayer_norm_fused: −1 in the
  // default mode, 0 never, 1 always); DEEPINFER_CUDA_SUBLAYER_NORM=0|1.
  int sublayer_norm = -1;
  // Zeroed counters: [0] cuda::mla_sublayer's and [1] cuda::moe_one's grid barriers, [2]
  // cuda::norm_route's arrivals.
  unsigned long long* grid_counter = nullptr;
  bool invariant_naive = true;  // set_invariant_naive_mla; DEEPINFER_CUDA_INVARIANT_NAIVE=0|1
  bool fp8_glu = false;          // set_fp8_glu_fused; DEEPINFER_CUDA_FP8_GLU=0|1
  bool w8a8_early_w = false;     // set_w8a8_early_weights; DEEPINFER_CUDA_W8A8_EARLY_W=0|1
  // The MoE's grouped FP8 GEMMs skip an idle warpgroup's MMAs (Fp8GemmArgs::idle_skip; the same
  // bits); DEEPINFER_CUDA_FP8_IDLE_SKIP=0|1, a lab knob.
  bool fp8_idle_skip = true;
  // The MoE's grouped FP8 GEMMs with their second warpgroup one K block behind
  // (Fp8GemmArgs::stagger; the same bits): −1 from kStaggerMinRows routed rows (measured faster
  // there, docs/perf.md version 21), 0 never, 1 always; DEEPINFER_CUDA_FP8_STAGGER=-1|0|1.
  int64_t fp8_stagger = -1;
  // The MoE's grouped FP8 GEMMs run tiles of ≤ 64 rows on both warpgroups, split by columns
  // (Fp8GemmArgs::narrow_tails; the same bits): −1 below kNarrowTailsMaxRows routed rows, 0
  // never, 1 always; DEEPINFER_CUDA_FP8_NARROW_TAILS=-1|0|1.
  int64_t fp8_narrow = -1;
  // The MoE's grouped FP8 GEMMs on 128 × 192 tiles (Fp8GemmArgs::n192; the same bits): −1 from
  // kN192MinRows routed rows, 0 never, 1 always; DEEPINFER_CUDA_FP8_N192=-1|0|1.
  int64_t fp8_n192 = -1;
  // Blocks per cluster of the model's FP8 wgmma GEMMs (Fp8GemmArgs::cluster: 0 the kernel's
  // default, 1 or 2; the same bits); DEEPINFER_CUDA_FP8_CLUSTER=n, a lab knob.
  int fp8_cluster = 0;
  // Two stacked FP8 linears of one input on the W8A8 form in one GEMM (matmul_parts; the same
  // bits); DEEPINFER_CUDA_W8A8_STACK=0|1, a lab knob.
  bool w8a8_stack = true;
  // The norms' rows for their consumers (quantized_rows; the same bits either way);
  // DEEPINFER_CUDA_NORM_ROWS=0|1, a lab knob.
  bool norm_rows = true;
  // The dense FP8 GEMV's tensor-core form from this many 8-row units (GemvArgs::tc_min_units; 0:
  // its own bound); DEEPINFER_CUDA_GEMV_TC_MIN_UNITS=n, a lab knob.
  int64_t gemv_tc_min_units = 0;
  // FP8 GEMVs at one row on the ring-fed form (GemvArgs::ring; set_gemv_ring;
  // DEEPINFER_CUDA_GEMV_RING=0|1). Off: slower in the model (perf.md, version 33).
  bool gemv_ring = false;
  bool moe_norm_fold = true;  // set_moe_norm_fold; DEEPINFER_CUDA_MOE_NORM_FOLD=0|1
  // The invariant router's tiled kernel from this many rows, 0 = never (set_router_tiled;
  // DEEPINFER_CUDA_ROUTER_TILED=0|1).
  int64_t router_tiled_rows = 0;
  // The default mode's fp32 router GEMMs of more than kGemvMaxRows rows on the split-bf16 tensor
  // cores (cuda::router_gemm, the weight's image from place_linear_fp32) instead of cuBLAS's
  // SGEMM; set_router_split; DEEPINFER_CUDA_ROUTER_SPLIT=0|1.
  bool router_split = false;
  // The default mode's router from router_parts_rows rows on the norm's two-part bf16 rows
  // (set_router_parts; DEEPINFER_CUDA_ROUTER_PARTS=0|1, DEEPINFER_CUDA_ROUTER_PARTS_ROWS=n).
  bool router_parts = false;
  int64_t router_parts_rows = 0;
  // The MoE's grouped FP8 gate|up GEMM reads each slot's row from the tokens' quantized rows
  // through the permutation (cuda::MoeArgs::gather_a: no gather pass; the same bits);
  // set_fp8_gather_a; DEEPINFER_CUDA_FP8_GATHER_A=0|1.
  bool fp8_gather_a = false;
  // FP8 checkpoints' prefill kv_b on the W8A8 form (MlaParams::kv_b_proj_fp8; set_kvb_w8a8;
  // DEEPINFER_CUDA_KVB_W8A8=0|1).
  bool kvb_w8a8 = false;
  // The prefill attention kernel writes o_proj's input rows (MlaParams::out_rows; set_mla_oproj_rows;
  // DEEPINFER_CUDA_MLA_OPROJ_ROWS=0|1; on since run s42-2: FP8 4K −0.60 ms).
  bool mla_oproj_rows = true;
  // A prefill-only step's q_pe rotated by the prefill attention kernel as it reads q (the latent
  // write leaves it; MlaParams::q_rope; set_mla_q_rope; DEEPINFER_CUDA_MLA_Q_ROPE=0|1).
  bool mla_q_rope = false;
  // The shared experts in the routed launch: -1 by moe_ffn's size rule, 0 never, 1 always (the
  // batch-invariant mode always); DEEPINFER_CUDA_MOE_SHARED_FUSE=0|1, a lab knob.
  int shared_fuse = -1;
  // Keys per batch-invariant MLA decode split (kMlaInvariantSplitKeys; a multiple of 32, the
  // kernels' key tile); DEEPINFER_CUDA_MLA_INVARIANT_SPLIT=n, a lab knob.
  int64_t mla_invariant_split_keys = 0;
  bool moe_one_chain = true;     // set_invariant_moe_one_chain; DEEPINFER_CUDA_INVARIANT_MOE_CHAIN=0|1
  // The invariant router at decode sizes in one launch (gemm_f32_ordered_fused: the bits of its
  // parallel chunks + their sum); DEEPINFER_CUDA_INVARIANT_FUSED_ROUTER=0|1, a lab knob.
  bool invariant_fused_router = true;
  bool batch_invariant = false;  // set_batch_invariant
};

namespace {

// The MoE form's size rules (kMoeDecodeMaxRows, moe_prefill_sized, moe_form): cuda_moe_form.h.
using cuda::kMoeDecodeMaxRows;
using cuda::moe_prefill_sized;
// Whether the bf16 wgmma grouped form takes these sizes (bf16 weights on sm_90).
bool moe_wgmma_ok(bool fp8, int64_t D, int64_t I) {
  return !fp8 && cuda::bf16_wgmma_grouped_ok(D) && cuda::bf16_wgmma_grouped_ok(I);
}
// Default mode: the shared experts run in the routed experts' launch (moe_ffn) for steps of at
// most this many tokens (one 16-row pass over their slices) — and, with FP8 weights, for every
// decode-sized step (≤ kMoeDecodeMaxRows routed rows). V2-Lite decode, ms per step: bf16 B = 1
// 4.05 → 3.86 fused, B = 32 11.65 → 11.84 (two passes over the slices lose to cuBLAS's one GEMM;
// run s7-2); FP8 B = 32 16.35 → 15.60 (runs s6-10, s7-1), when both the routed experts and the
// separate shared MLP ran on small_m_gemm. Measured again on the W8A8 forms both take since run
// s17-7 (run s18-2, DEEPINFER_CUDA_MOE_SHARED_FUSE): never fusing, FP8 B = 1 2.64 → 2.86 ms and
// B = 32 8.24 → 9.30; always fusing moves B = 256 and prefill within the runs' spread.
constexpr int64_t kMoeFusedSharedMaxTokens = 16;
// moe_ffn_norm folds the norm into the combine from this many tokens: combine_norm_kernel is a
// block per token, where the combine alone spreads a token over D / 512 blocks — at decode
// sizes the separate launches were no slower (run s37-6: bf16 B = 32 10.60 against 10.50 ms
// folded from two tokens), at prefill sizes the fold saves the fp32 [T, D] round trip.
constexpr int64_t kMoeNormFoldMinTokens = 512;
// Batch-invariant mode: GEMMs of at most this many rows use small_m_gemm (16-row passes over
// the weights), larger ones the tiled kernel; both fold K identically (bitwise-equal results).
constexpr int64_t kInvariantSmallRows = 64;
// Batch-invariant router GEMMs of at most this many rows run their K chunks in parallel blocks.
constexpr int64_t kInvariantRouterParallelRows = 16;
// Batch-invariant MLA decode: a row of n keys is cut into splits of mla_split_span(n, 64, 32)
// keys — ceil(n / 64) splits up to 2048 keys, at most 32 (a function of the row alone).
// Decode-shaped steps launch all 32 split slots, so a graph's launch never changes as contexts
// grow; other steps launch what their longest row needs. A decode row's latency is its split's
// tile count, a large batch's cost its partial states: 64 keys against 128 took the mode's
// overhead at V2-Lite 512 keys B = 1 from +16 % to +12 % (bf16; FP8 +9 → +5 %) for B = 32's
// +12 → +13 % (FP8 +3 → +5 %), every figure within point 5's 15 % (run s33-7, docs/perf.md
// version 30); 256 cost B = 1 +17 % (run s5-6).
constexpr int64_t kMlaInvariantSplitKeys = 64;
constexpr int64_t kMlaInvariantMaxSplits = 32;
// Default-mode dense linears of at most this many rows run on the decode GEMV (cuda_gemv.cu): the
// weights read once at the copy rate (FP8 at a byte each), fp32 activations rounded to bf16 as
// they are read (no conversion launch), fp32 router weights as they are. Beyond, FP8 weights
// take the dense W8A8 form where it applies (dense_w8a8_fits), else small_m_gemm's tensor-core
// 16-row passes up to kInvariantSmallRows (run s5-8, FP8 decode B = 32: the 5632×2048 MLP
// 6.57 ms per step on CUDA cores, 2.08 ms with small_m_gemm); bf16 weights cuBLAS. (The MoE's
// GEMV bound, cuda::kMoeGemvMaxTokens, is the same.)
constexpr int64_t kGemvMaxRows = 2;
static_assert(kGemvMaxRows == cuda::kMoeGemvMaxTokens);

Elem elem_of(DType t) {
  switch (t) {
    case DType::kF32: return Elem::kF32;
    case DType::kBF16: return Elem::kBF16;
    case DType::kF8E4M3: return Elem::kF8;
    default: DI_CHECK(false && "CUDA backend: unsupported dtype");
  }
  return Elem::kF32;
}

template <typename T = void>
T* dptr(const Tensor& t) {
  DI_CHECK(t.device().kind == DeviceKind::kCuda);
  return static_cast<T*>(t.raw_data());
}
template <typename T>
const T* cdptr(const Tensor& t) {
  return dptr<T>(t);
}

std::shared_ptr<Buffer> device_buffer(size_t bytes, int index) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess)
    detail::check_failed(__FILE__, __LINE__,
                         fmt::format("cudaMalloc of {} bytes failed: {}", bytes, cudaGetErrorString(err)));
  return std::make_shared<Buffer>(p, bytes, Device{DeviceKind::kCuda, index},
                                  [](void* data, void*) { cudaFree(data); }, nullptr);
}

}  // namespace

CudaBackend::CudaBackend(int device_index) : device_index_(device_index), s_(std::make_unique<CudaState>()) {
  DI_CUDA_CHECK(cudaSetDevice(device_index));
  DI_CUDA_CHECK(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking));
  DI_CUBLAS_CHECK(cublasCreate(&s_->blas));
  DI_CUBLAS_CHECK(cublasSetStream(s_->blas, s_->stream));
  constexpr size_t kWorkspace = size_t{64} << 20;
  DI_CUDA_CHECK(cudaMalloc(&s_->blas_workspace, kWorkspace));
  DI_CUBLAS_CHECK(cublasSetWorkspace(s_->blas, s_->blas_workspace, kWorkspace));
  if (bool on = false; read_env_switch("DEEPINFER_CUDA_FP8_W8A8", on)) s_->dense_w8a8 = on ? 1 : 0;
  read_env_switch("DEEPINFER_CUDA_MLA_WGMMA", s_->mla_wgmma);
  read_env_switch("DEEPINFER_CUDA_MLA_SUBLAYER", s_->mla_sublayer);
  read_env_switch("DEEPINFER_CUDA_MLA_SUBLAYER_FP8", s_->mla_sublayer_fp8);
  read_env_switch("DEEPINFER_CUDA_MOE_ONE", s_->moe_one);
  read_env_switch("DEEPINFER_CUDA_MOE_ONE_FP8", s_->moe_one_fp8);
  read_env_switch("DEEPINFER_CUDA_GEMV_RING", s_->gemv_ring);
  read_env_switch("DEEPINFER_CUDA_MOE_NORM_FOLD", s_->moe_norm_fold);
  read_env_switch("DEEPINFER_CUDA_ROUTER_SPLIT", s_->router_split);
  read_env_switch("DEEPINFER_CUDA_ROUTER_PARTS", s_->router_parts);
  s_->router_parts_rows = kRouterPartsMinRows;
  read_env_int("DEEPINFER_CUDA_ROUTER_PARTS_ROWS", 1, int64_t{1} << 40, 1, s_->router_parts_rows);
  read_env_switch("DEEPINFER_CUDA_FP8_GATHER_A", s_->fp8_gather_a);
  read_env_switch("DEEPINFER_CUDA_KVB_W8A8", s_->kvb_w8a8);
  read_env_switch("DEEPINFER_CUDA_MLA_OPROJ_ROWS", s_->mla_oproj_rows);
  read_env_switch("DEEPINFER_CUDA_MLA_Q_ROPE", s_->mla_q_rope);
  if (bool on = false; read_env_switch("DEEPINFER_CUDA_MOE_ONE_W8A8", on)) s_->moe_one_w8a8 = on ? 1 : 0;
  if (bool on = false; read_env_switch("DEEPINFER_CUDA_NORM_ROUTE", on)) s_->norm_route = on ? 1 : 0;
  if (bool on = false; read_env_switch("DEEPINFER_CUDA_SUBLAYER_NORM", on)) s_->sublayer_norm = on ? 1 : 0;
  DI_CUDA_CHECK(cudaMalloc(&s_->grid_counter, 3 * sizeof(unsigned long long)));
  DI_CUDA_CHECK(cudaMemset(s_->grid_counter, 0, 3 * sizeof(unsigned long long)));
  s_->dense_w8a8_rows = kGemvMaxRows;
  read_env_int("DEEPINFER_CUDA_FP8_W8A8_ROWS", 0, int64_t{1} << 40, 1, s_->dense_w8a8_rows);
  if (int64_t form = -1; read_env_int("DEEPINFER_CUDA_MOE_FORM", 0, 5, 1, form)) s_->moe_gemm = static_cast<int>(form);
  read_env_switch("DEEPINFER_CUDA_INVARIANT_MOE_CHAIN", s_->moe_one_chain);
  if (bool on = false; read_env_switch("DEEPINFER_CUDA_ROUTER_TILED", on))
    s_->router_tiled_rows = on ? kRouterTiledMinRows : 0;
  if (bool fuse = false; read_env_switch("DEEPINFER_CUDA_MOE_SHARED_FUSE", fuse)) s_->shared_fuse = fuse ? 1 : 0;
  s_->mla_invariant_split_keys = kMlaInvariantSplitKeys;
  read_env_int("DEEPINFER_CUDA_MLA_INVARIANT_SPLIT", 32, 4096, 32, s_->mla_invariant_split_keys);
  read_env_switch("DEEPINFER_CUDA_FP8_GLU", s_->fp8_glu);
  read_env_switch("DEEPINFER_CUDA_W8A8_EARLY_W", s_->w8a8_early_w);
  read_env_switch("DEEPINFER_CUDA_FP8_IDLE_SKIP", s_->fp8_idle_skip);
  read_env_int("DEEPINFER_CUDA_FP8_STAGGER", -1, 1, 1, s_->fp8_stagger);
  read_env_int("DEEPINFER_CUDA_FP8_NARROW_TAILS", -1, 1, 1, s_->fp8_narrow);
  read_env_int("DEEPINFER_CUDA_FP8_N192", -1, 1, 1, s_->fp8_n192);
  if (int64_t n = 0; read_env_int("DEEPINFER_CUDA_FP8_CLUSTER", 0, 2, 1, n)) s_->fp8_cluster = static_cast<int>(n);
  read_env_switch("DEEPINFER_CUDA_W8A8_STACK", s_->w8a8_stack);
  read_env_switch("DEEPINFER_CUDA_NORM_ROWS", s_->norm_rows);
  read_env_int("DEEPINFER_CUDA_GEMV_TC_MIN_UNITS", 1, int64_t{1} << 30, 1, s_->gemv_tc_min_units);
  read_env_switch("DEEPINFER_CUDA_INVARIANT_NAIVE", s_->invariant_naive);
  read_env_switch("DEEPINFER_CUDA_INVARIANT_FUSED_ROUTER", s_->invariant_fused_router);
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(s_->stream);
  for (const auto& t : s_->timed_ops) {
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.end);
  }
  for (cudaEvent_t e : s_->timing_events) cudaEventDestroy(e);
  for (cudaEvent_t e : s_->events) cudaEventDestroy(e);
  for (cudaGraphExec_t g : s_->graphs) cudaGraphExecDestroy(g);
  for (auto& st : s_->staging) cudaFreeHost(st.data);
  cudaFree(s_->blas_workspace);
  cudaFree(s_->grid_counter);
  cublasDestroy(s_->blas);
  cudaStreamDestroy(s_->stream);
}

void CudaBackend::synchronize() { DI_CUDA_CHECK(cudaStreamSynchronize(s_->stream)); }

bool CudaBackend::supports_graphs() const { return !s_->op_timing; }

void CudaBackend::set_moe_gemm(int form) {
  DI_CHECK(form >= -1 && form <= 5);
  s_->moe_gemm = form;
}

void CudaBackend::set_dense_fp8_w8a8(int mode) {
  DI_CHECK(mode >= -1 && mode <= 1);
  s_->dense_w8a8 = mode;
}

void CudaBackend::set_mla_prefill_wgmma(bool on) { s_->mla_wgmma = on; }

void CudaBackend::set_mla_sublayer_fused(bool on) { s_->mla_sublayer = on; }

void CudaBackend::set_moe_one_fused(bool on) { s_->moe_one = on; }
void CudaBackend::set_moe_one_fp8(bool on) { s_->moe_one_fp8 = on; }
void CudaBackend::set_norm_route_fused(int mode) {
  DI_CHECK(mode >= -1 && mode <= 1);
  s_->norm_route = mode;
}
void CudaBackend::set_sublayer_norm_fused(int mode) {
  DI_CHECK(mode >= -1 && mode <= 1);
  s_->sublayer_norm = mode;
}
void CudaBackend::set_moe_one_w8a8(int mode) {
  DI_CHECK(mode >= -1 && mode <= 1);
  s_->moe_one_w8a8 = mode;
}

void CudaBackend::set_invariant_naive_mla(bool on) { s_->invariant_naive = on; }

void CudaBackend::set_fp8_glu_fused(bool on) { s_->fp8_glu = on; }

void CudaBackend::set_w8a8_early_weights(bool on) { s_->w8a8_early_w = on; }
void CudaBackend::set_w8a8_stack(bool on) { s_->w8a8_stack = on; }

void CudaBackend::set_gemv_tc_min_units(int64_t units) {
  DI_CHECK(units >= 0);
  s_->gemv_tc_min_units = units;
}

void CudaBackend::set_gemv_ring(bool on) { s_->gemv_ring = on; }
void CudaBackend::set_moe_norm_fold(bool on) { s_->moe_norm_fold = on; }
void CudaBackend::set_router_split(bool on) { s_->router_split = on; }
void CudaBackend::set_router_parts(bool on, int64_t min_rows) {
  DI_CHECK_GE(min_rows, 1);
  s_->router_parts = on;
  s_->router_parts_rows = min_rows;
}
void CudaBackend::set_fp8_gather_a(bool on) { s_->fp8_gather_a = on; }
void CudaBackend::set_kvb_w8a8(bool on) { s_->kvb_w8a8 = on; }
void CudaBackend::set_mla_oproj_rows(bool on) { s_->mla_oproj_rows = on; }
void CudaBackend::set_mla_q_rope(bool on) { s_->mla_q_rope = on; }

void CudaBackend::set_router_tiled(bool on, int64_t min_rows) {
  DI_CHECK(min_rows > kInvariantRouterParallelRows);
  s_->router_tiled_rows = on ? min_rows : 0;
}

void CudaBackend::set_invariant_moe_one_chain(bool on) { s_->moe_one_chain = on; }

// Only the flash kernel's dims: the fallback's per-sequence TF32 GEMMs take cuBLAS algorithms
// by the chunk's shape.
bool CudaBackend::naive_mla_batch_invariant(const MlaParams& p) const {
  return s_->invariant_naive &&
         cuda::mla_prefill_supported(p.qk_nope_head_dim, p.qk_rope_head_dim, p.v_head_dim, p.kv_lora_rank);
}

void CudaBackend::set_op_timing(bool on) { s_->op_timing = on; }

void CudaBackend::set_batch_invariant(bool on) { s_->batch_invariant = on; }

CudaBackend::OpTimer::OpTimer(CudaBackend& b, const char* op, int64_t n, int64_t k) : b_(b) {
  CudaState& s = *b.s_;
  if (!s.op_timing || s.capturing) return;
  auto take = [&s]() {
    cudaEvent_t e;
    if (s.timing_events.empty()) {
      DI_CUDA_CHECK(cudaEventCreate(&e));
    } else {
      e = s.timing_events.back();
      s.timing_events.pop_back();
    }
    return e;
  };
  CudaState::TimedOp t{n >= 0 ? fmt::format("{} {}x{}", op, n, k) : std::string(op), take(), take()};
  DI_CUDA_CHECK(cudaEventRecord(t.start, s.stream));
  slot_ = static_cast<int64_t>(s.timed_ops.size());
  s.timed_ops.push_back(std::move(t));
}

CudaBackend::OpTimer::~OpTimer() {
  if (slot_ >= 0) cudaEventRecord(b_.s_->timed_ops[static_cast<size_t>(slot_)].end, b_.s_->stream);
}

std::vector<OpTime> CudaBackend::take_op_times() {
  synchronize();
  std::vector<OpTime> out;
  for (auto& t : s_->timed_ops) {
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.end));
    auto it = std::find_if(out.begin(), out.end(), [&](const OpTime& o) { return o.op == t.name; });
    if (it == out.end()) it = out.insert(out.end(), OpTime{t.name, 0, 0.0});
    ++it->calls;
    it->ms += ms;
    s_->timing_events.push_back(t.start);
    s_->timing_events.push_back(t.end);
  }
  s_->timed_ops.clear();
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

Tensor CudaBackend::allocate_staging(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  void* p = nullptr;
  DI_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
  std::memset(p, 0, std::max<size_t>(bytes, 1));
  auto buffer = std::make_shared<Buffer>(p, bytes, Device::cpu(), [](void* data, void*) { cudaFreeHost(data); }, nullptr);
  return Tensor(buffer, 0, dtype, shape);
}

void CudaBackend::copy_to_host_async(const Tensor& src, Tensor& host_dst) {
  DI_CHECK_EQ(src.n_bytes(), host_dst.n_bytes());
  if (src.n_bytes() == 0) return;
  DI_CUDA_CHECK(cudaMemcpyAsync(host_dst.raw_data(), src.raw_data(), src.n_bytes(), cudaMemcpyDeviceToHost, s_->stream));
}

int64_t CudaBackend::record_fence() {
  int64_t id;
  if (!s_->free_events.empty()) {
    id = s_->free_events.back();
    s_->free_events.pop_back();
  } else {
    cudaEvent_t e;
    DI_CUDA_CHECK(cudaEventCreate(&e));
    s_->events.push_back(e);
    id = static_cast<int64_t>(s_->events.size()) - 1;
  }
  DI_CUDA_CHECK(cudaEventRecord(s_->events[static_cast<size_t>(id)], s_->stream));
  return id;
}

void CudaBackend::wait_fence(int64_t fence) { DI_CUDA_CHECK(cudaEventSynchronize(s_->events[static_cast<size_t>(fence)])); }

double CudaBackend::fence_elapsed_ms(int64_t from, int64_t to) {
  float ms = 0;
  DI_CUDA_CHECK(cudaEventElapsedTime(&ms, s_->events[static_cast<size_t>(from)], s_->events[static_cast<size_t>(to)]));
  return ms;
}

void CudaBackend::release_fence(int64_t fence) { s_->free_events.push_back(fence); }

void CudaBackend::capture_begin() {
  DI_CUDA_CHECK(cudaStreamBeginCapture(s_->stream, cudaStreamCaptureModeThreadLocal));
  s_->capturing = true;
}

int64_t CudaBackend::capture_end() {
  cudaGraph_t graph = nullptr;
  s_->capturing = false;
  DI_CUDA_CHECK(cudaStreamEndCapture(s_->stream, &graph));
  cudaGraphExec_t exec = nullptr;
  DI_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  DI_CUDA_CHECK(cudaGraphDestroy(graph));
  s_->graphs.push_back(exec);
  return static_cast<int64_t>(s_->graphs.size()) - 1;
}

void CudaBackend::graph_launch(int64_t graph) {
  DI_CUDA_CHECK(cudaGraphLaunch(s_->graphs[static_cast<size_t>(graph)], s_->stream));
}

int64_t CudaBackend::step_memory_generation() const { return s_->arena.generation(); }

void CudaBackend::resolve_tokens(Tensor& ids, const Tensor& pending) {
  cuda::resolve_tokens(dptr<int32_t>(ids), ids.numel(), cdptr<int32_t>(pending), s_->stream);
}
void* CudaBackend::stream() const { return s_->stream; }
int64_t CudaBackend::step_memory_bytes() const { return static_cast<int64_t>(s_->arena.capacity()); }

std::pair<int64_t, int64_t> CudaBackend::memory_info() const {
  size_t free_b = 0, total_b = 0;
  DI_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
}

Tensor CudaBackend::empty(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  void* p = s_->arena.alloc(bytes);
  return Tensor(Buffer::wrap(p, bytes, device(), nullptr), 0, dtype, shape);
}

Tensor CudaBackend::allocate(DType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  Tensor t(device_buffer(bytes, device_index_), 0, dtype, shape);
  if (bytes > 0) DI_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, bytes, s_->stream));
  return t;
}

Tensor CudaBackend::upload(const Tensor& host) {
  DI_CHECK(host.device().kind == DeviceKind::kCpu);
  Tensor t = empty(host.dtype(), host.shape());
  copy_from_host(host.raw_data(), t);
  return t;
}

void CudaBackend::copy_from_host(const void* src, Tensor& dst) {
  const size_t bytes = dst.n_bytes();
  if (bytes == 0) return;
  constexpr size_t kStagedMax = size_t{16} << 20;
  if (bytes > kStagedMax) {  // weights: from pageable memory (waits for the stream, returns once staged)
    DI_CUDA_CHECK(cudaMemcpyAsync(dptr(dst), src, bytes, cudaMemcpyHostToDevice, s_->stream));
    return;
  }
  CudaState::Staging& st = s_->staging[s_->current_staging];
  const size_t need = st.used + (bytes + 255) / 256 * 256;
  if (need > st.capacity) {  // grow (rare): the old buffer may still be read by queued copies
    synchronize();
    char* grown = nullptr;
    const size_t capacity = std::max<size_t>({need, 2 * st.capacity, size_t{1} << 20});
    DI_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&grown), capacity));
    if (st.data != nullptr) cudaFreeHost(st.data);
    st.data = grown;
    st.capacity = capacity;
    st.used = 0;
  }
  char* slot = st.data + st.used;
  st.used += (bytes + 255) / 256 * 256;
  std::memcpy(slot, src, bytes);
  DI_CUDA_CHECK(cudaMemcpyAsync(dptr(dst), slot, bytes, cudaMemcpyHostToDevice, s_->stream));
}

Tensor CudaBackend::to_host(const Tensor& t) {
  if (t.device().kind == DeviceKind::kCpu) return t;
  Tensor h = Tensor::empty_host(t.dtype(), t.shape());
  if (t.n_bytes() > 0)
    DI_CUDA_CHECK(cudaMemcpyAsync(h.raw_data(), t.raw_data(), t.n_bytes(), cudaMemcpyDeviceToHost, s_->stream));
  synchronize();
  return h;
}

namespace {
// L2 kept for the step's working memory (kStepL2PersistMiB; DEEPINFER_CUDA_L2_PERSIST_MB
// overrides it, 0 turns it off), capped by the device's own limits.
constexpr int64_t kStepL2PersistMiB = 24;
}  // namespace

// The first bytes of the step arena — where every step's activations, attention partials and MoE
// intermediates are allocated (a stack reset each step) — are an L2-persisting access window:
// the weights streaming through L2 (tens of MB per layer) evict each other, not the small data
// the step's kernels hand each other. Run s12-4 (V2-Lite, 0 → 24 MiB, same machine): bf16 decode
// B = 32 11.13 → 10.59 ms, B = 256 19.08 → 18.53, FP8 15.65 → 15.52 and 21.82 → 21.36; B = 1 and
// prefill unchanged (the GEMV's evict-first loads already keep B = 1's); 40 MiB was worse than
// none. Captured graphs keep the window their kernels were captured with.
void CudaBackend::keep_step_memory_in_l2() {
  CudaState::L2Window& w = s_->l2_window;
  if (!w.configured) {  // this backend's device: its limits, its set-aside
    int64_t mib = kStepL2PersistMiB;
    read_env_int("DEEPINFER_CUDA_L2_PERSIST_MB", 0, int64_t{1} << 20, 1, mib);
    int max_persist = 0, max_window = 0;
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, device_index_));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device_index_));
    w.bytes = std::min({static_cast<size_t>(mib) << 20, static_cast<size_t>(max_persist),
                        static_cast<size_t>(max_window)});
    if (w.bytes > 0) DI_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, w.bytes));
    w.configured = true;
  }
  const auto [base, size] = s_->arena.first_chunk();
  const size_t bytes = std::min(size, w.bytes);
  if (bytes == 0 || (base == w.base && bytes == w.window)) return;
  cudaStreamAttrValue v{};
  v.accessPolicyWindow.base_ptr = base;
  v.accessPolicyWindow.num_bytes = bytes;
  v.accessPolicyWindow.hitRatio = 1.0f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  DI_CUDA_CHECK(cudaStreamSetAttribute(s_->stream, cudaStreamAttributeAccessPolicyWindow, &v));
  w.base = base;
  w.window = bytes;
}

void CudaBackend::begin_step() {
  if (s_->arena.merge_needed()) synchronize();
  s_->arena.reset();
  keep_step_memory_in_l2();
  // Staging: close the buffer the last step copied from; reopen the other once its step ran.
  CudaState::Staging& done = s_->staging[s_->current_staging];
  if (done.fence >= 0) release_fence(done.fence);
  done.fence = record_fence();
  s_->current_staging ^= 1;
  CudaState::Staging& next = s_->staging[s_->current_staging];
  if (next.fence >= 0) wait_fence(next.fence);
  next.used = 0;
}

int64_t CudaBackend::step_mark() { return s_->arena.mark(); }
void CudaBackend::step_release(int64_t mark) { s_->arena.release(mark); }

namespace {
// Op-internal scratch is handed back when the op returns (its kernels are already queued).
class ScratchScope {
 public:
  explicit ScratchScope(Backend& b) : b_(b), mark_(b.step_mark()) {}
  ~ScratchScope() { b_.step_release(mark_); }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  Backend& b_;
  int64_t mark_;
};
}  // namespace

// ---- Weight placement --------------------------------------------------------------------------

Tensor CudaBackend::place_tensor(const Tensor& host) {
  if (host.dtype() == DType::kF16) {  // widened once, like the host loader
    Tensor f = Tensor::empty_host(DType::kF32, host.shape());
    for (int64_t i = 0; i < host.numel(); ++i) f.data<float>()[i] = f16_to_f32(host.data<uint16_t>()[i]);
    return place_tensor(f);
  }
  Tensor t = allocate(host.dtype(), host.shape());
  copy_from_host(host.raw_data(), t);
  synchronize();  // the host copy may be released by the caller
  return t;
}

LinearWeight CudaBackend::place_linear_fp32(const LinearWeight& host) {
  Tensor f = Tensor::empty_host(DType::kF32, {host.n_out(), host.n_in()});
  host.dequantize(0, host.n_out(), 0, host.n_in(), f.data<float>(), host.n_in());
  LinearWeight w;
  w.weight = place_tensor(f);
  const int64_t N = host.n_out(), K = host.n_in();
  if (K % cuda::kRouterChunkK == 0 && N > 0) {  // router_gemm's operand (router_split.h)
    const int parts = cuda::router_image_parts(f.data<float>(), N * K);
    Tensor image = Tensor::empty_host(DType::kBF16, {cuda::router_image_chunks(N, K), parts, cuda::kRouterBlockElems});
    cuda::build_router_image(f.data<float>(), N, K, parts, image.data<uint16_t>());
    w.derived = place_tensor(image);
  }
  if (s_->router_parts && N > 0 && K % 8 == 0 && cuda::router_image_parts(f.data<float>(), N * K) == 1) {
    // [W | W] in bf16 (exact: W's values are bf16 values), for the GEMM on x's two-part rows
    // (set_router_parts; placed only while it is on: V3's 58 routers would hold 425 MB).
    Tensor pair = Tensor::empty_host(DType::kBF16, {N, 2 * K});
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        pair.data<uint16_t>()[n * 2 * K + k] = pair.data<uint16_t>()[n * 2 * K + K + k] =
            f32_to_bf16(f.data<float>()[n * K + k]);
    w.derived2 = place_tensor(pair);
  }
  return w;
}

LinearWeight CudaBackend::allocate_linear(int64_t n_out, int64_t n_in, DType dtype) {
  LinearWeight w;
  if (dtype == DType::kF32) {
    w.weight = allocate(DType::kF32, {n_out, n_in});
  } else if (dtype == DType::kF8E4M3) {
    w.weight = allocate(DType::kF8E4M3, {n_out, n_in});
    w.block_n = 1;
    w.block_k = 128;
    w.scale_inv = allocate(DType::kF32, {n_out, (n_in + 127) / 128});
  } else {
    DI_CHECK(dtype == DType::kBF16);
    w.weight = allocate(DType::kBF16, {n_out, n_in});
  }
  return w;
}

LinearWeight CudaBackend::place_linear(const std::vector<const LinearWeight*>& parts) {
  DI_CHECK(!parts.empty());
  const int64_t K = parts[0]->n_in();
  const bool fp8 = parts[0]->dtype() == DType::kF8E4M3;
  int64_t N = 0;
  for (const LinearWeight* p : parts) {
    DI_CHECK_EQ(p->n_in(), K);
    DI_CHECK_EQ(p->dtype() == DType::kF8E4M3, fp8);
    if (fp8) DI_CHECK_EQ(p->block_k, parts[0]->block_k);
    N += p->n_out();
  }
  LinearWeight w;
  if (fp8) {
    // Codes as stored; scales expanded to one row per output row (block_n = 1), so any row
    // split of the stack keeps its scales. Uniform 128-row blocks where every part starts at a
    // multiple of 128 rows and its own scales are uniform over 128-row blocks.
    const int64_t bk = parts[0]->block_k, n_kb = (K + bk - 1) / bk;
    bool uniform = true;
    int64_t start = 0;
    for (const LinearWeight* p : parts) {
      uniform = uniform && start % 128 == 0 && (p->block_n % 128 == 0 || (p->block_n == 1 && p->uniform_row_blocks));
      start += p->n_out();
    }
    Tensor q = Tensor::empty_host(DType::kF8E4M3, {N, K});
    Tensor sc = Tensor::empty_host(DType::kF32, {N, n_kb});
    int64_t row = 0;
    for (const LinearWeight* p : parts) {
      std::memcpy(q.data<uint8_t>() + row * K, p->weight.raw_data(), p->weight.n_bytes());
      const int64_t src_kb = p->scale_inv.size(1);
      DI_CHECK_EQ(src_kb, n_kb);
      for (int64_t r = 0; r < p->n_out(); ++r)
        std::memcpy(sc.data<float>() + (row + r) * n_kb, p->scale_inv.data<float>() + (r / p->block_n) * src_kb,
                    sizeof(float) * static_cast<size_t>(n_kb));
      row += p->n_out();
    }
    w.weight = place_tensor(q);
    w.scale_inv = place_tensor(sc);
    w.block_n = 1;
    w.block_k = bk;
    w.uniform_row_blocks = uniform;
    return w;
  }
  Tensor b = Tensor::empty_host(DType::kBF16, {N, K});
  uint16_t* o = b.data<uint16_t>();
  for (const LinearWeight* p : parts) {
    const int64_t n = p->weight.numel();
    if (p->dtype() == DType::kBF16) {
      std::memcpy(o, p->weight.raw_data(), p->weight.n_bytes());
    } else {
      DI_CHECK(p->dtype() == DType::kF32);
      const float* src = p->weight.data<float>();
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(src[i]);
    }
    o += n;
  }
  w.weight = place_tensor(b);
  return w;
}

void CudaBackend::fill_random(Tensor& t, uint64_t seed, bool normal, float a, float b) {
  cuda::fill_random(dptr(t), elem_of(t.dtype()), t.numel(), seed, normal, a, b, s_->stream);
  // Done before anything else runs: kernels read weights before waiting for the previous kernel
  // (cuda_launch.cuh), so no kernel may still be writing one.
  synchronize();
}

// ---- Ops -------------------------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  OpTimer timer(*this, "embedding");

  DI_CHECK_EQ(out.size(1), table.size(1));
  cuda::embedding(dptr(table), elem_of(table.dtype()), cdptr<int32_t>(ids), ids.numel(), table.size(1),
                  dptr<float>(out), s_->stream);
}

void CudaBackend::rms_norm(const Tensor& x, int64_t x_stride, const Tensor& weight, float eps, Tensor& out) {
  OpTimer timer(*this, "rms_norm");

  const int64_t d = weight.numel();
  DI_CHECK_GE(out.size(1), d);
  cuda::rms_norm(cdptr<float>(x), x_stride == 0 ? d : x_stride, dptr(weight), elem_of(weight.dtype()), d, eps,
                 dptr<float>(out), out.size(1), out.size(0), s_->stream);
}

void CudaBackend::add_rms_norm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) {
  OpTimer timer(*this, "add_rms_norm");

  const int64_t d = residual.size(1);
  DI_CHECK_EQ(weight.numel(), d);
  cuda::add_rms_norm(dptr<float>(residual), cdptr<float>(delta), dptr(weight), elem_of(weight.dtype()), d, eps,
                     dptr<float>(out), residual.size(0), s_->stream);
}

QuantizedRows CudaBackend::quantized_rows(int64_t T, int64_t D, const std::vector<const LinearWeight*>& consumers) {
  if (T == 0 || !s_->norm_rows) return {};
  bool fp8 = false, bf16_rows = false;
  for (const LinearWeight* w : consumers) {
    if (w == nullptr || w->n_in() != D) continue;
    fp8 = fp8 || (w->dtype() == DType::kF8E4M3 && dense_w8a8_fits(T, *w));
    // bf16 linears convert x to bf16 past the GEMV's rows (cuBLAS), or always (invariant mode).
    bf16_rows = bf16_rows || (w->dtype() == DType::kBF16 && (s_->batch_invariant || T > kGemvMaxRows));
  }
  QuantizedRows q;
  if (fp8 && D % cuda::kFp8GroupK == 0) {
    q.codes = empty(DType::kU8, {T, D});                        // [T, D] e4m3
    q.scales = empty(DType::kF32, {T, D / cuda::kFp8GroupK});  // [T, D / 128]
  } else if (!fp8 && bf16_rows && D % 4 == 0) {
    q.codes = empty(DType::kBF16, {T, D});  // [T, D] bf16
  }
  return q;
}

void CudaBackend::add_rms_norm_quantized(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps,
                                         Tensor& out, QuantizedRows& xq) {
  if (!xq.defined()) {
    add_rms_norm(residual, delta, weight, eps, out);
    return;
  }
  OpTimer timer(*this, "add_rms_norm");
  const int64_t T = residual.size(0), d = residual.size(1);
  DI_CHECK_EQ(weight.numel(), d);
  DI_CHECK(xq.codes.size(0) == T && xq.codes.size(1) == d);
  const auto we = elem_of(weight.dtype());
  if (xq.codes.dtype() == DType::kBF16) {
    if (cuda::add_rms_norm_bf16(dptr<float>(residual), cdptr<float>(delta), dptr(weight), we, d, eps, dptr<float>(out),
                                dptr<bf16>(xq.codes), T, s_->stream))
      return;
    cuda::add_rms_norm(dptr<float>(residual), cdptr<float>(delta), dptr(weight), we, d, eps, dptr<float>(out), T,
                       s_->stream);
    cuda::to_bf16(cdptr<float>(out), d, T, d, dptr<bf16>(xq.codes), s_->stream);
    return;
  }
  DI_CHECK(xq.codes.dtype() == DType::kU8 && xq.scales.size(0) == T && xq.scales.size(1) == d / cuda::kFp8GroupK);
  if (cuda::add_rms_norm_quantized(dptr<float>(residual), cdptr<float>(delta), dptr(weight), we, d, eps,
                                   dptr<float>(out), dptr<uint8_t>(xq.codes), dptr<float>(xq.scales), T, s_->stream))
    return;
  // Shapes the fused kernel does not take: the norm, then the quantizer (the same bits).
  cuda::add_rms_norm(dptr<float>(residual), cdptr<float>(delta), dptr(weight), we, d, eps, dptr<float>(out), T,
                     s_->stream);
  cuda::quantize_fp8_rows_bf16(cdptr<float>(out), d, nullptr, 1, T, d, dptr<uint8_t>(xq.codes), dptr<float>(xq.scales),
                               s_->stream);
}

// xq's codes and scales when given, defined, e4m3 and of x's shape [M, K] (K % 128 == 0), else null.
std::pair<const uint8_t*, const float*> CudaBackend::quantized_of(const QuantizedRows* xq, int64_t M, int64_t K) const {
  if (xq == nullptr || !xq->defined() || xq->codes.dtype() != DType::kU8) return {nullptr, nullptr};
  DI_CHECK(xq->codes.size(0) == M && xq->codes.size(1) == K && K % cuda::kFp8GroupK == 0 &&
           xq->scales.size(1) == K / cuda::kFp8GroupK && "QuantizedRows of another shape than x");
  return {cdptr<uint8_t>(xq->codes), cdptr<float>(xq->scales)};
}

// xq's bf16 rows when given, defined, bf16 and of x's shape [M, K], else null.
const void* CudaBackend::bf16_rows_of(const QuantizedRows* xq, int64_t M, int64_t K) const {
  if (xq == nullptr || !xq->defined() || xq->codes.dtype() != DType::kBF16) return nullptr;
  DI_CHECK(xq->codes.size(0) == M && xq->codes.size(1) == K && "QuantizedRows of another shape than x");
  return xq->codes.raw_data();
}

// x [T, D] fp32 rounded to bf16 and quantized per 1×128 group (quantize_fp8_rows_bf16), once,
// for the W8A8 consumers of one x (matmul_parts' parts; the shared MLP and the routed experts'
// form 5 in moe_ffn): made by the norm that wrote x (ready), or into buffers of the caller's
// step-memory scope that the first consumer's ensure() fills (rows_fp8).
struct CudaBackend::RowsFp8Once {
  const float* x = nullptr;  // [T, D] fp32, row pitch D
  int64_t T = 0, D = 0;
  uint8_t* q = nullptr;      // [T, D] e4m3
  float* scale = nullptr;    // [T, D / 128] fp32
  bool ready = false;
  void ensure(cudaStream_t s) {
    if (ready) return;
    cuda::quantize_fp8_rows_bf16(x, D, nullptr, 1, T, D, q, scale, s);
    ready = true;
  }
};

CudaBackend::RowsFp8Once CudaBackend::rows_fp8(const Tensor& x, const QuantizedRows* xq) {
  const int64_t T = x.size(0), D = x.size(1);
  if (auto [q, sq] = quantized_of(xq, T, D); q != nullptr)
    return RowsFp8Once{cdptr<float>(x), T, D, const_cast<uint8_t*>(q), const_cast<float*>(sq), true};
  DI_CHECK_EQ(D % cuda::kFp8GroupK, 0);
  Tensor q = empty(DType::kU8, {T, D});                        // [T, D] e4m3
  Tensor sq = empty(DType::kF32, {T, D / cuda::kFp8GroupK});  // [T, D / 128]
  return RowsFp8Once{cdptr<float>(x), T, D, dptr<uint8_t>(q), dptr<float>(sq), false};
}

const void* CudaBackend::bf16_weight(const LinearWeight& w) {
  if (w.dtype() == DType::kBF16) return dptr(w.weight);
  DI_CHECK(w.dtype() == DType::kF8E4M3);
  Tensor deq = empty(DType::kBF16, {w.n_out(), w.n_in()});
  cuda::dequant_fp8(cdptr<uint8_t>(w.weight), cdptr<float>(w.scale_inv), w.n_out(), w.n_in(), w.block_n, w.block_k,
                    w.scale_inv.size(1), dptr<bf16>(deq), s_->stream);
  return dptr(deq);
}

void CudaBackend::linear(const void* xb, int64_t M, const LinearWeight& w, float* out, int64_t ldc) {
  const int64_t N = w.n_out(), K = w.n_in();
  const bool fp8 = w.dtype() == DType::kF8E4M3;
  if (s_->batch_invariant) {
    DI_CHECK(!fp8 || w.block_n == 1);
    if (fp8 && dense_w8a8_fits(M, w)) {  // every size (dense_w8a8_fits): a row's bits do not depend on M
      linear_w8a8(xb, M, w, N, w.uniform_row_blocks, out, ldc);
      return;
    }
    invariant_gemm(xb, M, w.weight.raw_data(), fp8 ? cdptr<float>(w.scale_inv) : nullptr, fp8, w.block_k, N, K, out,
                   ldc);
    return;
  }
  if (try_gemv(xb, Elem::kBF16, K, M, w, N, out, ldc)) return;
  if (fp8 && dense_w8a8_fits(M, w)) {
    linear_w8a8(xb, M, w, N, w.uniform_row_blocks, out, ldc);
    return;
  }
  if (fp8 && M <= kInvariantSmallRows && w.block_n == 1) {
    invariant_gemm(xb, M, w.weight.raw_data(), cdptr<float>(w.scale_inv), true, w.block_k, N, K, out, ldc);
    return;
  }
  const auto* wb = static_cast<const bf16*>(bf16_weight(w));
  cuda::gemm(s_->blas, M, N, K, static_cast<const bf16*>(xb), K, 0, wb, K, 0, true, out, Elem::kF32, ldc, 0, 1);
}

// The dense W8A8 form (set_dense_fp8_w8a8; by default where the scales are uniform over 128-row
// blocks): FP8 weights with per-row scales and 128-wide K blocks (CudaBackend's placement), K a
// whole number of blocks, more rows than the decode GEMV takes (dense_w8a8_rows: kGemvMaxRows
// by default), an sm_90 GPU. Measured (run s14-2, V2-Lite shapes at 4,096 rows): the block form
// ~1,000 TFLOP/s, the per-row form ~560; the fallback (dequantize, then bf16 cuBLAS) ~330 in the
// model (s14-2). At decode sizes it streams the weights through TMA where small_m_gemm widens
// them on the CUDA cores once per 16-row pass (run s17-6, V2-Lite FP8 ms per step, from 64 rows
// → from 2: B = 32 8.81 → 8.17, B = 64 11.30 → 9.30, B = 8 6.61 → 6.58; from 16: the same).
// The batch-invariant mode takes it at every size, as it takes the MoE's form 5: a row's
// arithmetic in the wgmma GEMM (its K blocks' MMAs promoted in K order, its own 1×128 groups)
// depends neither on M nor on the row's place in its tile, so it needs no invariant K structure,
// and FP8 weights are no longer widened to bf16 (small_m_gemm, the widened wgmma form).
bool CudaBackend::dense_w8a8_fits(int64_t M, const LinearWeight& w, bool partial_k) const {
  const bool on = s_->dense_w8a8 == 1 || (s_->dense_w8a8 == -1 && w.uniform_row_blocks);
  return on && M > (s_->batch_invariant ? 0 : s_->dense_w8a8_rows) && w.block_n == 1 && w.block_k == cuda::kFp8GroupK &&
         w.n_in() % (partial_k ? 16 : cuda::kFp8GroupK) == 0 &&
         reinterpret_cast<uintptr_t>(w.weight.raw_data()) % 16 == 0 && cuda::fp8_wgmma_available();
}

// out[M, n_rows] (row pitch ldc) = the rows of xb (bf16 [M, K]) quantized per 1×128 group
// (quantize_fp8_rows, DeepSeek's activation recipe) times the FP8 weights on the wgmma GEMM,
// each 128-wide K block promoted with row scale × the weight row's scale — the MoE's W8A8 form
// (form 5) for a dense linear: no bf16 copy of the weights, FP8 matrix rate; activations lose up
// to 2^-4 relative per element (CudaOps.LinearW8a8MatchesQuantizedReference).
void CudaBackend::linear_w8a8(const void* xb, int64_t M, const LinearWeight& w, int64_t n_rows, bool uniform,
                              float* out, int64_t ldc) {
  const int64_t K = w.n_in(), n_kb = K / cuda::kFp8GroupK;
  ScratchScope scope(*this);
  Tensor q = empty(DType::kU8, {M, K});      // [M, K] e4m3
  Tensor sq = empty(DType::kF32, {M, n_kb});  // [M, K / 128]
  cuda::quantize_fp8_rows(xb, cuda::Elem::kBF16, M, K, dptr<uint8_t>(q), dptr<float>(sq), false, s_->stream);
  fp8_gemm_w8a8(dptr<uint8_t>(q), dptr<float>(sq), M, w, n_rows, uniform, out, ldc);
}

void CudaBackend::fp8_gemm_w8a8(const uint8_t* q, const float* sq, int64_t M, const LinearWeight& w, int64_t n_rows,
                                bool uniform, float* out, int64_t ldc, float* out2, int64_t ldc2, int64_t n_split) {
  cuda::Fp8GemmArgs g;
  g.a = q;
  g.a_scale = sq;
  g.w = cdptr<uint8_t>(w.weight);
  g.w_scale = cdptr<float>(w.scale_inv);
  g.M = M, g.N = n_rows, g.K = w.n_in(), g.block_n = 1, g.w_scale_uniform = uniform;
  g.c = out, g.c_elem = cuda::Elem::kF32, g.ldc = ldc;
  g.c2 = out2, g.ldc2 = ldc2, g.n_split = n_split;
  g.variant = 3;
  g.w_stable = s_->w8a8_early_w;  // placed weights
  g.cluster = s_->fp8_cluster;
  cuda::fp8_gemm(g, nullptr, nullptr, s_->stream);
}

// Whether a linear of M fp32 rows (row pitch ldx) takes the W8A8 form straight from fp32
// (quantize_fp8_rows_bf16: the rounding to bf16 and the quantization in one pass, no bf16 copy).
bool CudaBackend::w8a8_from_f32(const Tensor& x, int64_t ldx, int64_t M, const LinearWeight& w) const {
  return w.dtype() == DType::kF8E4M3 && dense_w8a8_fits(M, w) && ldx % 4 == 0 &&
         reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0;
}

bool CudaBackend::gemv_fits(const void* a, cuda::Elem a_elem, int64_t lda, int64_t M, const LinearWeight& w) const {
  if (s_->batch_invariant || M > kGemvMaxRows) return false;
  const bool fp8 = w.dtype() == DType::kF8E4M3;
  if (fp8 && w.block_n != 1) return false;
  return cuda::gemv_ok(a_elem, a, lda, elem_of(w.dtype()), w.n_in(), fp8 ? w.block_k : 0) &&
         reinterpret_cast<uintptr_t>(w.weight.raw_data()) % 16 == 0;
}

bool CudaBackend::try_gemv(const void* a, cuda::Elem a_elem, int64_t lda, int64_t M, const LinearWeight& w,
                           int64_t n_rows, float* out, int64_t ldc, float* out2, int64_t n2) {
  if (!gemv_fits(a, a_elem, lda, M, w)) return false;
  const bool fp8 = w.dtype() == DType::kF8E4M3;
  cuda::GemvArgs g;
  g.a = a, g.a_elem = a_elem, g.lda = lda;
  g.w = dptr(w.weight), g.w_elem = elem_of(w.dtype());
  if (fp8) g.w_scale = cdptr<float>(w.scale_inv), g.block_k = w.block_k;
  g.N = n_rows + n2, g.K = w.n_in();
  g.rows = M, g.max_rows = M;
  g.c = out, g.ldc = ldc;
  g.tc_min_units = s_->gemv_tc_min_units;
  g.ring = s_->gemv_ring;
  if (out2 != nullptr) g.c2 = out2, g.ldc2 = n2, g.n_split = n_rows;
  cuda::gemv(g, s_->stream);
  return true;
}

void CudaBackend::invariant_gemm(const void* xb, int64_t M, const void* w, const float* scale, bool fp8,
                                 int64_t block_k, int64_t N, int64_t K, float* out, int64_t ldc) {
  const auto* a = static_cast<const bf16*>(xb);
  if (M <= kInvariantSmallRows && cuda::small_m_gemm_ok(K, fp8, block_k)) {
    const int64_t splits = cuda::invariant_k_splits(K);
    ScratchScope scope(*this);
    float* part = splits > 1 ? dptr<float>(empty(DType::kF32, {splits, M, N})) : nullptr;
    cuda::small_m_gemm(a, K, w, scale, fp8, block_k, N, nullptr, nullptr, 1, M, M, out, ldc, part, s_->stream);
  } else if (cuda::bf16_wgmma_invariant_ok(K) &&
             (!fp8 || (cuda::widen_fp8_weights_ok(N, K, block_k) && 2 * N * K <= cuda::kMoeWidenMaxBytes))) {
    // The same bits on wgmma; FP8 weights widened to bf16 first, as the small-M kernels widen them.
    ScratchScope scope(*this);
    const bf16* wb = static_cast<const bf16*>(w);
    if (fp8) {
      Tensor wide = empty(DType::kBF16, {N, K});
      cuda::widen_fp8_weights(static_cast<const uint8_t*>(w), scale, N, K, block_k, dptr<bf16>(wide), s_->stream);
      wb = cdptr<bf16>(wide);
    }
    cuda::bf16_wgmma_dense_gemm(a, M, K, wb, N, out, ldc, s_->stream, true);
  } else {
    cuda::dense_gemm_tiled(a, M, K, w, scale, fp8, block_k, N, out, ldc, s_->stream);
  }
}

void CudaBackend::matmul(const Tensor& x, int64_t x_stride, const LinearWeight& w, Tensor& out) {
  OpTimer timer(*this, "matmul", w.n_out(), w.n_in());

  const int64_t M = out.size(0), N = w.n_out(), K = w.n_in();
  DI_CHECK_EQ(out.size(1), N);
  if (M == 0) return;
  ScratchScope scope(*this);
  if (w.dtype() == DType::kF32) {  // fp32 weights (the router): fp32 GEMM, no tf32
    if (s_->batch_invariant) {  // decode-sized steps: K chunks in parallel blocks (same bits)
      const int64_t chunks = cuda::gemm_f32_ordered_chunks(K);
      if (M <= kInvariantRouterParallelRows && chunks > 1 && s_->invariant_fused_router &&
          cuda::gemm_f32_ordered_fused_ok(K)) {  // ... of one launch
        cuda::gemm_f32_ordered_fused(cdptr<float>(x), x_stride == 0 ? K : x_stride, cdptr<float>(w.weight), M, N, K,
                                     dptr<float>(out), N, s_->stream);
        return;
      }
      float* part = M <= kInvariantRouterParallelRows && chunks > 1 ? dptr<float>(empty(DType::kF32, {chunks, M, N}))
                                                                      : nullptr;
      cuda::gemm_f32_ordered(cdptr<float>(x), x_stride == 0 ? K : x_stride, cdptr<float>(w.weight), M, N, K,
                             dptr<float>(out), N, part, s_->stream,
                             s_->router_tiled_rows > 0 && M >= s_->router_tiled_rows);
      return;
    }
    const int64_t ldx = x_stride == 0 ? K : x_stride;
    if (try_gemv(x.raw_data(), Elem::kF32, ldx, M, w, N, dptr<float>(out), N)) return;
    // The split-bf16 tensor-core form (set_router_split; w.derived: the image place_linear_fp32
    // built), else cuBLAS's fp32 SGEMM (~39 µs a V2-Lite layer at 4,096 rows; a 3xTF32 kernel
    // measured slower, 52 µs, run s21-4, in history at 3433027; the split form on mma.sync 51–54
    // µs, version 26).
    if (s_->router_split && w.derived.defined() && cuda::router_gemm_ok(cdptr<float>(x), ldx, K)) {
      cuda::router_gemm(cdptr<float>(x), ldx, cdptr<uint16_t>(w.derived), static_cast<int>(w.derived.size(1)), M, N,
                        K, dptr<float>(out), N, s_->stream);
      return;
    }
    cuda::gemm_f32(s_->blas, M, N, K, cdptr<float>(x), ldx, cdptr<float>(w.weight), K, dptr<float>(out), N);
    return;
  }
  // Decode sizes: the GEMV rounds the fp32 rows to bf16 as it reads them (no conversion launch).
  if (try_gemv(x.raw_data(), Elem::kF32, x_stride == 0 ? K : x_stride, M, w, N, dptr<float>(out), N)) return;
  if (w8a8_from_f32(x, x_stride == 0 ? K : x_stride, M, w)) {  // rounded and quantized in one pass
    Tensor q = empty(DType::kU8, {M, K});                        // [M, K] e4m3
    Tensor sq = empty(DType::kF32, {M, K / cuda::kFp8GroupK});  // [M, K / 128]
    cuda::quantize_fp8_rows_bf16(cdptr<float>(x), x_stride == 0 ? K : x_stride, nullptr, 1, M, K, dptr<uint8_t>(q),
                                 dptr<float>(sq), s_->stream);
    fp8_gemm_w8a8(dptr<uint8_t>(q), dptr<float>(sq), M, w, N, w.uniform_row_blocks, dptr<float>(out), N);
    return;
  }
  Tensor xb = empty(DType::kBF16, {M, K});
  cuda::to_bf16(cdptr<float>(x), x_stride == 0 ? K : x_stride, M, K, dptr<bf16>(xb), s_->stream);
  linear(dptr(xb), M, w, dptr<float>(out), N);
}

void CudaBackend::rope(Tensor& x, int64_t offset, const Tensor& positions, const RopeParams& rope) {
  OpTimer timer(*this, "rope");

  cuda::RopeArgs a;
  DI_CHECK_LE(static_cast<int64_t>(rope.inv_freq.size()), 64);
  std::copy(rope.inv_freq.begin(), rope.inv_freq.end(), a.inv_freq);
  a.half = static_cast<int>(rope.inv_freq.size());
  a.attention_factor = rope.attention_factor;
  a.interleave = rope.interleave;
  DI_CHECK_LE(offset + rope.dim(), x.size(2));
  cuda::rope(dptr<float>(x), x.size(0), x.size(1), x.size(2), offset, cdptr<int32_t>(positions), a, s_->stream);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  OpTimer timer(*this, "silu_mul");

  DI_CHECK_EQ(gate_up.size(1), 2 * out.size(1));
  cuda::silu_mul(cdptr<float>(gate_up), out.size(0), out.size(1), dptr(out), Elem::kF32, s_->stream);
}

void CudaBackend::kv_write(const Tensor& latent, const Tensor& slots, Tensor& cache) {
  OpTimer timer(*this, "kv_write");

  DI_CHECK_EQ(cache.size(2), latent.size(1));
  cuda::kv_write(cdptr<float>(latent), cdptr<int32_t>(slots), latent.size(0), latent.size(1), dptr(cache),
                 elem_of(cache.dtype()), s_->stream);
}

void CudaBackend::mla_kv_write(Tensor& kv, const Tensor& norm, float eps, const Tensor& positions,
                               const RopeParams& rope, const Tensor& slots, Tensor& cache) {
  OpTimer timer(*this, "mla_kv_write");
  latent_write(kv, norm, eps, positions, rope, slots, cache, cuda::MlaQRope{});
}

void CudaBackend::mla_rope_kv_write(Tensor& q, int64_t q_offset, Tensor& kv, const Tensor& norm, float eps,
                                    const Tensor& positions, const RopeParams& rope, const Tensor& slots, Tensor& cache,
                                    MlaParams* reader) {
  OpTimer timer(*this, "mla_rope_kv_write");
  DI_CHECK_EQ(q.ndim(), 3);
  DI_CHECK_EQ(q.size(0), kv.size(0));
  DI_CHECK_LE(q_offset + rope.dim(), q.size(2));
  cuda::MlaQRope qr;
  if (reader != nullptr && q_rope_in_prefill(*reader, q, q_offset, rope)) {
    // The rotation left to the reader's prefill kernel: the latent write stores the tokens'
    // tables instead ([T, dr], step memory: the layer's attention reads it).
    reader->q_rope = empty(DType::kF32, {q.size(0), rope.dim()});
    qr.table = dptr<float>(reader->q_rope);
  } else {
    qr.q = dptr<float>(q);
    qr.heads = q.size(1), qr.stride = q.size(2), qr.offset = q_offset;
  }
  latent_write(kv, norm, eps, positions, rope, slots, cache, qr);
}

bool CudaBackend::q_rope_in_prefill(const MlaParams& p, const Tensor& q, int64_t q_offset,
                                    const RopeParams& rope) const {
  const int64_t dn = p.qk_nope_head_dim, dr = p.qk_rope_head_dim;
  return s_->mla_q_rope && rope.interleave && rope.dim() == dr && q_offset == dn && q.size(1) == p.n_heads &&
         q.size(2) == dn + dr && prefill_on_wgmma(p);
}

bool CudaBackend::prefill_on_wgmma(const MlaParams& p) const {
  const int64_t dn = p.qk_nope_head_dim, dr = p.qk_rope_head_dim, dv = p.v_head_dim, r = p.kv_lora_rank;
  return s_->mla_wgmma && cuda::mla_prefill_supported(dn, dr, dv, r) && cuda::mla_prefill_wgmma_ok(dn, dr, dv, r);
}

void CudaBackend::latent_write(Tensor& kv, const Tensor& norm, float eps, const Tensor& positions,
                               const RopeParams& rope, const Tensor& slots, Tensor& cache, const cuda::MlaQRope& q) {
  const int64_t r = norm.numel(), width = kv.size(1);
  DI_CHECK_EQ(cache.size(2), width);
  DI_CHECK_LE(r + rope.dim(), width);
  cuda::RopeArgs a;
  DI_CHECK_LE(static_cast<int64_t>(rope.inv_freq.size()), cuda::kRopeMaxHalf);
  std::copy(rope.inv_freq.begin(), rope.inv_freq.end(), a.inv_freq);
  a.half = static_cast<int>(rope.inv_freq.size());
  a.attention_factor = rope.attention_factor;
  a.interleave = rope.interleave;
  cuda::mla_kv_write(dptr<float>(kv), kv.size(0), width, r, dptr(norm), elem_of(norm.dtype()), eps,
                     cdptr<int32_t>(positions), a, cdptr<int32_t>(slots), dptr(cache), elem_of(cache.dtype()), q,
                     s_->stream);
}

void CudaBackend::mla_decode_sublayer(const MlaSublayerWeights& w, const Tensor& x, const QuantizedRows* xq,
                                      const Tensor& positions, const Tensor& slots, const AttentionBatch& decode,
                                      Tensor& cache, Tensor& out) {
  if (!sublayer_kernel(w, x, positions, slots, decode, cache, out, nullptr))
    Backend::mla_decode_sublayer(w, x, xq, positions, slots, decode, cache, out);
}

void CudaBackend::add_rms_norm_mla_decode_sublayer(Tensor& residual, const Tensor& delta, const Tensor& norm,
                                                   float eps, Tensor& x, QuantizedRows& xq,
                                                   const MlaSublayerWeights& w, const Tensor& positions,
                                                   const Tensor& slots, const AttentionBatch& decode, Tensor& cache,
                                                   Tensor& out) {
  const int64_t D = residual.size(1);
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  // By default only the default mode folds it: the invariant forms measured slower with it
  // (docs/perf.md, version 29). The op path's x at one row is add_rms_norm's vectorized kernel's
  // (whatever xq is) exactly where the conditions below hold.
  const bool on = s_->sublayer_norm == 1 || (s_->sublayer_norm == -1 && !s_->batch_invariant);
  const bool fold = on && residual.size(0) == 1 && x.size(0) == 1 && x.size(1) == D &&
                    norm.numel() == D && D % 4 == 0 && D <= cuda::kMlaSublayerNormMaxD &&
                    aligned(residual.raw_data()) && aligned(delta.raw_data()) && aligned(x.raw_data());
  if (fold) {
    cuda::MlaSublayerArgs in;
    in.residual = dptr<float>(residual);
    in.delta = cdptr<float>(delta);
    in.in_norm = dptr(norm);
    in.in_norm_elem = elem_of(norm.dtype());
    in.in_eps = eps;
    in.x_out = dptr<float>(x);
    if (sublayer_kernel(w, x, positions, slots, decode, cache, out, &in)) return;
  }
  add_rms_norm_quantized(residual, delta, norm, eps, x, xq);
  mla_decode_sublayer(w, x, &xq, positions, slots, decode, cache, out);
}

bool CudaBackend::sublayer_kernel(const MlaSublayerWeights& w, const Tensor& x, const Tensor& positions,
                                  const Tensor& slots, const AttentionBatch& decode, Tensor& cache, Tensor& out,
                                  const cuda::MlaSublayerArgs* in_norm) {
  const MlaParams& p = w.mla;
  const int64_t D = x.size(1), H = p.n_heads, dn = p.qk_nope_head_dim, dr = p.qk_rope_head_dim;
  const int64_t dv = p.v_head_dim, r = p.kv_lora_rank;
  auto bf16_linear = [](const LinearWeight* l, int64_t n, int64_t k) {
    return l->dtype() == DType::kBF16 && l->n_out() == n && l->n_in() == k;
  };
  // FP8 linears as the CUDA placement stores them (a scale per row and 128-column block).
  auto fp8_linear = [](const LinearWeight* l, int64_t n, int64_t k) {
    return l->dtype() == DType::kF8E4M3 && l->n_out() == n && l->n_in() == k && l->block_n == 1 &&
           l->block_k == cuda::kFp8GroupK && k % cuda::kFp8GroupK == 0 && l->scale_inv.defined() &&
           l->scale_inv.size(0) == n && l->scale_inv.size(1) == k / cuda::kFp8GroupK;
  };
  const bool bf16_w = bf16_linear(w.q_proj, H * (dn + dr), D) && bf16_linear(w.kv_a_proj, r + dr, D) &&
                      bf16_linear(w.o_proj, D, H * dv);
  // FP8 linears: the default form dots them as the FP8 decode GEMV does; the invariant form as
  // the mode's W8A8 GEMM does — where the mode's op path takes that form for all three at one
  // row (dense_w8a8_fits), else its bits are the small-M GEMM's and the op path runs.
  const bool fp8_w = s_->mla_sublayer_fp8 && fp8_linear(w.q_proj, H * (dn + dr), D) &&
                     fp8_linear(w.kv_a_proj, r + dr, D) && fp8_linear(w.o_proj, D, H * dv) &&
                     (!s_->batch_invariant
                          ? cuda::mla_sublayer_fp8_fits(D)
                          : (dense_w8a8_fits(1, *w.q_proj) && dense_w8a8_fits(1, *w.kv_a_proj) &&
                             dense_w8a8_fits(1, *w.o_proj) && cuda::mla_sublayer_invariant_fp8_fits(D)));
  // One row of one selected sequence: host-side sizes, the same at every replay of a decode graph.
  const bool one_row = x.size(0) == 1 && decode.n_seqs == 1 && decode.n_rows == 1 && decode.selected(0) &&
                       decode.q_indptr[1] - decode.q_indptr[0] == 1;
  const DType norm_dt = w.kv_a_layernorm->dtype();
  if (!one_row || !s_->mla_sublayer || cache.dtype() != DType::kBF16 ||
      cache.size(2) != r + dr || (norm_dt != DType::kF32 && norm_dt != DType::kBF16) ||
      !cuda::mla_sublayer_fits(D, H, dn, dr, dv, r, static_cast<int64_t>(w.rope->inv_freq.size())) ||
      !(bf16_w || fp8_w) || !bf16_linear(p.kv_b_proj, H * (dn + dv), r))
    return false;
  OpTimer timer(*this, in_norm != nullptr ? "add_rms_norm_mla_decode_sublayer" : "mla_decode_sublayer");
  ScratchScope scope(*this);
  cuda::MlaSublayerArgs a;
  if (in_norm != nullptr) {
    a.residual = in_norm->residual;
    a.delta = in_norm->delta;
    a.in_norm = in_norm->in_norm;
    a.in_norm_elem = in_norm->in_norm_elem;
    a.in_eps = in_norm->in_eps;
    a.x_out = in_norm->x_out;
  }
  a.x = cdptr<float>(x);
  a.D = D;
  a.fp8 = fp8_w;
  a.w_q = w.q_proj->weight.raw_data();
  a.w_kv = w.kv_a_proj->weight.raw_data();
  a.w_o = w.o_proj->weight.raw_data();
  if (fp8_w) {
    a.s_q = cdptr<float>(w.q_proj->scale_inv);
    a.s_kv = cdptr<float>(w.kv_a_proj->scale_inv);
    a.s_o = cdptr<float>(w.o_proj->scale_inv);
  }
  a.kv_norm = w.kv_a_layernorm->raw_data();
  a.kv_norm_elem = elem_of(norm_dt);
  a.eps = w.eps;
  std::copy(w.rope->inv_freq.begin(), w.rope->inv_freq.end(), a.rope.inv_freq);
  a.rope.half = static_cast<int>(w.rope->inv_freq.size());
  a.rope.attention_factor = w.rope->attention_factor;
  a.rope.interleave = w.rope->interleave;
  a.positions = cdptr<int32_t>(positions);
  a.slots = cdptr<int32_t>(slots);
  a.cache = dptr<cuda::bf16>(cache);
  a.block_size = decode.block_size;
  a.kv_len = decode.dev.kv_len;
  a.block_indptr = decode.dev.block_indptr;
  a.block_ids = decode.dev.block_ids;
  a.kv_b = cdptr<cuda::bf16>(p.kv_b_proj->weight);
  a.scale = p.softmax_scale;
  a.out = dptr<float>(out);
  const int64_t n_splits = cuda::mla_sublayer_max_splits();
  a.q = dptr<float>(empty(DType::kF32, {H * (dn + dr)}));
  a.kv = dptr<float>(empty(DType::kF32, {r + dr}));
  a.q_lat = dptr<cuda::bf16>(empty(DType::kBF16, {H, r}));
  a.q_pe = dptr<cuda::bf16>(empty(DType::kBF16, {H, dr}));
  a.part_acc = dptr<float>(empty(DType::kF32, {n_splits, H, r}));
  a.part_ml = reinterpret_cast<float2*>(dptr<float>(empty(DType::kF32, {n_splits, H, 2})));
  a.o = dptr<float>(empty(DType::kF32, {H * dv}));
  a.counter = s_->grid_counter;
  if (s_->batch_invariant) {  // the invariant form: the op-by-op path's bits (the rule mla_attention uses)
    a.split_keys = s_->mla_invariant_split_keys;
    a.max_splits = kMlaInvariantMaxSplits;
  }
  cuda::mla_sublayer(a, s_->stream);
  s_->after_fp8_sublayer = fp8_w;
  return true;
}

void CudaBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  OpTimer timer(*this, "gather_rows");

  DI_CHECK_EQ(out.size(1), x.size(1));
  cuda::gather_rows(cdptr<float>(x), cdptr<int32_t>(rows), rows.numel(), x.size(1), dptr<float>(out), s_->stream);
}

void CudaBackend::add(Tensor& out, const Tensor& x) {
  OpTimer timer(*this, "add");

  DI_CHECK_EQ(out.numel(), x.numel());
  cuda::add(dptr<float>(out), cdptr<float>(x), out.numel(), s_->stream);
}

namespace {
// The routing rule and outputs of moe_route's kernel (logits and T left to the caller).
cuda::RouteArgs route_args(const RouterParams& p, int64_t E, Tensor& ids, Tensor& weights) {
  cuda::RouteArgs a{};
  a.bias = p.correction_bias;
  a.E = E;
  a.n_group = p.n_group;
  a.topk_group = p.topk_group;
  a.top_k = p.top_k;
  a.scoring = p.scoring_func == ScoringFunc::kSoftmax ? 0 : 1;
  a.method = p.topk_method == TopkMethod::kGreedy ? 0 : p.topk_method == TopkMethod::kGroupLimitedGreedy ? 1 : 2;
  a.norm_topk_prob = p.norm_topk_prob;
  a.scale = p.routed_scaling_factor;
  a.ids = dptr<int32_t>(ids);
  a.weights = dptr<float>(weights);
  return a;
}
}  // namespace

void CudaBackend::add_rms_norm_route(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps, Tensor& out,
                                     QuantizedRows& xq, const LinearWeight& router, const RouterParams& p, Tensor& ids,
                                     Tensor& weights) {
  const int64_t T = residual.size(0), D = residual.size(1), E = router.n_out();
  const bool after_fp8_sublayer = std::exchange(s_->after_fp8_sublayer, false);
  if (norm_route_parts(residual, delta, norm, eps, out, xq, router, p, ids, weights)) return;
  const int q_kind = !xq.defined() ? 0 : xq.codes.dtype() == DType::kU8 ? 1 : 2;
  auto aligned = [](const void* ptr, uintptr_t n) { return reinterpret_cast<uintptr_t>(ptr) % n == 0; };
  // By default where x's rows are FP8 codes (the FP8 W8A8 consumers': the batch-invariant mode's
  // FP8 steps, where it measured faster) and right after the FP8 sublayer kernel (the default
  // mode's FP8 steps: 0.02 ms faster, version 29 and run s35-3). Its blocks need ~11 KB of shared
  // memory: beside the FP8 sublayer's blocks they fit and start early (the router rows into L2
  // before the wait); the bf16 sublayer leaves ~6 KB, so there it starts only once the sublayer's
  // blocks have left and the three launches measured faster (docs/perf.md, version 32). The op
  // path's norm at one row is add_rms_norm's vectorized kernel exactly where the alignments below
  // hold, so the kernel's bits are the op path's.
  const bool on = s_->norm_route == 1 || (s_->norm_route == -1 && (q_kind == 1 || after_fp8_sublayer));
  const bool fits = on && T == 1 && router.dtype() == DType::kF32 && router.n_in() == D &&
                    cuda::norm_route_ok(D, E, p.n_group, p.top_k, q_kind) && aligned(residual.raw_data(), 16) &&
                    aligned(delta.raw_data(), 16) && aligned(out.raw_data(), 16) &&
                    aligned(router.weight.raw_data(), 16) &&
                    (q_kind == 0 || aligned(xq.codes.raw_data(), q_kind == 1 ? 4 : 8));
  if (!fits) {
    Backend::add_rms_norm_route(residual, delta, norm, eps, out, xq, router, p, ids, weights);
    return;
  }
  OpTimer timer(*this, "add_rms_norm_route");
  DI_CHECK_EQ(norm.numel(), D);
  DI_CHECK(out.size(0) == 1 && out.size(1) == D && ids.numel() == p.top_k && weights.numel() == p.top_k);
  if (q_kind == 1) DI_CHECK(xq.scales.size(0) == 1 && xq.scales.size(1) == D / cuda::kFp8GroupK);
  if (q_kind != 0) DI_CHECK(xq.codes.size(0) == 1 && xq.codes.size(1) == D);
  ScratchScope scope(*this);
  cuda::NormRouteArgs a{};
  a.residual = dptr<float>(residual);
  a.delta = cdptr<float>(delta);
  a.norm = dptr(norm);
  a.norm_elem = elem_of(norm.dtype());
  a.D = D;
  a.eps = eps;
  a.out = dptr<float>(out);
  a.q_kind = q_kind;
  a.q = q_kind == 0 ? nullptr : xq.codes.raw_data();
  a.sq = q_kind == 1 ? dptr<float>(xq.scales) : nullptr;
  a.router = cdptr<float>(router.weight);
  a.logits = dptr<float>(empty(DType::kF32, {E}));
  a.counter = s_->grid_counter + 2;
  a.route = route_args(p, E, ids, weights);
  a.route.T = 1;
  cuda::norm_route(a, s_->stream);
}

bool CudaBackend::norm_route_parts(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps, Tensor& out,
                                   QuantizedRows& xq, const LinearWeight& router, const RouterParams& p, Tensor& ids,
                                   Tensor& weights) {
  const int64_t T = residual.size(0), D = residual.size(1), E = router.n_out();
  if (!s_->router_parts || s_->batch_invariant || T < s_->router_parts_rows || router.dtype() != DType::kF32 ||
      !router.derived2.defined() || router.n_in() != D || router.derived2.size(1) != 2 * D)
    return false;
  const int q_kind = !xq.defined() ? 0 : xq.codes.dtype() == DType::kU8 ? 1 : 2;
  if (q_kind != 0) DI_CHECK(xq.codes.size(0) == T && xq.codes.size(1) == D);
  if (q_kind == 1) DI_CHECK(xq.scales.size(0) == T && xq.scales.size(1) == D / cuda::kFp8GroupK);
  DI_CHECK_EQ(norm.numel(), D);
  OpTimer timer(*this, "add_rms_norm_route");
  ScratchScope scope(*this);
  Tensor parts = empty(DType::kBF16, {T, 2 * D});  // [T, 2D] x's rows as [RN(x) | RN(x − RN(x))]
  if (!cuda::add_rms_norm_parts(dptr<float>(residual), cdptr<float>(delta), dptr(norm), elem_of(norm.dtype()), D, eps,
                                dptr<float>(out), q_kind, q_kind == 0 ? nullptr : xq.codes.raw_data(),
                                q_kind == 1 ? dptr<float>(xq.scales) : nullptr, dptr<bf16>(parts), T, s_->stream))
    return false;  // nothing launched: the op path
  Tensor logits = empty(DType::kF32, {T, E});  // [T, E] = parts · [W | W]ᵀ, fp32 accumulation
  cuda::gemm(s_->blas, T, E, 2 * D, cdptr<bf16>(parts), 2 * D, 0, cdptr<bf16>(router.derived2), 2 * D, 0, true,
             dptr(logits), Elem::kF32, E, 0, 1, 0.0f);
  moe_route(logits, p, ids, weights);
  return true;
}

namespace {
void* arena_alloc(void* ctx, size_t bytes);  // step memory for the launchers' scratch (defined below)
}  // namespace

void CudaBackend::mla_attention(const MlaParams& p, MlaForm form, const Tensor& q, const Tensor& cache,
                                const AttentionBatch& batch, Tensor& out) {
  OpTimer timer(*this, form == MlaForm::kAbsorbed ? "mla_attention absorbed" : "mla_attention naive");

  const int64_t H = p.n_heads, dn = p.qk_nope_head_dim, dr = p.qk_rope_head_dim, dv = p.v_head_dim;
  const int64_t r = p.kv_lora_rank, dqk = dn + dr, width = r + dr, T = q.size(0);
  DI_CHECK_EQ(q.size(2), dqk);
  DI_CHECK_EQ(cache.size(2), width);
  DI_CHECK(cache.dtype() == DType::kBF16);
  if (T == 0 || batch.n_seqs == 0) return;
  ScratchScope scope(*this);
  cudaStream_t st = s_->stream;
  // q's rotation left by mla_rope_kv_write (p.q_rope, interleaved pairs): the wgmma prefill kernel
  // applies it as it reads q; every other path reads a copy of q rotated by the same table.
  const bool rope_in_kernel = p.q_rope.defined() && form == MlaForm::kNaive && prefill_on_wgmma(p);
  Tensor q_rotated;  // [T, H, dn + dr]
  if (p.q_rope.defined()) {
    DI_CHECK_EQ(p.q_rope.size(0), T);
    DI_CHECK_EQ(p.q_rope.size(1), dr);
    if (!rope_in_kernel) {
      q_rotated = empty(DType::kF32, {T, H, dqk});
      DI_CUDA_CHECK(cudaMemcpyAsync(dptr(q_rotated), q.raw_data(), q.n_bytes(), cudaMemcpyDeviceToDevice, st));
      cuda::rope_from_table(dptr<float>(q_rotated), T, H, dqk, dn, cdptr<float>(p.q_rope), static_cast<int>(dr / 2),
                            st);
    }
  }
  const Tensor& qx = q_rotated.defined() ? q_rotated : q;  // what the kernels below read
  // kv_b rows per head: W_UK_h [dn, r] then W_UV_h [dv, r].
  const auto* kvb = static_cast<const bf16*>(bf16_weight(*p.kv_b_proj));
  const bf16* cache_p = cdptr<bf16>(cache);

  if (form == MlaForm::kAbsorbed) {
    cuda::MlaDecodeArgs a{};
    a.q = cdptr<float>(qx);
    a.kv_b = kvb;
    a.kv_b_stable = p.kv_b_proj->dtype() == DType::kBF16;  // the placed weight itself (bf16_weight)
    a.cache = cache_p;
    a.q_indptr = batch.dev.q_indptr;
    a.kv_len = batch.dev.kv_len;
    a.block_indptr = batch.dev.block_indptr;
    a.block_ids = batch.dev.block_ids;
    a.seq_mask = batch.dev.seq_mask;
    a.n_seqs = batch.n_seqs;
    a.T = T;
    a.H = H;
    a.r = r;
    a.dr = dr;
    a.dn = dn;
    a.dv = dv;
    a.block_size = batch.block_size;
    a.n_blocks = cache.size(0);
    a.scale = p.softmax_scale;
    a.out = dptr<float>(out);
    // The selected rows, counted from the host's index arrays: a size, like T (a decode-only
    // step selects all T rows, so its graph replays the same grids).
    bool decode_shaped = true;  // one row per selected sequence
    int64_t max_keys = 0;
    for (int64_t b = 0; b < batch.n_seqs; ++b) {
      if (!batch.selected(b)) continue;
      const int64_t rows = batch.q_indptr[b + 1] - batch.q_indptr[b];
      a.n_rows += rows;
      a.max_q_len = std::max(a.max_q_len, rows);  // > 1 with batch_invariant: the multi-row kernel
      decode_shaped = decode_shaped && rows == 1;
      max_keys = std::max<int64_t>(max_keys, batch.kv_len[b]);
    }
    if (s_->batch_invariant) {
      // The per-row rule needs every row's split count within the launch's slots: all 32 for
      // decode-shaped steps (graph replays see growing contexts), else the longest row's.
      a.split_keys = s_->mla_invariant_split_keys;
      a.max_splits = decode_shaped ? kMlaInvariantMaxSplits
                                   : cuda::mla_row_splits(max_keys, a.split_keys, kMlaInvariantMaxSplits);
    }
    cuda::mla_decode(a, arena_alloc, &s_->arena, st);
    return;
  }

  // Naive form on the flash-attention kernel (cuda_mla_prefill.cu) where it takes the head dims:
  // the selected sequences in groups of ≤ kMlaPrefillMaxSeqs whose K/V scratch stays under
  // ~1 GiB (a longer sequence alone); per group its latents gathered into one bf16 buffer, one
  // bf16 GEMM decompressing [k_nope_h | v_h] for every key and head (bf16 out: the kernel's
  // operand precision), then one attention launch. The batch-invariant mode decompresses on
  // invariant_gemm instead (cuBLAS picks its algorithm by the group's key count): c_kv copied
  // compact, fp32 out, rounded to bf16 — each key's row fixed by the key alone; the kernel's rows
  // do not depend on their chunk (CudaMlaPrefill.DeterministicAndChunkInvariant).
  if (cuda::mla_prefill_supported(dn, dr, dv, r)) {
    const int64_t kv_cols = H * (dn + dv);
    const bool invariant = s_->batch_invariant;
    // kv_b on the W8A8 form (set_kvb_w8a8): the default mode, an FP8 checkpoint's placed weight,
    // whole 128-wide groups of c_kv, 16-byte aligned latent rows; per group, where the dense W8A8
    // form takes the weight at its key count.
    const LinearWeight* wf = p.kv_b_proj_fp8;
    const bool kvb_w8a8 = s_->kvb_w8a8 && !invariant && wf != nullptr && wf->dtype() == DType::kF8E4M3 &&
                          wf->n_in() == r && wf->n_out() == kv_cols && r % cuda::kFp8GroupK == 0 &&
                          width % 8 == 0;
    // o_proj's input rows from the wgmma kernel's epilogue (set_mla_oproj_rows): the default mode,
    // that kernel, one 1×128 group per head (dv = 128), the rows' form what quantized_rows made.
    QuantizedRows* oq = p.out_rows;
    const bool oq_in_kernel =
        oq != nullptr && oq->defined() && s_->mla_oproj_rows && !invariant && prefill_on_wgmma(p) &&
        oq->codes.size(0) == T && oq->codes.size(1) == H * dv &&
        (oq->codes.dtype() == DType::kBF16 ||
         (oq->codes.dtype() == DType::kU8 && dv == cuda::kFp8GroupK && oq->scales.size(1) == H));
    const int64_t key_bytes = 2 * (kv_cols + width) + (invariant ? 4 * kv_cols + 2 * r : 0);
    const int64_t max_group_keys = std::max<int64_t>(1, (int64_t{1} << 30) / key_bytes);
    std::vector<cuda::MlaPrefillSeq> group;  // key_row0: offsets into the group's buffers
    std::vector<int64_t> group_seqs;         // their sequence ids (for the page lists)
    int64_t group_keys = 0;
    auto run_group = [&] {
      if (group.empty()) return;
      ScratchScope per_group(*this);
      Tensor lat = empty(DType::kBF16, {group_keys, width});  // [Σ kv_len, r + dr] [c_kv | k_pe] per key
      for (size_t i = 0; i < group.size(); ++i) {
        const int32_t* pages = batch.dev.block_ids + batch.block_indptr[group_seqs[i]];
        cuda::gather_latent(cache_p, pages, batch.block_size, width, group[i].kv_len,
                            dptr<bf16>(lat) + group[i].key_row0 * width, Elem::kBF16, st);
      }
      Tensor kvd = empty(DType::kBF16, {group_keys, kv_cols});  // [Σ kv_len, H·(dn + dv)] [k_nope_h | v_h]
      if (invariant) {
        Tensor ckv = empty(DType::kBF16, {group_keys, r});         // [Σ kv_len, r] c_kv, compact
        Tensor kvf = empty(DType::kF32, {group_keys, kv_cols});    // [Σ kv_len, H·(dn + dv)]
        DI_CUDA_CHECK(cudaMemcpy2DAsync(dptr(ckv), sizeof(bf16) * r, dptr(lat), sizeof(bf16) * width,
                                        sizeof(bf16) * r, group_keys, cudaMemcpyDeviceToDevice, st));
        invariant_gemm(dptr(ckv), group_keys, kvb, nullptr, false, 0, kv_cols, r, dptr<float>(kvf), kv_cols);
        cuda::to_bf16(cdptr<float>(kvf), kv_cols, group_keys, kv_cols, dptr<bf16>(kvd), st);
      } else if (kvb_w8a8 && dense_w8a8_fits(group_keys, *wf)) {
        // The FP8 checkpoint's kv_b on the W8A8 form (set_kvb_w8a8): each key's c_kv quantized
        // per 1×128 group (quantize_fp8_rows, straight from the latent rows), the FP8 wgmma GEMM
        // writing [k_nope_h | v_h] in bf16 — the FP8 GEMM path of DeepSeek's reference (gemm_impl
        // "fp8") for wkv_b outside absorption.
        Tensor q8 = empty(DType::kU8, {group_keys, r});                       // [Σ kv_len, r] e4m3
        Tensor s8 = empty(DType::kF32, {group_keys, r / cuda::kFp8GroupK});  // [Σ kv_len, r / 128]
        cuda::quantize_fp8_rows(dptr<bf16>(lat), cuda::Elem::kBF16, group_keys, r, dptr<uint8_t>(q8), dptr<float>(s8),
                                false, st, width);
        cuda::Fp8GemmArgs g;
        g.a = dptr<uint8_t>(q8), g.a_scale = dptr<float>(s8);
        g.w = cdptr<uint8_t>(wf->weight), g.w_scale = cdptr<float>(wf->scale_inv);
        g.M = group_keys, g.N = kv_cols, g.K = r, g.block_n = 1, g.w_scale_uniform = wf->uniform_row_blocks;
        g.c = dptr(kvd), g.c_elem = cuda::Elem::kBF16, g.ldc = kv_cols;
        g.variant = 3;
        g.w_stable = s_->w8a8_early_w;  // placed weights
        g.cluster = s_->fp8_cluster;
        cuda::fp8_gemm(g, nullptr, nullptr, st);
      } else {
        cuda::gemm(s_->blas, group_keys, kv_cols, r, dptr<bf16>(lat), width, 0, kvb, r, 0, true, dptr(kvd),
                   Elem::kBF16, kv_cols, 0, 1);
      }
      cuda::MlaPrefillArgs a{};
      a.q = cdptr<float>(qx);
      if (rope_in_kernel) a.q_rope = cdptr<float>(p.q_rope);
      a.kv = cdptr<bf16>(kvd);
      a.lat = cdptr<bf16>(lat);
      a.ld_lat = width;
      a.H = H;
      a.dn = dn;
      a.dr = dr;
      a.dv = dv;
      a.r = r;
      a.scale = p.softmax_scale;
      a.out = dptr<float>(out);
      if (oq_in_kernel && oq->codes.dtype() == DType::kU8) {
        a.out_q = dptr<uint8_t>(oq->codes), a.out_qs = dptr<float>(oq->scales), a.out = nullptr;
      } else if (oq_in_kernel) {
        a.out_b = dptr<bf16>(oq->codes), a.out = nullptr;
      }
      a.seqs = group.data();
      a.n_seqs = static_cast<int64_t>(group.size());
      a.n_keys = group_keys;
      a.kernel = s_->mla_wgmma ? -1 : 0;
      cuda::mla_prefill(a, st);
      group.clear();
      group_seqs.clear();
      group_keys = 0;
    };
    for (int64_t b = 0; b < batch.n_seqs; ++b) {
      if (!batch.selected(b)) continue;
      const int64_t q0 = batch.q_indptr[b], qn = batch.q_indptr[b + 1] - q0, S = batch.kv_len[b];
      if (qn == 0) continue;
      if (static_cast<int64_t>(group.size()) == cuda::kMlaPrefillMaxSeqs || group_keys + S > max_group_keys)
        run_group();
      group.push_back({static_cast<int32_t>(q0), static_cast<int32_t>(qn), static_cast<int32_t>(S),
                       static_cast<int32_t>(group_keys)});
      group_seqs.push_back(b);
      group_keys += S;
    }
    run_group();
    if (oq_in_kernel) oq->filled = true;
    return;
  }

  // Fallback for other head dims (see mla_prefill_supported), per selected sequence: decompress
  // its cached latents (bf16 GEMM, fp32 out), then attention as TF32 GEMMs on fp32 q, K, V and
  // probabilities (no bf16 rounding of q or P).
  const float* qf = cdptr<float>(qx);
  for (int64_t b = 0; b < batch.n_seqs; ++b) {
    if (!batch.selected(b)) continue;
    const int64_t q0 = batch.q_indptr[b], qn = batch.q_indptr[b + 1] - q0, S = batch.kv_len[b];
    if (qn == 0) continue;
    ScratchScope per_seq(*this);
    const int32_t* pages = batch.dev.block_ids + batch.block_indptr[b];
    Tensor lat = empty(DType::kBF16, {S, width});     // [c_kv | k_pe] per cached position
    cuda::gather_latent(cache_p, pages, batch.block_size, width, S, dptr(lat), Elem::kBF16, st);
    Tensor lat32 = empty(DType::kF32, {S, width});
    cuda::gather_latent(cache_p, pages, batch.block_size, width, S, dptr(lat32), Elem::kF32, st);
    Tensor kvd = empty(DType::kF32, {S, H * (dn + dv)});  // [k_nope_h | v_h] per head
    cuda::gemm(s_->blas, S, H * (dn + dv), r, dptr<bf16>(lat), width, 0, kvb, r, 0, true, dptr(kvd), Elem::kF32,
               H * (dn + dv), 0, 1);
    // Query rows in chunks so the [H, rows, S] scores and probabilities stay under ~512 MB.
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(qn, (int64_t{512} << 20) / (8 * H * S)));
    for (int64_t i0 = 0; i0 < qn; i0 += chunk) {
      const int64_t rows = std::min(chunk, qn - i0);
      ScratchScope per_chunk(*this);
      Tensor scores = empty(DType::kF32, {H, rows, S});
      const float* qrow = qf + (q0 + i0) * H * dqk;
      cuda::gemm_tf32(s_->blas, rows, S, dn, qrow, H * dqk, dqk, dptr<float>(kvd), H * (dn + dv), dn + dv, true,
                      dptr<float>(scores), S, rows * S, H);
      cuda::gemm_tf32(s_->blas, rows, S, dr, qrow + dn, H * dqk, dqk, dptr<float>(lat32) + r, width, 0, true,
                      dptr<float>(scores), S, rows * S, H, 1.0f);
      Tensor P = empty(DType::kF32, {H, rows, S});
      cuda::causal_softmax(cdptr<float>(scores), H, rows, S, S - qn + i0, p.softmax_scale, dptr<float>(P), st);
      cuda::gemm_tf32(s_->blas, rows, dv, S, dptr<float>(P), S, rows * S, dptr<float>(kvd) + dn, H * (dn + dv),
                      dn + dv, false, dptr<float>(out) + (q0 + i0) * H * dv, H * dv, dv, H);
    }
  }
}

void CudaBackend::moe_route(const Tensor& logits, const RouterParams& p, Tensor& ids, Tensor& weights) {
  OpTimer timer(*this, "moe_route");

  cuda::RouteArgs a = route_args(p, logits.size(1), ids, weights);
  a.logits = cdptr<float>(logits);
  a.T = logits.size(0);
  cuda::moe_route(a, s_->stream);
}

namespace {
void* arena_alloc(void* ctx, size_t bytes) { return static_cast<StepArena*>(ctx)->alloc(bytes); }

// Whether `parts` are consecutive row blocks of one buffer, in order (see deepseek_placement.h).
bool stacked(const std::vector<const LinearWeight*>& parts) {
  for (size_t i = 1; i < parts.size(); ++i) {
    const LinearWeight& a = *parts[i - 1];
    const LinearWeight& b = *parts[i];
    if (static_cast<const char*>(a.weight.raw_data()) + a.weight.n_bytes() != b.weight.raw_data()) return false;
    if (a.dtype() == DType::kF8E4M3 &&
        (a.block_n != 1 || static_cast<const char*>(a.scale_inv.raw_data()) + a.scale_inv.n_bytes() !=
                               b.scale_inv.raw_data()))
      return false;
  }
  return true;
}
}  // namespace

void CudaBackend::matmul_parts(const Tensor& x, const std::vector<const LinearWeight*>& w,
                               const std::vector<Tensor*>& out, const QuantizedRows* xq) {
  DI_CHECK_EQ(w.size(), out.size());
  if (s_->batch_invariant && invariant_parts_one_row(x, w, out, xq)) return;
  // Decode sizes, two parts stacked by the placement: one GEMV over both, its output split.
  const bool two = w.size() == 2 && out[0]->size(0) == out[1]->size(0) && w[0]->dtype() == w[1]->dtype() &&
                   w[0]->n_in() == w[1]->n_in() && w[0]->dtype() != DType::kF32 && stacked(w);
  const int64_t M = out[0]->size(0), K = w[0]->n_in();
  if (!two || M == 0 || x.size(1) != K || !gemv_fits(x.raw_data(), Elem::kF32, K, M, *w[0])) {
    // Prefill sizes with every part on the W8A8 form: x rounded and quantized once for all of
    // them — what each part's matmul would compute again (the same bits; 52 µs per V2-Lite layer
    // at 16,384 rows, run s15-8).
    // (One part: where x's rows come quantized, MlaParams::out_rows — x itself may be unwritten.)
    bool w8a8 = M > 0 && x.size(1) == K && x.size(0) == M && (w.size() > 1 || quantized_of(xq, M, K).first != nullptr);
    for (size_t i = 0; w8a8 && i < w.size(); ++i)
      w8a8 = w[i]->n_in() == K && out[i]->size(0) == M && out[i]->size(1) == w[i]->n_out() &&
             w8a8_from_f32(x, K, M, *w[i]);
    if (!w8a8) {
      // bf16 parts past the GEMV's rows: each part's GEMM on the norm's bf16 rows (matmul's
      // conversion, made once), else one matmul each.
      const void* xb = bf16_rows_of(xq, M, K);
      for (size_t i = 0; xb != nullptr && i < w.size(); ++i)
        if (w[i]->dtype() != DType::kBF16 || w[i]->n_in() != K || out[i]->size(0) != M ||
            out[i]->size(1) != w[i]->n_out() || gemv_fits(x.raw_data(), Elem::kF32, K, M, *w[i]))
          xb = nullptr;
      if (xb == nullptr) {
        Backend::matmul_parts(x, w, out);
        return;
      }
      for (size_t i = 0; i < w.size(); ++i) {
        OpTimer timer(*this, "matmul", w[i]->n_out(), K);
        ScratchScope scope(*this);
        linear(xb, M, *w[i], dptr<float>(*out[i]), w[i]->n_out());
      }
      return;
    }
    ScratchScope scope(*this);
    RowsFp8Once rows = rows_fp8(x, xq);  // x's rows quantized: by the norm, else here once for all parts
    // Two parts stacked by the placement, the first a whole number of 128-row tiles: one GEMM
    // over the stack, each part's columns into its own output (Fp8GemmArgs::c2; the same bits).
    // V2-Lite's kv_a_proj (576 rows, 4.5 column tiles) ran as a second launch of 5 blocks per
    // row tile: 20 µs per layer at 4,096 rows (0.48 of the FP8 rate, run s17-3).
    if (w.size() == 2 && stacked(w) && w[0]->n_out() % cuda::kFp8GroupK == 0 && s_->w8a8_stack) {
      const int64_t n0 = w[0]->n_out(), n1 = w[1]->n_out();
      OpTimer timer(*this, "matmul", n0 + n1, K);
      rows.ensure(s_->stream);
      fp8_gemm_w8a8(rows.q, rows.scale, M, *w[0], n0 + n1,
                    w[0]->uniform_row_blocks && w[1]->uniform_row_blocks, dptr<float>(*out[0]), n0,
                    dptr<float>(*out[1]), n1, n0);
      return;
    }
    for (size_t i = 0; i < w.size(); ++i) {
      OpTimer timer(*this, "matmul", w[i]->n_out(), K);  // the first part's time holds the quantizer
      rows.ensure(s_->stream);
      fp8_gemm_w8a8(rows.q, rows.scale, M, *w[i], w[i]->n_out(), w[i]->uniform_row_blocks,
                    dptr<float>(*out[i]), w[i]->n_out());
    }
    return;
  }
  const int64_t n0 = w[0]->n_out(), n1 = w[1]->n_out();
  DI_CHECK(out[0]->size(1) == n0 && out[1]->size(1) == n1);
  OpTimer timer(*this, "matmul", n0 + n1, K);
  try_gemv(x.raw_data(), Elem::kF32, K, M, *w[0], n0, dptr<float>(*out[0]), n0, dptr<float>(*out[1]), n1);
}

// The batch-invariant mode at one row: stacked parts whose outputs lie back to back (the row of
// part i + 1 starts where part i's ends — the model allocates q (or q_a) then kv, adjacent when
// the first row is a multiple of 256 bytes, as at DeepSeek's dims) are one invariant GEMM over
// the stack: each output element's fold does not depend on the columns beside it (16-column
// items, the K structure fixed), so the bits are the separate GEMMs'. One conversion and one GEMM (with its
// K-split sum) instead of two of each: V2-Lite's kv_a_proj took 10 µs per layer on its own at
// B = 1 (run s15-7). FP8 parts on the W8A8 form likewise: one quantizer, one wgmma GEMM. Returns
// false (nothing run) where the conditions do not hold.
bool CudaBackend::invariant_parts_one_row(const Tensor& x, const std::vector<const LinearWeight*>& w,
                                          const std::vector<Tensor*>& out, const QuantizedRows* xq) {
  if (w.size() < 2 || x.dtype() != DType::kF32 || x.size(0) != 1 || !stacked(w)) return false;
  const int64_t K = w[0]->n_in();
  if (x.size(1) != K) return false;
  int64_t N = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const Tensor& o = *out[i];
    const bool same_kind = w[i]->dtype() == w[0]->dtype() && w[i]->n_in() == K && w[i]->block_k == w[0]->block_k &&
                           w[i]->block_n == w[0]->block_n;
    const bool adjacent = cdptr<float>(o) == cdptr<float>(*out[0]) + N;
    if (!same_kind || o.dtype() != DType::kF32 || o.size(0) != 1 || o.size(1) != w[i]->n_out() || !adjacent)
      return false;
    N += w[i]->n_out();
  }
  const bool fp8 = w[0]->dtype() == DType::kF8E4M3;
  if ((w[0]->dtype() != DType::kBF16 && !fp8) || (fp8 && w[0]->block_n != 1)) return false;
  // FP8 parts on the W8A8 form (as every row of every step takes them here): one GEMM over the
  // stack, its tiles' scale blocks aligned with the parts' when each part but the last is a
  // whole number of 128-row blocks (else the per-row form: the same bits).
  int w8a8 = 0;  // parts that take the W8A8 form
  bool uniform = true;
  for (size_t i = 0; fp8 && i < w.size(); ++i) {
    w8a8 += w8a8_from_f32(x, K, 1, *w[i]) ? 1 : 0;
    uniform = uniform && w[i]->uniform_row_blocks && (i + 1 == w.size() || w[i]->n_out() % cuda::kFp8GroupK == 0);
  }
  if (w8a8 != 0 && w8a8 != static_cast<int>(w.size())) return false;  // each part its own way
  OpTimer timer(*this, "matmul", N, K);
  ScratchScope scope(*this);
  if (w8a8 != 0) {
    RowsFp8Once rows = rows_fp8(x, xq);  // the norm's, or made here
    rows.ensure(s_->stream);
    fp8_gemm_w8a8(rows.q, rows.scale, 1, *w[0], N, uniform, dptr<float>(*out[0]), N);
    return true;
  }
  const void* xb = bf16_rows_of(xq, 1, K);  // the norm's, or made here
  if (xb == nullptr) {
    Tensor own = empty(DType::kBF16, {1, K});
    cuda::to_bf16(cdptr<float>(x), K, 1, K, dptr<bf16>(own), s_->stream);
    xb = dptr(own);
  }
  invariant_gemm(xb, 1, w[0]->weight.raw_data(), fp8 ? cdptr<float>(w[0]->scale_inv) : nullptr, fp8, w[0]->block_k, N,
                 K, dptr<float>(*out[0]), N);
  return true;
}

void CudaBackend::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                              const std::vector<MlpWeights>& experts, Tensor& out) {
  OpTimer timer(*this, "moe_experts");
  run_moe(x, ids, weights, experts, nullptr, out);
}

void CudaBackend::moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights,
                          const std::vector<MlpWeights>& experts, const SharedExperts& shared, Tensor& out,
                          const QuantizedRows* xq_in) {
  (void)moe_ffn_impl(x, ids, weights, experts, shared, out, xq_in, nullptr);
}

bool CudaBackend::moe_ffn_norm(const Tensor& x, const Tensor& ids, const Tensor& weights,
                               const std::vector<MlpWeights>& experts, const SharedExperts& shared, Tensor& out,
                               const QuantizedRows* xq, const NextNorm& next) {
  DI_CHECK(next.residual != nullptr && next.weight != nullptr && next.x != nullptr && next.xq != nullptr);
  if (x.size(0) < kMoeNormFoldMinTokens || !s_->moe_norm_fold) {
    moe_ffn(x, ids, weights, experts, shared, out, xq);
    return false;
  }
  if (!moe_ffn_impl(x, ids, weights, experts, shared, out, xq, &next))
    add_rms_norm_quantized(*next.residual, out, *next.weight, next.eps, *next.x, *next.xq);
  return true;
}

bool CudaBackend::moe_ffn_impl(const Tensor& x, const Tensor& ids, const Tensor& weights,
                               const std::vector<MlpWeights>& experts, const SharedExperts& shared, Tensor& out,
                               const QuantizedRows* xq_in, const NextNorm* next) {
  const int64_t S = shared.mlp != nullptr && shared.slices != nullptr ? static_cast<int64_t>(shared.slices->size()) : 0;
  // The shared slices as extra experts of the routed launch (combined after each token's routed
  // slots) at decode sizes (kMoeFusedSharedMaxTokens), where the separate shared MLP is ~6
  // latency-bound launches (conversion, two GEMMs, split-K reduce, SiLU·mul, add); at
  // prefill sizes with bf16 weights on sm_90 (the wgmma form, SiLU·mul in its epilogue: V2-Lite
  // prefill 4,096 59.0 → 57.3 ms, 16,384 324 → 319 ms, run s10-12); and in the batch-invariant
  // mode at every size, so that a row's arithmetic never depends on its batch. Other default-mode
  // steps keep the shared MLP on its own (cuBLAS for bf16 weights), its output added by the
  // routed combine.
  const bool fp8 = !experts.empty() && experts[0].gate_proj.dtype() == DType::kF8E4M3;
  const int64_t E_all = static_cast<int64_t>(experts.size()) + S, R = x.size(0) * (ids.size(1) + S);
  const bool wgmma_prefill = moe_prefill_sized(R, E_all) && !experts.empty() &&
                             moe_wgmma_ok(fp8, x.size(1), experts[0].gate_proj.n_out());
  const bool rule = x.size(0) <= kMoeFusedSharedMaxTokens ||
                    (fp8 && x.size(0) * (ids.size(1) + S) <= kMoeDecodeMaxRows) || wgmma_prefill;
  const bool fuse = s_->batch_invariant || (s_->shared_fuse < 0 ? rule : s_->shared_fuse == 1);
  // x's rows as the norm that wrote them quantized them (xq_in), for the W8A8 forms below.
  RowsFp8Once given;
  if (quantized_of(xq_in, x.size(0), x.size(1)).first != nullptr) given = rows_fp8(x, xq_in);
  RowsFp8Once* ready = given.ready ? &given : nullptr;
  if ((S > 0 && fuse) || shared.mlp == nullptr) {
    if (moe_one(x, ids, weights, experts, S > 0 ? shared.slices : nullptr, out)) return false;
  }
  if (S > 0 && fuse) {
    OpTimer timer(*this, "moe_experts+shared");
    return run_moe(x, ids, weights, experts, shared.slices, out, nullptr, ready, next);
  }
  if (shared.mlp == nullptr) {
    OpTimer timer(*this, "moe_experts");
    return run_moe(x, ids, weights, experts, nullptr, out, nullptr, ready, next);
  }
  // The shared MLP first, then the routed experts, whose combine adds its output (the add op's
  // values without its pass over memory: 1.2 ms of a V2-Lite prefill at 4,096 tokens, run s9-7).
  // FP8 weights: both may take x's rows quantized the same way (the shared MLP's W8A8 form, the
  // routed experts' form 5), quantized once (RowsFp8Once: 52 µs per V2-Lite layer at 16,384
  // tokens, run s15-8).
  ScratchScope scope(*this);
  Tensor s = empty(DType::kF32, {x.size(0), out.size(1)});  // [T, D]
  RowsFp8Once xq = given;
  if (ready == nullptr && fp8 && x.size(1) % cuda::kFp8GroupK == 0) xq = rows_fp8(x, nullptr);
  mlp_impl(x, *shared.mlp, s, xq.q != nullptr ? &xq : nullptr);
  OpTimer timer(*this, "moe_experts");
  return run_moe(x, ids, weights, experts, nullptr, out, &s, xq.q != nullptr ? &xq : nullptr, next);
}

bool CudaBackend::moe_one(const Tensor& x, const Tensor& ids, const Tensor& weights,
                          const std::vector<MlpWeights>& experts, const std::vector<MlpWeights>* shared_slices,
                          Tensor& out) {
  const int64_t S = shared_slices != nullptr ? static_cast<int64_t>(shared_slices->size()) : 0;
  if (x.size(0) != 1 || experts.empty()) return false;
  const DType dt = experts[0].gate_proj.dtype();
  const bool fp8 = dt == DType::kF8E4M3;
  if (dt != DType::kBF16 && !fp8) return false;
  const int64_t D = x.size(1), I = experts[0].gate_proj.n_out(), k = ids.size(1);
  const int64_t block_k = fp8 ? experts[0].gate_proj.block_k : 0;
  // FP8: per-row scales (block_n 1, as placed), one block_k for both stacks.
  if (fp8 && (experts[0].gate_proj.block_n != 1 || experts[0].down_proj.block_n != 1 ||
              experts[0].down_proj.block_k != block_k))
    return false;
  // The form by the mode, the switches and what fits (cuda_moe_form.h).
  cuda::MoeOneQuery q;
  q.fp8 = fp8;
  q.batch_invariant = s_->batch_invariant;
  q.enabled = s_->moe_one, q.fp8_on = s_->moe_one_fp8, q.chain_on = s_->moe_one_chain, q.w8a8 = s_->moe_one_w8a8;
  if (fp8) {
    q.fp8_fits = cuda::moe_one_fits(D, I, k, S, true, block_k);
    q.w8a8_fits = cuda::moe_w8a8_ok(D, I, true, block_k) && cuda::moe_one_w8a8_fits(D, I, k, S, block_k);
  } else {
    q.bf16_fits = cuda::moe_one_fits(D, I, k, S);
    q.chain_fits = cuda::moe_one_fits(D, I, k, S, false, 0, true);
  }
  const cuda::MoeOneForm form = cuda::moe_one_form(q);
  if (form == cuda::MoeOneForm::kNone) return false;
  const bool chain = form == cuda::MoeOneForm::kChain, w8a8 = form == cuda::MoeOneForm::kW8a8;
  std::vector<const LinearWeight*> w13, w2;
  for (const std::vector<MlpWeights>* list : {&experts, shared_slices}) {
    if (list == nullptr) continue;
    for (const MlpWeights& m : *list) {
      if (m.gate_proj.n_out() != I || m.down_proj.n_in() != I || m.gate_proj.n_in() != D || m.gate_proj.dtype() != dt ||
          m.down_proj.dtype() != dt)
        return false;
      w13.push_back(&m.gate_proj);
      w13.push_back(&m.up_proj);
      w2.push_back(&m.down_proj);
    }
  }
  if (!stacked(w13) || !stacked(w2)) return false;
  OpTimer timer(*this, "moe_one");
  ScratchScope scope(*this);
  cuda::MoeOneArgs a;
  a.x = cdptr<float>(x);
  a.D = D, a.I = I, a.k = k, a.E = static_cast<int64_t>(experts.size()), a.n_shared = S;
  a.ids = cdptr<int32_t>(ids);
  a.weights = cdptr<float>(weights);
  a.w13 = experts[0].gate_proj.weight.raw_data();
  a.w2 = experts[0].down_proj.weight.raw_data();
  if (fp8) {
    a.fp8 = true;
    a.w13_scale = cdptr<float>(experts[0].gate_proj.scale_inv);
    a.w2_scale = cdptr<float>(experts[0].down_proj.scale_inv);
    a.block_k = block_k;
  }
  a.chain = chain;
  a.w8a8 = w8a8;
  a.out = dptr<float>(out);
  a.h = dptr<float>(empty(DType::kF32, {(k + S) * I}));
  a.counter = s_->grid_counter + 1;
  if (w8a8) cuda::moe_one_w8a8(a, s_->stream);
  else cuda::moe_one(a, s_->stream);
  return true;
}

bool CudaBackend::run_moe(const Tensor& x, const Tensor& ids, const Tensor& weights,
                          const std::vector<MlpWeights>& experts, const std::vector<MlpWeights>* shared_slices,
                          Tensor& out, const Tensor* addend, RowsFp8Once* xq, const NextNorm* next) {
  const int64_t E = static_cast<int64_t>(experts.size());
  DI_CHECK_GT(E, 0);
  std::vector<const LinearWeight*> w13, w2;
  for (const std::vector<MlpWeights>* list : {&experts, shared_slices}) {
    if (list == nullptr) continue;
    for (const MlpWeights& m : *list) {
      w13.push_back(&m.gate_proj);
      w13.push_back(&m.up_proj);
      w2.push_back(&m.down_proj);
    }
  }
  DI_CHECK(stacked(w13) && stacked(w2) && "experts must be placed by place_deepseek_weights (stacked layout)");
  cuda::MoeArgs a{};
  a.n_shared = shared_slices != nullptr ? static_cast<int64_t>(shared_slices->size()) : 0;
  a.x = cdptr<float>(x);
  a.ids = cdptr<int32_t>(ids);
  a.weights = cdptr<float>(weights);
  a.T = x.size(0);
  a.D = x.size(1);
  a.k = ids.size(1);
  a.E = E;
  a.I = experts[0].gate_proj.n_out();
  a.fp8 = experts[0].gate_proj.dtype() == DType::kF8E4M3;
  a.w13 = dptr(experts[0].gate_proj.weight);
  a.w2 = dptr(experts[0].down_proj.weight);
  if (a.fp8) {
    a.w13_scale = cdptr<float>(experts[0].gate_proj.scale_inv);
    a.w2_scale = cdptr<float>(experts[0].down_proj.scale_inv);
    a.block_k = experts[0].gate_proj.block_k;
    // The stacks' flags (the first expert's views start at row 0 of them).
    a.w13_uniform = experts[0].gate_proj.uniform_row_blocks;
    a.w2_uniform = experts[0].down_proj.uniform_row_blocks;
  } else {
    DI_CHECK(experts[0].gate_proj.dtype() == DType::kBF16);
  }
  a.out = dptr<float>(out);
  if (addend != nullptr) {
    DI_CHECK(addend->dtype() == DType::kF32 && addend->size(0) == a.T && addend->size(1) == out.size(1));
    a.addend = cdptr<float>(*addend);
  }
  // The form by the step's size and mode (cuda_moe_form.h).
  cuda::MoeFormQuery q;
  q.tokens = a.T;
  q.rows = a.T * (a.k + a.n_shared);
  q.experts = a.E + a.n_shared;
  q.fp8 = a.fp8;
  q.batch_invariant = s_->batch_invariant;
  q.capturing = s_->capturing;
  q.forced = s_->moe_gemm;
  q.gemv_ok = cuda::moe_gemv_ok(a.D, a.I, a.fp8, a.block_k);
  q.small_ok = cuda::small_m_gemm_ok(a.D, a.fp8, a.block_k) && cuda::small_m_gemm_ok(a.I, a.fp8, a.block_k);
  q.wgmma_ok = moe_wgmma_ok(a.fp8, a.D, a.I);
  q.wgmma_inv_ok = a.fp8 ? cuda::moe_wgmma_fp8_ok(a.E + a.n_shared, a.D, a.I, a.block_k)
                         : cuda::bf16_wgmma_invariant_ok(a.D) && cuda::bf16_wgmma_invariant_ok(a.I);
  q.w8a8_ok = cuda::moe_w8a8_ok(a.D, a.I, a.fp8, a.block_k);
  a.form = cuda::moe_form(q);
  a.blas = s_->blas;
  // The invariant mode's bf16 MoE in one K chain (set_invariant_moe_one_chain: the default
  // mode's wgmma and tiled kernels as they are), else its K structure (MoeArgs::invariant).
  a.one_chain = s_->batch_invariant && s_->moe_one_chain && !a.fp8;
  a.invariant = s_->batch_invariant && !a.one_chain;
  a.glu_fused = s_->fp8_glu;
  a.gather_a = s_->fp8_gather_a;
  a.idle_skip = s_->fp8_idle_skip;
  a.gemv_ring = s_->gemv_ring;
  a.stagger = s_->fp8_stagger == 1 || (s_->fp8_stagger == -1 && a.T * a.k >= kStaggerMinRows);
  a.fp8_cluster = s_->fp8_cluster;
  a.narrow_tails = s_->fp8_narrow == 1 || (s_->fp8_narrow == -1 && a.T * a.k < kNarrowTailsMaxRows);
  a.n192 = s_->fp8_n192 == 1 || (s_->fp8_n192 == -1 && a.T * a.k >= kN192MinRows);
  if (xq != nullptr && a.form == 5 && a.k > 1) {  // (k = 1 gathers while it quantizes: no copy to save)
    DI_CHECK(xq->x == a.x && xq->T == a.T && xq->D == a.D);
    xq->ensure(s_->stream);
    a.xq = xq->q;
    a.xq_scale = xq->scale;
  }
  if (next != nullptr) {  // the norm's operands as add_rms_norm_quantized takes them
    const Tensor& res = *next->residual;
    DI_CHECK(res.dtype() == DType::kF32 && res.size(0) == a.T && res.size(1) == out.size(1));
    DI_CHECK(next->x->dtype() == DType::kF32 && next->x->size(0) == a.T && next->x->size(1) == out.size(1));
    DI_CHECK_EQ(next->weight->numel(), out.size(1));
    a.norm.residual = dptr<float>(*next->residual);
    a.norm.w = dptr(*next->weight);
    a.norm.we = elem_of(next->weight->dtype());
    a.norm.eps = next->eps;
    a.norm.x = dptr<float>(*next->x);
    const QuantizedRows& rows = *next->xq;
    if (rows.defined()) {
      DI_CHECK(rows.codes.size(0) == a.T && rows.codes.size(1) == out.size(1));
      if (rows.codes.dtype() == DType::kBF16) {
        a.norm.xb = dptr<bf16>(rows.codes);
      } else {
        DI_CHECK(rows.codes.dtype() == DType::kU8 && rows.scales.size(0) == a.T &&
                 rows.scales.size(1) == out.size(1) / cuda::kFp8GroupK);
        a.norm.q = dptr<uint8_t>(rows.codes);
        a.norm.sq = dptr<float>(rows.scales);
      }
    }
  }
  ScratchScope scope(*this);
  return cuda::moe_experts(a, arena_alloc, &s_->arena, s_->stream);
}

void CudaBackend::mlp(const Tensor& x, const MlpWeights& w, Tensor& out) { mlp_impl(x, w, out, nullptr); }

void CudaBackend::mlp_impl(const Tensor& x, const MlpWeights& w, Tensor& out, RowsFp8Once* xq) {
  OpTimer timer(*this, "mlp", 2 * w.gate_proj.n_out(), w.gate_proj.n_in());

  const int64_t T = x.size(0), D = x.size(1), I = w.gate_proj.n_out();
  if (T == 0) return;
  ScratchScope scope(*this);
  cudaStream_t st = s_->stream;
  // FP8 on the W8A8 form (dense_w8a8_fits): x rounded and quantized in one pass, gate|up in one
  // GEMM where stacked, written in bf16 (as the MoE's form 5 has them, and as the reference
  // system's bf16 MLP rounds them: half the bytes of an fp32 [T, 2I] round trip), the SiLU·mul
  // written straight into the down projection's quantized input (silu_mul_quantize_fp8) — or,
  // set_fp8_glu_fused with stacked halves of uniform scale blocks, by that GEMM's epilogue
  // (fp8_wgmma_glu_quantize: the same codes, no [T, 2I] at all).
  const bool w8a8 = !gemv_fits(x.raw_data(), Elem::kF32, D, T, w.gate_proj) && w8a8_from_f32(x, D, T, w.gate_proj) &&
                    w8a8_from_f32(x, D, T, w.up_proj) && dense_w8a8_fits(T, w.down_proj, true) && I % 16 == 0;
  const bool uniform = stacked({&w.gate_proj, &w.up_proj}) && w.gate_proj.uniform_row_blocks &&
                       w.up_proj.uniform_row_blocks && I % 128 == 0;
  const bool glu = w8a8 && uniform && s_->fp8_glu && cuda::fp8_wgmma_glu_ok(I, true);
  Tensor gu = glu ? Tensor() : empty(w8a8 ? DType::kBF16 : DType::kF32, {T, 2 * I});  // [gate | up]
  // Decode sizes: the GEMV reads x in fp32 (rounded to bf16 as it goes), both halves in one
  // launch when they are stacked. (Unstacked halves both go or neither: the checks match.)
  const bool gemv_done =
      !w8a8 && (stacked({&w.gate_proj, &w.up_proj})
                    ? try_gemv(x.raw_data(), Elem::kF32, D, T, w.gate_proj, 2 * I, dptr<float>(gu), 2 * I)
                    : try_gemv(x.raw_data(), Elem::kF32, D, T, w.gate_proj, I, dptr<float>(gu), 2 * I) &&
                          try_gemv(x.raw_data(), Elem::kF32, D, T, w.up_proj, I, dptr<float>(gu) + I, 2 * I));
  Tensor q2, sq2;  // W8A8: the down projection's input, [T, I] e4m3 and [T, ceil(I / 128)]
  if (w8a8) {
    const uint8_t* q;  // [T, D] e4m3
    const float* sq;   // [T, D / 128]
    Tensor q_own, sq_own;
    if (xq != nullptr) {  // quantized once for this MLP and another consumer of x (moe_ffn)
      DI_CHECK(xq->x == cdptr<float>(x) && xq->T == T && xq->D == D);
      xq->ensure(st);
      q = xq->q, sq = xq->scale;
    } else {
      q_own = empty(DType::kU8, {T, D});
      sq_own = empty(DType::kF32, {T, D / cuda::kFp8GroupK});
      cuda::quantize_fp8_rows_bf16(cdptr<float>(x), D, nullptr, 1, T, D, dptr<uint8_t>(q_own), dptr<float>(sq_own), st);
      q = cdptr<uint8_t>(q_own), sq = cdptr<float>(sq_own);
    }
    q2 = empty(DType::kU8, {T, I});
    sq2 = empty(DType::kF32, {T, (I + cuda::kFp8GroupK - 1) / cuda::kFp8GroupK});
    if (glu) {
      cuda::Fp8GemmArgs g;
      g.a = q, g.a_scale = sq;
      g.w = cdptr<uint8_t>(w.gate_proj.weight), g.w_scale = cdptr<float>(w.gate_proj.scale_inv);
      g.M = T, g.N = 2 * I, g.K = D, g.block_n = 1, g.w_scale_uniform = true;
      cuda::fp8_wgmma_glu_quantize(g, dptr<uint8_t>(q2), dptr<float>(sq2), st);
    } else {
      cuda::Fp8GemmArgs g;
      g.a = q, g.a_scale = sq;
      g.M = T, g.K = D, g.block_n = 1;
      g.c_elem = cuda::Elem::kBF16, g.ldc = 2 * I;
      g.variant = 3;
      g.w_stable = s_->w8a8_early_w;  // placed weights
      g.cluster = s_->fp8_cluster;
      const bool one = stacked({&w.gate_proj, &w.up_proj});
      for (int half = 0; half < (one ? 1 : 2); ++half) {
        const LinearWeight& wp = half == 0 ? w.gate_proj : w.up_proj;
        g.w = cdptr<uint8_t>(wp.weight), g.w_scale = cdptr<float>(wp.scale_inv);
        g.N = one ? 2 * I : I;
        g.w_scale_uniform = one ? uniform : wp.uniform_row_blocks;
        g.c = dptr<bf16>(gu) + half * I;
        cuda::fp8_gemm(g, nullptr, nullptr, st);
      }
    }
  } else if (!gemv_done) {
    Tensor xb = empty(DType::kBF16, {T, D});
    cuda::to_bf16(cdptr<float>(x), D, T, D, dptr<bf16>(xb), st);
    if (stacked({&w.gate_proj, &w.up_proj}) && w.gate_proj.dtype() == DType::kBF16 && s_->batch_invariant) {
      invariant_gemm(dptr(xb), T, w.gate_proj.weight.raw_data(), nullptr, false, 0, 2 * I, D, dptr<float>(gu), 2 * I);
    } else if (stacked({&w.gate_proj, &w.up_proj}) && w.gate_proj.dtype() == DType::kBF16) {
      cuda::gemm(s_->blas, T, 2 * I, D, dptr<bf16>(xb), D, 0, cdptr<bf16>(w.gate_proj.weight), D, 0, true, dptr(gu),
                 Elem::kF32, 2 * I, 0, 1);
    } else {
      linear(dptr(xb), T, w.gate_proj, dptr<float>(gu), 2 * I);
      linear(dptr(xb), T, w.up_proj, dptr<float>(gu) + I, 2 * I);
    }
  }
  if (w8a8) {
    const LinearWeight& wd = w.down_proj;
    if (!glu) cuda::silu_mul_quantize_fp8(dptr(gu), Elem::kBF16, T, I, dptr<uint8_t>(q2), dptr<float>(sq2), st);
    fp8_gemm_w8a8(dptr<uint8_t>(q2), dptr<float>(sq2), T, wd, wd.n_out(), wd.uniform_row_blocks, dptr<float>(out), D);
    return;
  }
  Tensor act = empty(DType::kBF16, {T, I});
  cuda::silu_mul(cdptr<float>(gu), T, I, dptr(act), Elem::kBF16, st);
  linear(dptr(act), T, w.down_proj, dptr<float>(out), D);
}

void CudaBackend::sample(const Tensor& logits, const std::vector<SampleRow>& rows, Tensor& tokens, Tensor& logprobs,
                         SampleExtras* extras) {
  OpTimer timer(*this, "sample");

  const int64_t R = logits.size(0), V = logits.size(1);
  DI_CHECK_EQ(static_cast<int64_t>(rows.size()), R);
  if (R == 0) return;
  ScratchScope scope(*this);
  const int64_t n_top = extras != nullptr && extras->top_ids.defined() ? extras->top_ids.size(1) : 0;
  // Per-row arguments, the Philox uniforms and the processors' token lists are computed here
  // (pure functions of the requests): one small upload each, no synchronization.
  std::vector<cuda::SampleRowArgs> args(static_cast<size_t>(R));
  std::vector<cuda::ProcRowArgs> procs;
  std::vector<int32_t> sampled, data;
  for (int64_t i = 0; i < R; ++i) {
    const SampleRow& r = rows[static_cast<size_t>(i)];
    cuda::SampleRowArgs& a = args[static_cast<size_t>(i)];
    a.temperature = r.params.temperature;
    a.top_k = r.params.top_k;
    a.top_p = r.params.top_p;
    a.min_p = r.params.min_p;
    a.u = philox_uniform(r.seed, r.position, RngPurpose::kSample);
    a.greedy = r.params.temperature < kGreedyTemperature;
    a.n_top = r.n_top_logprobs;
    DI_CHECK_LE(static_cast<int64_t>(r.n_top_logprobs), n_top);
    if (!a.greedy) sampled.push_back(static_cast<int32_t>(i));
    if (r.processors == nullptr || !r.processors->active()) continue;
    const LogitsProcessors& p = *r.processors;
    cuda::ProcRowArgs pr{};
    pr.row = static_cast<int32_t>(i);
    pr.rep = p.repetition_penalty;
    pr.freq = p.frequency_penalty;
    pr.pres = p.presence_penalty;
    auto append = [&](const std::vector<int32_t>& v, int32_t* begin, int32_t* end) {
      *begin = static_cast<int32_t>(data.size());
      data.insert(data.end(), v.begin(), v.end());
      *end = static_cast<int32_t>(data.size());
    };
    append(p.seen_tokens, &pr.seen_begin, &pr.seen_end);
    pr.n_seen = pr.seen_end - pr.seen_begin;
    data.insert(data.end(), p.seen_counts.begin(), p.seen_counts.end());
    append(p.masked, &pr.mask_begin, &pr.mask_end);
    append(p.pending, &pr.pend_begin, &pr.pend_end);
    if (!p.pending.empty()) DI_CHECK(extras != nullptr && extras->pending_tokens.defined());
    for (int32_t k : p.pending) DI_CHECK(k >= 0 && k < extras->pending_tokens.numel());
    procs.push_back(pr);
  }
  auto upload_bytes = [&](const void* src, size_t bytes) {
    Tensor t = empty(DType::kU8, {static_cast<int64_t>(std::max<size_t>(bytes, 1))});
    if (bytes > 0) copy_from_host(src, t);
    return t;
  };
  Tensor d_args = upload_bytes(args.data(), args.size() * sizeof(cuda::SampleRowArgs));
  Tensor d_sampled = upload_bytes(sampled.data(), sampled.size() * sizeof(int32_t));
  Tensor d_procs = upload_bytes(procs.data(), procs.size() * sizeof(cuda::ProcRowArgs));
  Tensor d_data = upload_bytes(data.data(), data.size() * sizeof(int32_t));
  cuda::SampleArgs a{};
  a.logits = cdptr<float>(logits);
  a.R = R;
  a.V = V;
  a.rows = static_cast<const cuda::SampleRowArgs*>(dptr(d_args));
  a.sampled = static_cast<const int32_t*>(dptr(d_sampled));
  a.n_sampled = static_cast<int64_t>(sampled.size());
  a.procs = static_cast<const cuda::ProcRowArgs*>(dptr(d_procs));
  a.n_procs = static_cast<int64_t>(procs.size());
  a.proc_data = static_cast<const int32_t*>(dptr(d_data));
  a.pending_tokens = extras != nullptr && extras->pending_tokens.defined() ? cdptr<int32_t>(extras->pending_tokens) : nullptr;
  a.tokens = dptr<int32_t>(tokens);
  a.logprobs = dptr<float>(logprobs);
  if (n_top > 0) {
    a.top_ids = dptr<int32_t>(extras->top_ids);
    a.top_logprobs = dptr<float>(extras->top_logprobs);
    a.n_top = n_top;
  }
  cuda::sample(a, arena_alloc, &s_->arena, s_->stream);
}

// ---- Factory ---------------------------------------------------------------------------------

Expected<std::unique_ptr<Backend>> make_cuda_backend(int device_index) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    return make_error(StatusCode::kUnsupported, "device 'cuda': no usable CUDA driver or GPU ({})",
                      cudaGetErrorString(err));
  if (device_index < 0 || device_index >= n)
    return make_error(StatusCode::kInvalidArgument, "device 'cuda': GPU index {} out of range ({} present)",
                      device_index, n);
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  if (prop.major < 9)
    return make_error(StatusCode::kUnsupported,
                      "device 'cuda': GPU {} ({}) has compute capability {}.{}; this build targets sm_90a/sm_100a",
                      device_index, prop.name, prop.major, prop.minor);
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device_index));
}

}  // namespace deepinfer
