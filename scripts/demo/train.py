#!/usr/bin/env python3
"""Train the embedded demo model (models/demo): a small DeepSeek-V3 with one MTP module.

Usage (on the GPU machine; the data comes from scripts/demo/prepare_data.py):
    python3 scripts/demo/train.py --data .demo/data --out OUT [--steps N] [--smoke]

What it does, in order (all of it in one process, fixed seeds):
 1. trains a byte-level BPE tokenizer (HF `tokenizers`, 8192 entries, DeepSeek's pre-tokenizer and special
    tokens) on the training text;
 2. builds transformers' `DeepseekV3ForCausalLM` (MLA with q-LoRA, 1 dense + 3 MoE layers, 8 routed experts
    top-2 in 4 groups with sigmoid/noaux_tc routing and a correction bias, one shared expert) plus one MTP
    module written here from transformers' `DeepseekV3DecoderLayer` (DeepSeek's checkpoint layout: `enorm`,
    `hnorm`, `eh_proj` on [enorm(emb); hnorm(h)], a full MoE block, `shared_head.norm`; embedding and head
    shared with the main model), and trains both jointly (next token + 0.3 x token after next), updating the
    correction bias with DeepSeek's auxiliary-loss-free rule;
 3. keeps the weights that did best on a validation slice of the training documents, rounds them to bf16
    and evaluates them on the held-out text (perplexity, next-token and MTP next-next-token accuracy);
 4. exports OUT/model/ in DeepSeek's release layout (config.json, model.safetensors, tokenizer files);
 5. reloads that folder into transformers in float32 on CPU (eager attention and experts) and writes the
    golden data the C++ engine is tested against: OUT/model/golden.json and OUT/model/heldout_ids.json;
 6. writes OUT/train_log.json (hyperparameters, training curve, evaluations, timings).

--smoke runs every stage with a few steps and a small validation, to check the pipeline and time a step.
GPU training is seeded but not bit-reproducible (CUDA atomics in index_add_/embedding backward); the
golden data is computed from the exported file, so it matches the committed weights exactly.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import transformers  # noqa: E402
import tokenizers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds3  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "golden"))
import make_fixtures as mf  # noqa: E402  (DeepSeek <-> transformers naming, config.json writer)

# --------------------------------------------------------------------------------------------------
# Hyperparameters (everything that decides the result; logged verbatim)
# --------------------------------------------------------------------------------------------------

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
SPECIAL_TOKENS = [
    BOS, EOS, PAD, "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
]
# DeepSeek-V3's tokenizer.json pre-tokenizer block, verbatim: digits in runs of <= 3, CJK runs, then the main
# split; ByteLevel only maps bytes (use_regex false). Kept as JSON text so the written file carries the same
# patterns character for character (engines recognize the pre-tokenizer by them).
DS_PRE_TOKENIZER = json.loads(r'''{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false}, {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"}, "behavior": "Isolated", "invert": false}, {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}''')
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}<｜User｜>{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}<｜Assistant｜>{{ message['content'] }}<｜end▁of▁sentence｜>"
    "{% else %}{{ message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)

MODEL = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=512,          # the dense first layer
    moe_intermediate_size=64,       # one routed expert and the shared expert
    num_hidden_layers=4,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=128,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    initializer_range=0.02,
)

TRAIN = dict(
    seed=1234,
    seq_len=1024,
    batch_size=32,
    steps=2300,
    warmup_steps=100,
    lr=2.5e-3,
    min_lr_ratio=0.1,
    weight_decay=0.1,
    betas=(0.9, 0.95),
    grad_clip=1.0,
    mtp_loss_weight=0.3,
    bias_update_speed=1e-3,         # gamma of the auxiliary-loss-free balancing rule
    eval_every=100,
    validation_one_in=50,           # training documents set aside for choosing the checkpoint
    validation_tokens=131072,
    autocast="bfloat16",
    max_train_seconds=330.0,        # safety stop (logged) so that the whole run ends inside its lease
)

GOLDEN = dict(
    prompts=[
        "The history of the city",
        "In the morning, the old man",
        "The president said that",
        "She opened the door and",
        "Scientists have found that",
        "It was a cold winter night",
        "The committee voted to",
        "When I was a child,",
        "The best way to learn",
        "He looked at the sky and",
    ],
    n_prompts=5,
    max_new_tokens=32,
    margin_good=1e-3,
    route_gap_good=1e-4,
    heldout_tokens=4096,
    window=1024,
    mtp_argmax_positions=64,
)

MAX_MODEL_DIR_BYTES = 16_000_000


def log(msg: str = "") -> None:
    print(msg, flush=True)


def fail(msg: str):
    raise SystemExit(f"DEMO TRAINING FAILED: {msg}")


# --------------------------------------------------------------------------------------------------
# Data and tokenizer
# --------------------------------------------------------------------------------------------------


def read_docs(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [d for d in f.read().split("\n\n") if d.strip()]


def train_tokenizer(docs: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    splits = [pre_tokenizers.Split(Regex(p["pattern"]["Regex"]), behavior="isolated", invert=False)
              for p in DS_PRE_TOKENIZER["pretokenizers"] if p["type"] == "Split"]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    # Write DeepSeek's block itself if the library serialized the same pre-tokenizer differently.
    spec = json.loads(tok.to_str())
    if spec["pre_tokenizer"] != DS_PRE_TOKENIZER:
        log(f"    note: pre_tokenizer serialized as {json.dumps(spec['pre_tokenizer'])[:300]}; writing DeepSeek's block")
        spec["pre_tokenizer"] = DS_PRE_TOKENIZER
        patched = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
        sample = docs[:200]
        if [e.ids for e in patched.encode_batch(sample)] != [e.ids for e in tok.encode_batch(sample)]:
            fail("DeepSeek's pre_tokenizer block encodes differently from the one trained with")
        tok = patched
    if tok.get_vocab_size() != vocab_size:
        fail(f"tokenizer has {tok.get_vocab_size()} entries, wanted {vocab_size}")
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            fail(f"special token {s} has id {tok.token_to_id(s)}, wanted {i}")
    return tok


def write_tokenizer(tok: Tokenizer, model_dir: str) -> None:
    tok.save(os.path.join(model_dir, "tokenizer.json"))

    def added(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True,
                "rstrip": False, "single_word": False}

    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": added(BOS),
        "eos_token": added(EOS),
        "pad_token": added(EOS),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": MODEL["max_position_embeddings"],
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def encode_docs(tok: Tokenizer, docs: list[str]) -> torch.Tensor:
    """[n_tokens] int64: each document as BOS + text + EOS, concatenated."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.append(bos)
        out.extend(enc.ids)
        out.append(eos)
    return torch.tensor(out, dtype=torch.int64)


