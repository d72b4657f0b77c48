// Roofline floors of `deepinfer bench`: the bytes a decode step must read and the FLOPs a prefill
// must do, from the config alone. For bf16 weights these are scripts/bench/floors.py's figures
// (decode_bytes, prefill_flops, torch_peer.mean_kv_tokens), term by term; FP8 weights extend
// them. Keep the two in step (tests/tools/bench_floors_test.cpp pins numbers floors.py prints).
// Owns no timing and no device: the measured rates come from cuda_limits.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "model/deepseek/deepseek_config.h"

namespace deepinfer {

// Expected number of distinct routed experts one MoE layer reads for `batch` tokens, each
// choosing top_k of E uniformly at random: E·(1 − (1 − k/E)^batch). Exactly k for batch 1;
// 0 for a dense model or batch ≤ 0.
double expected_distinct_experts(const DeepseekConfig& c, int64_t batch);

// Weight bytes a decode step of `batch` sequences (one new token each) must read: every
// attention weight, dense FFN, router, shared experts, layer norms, the final norm and lm_head
// once, plus expected_distinct_experts(batch) routed experts per MoE layer (the embedding rows
// are negligible and not counted). weight_dtype:
//   kBF16    2 bytes per parameter (= 2 · floors.decode_weight_params);
//   kF8E4M3  the layout of dummy_deepseek_weights: every attention/MLP/expert linear 1 byte per
//            element plus one fp32 scale per c.fp8 block (128×128 when c.fp8 is unset: the
//            checkpoint's grid, the least a kernel must read); norms, router and lm_head bf16.
double decode_weight_bytes(const DeepseekConfig& c, int64_t batch, DType weight_dtype);

// Bytes of the MLA latent cache per cached token over all layers:
// kv_latent_dim · kv_value_bytes · num_hidden_layers (V2-Lite, bf16 pages: 576 · 2 · 27 = 31,104).
int64_t kv_bytes_per_token(const DeepseekConfig& c, int64_t kv_value_bytes);

// Tokens each sequence's attention reads, averaged over the timed decode steps: after the
// prefill each sequence holds `context` tokens; step i (warm-up included, 0-based) attends to
// context + i + 1; the timed steps are i = warmup .. warmup + steps − 1.
double mean_kv_tokens(int64_t context, int64_t warmup, int64_t steps);

// decode_weight_bytes(batch) + batch · kv_tokens · kv_bytes_per_token(kv_value_bytes).
double decode_bytes(const DeepseekConfig& c, int64_t batch, double kv_tokens, DType weight_dtype,
                    int64_t kv_value_bytes);

// FLOPs of a batch-1 prefill of n tokens from an empty cache (DeepseekCost::prefill_flops):
// 2·active_params·n + 2·n(n+1)/2·layers·heads·(qk_head_dim + v_head_dim).
double prefill_flops(const DeepseekConfig& c, int64_t n_tokens);

// The time `amount` (bytes or FLOPs) takes at `per_second`, in ms. Precondition: per_second > 0.
inline double floor_ms(double amount, double per_second) { return amount / per_second * 1e3; }

}  // namespace deepinfer
