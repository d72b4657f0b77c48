"""Roofline floors for DeepSeek-V2/V3 benchmarks, computed from a Hugging Face config.json dict.

Pure Python (no torch): imported by ``torch_peer.py`` and by anything else that must report the
same figures as the C++ side. The parameter counts mirror ``src/model/deepseek/deepseek_cost.cpp``
(``deepseek_cost``) term by term, and the layer test mirrors ``DeepseekConfig::is_moe_layer``; if
one changes, change the other.

Conventions
-----------
* ``cfg`` is the parsed config.json (a dict). ``q_lora_rank: null`` means one ``q_proj``;
  ``n_routed_experts: null`` means a dense model. MTP layers (``num_nextn_predict_layers``) are
  never counted.
* A *floor* is the time a step cannot beat on this card: bytes that must move divided by the
  measured copy bandwidth (decode), or FLOPs that must be done divided by the measured bf16
  GEMM rate (prefill). ``ratio_to_floor = floor_ms / measured_ms`` (1.0 = at the floor).
* Weights are counted at ``weight_bytes`` per parameter (2 = bf16). The KV bytes are those of
  the engine's MLA *latent* cache: ``kv_lora_rank + qk_rope_head_dim`` values per token per
  layer at ``kv_value_bytes`` each (2 = bf16), not the decompressed K/V that transformers caches
  (``hf_kv_bytes_per_token`` gives that figure, for information only).
"""

from __future__ import annotations

__all__ = [
    "dims",
    "is_moe_layer",
    "param_counts",
    "expected_distinct_experts",
    "decode_weight_params",
    "kv_bytes_per_token",
    "hf_kv_bytes_per_token",
    "decode_bytes",
    "decode_floor_ms",
    "prefill_flops",
    "prefill_floor_ms",
]


def _int(cfg: dict, key: str, default: int = 0) -> int:
    v = cfg.get(key)
    return default if v is None else int(v)


def dims(cfg: dict) -> dict:
    """The integer hyper-parameters the formulas use, with nulls resolved.

    q_lora_rank null -> 0 (one q_proj); n_routed_experts / n_shared_experts /
    num_experts_per_tok null -> 0; moe_layer_freq null -> 1; first_k_dense_replace null -> 0.
    """
    return {
        "d": _int(cfg, "hidden_size"),
        "vocab": _int(cfg, "vocab_size"),
        "layers": _int(cfg, "num_hidden_layers"),
        "heads": _int(cfg, "num_attention_heads"),
        "inter": _int(cfg, "intermediate_size"),
        "moe_inter": _int(cfg, "moe_intermediate_size"),
        "q_lora": _int(cfg, "q_lora_rank"),
        "kv_lora": _int(cfg, "kv_lora_rank"),
        "nope": _int(cfg, "qk_nope_head_dim"),
        "rope": _int(cfg, "qk_rope_head_dim"),
        "v": _int(cfg, "v_head_dim"),
        "experts": _int(cfg, "n_routed_experts"),
        "shared": _int(cfg, "n_shared_experts"),
        "topk": _int(cfg, "num_experts_per_tok"),
        "first_dense": _int(cfg, "first_k_dense_replace"),
        "moe_freq": max(1, _int(cfg, "moe_layer_freq", 1)),
    }


def is_moe_layer(cfg: dict, layer: int) -> bool:
    """Layer ``layer`` is MoE iff n_routed_experts > 0, layer >= first_k_dense_replace and
    layer % moe_layer_freq == 0 (as ``DeepseekConfig::is_moe_layer``; transformers ignores
    moe_layer_freq, which DeepSeek's configs set to 1)."""
    k = dims(cfg)
    return k["experts"] > 0 and layer >= k["first_dense"] and layer % k["moe_freq"] == 0


def param_counts(cfg: dict) -> dict:
    """Parameter counts, term by term as ``deepseek_cost`` in deepseek_cost.cpp.

    Per layer, attention (always read):
        q:   q_lora == 0: H*qk*d                      (q_proj)
             else:        q_lora*d + q_lora + H*qk*q_lora   (q_a_proj, q_a_layernorm, q_b_proj)
        kv:  (kv_lora + rope)*d + kv_lora + H*(nope + v)*kv_lora
                                              (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj)
        o:   d*H*v, plus the two layer norms 2*d
      with qk = nope + rope.
    Dense layer FFN: 3*d*inter.  One routed expert: expert = 3*d*moe_inter.
    MoE layer: router E*d, shared experts n_shared*expert, routed experts E*expert (total) or
      top_k*expert (active per token).
    Head: lm_head vocab*d + final norm d (active); the embedding table vocab*d is in the total
      only (a token reads one row).

    Returns a dict: total_params, active_params (weights one token's forward reads),
    attention_params (all layers), expert_params (one routed expert), n_moe_layers,
    router_params / shared_params (per MoE layer), dense_ffn_params (per dense layer),
    head_params, embedding_params, kv_values_per_token (latent values cached per token over
    all layers).
    """
    k = dims(cfg)
    d, h = k["d"], k["heads"]
    qk = k["nope"] + k["rope"]
    if k["q_lora"] == 0:
        attn = h * qk * d
    else:
        attn = k["q_lora"] * d + k["q_lora"] + h * qk * k["q_lora"]
    attn += (k["kv_lora"] + k["rope"]) * d + k["kv_lora"] + h * (k["nope"] + k["v"]) * k["kv_lora"]
    attn += d * h * k["v"] + 2 * d
    dense = 3 * d * k["inter"]
    expert = 3 * d * k["moe_inter"]
    router = k["experts"] * d
    shared = k["shared"] * expert
    total = active = attn_all = 0
    n_moe = 0
    for layer in range(k["layers"]):
        total += attn
        active += attn
        attn_all += attn
        if is_moe_layer(cfg, layer):
            n_moe += 1
            total += router + k["experts"] * expert + shared
            active += router + k["topk"] * expert + shared
        else:
            total += dense
            active += dense
    head = k["vocab"] * d + d
    embedding = k["vocab"] * d
    total += head + embedding
    active += head
    return {
        "total_params": total,
        "active_params": active,
        "attention_params": attn_all,
        "expert_params": expert,
        "n_moe_layers": n_moe,
        "router_params": router,
        "shared_params": shared,
        "dense_ffn_params": dense,
        "head_params": head,
        "embedding_params": embedding,
        "kv_values_per_token": k["layers"] * (k["kv_lora"] + k["rope"]),
    }


def expected_distinct_experts(cfg: dict, batch: int) -> float:
    """Expected number of distinct routed experts one MoE layer touches for ``batch`` tokens,
    each choosing top_k of E experts uniformly at random: E * (1 - (1 - k/E)^batch).
    batch = 1 gives exactly k; large batches approach E. 0 for a dense model."""
    k = dims(cfg)
    e, topk = k["experts"], k["topk"]
    if e <= 0 or batch <= 0:
        return 0.0
    return e * (1.0 - (1.0 - topk / e) ** batch)


def decode_weight_params(cfg: dict, batch: int) -> float:
    """Weights a decode step of ``batch`` sequences (one new token each) must read.

    = active_params - n_moe_layers * top_k * expert + n_moe_layers * distinct(batch) * expert
    i.e. attention, dense FFN, router, shared experts, final norm and lm_head once, plus each
    MoE layer's expected distinct routed experts (``expected_distinct_experts``). The embedding
    rows (batch * d) are negligible and not counted. batch = 1 gives active_params.
    """
    p = param_counts(cfg)
    k = dims(cfg)
    always = p["active_params"] - p["n_moe_layers"] * k["topk"] * p["expert_params"]
    return always + p["n_moe_layers"] * expected_distinct_experts(cfg, batch) * p["expert_params"]


def kv_bytes_per_token(cfg: dict, kv_value_bytes: int = 2) -> int:
    """Bytes of the engine's MLA latent cache per cached token per sequence, over all layers:
    (kv_lora_rank + qk_rope_head_dim) * kv_value_bytes * num_hidden_layers
    (V2-Lite, bf16: 576 * 2 * 27 = 31,104)."""
    k = dims(cfg)
    return (k["kv_lora"] + k["rope"]) * kv_value_bytes * k["layers"]


def hf_kv_bytes_per_token(cfg: dict, kv_value_bytes: int = 2) -> int:
    """For information: what transformers' DynamicCache stores per token per sequence (the
    decompressed K of qk_nope+qk_rope and V of v_head_dim per head, every layer):
    H * (qk_nope + qk_rope + v) * kv_value_bytes * layers (V2-Lite bf16: 276,480)."""
    k = dims(cfg)
    return k["heads"] * (k["nope"] + k["rope"] + k["v"]) * kv_value_bytes * k["layers"]


def decode_bytes(cfg: dict, batch: int, kv_tokens: float, weight_bytes: int = 2,
                 kv_value_bytes: int = 2) -> float:
    """Bytes one decode step must read: weight_bytes * decode_weight_params(batch)
    + batch * kv_tokens * kv_bytes_per_token, where kv_tokens is the number of cached tokens each
    sequence's attention reads in that step (the caller states it; torch_peer.py uses the mean
    over the timed steps, counting the step's own token)."""
    return (weight_bytes * decode_weight_params(cfg, batch)
            + batch * kv_tokens * kv_bytes_per_token(cfg, kv_value_bytes))


def decode_floor_ms(cfg: dict, batch: int, kv_tokens: float, copy_bytes_per_s: float,
                    weight_bytes: int = 2, kv_value_bytes: int = 2) -> float:
    """decode floor_ms = decode_bytes(...) / copy_bytes_per_s * 1e3, with copy_bytes_per_s the
    measured device-to-device copy bandwidth (bytes read + written per second)."""
    return decode_bytes(cfg, batch, kv_tokens, weight_bytes, kv_value_bytes) / copy_bytes_per_s * 1e3


def prefill_flops(cfg: dict, n_tokens: int) -> float:
    """FLOPs of a batch-1 prefill of n tokens from an empty cache (as DeepseekCost::prefill_flops):
    2 * active_params * n  +  2 * n(n+1)/2 * layers * heads * (qk_head_dim + v_head_dim)
    The first term is every weight matmul once per token (the naive kv_b decompression is one
    matmul per token, so it is in active_params); the second is causal QK^T and PV over the
    n(n+1)/2 (query, key) pairs per head, with qk_head_dim = qk_nope + qk_rope. Routing, norms,
    softmax and RoPE are not counted."""
    n = float(n_tokens)
    k = dims(cfg)
    pairs = n * (n + 1.0) / 2.0
    return (2.0 * param_counts(cfg)["active_params"] * n
            + 2.0 * pairs * k["layers"] * k["heads"] * (k["nope"] + k["rope"] + k["v"]))


def prefill_floor_ms(cfg: dict, n_tokens: int, flops_per_s: float) -> float:
    """prefill floor_ms = prefill_flops(n) / flops_per_s * 1e3, with flops_per_s the measured
    bf16 GEMM rate (8192^3 matmul)."""
    return prefill_flops(cfg, n_tokens) / flops_per_s * 1e3


if __name__ == "__main__":  # quick look: python3 floors.py CONFIG.json
    import json
    import sys

    for path in sys.argv[1:]:
        with open(path) as f:
            c = json.load(f)
        p = param_counts(c)
        print(f"{path}: total {p['total_params'] / 1e9:.3f} B, active {p['active_params'] / 1e9:.3f} B, "
              f"decode B=1 {decode_bytes(c, 1, 0) / 1e9:.3f} GB weights, "
              f"KV {kv_bytes_per_token(c)} B/token (HF cache {hf_kv_bytes_per_token(c)}), "
              f"prefill 4096: {prefill_flops(c, 4096) / 1e12:.2f} TFLOP; "
              f"distinct experts B=32: {expected_distinct_experts(c, 32):.2f}")
