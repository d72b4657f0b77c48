// The MoE step's grouped-GEMM form (cuda::moe_form, host code: runs without a GPU) at V2-Lite's
// decode and prefill sizes (64 routed experts of top-6, 2 shared slices), each rule against the
// measurements it stands on (cuda_moe_form.h): FP8 weights on sm_90 take W8A8 past one token
// and, in the batch-invariant mode, at every size; bf16 weights the GEMV up to 2 tokens,
// small_m_gemm up to 512 rows, the wgmma form beyond; the invariant mode only forms whose bits
// agree; forced forms fall back to the tiled kernel where the sizes do not fit; a graph capture
// never gets the form that synchronizes.
#include <gtest/gtest.h>

#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_moe_form.h"

namespace deepinfer {
namespace {

using cuda::MoeFormQuery;
using cuda::moe_form;

// A V2-Lite MoE step of `tokens` tokens on an sm_90 GPU: routed rows only (the default mode's
// shared MLP on its own) or with the shared slices in the launch.
MoeFormQuery v2_lite(int64_t tokens, bool fp8, bool shared_in_launch = false) {
  MoeFormQuery q;
  q.tokens = tokens;
  q.rows = tokens * (6 + (shared_in_launch ? 2 : 0));
  q.experts = 64 + (shared_in_launch ? 2 : 0);
  q.fp8 = fp8;
  q.gemv_ok = q.small_ok = true;
  q.wgmma_ok = !fp8;
  q.wgmma_inv_ok = true;  // bf16: D, I multiples of 64; FP8: widened within the budget
  q.w8a8_ok = fp8;
  return q;
}

TEST(CudaMoeForm, Bf16DefaultModeBySize) {
  EXPECT_EQ(moe_form(v2_lite(1, false, true)), 1);  // the GEMV
  EXPECT_EQ(moe_form(v2_lite(2, false, true)), 1);
  EXPECT_EQ(moe_form(v2_lite(3, false, true)), 3);  // small_m_gemm
  EXPECT_EQ(moe_form(v2_lite(64, false)), 3);       // 384 rows
  EXPECT_EQ(moe_form(v2_lite(128, false)), 4);      // 768 rows: the wgmma form (run s17-5)
  EXPECT_EQ(moe_form(v2_lite(256, false)), 4);
  EXPECT_EQ(moe_form(v2_lite(4096, false, true)), 4);  // prefill
  MoeFormQuery no_wgmma = v2_lite(256, false);
  no_wgmma.wgmma_ok = false;
  EXPECT_EQ(moe_form(no_wgmma), 0);  // tiled
  MoeFormQuery prefill = v2_lite(4096, false);
  prefill.wgmma_ok = false;
  EXPECT_EQ(moe_form(prefill), 2);  // per-expert cuBLAS: ≥ 64 rows per expert
  prefill.capturing = true;
  EXPECT_EQ(moe_form(prefill), 0) << "a graph capture never takes the synchronizing form";
}

TEST(CudaMoeForm, Fp8DefaultModeW8a8PastOneToken) {
  EXPECT_EQ(moe_form(v2_lite(1, true, true)), 1);  // the GEMV (2.47 vs 2.88 ms, run s17-5)
  for (int64_t t : {2, 8, 32, 64}) EXPECT_EQ(moe_form(v2_lite(t, true, true)), 5) << t << " tokens";
  for (int64_t t : {128, 256, 4096}) EXPECT_EQ(moe_form(v2_lite(t, true)), 5) << t << " tokens";
  MoeFormQuery no_gemv = v2_lite(1, true, true);
  no_gemv.gemv_ok = false;
  EXPECT_EQ(moe_form(no_gemv), 5);
  // Without W8A8 (another GPU, or block_k ≠ 128): the size rules, FP8 weights widened in-kernel.
  MoeFormQuery other = v2_lite(32, true, true);
  other.w8a8_ok = false;
  EXPECT_EQ(moe_form(other), 3);
  other = v2_lite(256, true);
  other.w8a8_ok = false;
  EXPECT_EQ(moe_form(other), 0);
}

TEST(CudaMoeForm, BatchInvariantModeTakesBitwiseEqualForms) {
  for (int64_t t : {1, 2, 32, 256, 4096}) {
    MoeFormQuery fp8 = v2_lite(t, true, true), bf16 = v2_lite(t, false, true);
    fp8.batch_invariant = bf16.batch_invariant = true;
    EXPECT_EQ(moe_form(fp8), 5) << t << " tokens: W8A8 at every size";
    const int f = moe_form(bf16);
    EXPECT_EQ(f, t * 8 <= cuda::kMoeDecodeMaxRows ? 3 : 4) << t << " tokens";
    EXPECT_NE(f, 1) << "the GEMV's sums differ from the other forms'";
    fp8.w8a8_ok = false;  // FP8 elsewhere: widened for the wgmma form at prefill sizes only
    EXPECT_EQ(moe_form(fp8), t * 8 <= cuda::kMoeDecodeMaxRows ? 3 : t >= 4096 ? 4 : 0) << t << " tokens";
  }
}

TEST(CudaMoeForm, ForcedFormsFallBackToTiledWhereTheyDoNotFit) {
  MoeFormQuery q = v2_lite(32, false, true);
  for (int f = 0; f <= 4; ++f) {
    q.forced = f;
    EXPECT_EQ(moe_form(q), f);
  }
  q.forced = 5;
  EXPECT_EQ(moe_form(q), 0) << "W8A8 needs FP8 weights";
  q = v2_lite(32, true, true);
  q.forced = 4;
  EXPECT_EQ(moe_form(q), 0) << "the default mode's wgmma form takes bf16 weights";
  q.batch_invariant = true;
  EXPECT_EQ(moe_form(q), 4) << "the invariant mode widens FP8 weights for it";
  q.forced = 2;
  q.capturing = true;
  EXPECT_EQ(moe_form(q), 0);
}

// The one-token kernel's form (cuda::moe_one_form): each mode takes only the forms whose bits it
// promises — the invariant mode the chain form (bf16) or the W8A8 form (FP8: form 5's bits,
// bitwise-tested on the GPU by CudaOps.MoeOneTokenKernelAtV2LiteSizes), never the FP8 form's
// f16-MMA dots — and the switches act as documented (cuda_backend.h).
TEST(CudaMoeForm, OneTokenKernelFormByModeAndSwitches) {
  using cuda::MoeOneForm;
  using cuda::MoeOneQuery;
  using cuda::moe_one_form;
  MoeOneQuery bf16;
  bf16.bf16_fits = bf16.chain_fits = true;
  EXPECT_EQ(moe_one_form(bf16), MoeOneForm::kBf16);
  bf16.batch_invariant = true;
  EXPECT_EQ(moe_one_form(bf16), MoeOneForm::kChain);
  bf16.chain_on = false;
  EXPECT_EQ(moe_one_form(bf16), MoeOneForm::kNone) << "the invariant K structure has no one-token form";
  bf16.batch_invariant = false;
  bf16.enabled = false;
  EXPECT_EQ(moe_one_form(bf16), MoeOneForm::kNone);

  MoeOneQuery fp8;
  fp8.fp8 = true;
  fp8.fp8_fits = fp8.w8a8_fits = true;
  EXPECT_EQ(moe_one_form(fp8), MoeOneForm::kNone) << "default mode: the grouped GEMVs unless switched";
  fp8.fp8_on = true;
  EXPECT_EQ(moe_one_form(fp8), MoeOneForm::kFp8);
  fp8.w8a8 = 1;
  EXPECT_EQ(moe_one_form(fp8), MoeOneForm::kW8a8);
  fp8.w8a8_fits = false;
  EXPECT_EQ(moe_one_form(fp8), MoeOneForm::kFp8) << "a W8A8 request that does not fit falls back";
  fp8.batch_invariant = true;
  EXPECT_EQ(moe_one_form(fp8), MoeOneForm::kNone) << "the invariant mode never takes the FP8 form";
  fp8.w8a8_fits = true;
  for (int w8a8 : {-1, 1}) {
    fp8.w8a8 = w8a8;
    EXPECT_EQ(moe_one_form(fp8), MoeOneForm::kW8a8) << w8a8;
  }
  fp8.w8a8 = 0;
  EXPECT_EQ(moe_one_form(fp8), MoeOneForm::kNone);
}

}  // namespace
}  // namespace deepinfer
#else
TEST(CudaMoeForm, NeedsCudaBuild) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif
