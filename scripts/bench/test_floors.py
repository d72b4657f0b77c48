"""Checks floors.py against hand-computed DeepSeek-V2-Lite figures.

Run: /usr/bin/python3 -m pytest scripts/bench/test_floors.py
"""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import floors  # noqa: E402


def load(name):
    with open(os.path.join(ROOT, "bench", "configs", name)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def lite():
    return load("deepseek_v2_lite.json")


# Hand arithmetic for V2-Lite (d=2048, H=16, qk=128+64, v=128, kv_lora=512, no q_lora,
# inter=10944, moe_inter=1408, 64 experts top-6, 2 shared, 27 layers, 1 dense, vocab 102400):
ATTN = (16 * 192 * 2048          # q_proj            6,291,456
        + 576 * 2048 + 512       # kv_a_proj + norm  1,180,160
        + 16 * 256 * 512         # kv_b_proj         2,097,152
        + 2048 * 16 * 128        # o_proj            4,194,304
        + 2 * 2048)              # two layer norms       4,096
EXPERT = 3 * 2048 * 1408          # 8,650,752
DENSE = 3 * 2048 * 10944          # 67,239,936
ROUTER = 64 * 2048
SHARED = 2 * EXPERT
HEAD = 102400 * 2048 + 2048       # lm_head + final norm
EMBED = 102400 * 2048


def test_attention_per_layer_by_hand():
    assert ATTN == 13_767_168


def test_v2_lite_params(lite):
    p = floors.param_counts(lite)
    assert p["n_moe_layers"] == 26
    assert p["expert_params"] == EXPERT
    assert p["attention_params"] == 27 * ATTN
    active = 27 * ATTN + DENSE + 26 * (ROUTER + 6 * EXPERT + SHARED) + HEAD
    total = 27 * ATTN + DENSE + 26 * (ROUTER + 64 * EXPERT + SHARED) + HEAD + EMBED
    assert p["active_params"] == active == 2_451_435_008
    assert p["total_params"] == total == 15_706_484_224
    assert p["active_params"] == pytest.approx(2.45e9, rel=2e-3)
    assert p["total_params"] == pytest.approx(15.7e9, rel=2e-3)


def test_v2_lite_decode_batch1(lite):
    # Batch 1 touches exactly top_k experts per MoE layer: the bytes are 2 x active params.
    assert floors.expected_distinct_experts(lite, 1) == pytest.approx(6.0)
    assert floors.decode_weight_params(lite, 1) == pytest.approx(2_451_435_008)
    assert floors.decode_bytes(lite, 1, 0) == pytest.approx(4.9e9, rel=2e-3)
    assert floors.decode_bytes(lite, 1, 0) == pytest.approx(4_902_870_016)


def test_v2_lite_kv(lite):
    assert floors.kv_bytes_per_token(lite) == 576 * 2 * 27 == 31_104
    assert floors.hf_kv_bytes_per_token(lite) == 16 * 320 * 2 * 27
    # 32 sequences of 512 cached tokens add 32*512*31104 bytes to the weights.
    extra = floors.decode_bytes(lite, 32, 512) - 2 * floors.decode_weight_params(lite, 32)
    assert extra == pytest.approx(32 * 512 * 31_104)


def test_v2_lite_distinct_experts(lite):
    for b in (1, 2, 32, 128, 256):
        want = 64 * (1 - (1 - 6 / 64) ** b)
        assert floors.expected_distinct_experts(lite, b) == pytest.approx(want)
    assert floors.expected_distinct_experts(lite, 256) == pytest.approx(64.0, abs=1e-6)
    # At large batch every expert is read: weights approach total - embedding table.
    assert floors.decode_weight_params(lite, 4096) == pytest.approx(15_706_484_224 - EMBED)
    # Monotone in batch.
    w = [floors.decode_weight_params(lite, b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert w == sorted(w)


def test_v2_lite_prefill_flops(lite):
    n = 4096
    want = 2 * 2_451_435_008 * n + 2 * (n * (n + 1) / 2) * 27 * 16 * (192 + 128)
    assert floors.prefill_flops(lite, n) == pytest.approx(want)
    assert floors.prefill_floor_ms(lite, n, 1e15) == pytest.approx(want / 1e15 * 1e3)


def test_floor_ms_units(lite):
    # Moving the step's own bytes takes 1 s = 1000 ms.
    b = floors.decode_bytes(lite, 1, 0)
    assert floors.decode_floor_ms(lite, 1, 0, b) == pytest.approx(1e3)
    # A realistic H200 copy rate (~4.8e12 B/s read + written) gives about 1 ms at batch 1.
    assert floors.decode_floor_ms(lite, 1, 0, 4.8e12) == pytest.approx(4_902_870_016 / 4.8e12 * 1e3)


def test_8l_q1536_variant():
    c = load("deepseek_v2_lite_8l_q1536.json")
    p = floors.param_counts(c)
    attn = (1536 * 2048 + 1536 + 16 * 192 * 1536) + (576 * 2048 + 512 + 16 * 256 * 512) + 2048 * 16 * 128 + 2 * 2048
    assert p["attention_params"] == 8 * attn
    assert p["n_moe_layers"] == 7
    assert p["total_params"] == 8 * attn + DENSE + 7 * (ROUTER + 64 * EXPERT + SHARED) + HEAD + EMBED
    assert floors.kv_bytes_per_token(c) == 576 * 2 * 8


def test_dense_and_nulls():
    c = {"hidden_size": 64, "vocab_size": 10, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 128, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
         "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": None, "num_experts_per_tok": None}
    p = floors.param_counts(c)
    assert p["n_moe_layers"] == 0
    assert floors.expected_distinct_experts(c, 8) == 0.0
    assert floors.decode_weight_params(c, 8) == p["active_params"]


def test_moe_layer_freq():
    c = dict(load("deepseek_v2_lite.json"), moe_layer_freq=2, first_k_dense_replace=0)
    assert [floors.is_moe_layer(c, i) for i in range(4)] == [True, False, True, False]