def encode_prompt(tok: Tokenizer, text: str) -> list[int]:
    ids = tok.encode(text).ids  # post-processor adds BOS
    manual = [tok.token_to_id(BOS)] + tok.encode(text, add_special_tokens=False).ids
    if ids != manual:
        fail(f"tokenizer post-processor disagrees with BOS + ids for {text!r}: {ids} vs {manual}")
    return ids


# --------------------------------------------------------------------------------------------------
# Model: transformers' DeepseekV3ForCausalLM + an MTP module in DeepSeek's layout
# --------------------------------------------------------------------------------------------------


def build_config() -> DeepseekV3Config:
    kw = dict(MODEL)
    kw.update(
        bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False, attention_bias=False,
        attention_dropout=0.0, hidden_act="silu", use_cache=True, moe_layer_freq=1, scoring_func="sigmoid",
        topk_method="noaux_tc", rope_interleave=True, num_mtp_layers=1,
    )
    cfg = DeepseekV3Config(**kw)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    if getattr(cfg, "num_nextn_predict_layers", None) != 1:
        fail("num_mtp_layers did not map onto num_nextn_predict_layers")
    for k, v in MODEL.items():
        if k != "rope_parameters" and getattr(cfg, k) != v:
            fail(f"config.{k}={getattr(cfg, k)!r} != requested {v!r}")
    return cfg


class MtpModule(nn.Module):
    """DeepSeek-V3's multi-token-prediction module (depth 1), stored as model.layers.{num_hidden_layers}.

    Position i combines the main model's post-final-norm hidden state h_i with the embedding of token i+1 and
    predicts token i+2: g = shared_head.norm(block(eh_proj([enorm(emb(t_{i+1})); hnorm(h_i)]))), logits =
    lm_head(g). The embedding and lm_head are the main model's (not stored again)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        d = config.hidden_size
        self.enorm = hf_ds3.DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.hnorm = hf_ds3.DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.block = hf_ds3.DeepseekV3DecoderLayer(config, layer_idx)
        self.shared_head_norm = hf_ds3.DeepseekV3RMSNorm(d, eps=config.rms_norm_eps)
        self.config = config

    def forward(self, h: torch.Tensor, next_ids: torch.Tensor, model) -> torch.Tensor:
        """h [B, T, d] (post model.norm), next_ids [B, T] (token i+1 at position i) -> g [B, T, d]."""
        e = model.model.embed_tokens(next_ids)
        u = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(h)], dim=-1))
        n_batch, n_tok = next_ids.shape
        pos = torch.arange(n_tok, device=u.device).unsqueeze(0).expand(n_batch, -1)
        cos_sin = model.model.rotary_emb(u, pos)
        if self.config._attn_implementation == "eager":
            mask = torch.full((n_tok, n_tok), torch.finfo(u.dtype).min, device=u.device, dtype=u.dtype)
            mask = torch.triu(mask, diagonal=1)[None, None]
        else:  # sdpa: no mask means causal (is_causal) in transformers' sdpa_attention_forward
            mask = None
        out = self.block(hidden_states=u, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        if isinstance(out, tuple):
            out = out[0]
        return self.shared_head_norm(out)

    def ds_state_dict(self, layer_idx: int) -> dict:
        """HF-side names (fused experts) under model.layers.{layer_idx}.; hf_to_ds splits the experts."""
        p = f"model.layers.{layer_idx}."
        out = {}
        for k, v in self.state_dict().items():
            if k.startswith("block."):
                out[p + k[len("block."):]] = v
            elif k.startswith("shared_head_norm."):
                out[p + "shared_head.norm." + k[len("shared_head_norm."):]] = v
            else:
                out[p + k] = v
        return out

    def load_ds_state_dict(self, ds: dict, layer_idx: int) -> None:
        p = f"model.layers.{layer_idx}."
        hf_keys = [k for k in self.ds_state_dict(layer_idx)]
        sub = {k: v for k, v in ds.items() if k.startswith(p)}
        merged = mf.ds_to_hf(sub, hf_keys)
        local = {}
        for k, v in merged.items():
            rest = k[len(p):]
            if rest.startswith("shared_head.norm."):
                local["shared_head_norm." + rest[len("shared_head.norm."):]] = v
            elif rest.split(".")[0] in ("enorm", "hnorm", "eh_proj"):
                local[rest] = v
            else:
                local["block." + rest] = v
        self.load_state_dict(local, strict=True)


def init_module(module: nn.Module, std: float, g: torch.Generator) -> None:
    """Norm weights 1, every other parameter N(0, std^2), correction biases 0 (independent of transformers'
    own initializer, so the starting point is fixed by the seed alone)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()


def moe_modules(model, mtp) -> list:
    mods = [m for m in model.modules() if hasattr(m, "gate") and hasattr(m.gate, "e_score_correction_bias")]
    mods += [m for m in mtp.modules() if hasattr(m, "gate") and hasattr(m.gate, "e_score_correction_bias")]
    return mods


@torch.no_grad()
def route(moe, x: torch.Tensor, cfg) -> torch.Tensor:
    """Expert ids [n_tok, top_k] chosen by DeepSeek's group-limited noaux_tc rule (masked groups at -inf)."""
    g = moe.gate
    e, n_group = cfg.n_routed_experts, cfg.n_group
    s = F.linear(x.reshape(-1, cfg.hidden_size).float(), g.weight.float()).sigmoid()
    s = s + g.e_score_correction_bias.float()
    group_score = s.view(-1, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_score, dtype=torch.bool)
    keep.scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, True)
    s = s.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    return s.topk(cfg.num_experts_per_tok, dim=-1).indices


class LoadBalancer:
    """Auxiliary-loss-free balancing (DeepSeek-V3 §2.1.2): after each step, bias_e += gamma * sign(mean - load_e).

    Loads are counted by a forward pre-hook on every MoE module that re-derives the routing decision from the
    module's input with DeepSeek's rule. The bias is then shifted so that its minimum is 0: a common shift
    changes no decision, and keeping every biased score positive makes transformers' routing (masked groups
    filled with 0.0) identical to DeepSeek's (masked groups at -inf), during training and in the export."""

    def __init__(self, mods, cfg, gamma: float):
        self.mods, self.cfg, self.gamma = mods, cfg, gamma
        self.counts = [torch.zeros(cfg.n_routed_experts, device=m.gate.weight.device) for m in mods]
        self.active = False
        for i, m in enumerate(mods):
            m.register_forward_pre_hook(self._hook(i))

    def _hook(self, i):
        def hook(mod, args):
            if self.active:
                idx = route(mod, args[0], self.cfg)
                self.counts[i] += torch.bincount(idx.flatten(), minlength=self.cfg.n_routed_experts).float()
        return hook

    @torch.no_grad()
    def update(self) -> float:
        """Applies the rule; returns the mean over layers of max_load / mean_load (1.0 = balanced)."""
        vio = []
        for m, c in zip(self.mods, self.counts):
            b = m.gate.e_score_correction_bias
            b += self.gamma * torch.sign(c.mean() - c)
            b -= b.min()
            vio.append(c.max() / c.mean().clamp(min=1.0))
            c.zero_()
        return float(torch.stack(vio).mean())


