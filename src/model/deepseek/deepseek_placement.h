// Weight placement: a DeepSeek model's weights in a device backend's memory, in the layout its
// kernels want, either copied from loaded (host) weights or drawn at random there
// (`--load-format dummy`, for benchmarks on shapes whose real weights are not at hand).
//
// Layout on device backends (host backends keep the loaded weights as they are):
//   - every Linear through Backend::place_linear (CUDA: bf16, or FP8 with per-row scales);
//   - a dense MLP's gate_proj and up_proj stacked into one [2I, D] weight, the parts kept as
//     row views, so one GEMM computes [gate | up] (FP8 with I % 128 != 0: each on its own, so
//     each keeps uniform 128-row scale blocks);
//   - each MoE layer's routed experts stacked into [E·2I, D] (gate_e ; up_e for e = 0..E-1)
//     and [E·D, I] (down_e), each expert's MlpWeights a set of row views into them;
//   - the shared experts (width S·I) also stacked there, after the routed ones, as S experts of
//     width I (shared_slices: gate and up rows s·I.., down columns s·I..), besides their own
//     stacked MLP — where FP8 blocks allow the cut;
//   - FP8 kv_b_proj also as a bf16 copy (kv_b_proj_bf16), the attention's operand precision.
// Backends detect these layouts by address (see CudaBackend::moe_experts).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "model/deepseek/deepseek_config.h"
#include "model/deepseek/deepseek_weights.h"

namespace deepinfer {

// Copies `host` into `backend`'s memory (identity on host backends).
DeepseekWeights place_deepseek_weights(Backend& backend, const DeepseekConfig& config, const DeepseekWeights& host);

// Random weights with the statistics of make_random_deepseek_tensors (linear ~ N(0, 1/fan_in),
// norms ~ U(0.7, 1.3), embeddings ~ N(0, 1)), created in place. weight_dtype: BF16 or F8E4M3
// (F8E4M3 needs config.fp8: dense linears FP8, router/embedding/lm_head/norms BF16).
// MTP modules are created when the config declares them.
DeepseekWeights dummy_deepseek_weights(Backend& backend, const DeepseekConfig& config, DType weight_dtype,
                                       uint64_t seed);

}  // namespace deepinfer
