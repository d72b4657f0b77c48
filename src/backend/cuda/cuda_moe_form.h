// Which grouped-GEMM form an MoE step runs (cuda::MoeArgs::form): a function of the step's shape,
// the mode and what the weights and the GPU allow — host code, so its rules are unit-tested
// without a GPU (tests/backend/cuda_moe_form_test.cpp). CudaBackend::run_moe fills the query.
// The forms (cuda_moe.cu): 0 tiled, 1 the decode GEMV, 2 a cuBLAS GEMM per expert (one host
// sync), 3 small_m_gemm, 4 the bf16 wgmma grouped GEMM, 5 W8A8 on the FP8 wgmma GEMM.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// MoE steps with at most this many routed rows (tokens × (top_k + shared slices)) are
// decode-sized: steps of at most kMoeGemvMaxTokens tokens run the decode GEMV (form 1: the
// weights at ~0.8 of the copy rate, run s8-3: V2-Lite bf16 B = 1 3.25 → 2.87 ms per step, FP8
// 3.50 → 2.89; B = 2 4.09 → 3.80 and 4.49 → 4.16), larger ones small_m_gemm (form 3: 16-row
// tensor-core passes over each active expert's weights; decode up to batch 85 at top-6 of 64
// experts — at B = 4 the GEMV's CUDA-core math already loses, run s8-1). Beyond, bf16 weights
// take the wgmma grouped GEMM on sm_90 (form 4; run s17-5, V2-Lite ms per step, tiled → wgmma:
// B = 128 15.54 → 12.71, B = 256 17.63 → 14.17; at B = 64, 384 rows, 11.82 vs 11.96), else the
// tiled kernel, or per-expert cuBLAS once the experts average kMoePerExpertMinRows rows
// (prefill) without wgmma and outside graph captures.
// FP8 weights on sm_90 take W8A8 (form 5) at every step of more than one token: its 128-row
// tiles hold a few rows per expert at decode sizes, but they stream the FP8 weights through TMA
// at the FP8 matrix rate, where small_m_gemm and the tiled kernel widen them on the CUDA cores
// (run s17-5, ms per step, size-picked → W8A8: B = 2 4.05 → 3.66, B = 8 9.04 → 6.60, B = 32
// 15.21 → 8.78, B = 128 15.05 → 10.41, B = 256 17.15 → 11.65; B = 1 keeps the GEMV, 2.47 vs 2.88).
constexpr int64_t kMoeDecodeMaxRows = 512;
constexpr int64_t kMoePerExpertMinRows = 64;
constexpr int64_t kMoeGemvMaxTokens = 2;

// Prefill-sized MoE steps: ≥ kMoePerExpertMinRows rows per expert on average (shared slices
// counted) — also moe_ffn's rule for whether the shared slices join the routed launch.
inline bool moe_prefill_sized(int64_t rows, int64_t experts) { return rows >= kMoePerExpertMinRows * experts; }

struct MoeFormQuery {
  int64_t tokens = 0;   // T
  int64_t rows = 0;     // routed (and shared) rows: T · (top_k + shared slices)
  int64_t experts = 0;  // routed experts + shared slices
  bool fp8 = false;
  bool batch_invariant = false;
  bool capturing = false;  // a CUDA graph is being captured: no host synchronization
  int forced = -1;         // CudaBackend::set_moe_gemm: −1 by size, else the form (0 … 5)
  // What the sizes, weights and GPU allow: the decode GEMV (moe_gemv_ok), small_m_gemm, the bf16
  // wgmma form (bf16 weights), its invariant form (bf16: K % 64 == 0; FP8: widened within the
  // budget), W8A8 (FP8 weights, block_k 128, sm_90).
  bool gemv_ok = false, small_ok = false, wgmma_ok = false, wgmma_inv_ok = false, w8a8_ok = false;
};

// The form. Forced: that form where the sizes allow it (form 4 as the mode needs it), else 0.
// Batch-invariant: only forms whose bits agree — FP8 W8A8 at every size where it runs (its rows
// never depend on the step's size); otherwise small-M up to kMoeDecodeMaxRows, the wgmma form
// beyond (FP8 weights, widened for it, at prefill sizes only: the widening costs a pass over
// every expert), else tiled. Default: the rules above; never form 2 while capturing.
int moe_form(const MoeFormQuery& q);

// Which persistent kernel a one-token MoE step runs instead of the grouped forms
// (CudaBackend::moe_one; cuda_moe_one.cu, cuda_moe_one_w8a8.cu): none, bf16, the chain form (the
// batch-invariant mode's bf16 arithmetic), the FP8 form (CUDA-core / f16-MMA dots: the default
// mode only, opt-in), or the W8A8 form (form 5's bits: the invariant mode's FP8 MoE, or the
// default mode's where asked).
enum class MoeOneForm { kNone, kBf16, kChain, kFp8, kW8a8 };
struct MoeOneQuery {
  bool fp8 = false;  // e4m3 experts (else bf16)
  bool batch_invariant = false;
  // The backend's switches: set_moe_one_fused, set_moe_one_fp8, set_moe_one_w8a8 (−1: the
  // invariant mode only, 1 both modes, 0 never), set_invariant_moe_one_chain.
  bool enabled = true, fp8_on = false, chain_on = true;
  int w8a8 = -1;
  // What the sizes and the GPU allow for each form (moe_one_fits; for W8A8 also moe_w8a8_ok).
  bool bf16_fits = false, chain_fits = false, fp8_fits = false, w8a8_fits = false;
};
// The form. The invariant mode takes only a form with its bits (chain for bf16, W8A8 for FP8),
// else none; a default-mode W8A8 request that does not fit falls back to the FP8 form where that
// is on.
MoeOneForm moe_one_form(const MoeOneQuery& q);

}  // namespace deepinfer::cuda