# --------------------------------------------------------------------------------------------------
# Losses and evaluation
# --------------------------------------------------------------------------------------------------


def losses(model, mtp, seq: torch.Tensor):
    """seq [B, T+2] -> (main next-token CE, MTP next-next-token CE), mean over positions."""
    x = seq[:, :-2]
    h = model.model(input_ids=x).last_hidden_state  # post model.norm
    logits = model.lm_head(h)
    main = F.cross_entropy(logits.float().flatten(0, 1), seq[:, 1:-1].flatten())
    g = mtp(h, seq[:, 1:-1], model)
    mlogits = model.lm_head(g)
    aux = F.cross_entropy(mlogits.float().flatten(0, 1), seq[:, 2:].flatten())
    return main, aux


@torch.no_grad()
def evaluate(model, mtp, stream: torch.Tensor, window: int, batch: int, autocast: bool) -> dict:
    """Non-overlapping windows of `window` tokens; every window predicts its own positions 1.. (main) and
    2.. (MTP). Returns mean NLL, perplexity and top-1 accuracies."""
    model.eval()
    mtp.eval()
    n_win = stream.numel() // window
    wins = stream[: n_win * window].view(n_win, window)
    nll = 0.0
    n_main = n_mtp = correct_main = correct_mtp = 0
    nll_mtp = 0.0
    dev = next(model.parameters()).device
    for i in range(0, n_win, batch):
        w = wins[i:i + batch].to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            h = model.model(input_ids=w).last_hidden_state
            logits = model.lm_head(h).float()
            g = mtp(h[:, :-1], w[:, 1:], model)
            mlogits = model.lm_head(g).float()
        tgt = w[:, 1:]
        lp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        nll -= float(lp.gather(-1, tgt.unsqueeze(-1)).sum())
        correct_main += int((logits[:, :-1].argmax(-1) == tgt).sum())
        n_main += tgt.numel()
        mt = w[:, 2:]
        mlp = torch.log_softmax(mlogits[:, :-1].double(), dim=-1)
        nll_mtp -= float(mlp.gather(-1, mt.unsqueeze(-1)).sum())
        correct_mtp += int((mlogits[:, :-1].argmax(-1) == mt).sum())
        n_mtp += mt.numel()
    model.train()
    mtp.train()
    return {"tokens": int(n_win * window), "windows": int(n_win), "window": window,
            "nll": nll / n_main, "ppl": math.exp(nll / n_main), "next_token_acc": correct_main / n_main,
            "mtp_nll": nll_mtp / n_mtp, "mtp_ppl": math.exp(nll_mtp / n_mtp), "mtp_next_next_acc": correct_mtp / n_mtp}


