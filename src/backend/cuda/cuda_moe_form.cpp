#include "backend/cuda/cuda_moe_form.h"

namespace deepinfer::cuda {

int moe_form(const MoeFormQuery& q) {
  const bool prefill_sized = moe_prefill_sized(q.rows, q.experts);
  int form;
  if (q.forced >= 0) {
    const bool unfit = (q.forced == 1 && !q.gemv_ok) || (q.forced == 3 && !q.small_ok) ||
                       (q.forced == 4 && !(q.batch_invariant ? q.wgmma_inv_ok : q.wgmma_ok)) ||
                       (q.forced == 5 && !q.w8a8_ok);
    form = unfit ? 0 : q.forced;
  } else if (q.batch_invariant) {
    if (q.w8a8_ok) form = 5;
    else if (q.rows <= kMoeDecodeMaxRows && q.small_ok) form = 3;
    else if (q.wgmma_inv_ok && (prefill_sized || !q.fp8)) form = 4;
    else form = 0;
  } else if (q.w8a8_ok && !(q.tokens == 1 && q.gemv_ok)) {
    form = 5;
  } else if (q.rows <= kMoeDecodeMaxRows) {
    form = (q.tokens <= kMoeGemvMaxTokens || !q.small_ok) && q.gemv_ok ? 1 : q.small_ok ? 3 : 0;
  } else if (prefill_sized) {
    form = q.wgmma_ok ? 4 : !q.capturing ? 2 : 0;
  } else {
    form = q.wgmma_ok ? 4 : 0;
  }
  return form == 2 && q.capturing ? 0 : form;
}

MoeOneForm moe_one_form(const MoeOneQuery& q) {
  if (!q.enabled) return MoeOneForm::kNone;
  if (q.fp8) {
    if ((q.batch_invariant ? q.w8a8 != 0 : q.w8a8 == 1) && q.w8a8_fits) return MoeOneForm::kW8a8;
    if (q.batch_invariant) return MoeOneForm::kNone;  // nothing else gives the mode's FP8 bits
    return q.fp8_on && q.fp8_fits ? MoeOneForm::kFp8 : MoeOneForm::kNone;
  }
  if (q.batch_invariant) return q.chain_on && q.chain_fits ? MoeOneForm::kChain : MoeOneForm::kNone;
  return q.bf16_fits ? MoeOneForm::kBf16 : MoeOneForm::kNone;
}

}  // namespace deepinfer::cuda