def lr_at(step: int, total: int) -> float:
    t = TRAIN
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    frac = (step - t["warmup_steps"]) / max(1, total - t["warmup_steps"])
    return t["lr"] * (t["min_lr_ratio"] + (1 - t["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


# --------------------------------------------------------------------------------------------------
# Export and golden data
# --------------------------------------------------------------------------------------------------


def export(model, mtp, cfg, model_dir: str) -> dict:
    """config.json + model.safetensors (bf16; e_score_correction_bias f32) in DeepSeek's naming."""
    spec = {"name": "demo", "arch": "DeepseekV3ForCausalLM", "store": "bfloat16", "layout": "orig_null",
            "mtp_layers": 1}
    cj = mf.config_json(spec, cfg)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    mf.check_config_roundtrip(spec, cfg, model_dir)

    hf_sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    ds = mf.hf_to_ds(hf_sd)
    expected = dict(mf.ds_expected_specs(cfg, True))
    if set(ds) != set(expected):
        fail(f"state dict does not map onto DeepSeek's layout: {sorted(set(ds) ^ set(expected))[:8]}")
    n = cfg.num_hidden_layers
    mtp_ds = mf.hf_to_ds({k: v.detach().cpu() for k, v in mtp.ds_state_dict(n).items()})
    # Shared with the main model and not stored again: the engine aliases them (DeepSeek's release copies them).
    shared = {f"model.layers.{n}.embed_tokens.weight", f"model.layers.{n}.shared_head.head.weight"}
    mtp_expected = {k: s for k, s in mf.mtp_specs(cfg) if k not in shared}
    if set(mtp_ds) != set(mtp_expected):
        fail(f"MTP state dict does not map onto DeepSeek's layout: {sorted(set(mtp_ds) ^ set(mtp_expected))[:8]}")
    ds.update(mtp_ds)
    expected.update(mtp_expected)
    store = {}
    for name in sorted(ds, key=mf.natural_key):
        t = ds[name]
        if tuple(t.shape) != tuple(expected[name]):
            fail(f"{name}: shape {tuple(t.shape)} != {expected[name]}")
        store[name] = (t.float() if name.endswith("e_score_correction_bias") else t.to(torch.bfloat16)).contiguous()
    save_file(store, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
    mf.check_written(model_dir, ["model.safetensors"], store)
    return store


def round_to_bf16(module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(p.to(torch.bfloat16).float())


@torch.no_grad()
def greedy(model, prompt: list[int], n: int) -> dict:
    seq = list(prompt)
    ids, margins = [], []
    for _ in range(n):
        row = mf.forward_logits(model, seq)[-1]
        tok = mf.argmax_lowest(row)
        ids.append(tok)
        margins.append(mf.top_gap(row))
        seq.append(tok)
    return {"ids": ids, "min_margin": min(margins)}


def golden(model_dir: str, tok: Tokenizer, heldout: torch.Tensor, gpu_store_model, gpu_mtp, cfg) -> dict:
    """Reload the exported folder in transformers (float32, CPU, eager) and compute the golden data."""
    with mf.capture_hf_warnings() as warns:
        cpu, info = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
            output_loading_info=True)
    cpu.eval()
    for w in warns:
        log(f"    [hf-warning:load] {w.splitlines()[0][:200]}")
    n = cfg.num_hidden_layers
    if info.get("missing_keys") or info.get("mismatched_keys") or info.get("error_msgs"):
        fail(f"from_pretrained: missing={info.get('missing_keys')} mismatched={info.get('mismatched_keys')}")
    bad = sorted(k for k in (info.get("unexpected_keys") or ()) if not k.startswith(f"model.layers.{n}."))
    if bad:
        fail(f"from_pretrained: unexpected non-MTP keys {bad[:8]}")
    ref = {k: v.detach().cpu() for k, v in gpu_store_model.state_dict().items()}
    got = cpu.state_dict()
    for k, v in ref.items():
        if not torch.equal(got[k], v.float()):
            fail(f"reloaded tensor {k} differs from the trained one")

    # MTP on CPU, loaded from the file (eager attention: explicit causal mask).
    ds = load_file(os.path.join(model_dir, "model.safetensors"))
    mtp = MtpModule(cpu.config, n)
    mtp.load_ds_state_dict({k: v.float() for k, v in ds.items()}, n)
    mtp.eval()

    # transformers' own tokenizer class on the written files must give the same ids (one BOS).
    try:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(model_dir)
        text = GOLDEN["prompts"][0]
        hf_ids = hf_tok(text)["input_ids"]
        tokenizer_check = {"class": type(hf_tok).__name__, "ids": hf_ids, "agrees": hf_ids == encode_prompt(tok, text)}
    except Exception as e:  # noqa: BLE001  (informational)
        tokenizer_check = {"error": repr(e)}
    log(f"    AutoTokenizer check: {tokenizer_check}")

    # Prompts: the first n_prompts candidates whose greedy run is decided by a clear margin everywhere.
    chosen, rejected = [], []
    for text in GOLDEN["prompts"]:
        ids = encode_prompt(tok, text)
        g = greedy(cpu, ids, GOLDEN["max_new_tokens"])
        try:
            gap = mf.min_route_gap(cpu, [ids + g["ids"][:-1]])
        except Exception as e:  # noqa: BLE001  (a transformers API change: record, do not fail)
            log(f"    route gap not measured: {e!r}")
            gap = None
        entry = {"text": text, "prompt_ids": ids, "greedy_ids": g["ids"], "min_margin": g["min_margin"],
                 "min_route_gap": gap, "continuation": tok.decode(g["ids"], skip_special_tokens=False)}
        ok = g["min_margin"] >= GOLDEN["margin_good"] and (gap is None or gap >= GOLDEN["route_gap_good"])
        (chosen if ok else rejected).append(entry)
        log(f"    prompt {text!r}: margin {g['min_margin']:.4g} route_gap {gap} -> {entry['continuation']!r}")
        if len(chosen) == GOLDEN["n_prompts"]:
            break
    if len(chosen) < GOLDEN["n_prompts"]:
        rejected.sort(key=lambda e: -e["min_margin"])
        log(f"!!!!! WARNING: only {len(chosen)} prompts met the margins; adding the best of the rest")
        chosen += rejected[: GOLDEN["n_prompts"] - len(chosen)]

    # Held-out perplexity over fixed ids, in windows; NLL in double from float32 logits.
    ids = heldout[: GOLDEN["heldout_tokens"]].tolist()
    win = GOLDEN["window"]
    windows = []
    nll_total, count = 0.0, 0
    mtp_correct = mtp_count = main_correct = 0
    mtp_first = None
    for s in range(0, len(ids), win):
        w = ids[s:s + win]
        with torch.no_grad():
            x = torch.tensor([w])
            h = cpu.model(input_ids=x).last_hidden_state
            logits = cpu.lm_head(h)[0].float()
            lp = torch.log_softmax(logits.double(), dim=-1)
            tgt = torch.tensor(w[1:])
            nll = -float(lp[:-1].gather(-1, tgt.unsqueeze(-1)).sum())
            main_correct += int((logits[:-1].argmax(-1) == tgt).sum())
            g = mtp(h[:, :-1], x[:, 1:], cpu)
            ml = cpu.lm_head(g)[0].float()
            pred = ml[:-1].argmax(-1)
            mtp_correct += int((pred == torch.tensor(w[2:])).sum())
            mtp_count += len(w) - 2
            if mtp_first is None:
                mtp_first = ml[: GOLDEN["mtp_argmax_positions"]].argmax(-1).tolist()
        windows.append({"start": s, "n_tokens": len(w), "nll_sum": nll})
        nll_total += nll
        count += len(w) - 1
    ppl = math.exp(nll_total / count)

    # Cross-check: the GPU model (same bf16 weights, float32, TF32 off) must agree with the CPU reload.
    gpu_store_model.eval()
    gpu_mtp.eval()
    with torch.no_grad():
        x = torch.tensor([ids[:win]])
        dev = next(gpu_store_model.parameters()).device
        hg = gpu_store_model.model(input_ids=x.to(dev)).last_hidden_state
        lg = gpu_store_model.lm_head(hg)[0].float().cpu()
        mg = gpu_store_model.lm_head(gpu_mtp(hg[:, :-1], x[:, 1:].to(dev), gpu_store_model))[0].float().cpu()
        hc = cpu.model(input_ids=x).last_hidden_state
        lc = cpu.lm_head(hc)[0]
        mc = cpu.lm_head(mtp(hc[:, :-1], x[:, 1:], cpu))[0]
    # A routing near-tie may flip between the two and move a few rows; a wrong mask would move most of them.
    gpu_cpu = {"main_max_abs_logit_diff": float((lg - lc).abs().max()),
               "main_median_row_max_abs_diff": float((lg - lc).abs().amax(-1).median()),
               "main_argmax_agreement": float((lg.argmax(-1) == lc.argmax(-1)).float().mean()),
               "mtp_max_abs_logit_diff": float((mg - mc).abs().max()),
               "mtp_median_row_max_abs_diff": float((mg - mc).abs().amax(-1).median()),
               "mtp_argmax_agreement": float((mg.argmax(-1) == mc.argmax(-1)).float().mean())}
    log(f"    GPU (sdpa) vs CPU (eager) on window 0: {gpu_cpu}")
    if min(gpu_cpu["main_argmax_agreement"], gpu_cpu["mtp_argmax_agreement"]) < 0.98:
        fail(f"GPU and CPU disagree: {gpu_cpu}")

    return {
        "name": "demo",
        "description": "models/demo: the embedded demo model trained by scripts/demo/train.py. Golden data from "
                       "the exported bf16 checkpoint reloaded into transformers in float32 on CPU (eager "
                       "attention, eager experts).",
        "architecture": "DeepseekV3ForCausalLM",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "compute_dtype": "float32",
        "weights_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "max_new_tokens": GOLDEN["max_new_tokens"],
        "greedy": "full recomputation each step; argmax of the last position, lowest id wins ties; eos does not stop",
        "prompts": chosen,
        "heldout": {
            "ids_file": "heldout_ids.json",
            "n_tokens": len(ids),
            "window": win,
            "scoring": "each window of <= window tokens is scored alone; positions 1.. of a window are predicted "
                       "from the window's own prefix; ppl = exp(sum nll / number of predicted tokens)",
            "windows": windows,
            "n_predicted": count,
            "ppl": ppl,
            "next_token_acc": main_correct / count,
            "mtp_next_next_acc": mtp_correct / mtp_count,
            "mtp_argmax_first_window": mtp_first,
        },
        "gpu_vs_cpu": gpu_cpu,
        "auto_tokenizer_check": tokenizer_check,
    }


def compact_json(obj) -> str:
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]", text)
    if json.loads(text) != obj:
        fail("compact JSON changed the content")
    return text + "\n"


# --------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder with train.txt and heldout.txt")
    ap.add_argument("--out", required=True, help="output folder (model/ and train_log.json are written there)")
    ap.add_argument("--steps", type=int, default=None, help=f"training steps (default {TRAIN['steps']})")
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything, to time and check the pipeline")
    args = ap.parse_args()
    t_start = time.time()
    timings = {}

    if args.smoke:
        TRAIN.update(steps=30, eval_every=10, validation_tokens=16384, warmup_steps=10)
    if args.steps is not None:
        TRAIN["steps"] = args.steps
    if not torch.cuda.is_available():
        fail("no CUDA device")
    random.seed(TRAIN["seed"])
    torch.manual_seed(TRAIN["seed"])
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__, "gpu": torch.cuda.get_device_name(0)}
    log(f"versions {versions}")
    log(f"MODEL {MODEL}")
    log(f"TRAIN {TRAIN}")

    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)

    # 1. data + tokenizer
    t0 = time.time()
    train_docs = read_docs(os.path.join(args.data, "train.txt"))
    heldout_docs = read_docs(os.path.join(args.data, "heldout.txt"))
    val_docs = [d for i, d in enumerate(train_docs) if i % TRAIN["validation_one_in"] == 0]
    fit_docs = [d for i, d in enumerate(train_docs) if i % TRAIN["validation_one_in"] != 0]
    tok = train_tokenizer(train_docs, MODEL["vocab_size"])
    write_tokenizer(tok, model_dir)
    timings["tokenizer_s"] = time.time() - t0
    t0 = time.time()
    train_stream = encode_docs(tok, fit_docs)
    val_stream = encode_docs(tok, val_docs)[: TRAIN["validation_tokens"]]
    heldout_stream = encode_docs(tok, heldout_docs)
    timings["encode_s"] = time.time() - t0
    data_stats = {"train_docs": len(fit_docs), "validation_docs": len(val_docs), "heldout_docs": len(heldout_docs),
                  "train_tokens": int(train_stream.numel()), "validation_tokens": int(val_stream.numel()),
                  "heldout_tokens": int(heldout_stream.numel()),
                  "train_bytes_per_token": sum(len(d) + 2 for d in fit_docs) / train_stream.numel()}
    log(f"data {data_stats} [{timings['tokenizer_s']:.1f}s tokenizer, {timings['encode_s']:.1f}s encode]")

    # 2. model
    dev = torch.device("cuda")
    cfg = build_config()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", experts_implementation="eager",
                                             dtype=torch.float32).to(dev)
    n = cfg.num_hidden_layers
    mtp = MtpModule(model.config, n).to(dev)
    init_gen = torch.Generator().manual_seed(TRAIN["seed"] + 1)
    init_module(model, MODEL["initializer_range"], init_gen)
    init_module(mtp, MODEL["initializer_range"], init_gen)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"parameters: main {n_params:,}  mtp {n_mtp:,}  total {n_params + n_mtp:,} "
        f"(bf16 {2 * (n_params + n_mtp) / 1e6:.2f} MB)")
    balancer = LoadBalancer(moe_modules(model, mtp), cfg, TRAIN["bias_update_speed"])
    if len(balancer.mods) != n - cfg.first_k_dense_replace + 1:
        fail(f"found {len(balancer.mods)} MoE modules")

    params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=TRAIN["betas"], fused=True)

    # 3. training
    gen = torch.Generator().manual_seed(TRAIN["seed"] + 2)
    T, B = TRAIN["seq_len"], TRAIN["batch_size"]
    stream_dev = train_stream.to(dev)
    offsets_in_window = torch.arange(T + 2, device=dev)
    curve, evals = [], []
    best = {"val_nll": float("inf"), "step": -1}
    best_state = None
    use_autocast = TRAIN["autocast"] == "bfloat16"
    model.train()
    mtp.train()
    t_train = time.time()
    step_times = []
    stopped_early = False
    total_steps = TRAIN["steps"]
    acc_main = acc_mtp = 0.0
    acc_n = 0
    for step in range(total_steps):
        ts = time.time()
        lr = lr_at(step, total_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, train_stream.numel() - (T + 2), (B,), generator=gen).to(dev)
        seq = stream_dev[starts.unsqueeze(1) + offsets_in_window]
        balancer.active = True
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_autocast):
            main_loss, mtp_loss = losses(model, mtp, seq)
            loss = main_loss + TRAIN["mtp_loss_weight"] * mtp_loss
        balancer.active = False
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, TRAIN["grad_clip"])
        opt.step()
        vio = balancer.update()
        acc_main += float(main_loss.detach())
        acc_mtp += float(mtp_loss.detach())
        acc_n += 1
        step_times.append(time.time() - ts)
        last = step == total_steps - 1
        if (step + 1) % 10 == 0 or last:
            curve.append({"step": step + 1, "lr": lr, "loss": acc_main / acc_n, "mtp_loss": acc_mtp / acc_n,
                          "grad_norm": float(gnorm), "max_load_over_mean": vio,
                          "tokens": (step + 1) * B * T, "seconds": time.time() - t_train})
            acc_main = acc_mtp = 0.0
            acc_n = 0
        if (step + 1) % TRAIN["eval_every"] == 0 or last:
            ev = evaluate(model, mtp, val_stream, T, 16, use_autocast)
            ev.update(step=step + 1, seconds=time.time() - t_train)
            evals.append(ev)
            tag = ""
            if ev["nll"] < best["val_nll"]:
                best = {"val_nll": ev["nll"], "step": step + 1}
                best_state = (copy.deepcopy(model.state_dict()), copy.deepcopy(mtp.state_dict()))
                tag = " *"
            c = curve[-1]
            log(f"step {step + 1:5d}  lr {lr:.2e}  loss {c['loss']:.4f}  mtp {c['mtp_loss']:.4f}  "
                f"val ppl {ev['ppl']:.2f}  val mtp acc {ev['mtp_next_next_acc']:.4f}  load max/mean {vio:.2f}  "
                f"{1000 * sum(step_times[-10:]) / len(step_times[-10:]):.0f} ms/step  "
                f"[{time.time() - t_train:.0f}s]{tag}")
        if time.time() - t_train > TRAIN["max_train_seconds"] and not last:
            log(f"!!!!! WARNING: stopping at step {step + 1}: max_train_seconds exceeded")
            stopped_early = True
            break
    timings["train_s"] = time.time() - t_train
    timings["ms_per_step_median"] = 1000 * sorted(step_times)[len(step_times) // 2]
    steps_done = step + 1
    log(f"trained {steps_done} steps in {timings['train_s']:.1f}s; best validation at step {best['step']}")

    # 4. best weights, rounded to what is stored, evaluated on held-out text (float32, TF32 off)
    model.load_state_dict(best_state[0])
    mtp.load_state_dict(best_state[1])
    round_to_bf16(model)
    round_to_bf16(mtp)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    heldout_eval = evaluate(model, mtp, heldout_stream, T, 16, False)
    val_eval = evaluate(model, mtp, val_stream, T, 16, False)
    timings["final_eval_s"] = time.time() - t0
    log(f"held-out (stored bf16 weights, fp32 compute): {heldout_eval}")

    # 5. export + golden
    t0 = time.time()
    export(model, mtp, cfg, model_dir)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    gold = golden(model_dir, tok, heldout_stream, model, mtp, cfg)
    with open(os.path.join(model_dir, "golden.json"), "w", encoding="utf-8") as f:
        f.write(compact_json(gold))
    with open(os.path.join(model_dir, "heldout_ids.json"), "w") as f:
        f.write(compact_json({"description": "the first heldout.n_tokens token ids of the held-out text "
                                             "(documents as BOS + text + EOS), scored by golden.json",
                              "ids": heldout_stream[: GOLDEN["heldout_tokens"]].tolist()}))
    timings["export_golden_s"] = time.time() - t0
    sizes = {f: os.path.getsize(os.path.join(model_dir, f)) for f in sorted(os.listdir(model_dir))}
    total = sum(sizes.values())
    log(f"model folder: {sizes} total {total}")
    if total > MAX_MODEL_DIR_BYTES:
        log(f"!!!!! WARNING: model folder is {total} bytes > {MAX_MODEL_DIR_BYTES}")

    timings["total_s"] = time.time() - t_start
    train_log = {
        "versions": versions, "model": MODEL, "train": TRAIN, "golden": {k: v for k, v in GOLDEN.items()},
        "data": data_stats, "parameters": {"main": n_params, "mtp": n_mtp, "total": n_params + n_mtp},
        "steps_done": steps_done, "stopped_early": stopped_early, "best_validation": best,
        "curve": curve, "validation": evals, "final": {"heldout": heldout_eval, "validation": val_eval,
                                                       "golden_heldout": gold["heldout"]["ppl"]},
        "golden_prompts": [{k: p[k] for k in ("text", "continuation", "min_margin")} for p in gold["prompts"]],
        "model_files": sizes, "timings": timings,
    }
    with open(os.path.join(args.out, "train_log.json"), "w", encoding="utf-8") as f:
        json.dump(train_log, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log(f"golden held-out ppl {gold['heldout']['ppl']:.4f}, mtp next-next acc {gold['heldout']['mtp_next_next_acc']:.4f}")
    log(f"done in {timings['total_s']:.1f}s: {timings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
