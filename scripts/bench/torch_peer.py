#!/usr/bin/env python3
"""PyTorch / transformers peer for the DeepInfer benchmark harness (one GPU, random bf16 weights).

Usage:
    python3 scripts/bench/torch_peer.py --config bench/configs/deepseek_v2_lite.json --out peer.json \
        [--prefill 4096,16384] [--decode-batch 1,32,128,256] [--context 512] [--decode-steps 8] \
        [--warmup 2] [--attn sdpa|eager] [--experts grouped_mm|batched_mm|eager] [--seed 0] \
        [--max-seconds 200] [--max-case-seconds 60]

What it does, in one process:
 1. Measures the card's ceilings: device-to-device copy bandwidth (a 2 GiB ``copy_``; bytes read +
    written; median of 20 CUDA-event-timed reps after 3 warm-ups) and the bf16 GEMM rate
    (8192^3 ``torch.matmul``; median of 20 after 3 warm-ups).
 2. Builds the transformers model from the config (``AutoConfig`` on a temporary copy of the json
    without ``auto_map``, then ``AutoModelForCausalLM.from_config(..., dtype=bfloat16)`` under
    ``torch.device("cuda")``: parameters are allocated on the GPU directly), and re-initialises every
    parameter on the GPU: embedding N(0,1), 1-D weights (norms) U(0.7,1.3), biases 0, every other
    weight (linears, router, fused expert tensors, lm_head) N(0, 1/fan_in) with fan_in = last dim.
    Eval mode, ``torch.inference_mode``.
 3. Prefill: batch 1, N random ids, one forward with a fresh ``DynamicCache`` and
    ``logits_to_keep=1`` (when the model's forward takes it); ``--prefill-warmup`` untimed runs,
    then the median of ``--prefill-reps`` CUDA-event-timed runs.
 4. Decode: per batch size B, one batched forward over B x ``--context`` random ids fills a fresh
    ``DynamicCache``; then ``--warmup`` + ``--decode-steps`` single-token steps, each feeding the
    argmax of the previous logits (``--feed random``: random ids); each step (forward + argmax) is
    timed with CUDA events; the median of the non-warm-up steps is reported.
 5. Floors from ``floors.py`` (pure python; the C++ side computes the same figures): decode
    floor = bytes read per step / copy bandwidth, prefill floor = FLOPs / GEMM rate.
    ``ratio_to_floor = floor_ms / measured_ms``.

Every case runs under a try: an out-of-memory (or any other) failure is recorded as
``{"error": ...}`` and the run continues. A case is skipped (``{"skipped": reason}``) when the
``--max-seconds`` budget (counted from process start) is spent, or when its estimated duration
(from the floors and the efficiency measured on the previous case of the same phase) exceeds
``--max-case-seconds`` or what is left of the budget. The JSON is rewritten after every case, so
a killed run leaves what it measured.

Output JSON (``--out``)::

    {"engine": "transformers",
     "versions": {"torch", "transformers", "cuda", "python"},
     "gpu": str, "config": path, "dtype": "bf16", "attn": "sdpa"|"eager",
     "experts_implementation": str (what the model ended up using),
     "limits": {"copy_bytes_per_s", "bf16_flops_per_s", "copy_bytes", "copy_ms_median",
                "gemm_n", "gemm_ms_median", "reps"},
     "model": {"total_params", "active_params" (floors.py), "hf_param_count" (transformers),
               "kv_bytes_per_token_mla", "kv_bytes_per_token_hf_cache", "build_s", "init": str,
               "memory_gib_after_build"},
     "settings": {... the command-line values ...},
     "floor_definitions": {"decode", "prefill", "ratio_to_floor": str},
     "notes": [str, ...],
     "wall_s": float, "finished": bool, ("fatal": str when the run died outside a case),
     "results": [
       {"phase": "prefill", "tokens": N, "batch": 1, "ms", "tok_per_s", "floor_ms",
        "ratio_to_floor", "flops", "reps", "ms_all", "logits_to_keep", "peak_mem_gib"},
       {"phase": "decode", "batch": B, "context": C, "ms_per_step", "tok_per_s", "floor_ms",
        "ratio_to_floor", "bytes", "kv_tokens", "distinct_experts", "steps", "warmup_steps",
        "ms_all", "prefill_ms", "cache_len_end", "peak_mem_gib"},
       ... a failed case keeps phase/tokens|batch/context/floor_ms and has "error": str
       ... ("OOM: ..." for out-of-memory); a skipped case keeps the same keys and has
       ... "skipped": str; a measured case may carry "note": str (fewer reps, cache length)]}

Written against torch 2.11 / transformers 5.17 (the versions scripts/golden/make_fixtures.py was
run with); it never touches the network (HF_HUB_OFFLINE=1). Python 3.10+.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback

T0 = time.monotonic()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Large, short-lived MoE/attention temporaries of different sizes: avoid fragmentation OOMs.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import floors  # noqa: E402

# Imported in main() so that --help and the pure helpers work without torch.
torch = None
transformers = None

COPY_BYTES = 2 << 30  # 2 GiB
GEMM_N = 8192
LIMIT_REPS = 20
LIMIT_WARMUP = 3
GIB = float(1 << 30)

# First-case efficiency guesses (measured ms = floor_ms / ratio) before anything is measured;
# deliberately pessimistic so that the first estimate over-, not under-states the time.
GUESS_RATIO = {"prefill": 0.05, "decode": 0.01}


def log(msg: str = "") -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def parse_int_list(text: str) -> list[int]:
    text = (text or "").strip()
    if not text:
        return []
    out = [int(x) for x in text.split(",") if x.strip()]
    if any(v <= 0 for v in out):
        raise argparse.ArgumentTypeError(f"sizes must be positive: {text!r}")
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="Hugging Face config.json of the model")
    ap.add_argument("--out", required=True, help="output JSON path")
    ap.add_argument("--prefill", type=parse_int_list, default=parse_int_list("4096,16384"),
                    help="comma-separated prefill lengths (batch 1); empty to skip")
    ap.add_argument("--decode-batch", type=parse_int_list, default=parse_int_list("1,32,128,256"),
                    help="comma-separated decode batch sizes; empty to skip")
    ap.add_argument("--context", type=int, default=512, help="tokens prefilled per sequence before decode")
    ap.add_argument("--decode-steps", type=int, default=8, help="timed decode steps per batch size")
    ap.add_argument("--warmup", type=int, default=2, help="untimed decode steps before the timed ones")
    ap.add_argument("--prefill-reps", type=int, default=3, help="timed prefill runs per length")
    ap.add_argument("--prefill-warmup", type=int, default=1, help="untimed prefill runs per length")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--experts", choices=["grouped_mm", "batched_mm", "eager"], default="grouped_mm",
                    help="transformers experts_implementation (5.x default: grouped_mm); batched_mm gathers one "
                         "weight copy per (token, expert) and runs out of memory on long prefills")
    ap.add_argument("--feed", choices=["argmax", "random"], default="argmax",
                    help="decode input: argmax of the previous step's logits, or random ids")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=200.0,
                    help="no case starts once this many seconds have passed since process start")
    ap.add_argument("--max-case-seconds", type=float, default=60.0,
                    help="skip a case whose estimated duration exceeds this")
    args = ap.parse_args(argv)
    if args.context < 1 or args.decode_steps < 1 or args.warmup < 0:
        ap.error("--context and --decode-steps must be >= 1, --warmup >= 0")
    if args.prefill_reps < 1 or args.prefill_warmup < 0:
        ap.error("--prefill-reps must be >= 1, --prefill-warmup >= 0")
    return args


# --------------------------------------------------------------------------------------------------
# Pure helpers (no torch)
# --------------------------------------------------------------------------------------------------


def is_oom(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    kind = "OOM" if is_oom(exc) else type(exc).__name__
    return f"{kind}: {first[:400]}"


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def mean_kv_tokens(context: int, warmup: int, steps: int) -> float:
    """Cached tokens each sequence's attention reads, averaged over the timed decode steps.

    After the prefill the cache holds `context` tokens; step i (0-based, warm-up included) adds
    one and attends to context + i + 1 tokens. The timed steps are i = warmup .. warmup+steps-1.
    """
    return context + warmup + (steps - 1) / 2.0 + 1.0


class Budget:
    def __init__(self, max_seconds: float, max_case_seconds: float):
        self.max_seconds = max_seconds
        self.max_case_seconds = max_case_seconds

    def elapsed(self) -> float:
        return time.monotonic() - T0

    def left(self) -> float:
        return self.max_seconds - self.elapsed()

    def skip_reason(self, estimate_s: float) -> str | None:
        if self.left() <= 0:
            return f"time budget --max-seconds {self.max_seconds:g} spent ({self.elapsed():.0f} s elapsed)"
        if estimate_s > self.max_case_seconds:
            return f"estimated {estimate_s:.0f} s > --max-case-seconds {self.max_case_seconds:g}"
        if estimate_s > self.left():
            return (f"estimated {estimate_s:.0f} s > {self.left():.0f} s left of "
                    f"--max-seconds {self.max_seconds:g}")
        return None


class Estimator:
    """Predicts a case's time as floor_ms / (ratio_to_floor of the last measured case of the phase)."""

    def __init__(self):
        self.ratio = dict(GUESS_RATIO)

    def observe(self, phase: str, result: dict) -> None:
        r = result.get("ratio_to_floor")
        if r is not None and r > 0 and math.isfinite(r):
            self.ratio[phase] = r

    def ms(self, phase: str, floor_ms: float) -> float:
        return floor_ms / self.ratio[phase]


def prefill_floor(cfg: dict, n: int, limits: dict) -> tuple[float, float]:
    flops = floors.prefill_flops(cfg, n)
    return flops, floors.prefill_floor_ms(cfg, n, limits["bf16_flops_per_s"])


def decode_floor(cfg: dict, batch: int, kv_tokens: float, limits: dict) -> tuple[float, float]:
    nbytes = floors.decode_bytes(cfg, batch, kv_tokens)
    return nbytes, floors.decode_floor_ms(cfg, batch, kv_tokens, limits["copy_bytes_per_s"])


def run_cases(args, cfg: dict, limits: dict, prefill_fn, decode_fn, emit) -> list[dict]:
    """Runs every prefill then decode case through prefill_fn / decode_fn (torch-free orchestration).

    prefill_fn(n, budget) -> dict with "ms_all" (list of ms) and optional extras;
    decode_fn(batch, budget) -> dict with "ms_all" and optional extras. Either may raise.
    emit(results) is called after every case.
    """
    budget = Budget(args.max_seconds, args.max_case_seconds)
    est = Estimator()
    results: list[dict] = []

    for n in args.prefill:
        flops, floor_ms = prefill_floor(cfg, n, limits)
        res = {"phase": "prefill", "tokens": n, "batch": 1, "floor_ms": floor_ms, "flops": flops}
        estimate_s = est.ms("prefill", floor_ms) * (args.prefill_warmup + args.prefill_reps) / 1e3
        reason = budget.skip_reason(estimate_s)
        if reason:
            res["skipped"] = reason
            log(f"prefill {n}: SKIPPED ({reason})")
        else:
            log(f"prefill {n}: floor {floor_ms:.2f} ms, estimate {estimate_s:.1f} s")
            err = None
            try:
                out = prefill_fn(n, budget)
                ms = median(out["ms_all"])
                res.update(ms=ms, tok_per_s=n / (ms / 1e3), ratio_to_floor=floor_ms / ms, reps=len(out["ms_all"]))
                res.update({k: v for k, v in out.items() if k not in res})
                est.observe("prefill", res)
                log(f"prefill {n}: {ms:.2f} ms, {res['tok_per_s']:.0f} tok/s, {res['ratio_to_floor']:.3f} of floor")
            except Exception as exc:  # noqa: BLE001 - every failure is recorded, the run goes on
                err = short_error(exc)
                if not is_oom(exc):
                    traceback.print_exc()
            if err is not None:
                res["error"] = err
                log(f"prefill {n}: ERROR {err}")
        results.append(res)
        emit(results)
        cleanup()

    kv_tokens = mean_kv_tokens(args.context, args.warmup, args.decode_steps)
    for b in args.decode_batch:
        nbytes, floor_ms = decode_floor(cfg, b, kv_tokens, limits)
        res = {"phase": "decode", "batch": b, "context": args.context, "floor_ms": floor_ms, "bytes": nbytes,
               "kv_tokens": kv_tokens, "distinct_experts": floors.expected_distinct_experts(cfg, b)}
        _, pf_floor = prefill_floor(cfg, args.context, limits)  # b independent sequences of `context`
        estimate_s = (b * est.ms("prefill", pf_floor)
                      + est.ms("decode", floor_ms) * (args.warmup + args.decode_steps)) / 1e3
        reason = budget.skip_reason(estimate_s)
        if reason:
            res["skipped"] = reason
            log(f"decode B={b}: SKIPPED ({reason})")
        else:
            log(f"decode B={b} ctx {args.context}: floor {floor_ms:.3f} ms/step, estimate {estimate_s:.1f} s")
            err = None
            try:
                out = decode_fn(b, budget)
                ms = median(out["ms_all"])
                res.update(ms_per_step=ms, tok_per_s=b / (ms / 1e3), ratio_to_floor=floor_ms / ms,
                           steps=len(out["ms_all"]), warmup_steps=args.warmup)
                res.update({k: v for k, v in out.items() if k not in res})
                est.observe("decode", res)
                log(f"decode B={b}: {ms:.2f} ms/step, {res['tok_per_s']:.1f} tok/s, "
                    f"{res['ratio_to_floor']:.3f} of floor")
            except Exception as exc:  # noqa: BLE001
                err = short_error(exc)
                if not is_oom(exc):
                    traceback.print_exc()
            if err is not None:
                res["error"] = err
                log(f"decode B={b}: ERROR {err}")
        results.append(res)
        emit(results)
        cleanup()
    return results


def format_table(doc: dict) -> str:
    lim = doc.get("limits") or {}
    lines = []
    lines.append(f"engine transformers {doc['versions'].get('transformers')} / torch {doc['versions'].get('torch')}"
                 f" on {doc.get('gpu')}, attn {doc.get('attn')}, experts {doc.get('experts_implementation')}")
    if lim:
        lines.append(f"limits: copy {lim['copy_bytes_per_s'] / 1e12:.3f} TB/s (read+write), "
                     f"bf16 GEMM {lim['bf16_flops_per_s'] / 1e12:.1f} TFLOP/s")
    m = doc.get("model") or {}
    if m:
        lines.append(f"model: {m.get('total_params', 0) / 1e9:.3f} B params "
                     f"({m.get('active_params', 0) / 1e9:.3f} B active per token)")
    lines.append(f"{'phase':<8} {'N/B':>6} {'ctx':>6} {'ms':>10} {'tok/s':>11} {'floor_ms':>9} {'ratio':>7}  note")
    for r in doc.get("results", []):
        size = r.get("tokens") if r["phase"] == "prefill" else r.get("batch")
        ctx = r.get("context", "-")
        ms = r.get("ms", r.get("ms_per_step"))
        note = r.get("error") or r.get("skipped") or ""
        ms_s = f"{ms:10.2f}" if ms is not None else f"{'-':>10}"
        tps = r.get("tok_per_s")
        tps_s = f"{tps:11.1f}" if tps is not None else f"{'-':>11}"
        ratio = r.get("ratio_to_floor")
        ratio_s = f"{ratio:7.3f}" if ratio is not None else f"{'-':>7}"
        lines.append(f"{r['phase']:<8} {size:>6} {ctx!s:>6} {ms_s} {tps_s} {r.get('floor_ms', float('nan')):9.3f} "
                     f"{ratio_s}  {note[:90]}")
    return "\n".join(lines)


def write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# torch side
# --------------------------------------------------------------------------------------------------


def cleanup() -> None:
    gc.collect()
    if torch is not None and torch.cuda.is_available():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - a sticky CUDA error shows up in the next case too
            log(f"cleanup: {short_error(exc)}")


def event_pair():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def measure_limits() -> dict:
    """Copy bandwidth (2 GiB copy_, bytes read + written) and bf16 GEMM rate (8192^3), each the
    median of 20 event-timed reps after 3 warm-ups."""
    dev = "cuda"
    src = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)
    for _ in range(LIMIT_WARMUP):
        dst.copy_(src)
    pairs = []
    for _ in range(LIMIT_REPS):
        s, e = event_pair()
        s.record()
        dst.copy_(src)
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    copy_ms = median([s.elapsed_time(e) for s, e in pairs])
    del src, dst

    a = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    b = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    c = torch.empty(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    for _ in range(LIMIT_WARMUP):
        torch.matmul(a, b, out=c)
    pairs = []
    for _ in range(LIMIT_REPS):
        s, e = event_pair()
        s.record()
        torch.matmul(a, b, out=c)
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    gemm_ms = median([s.elapsed_time(e) for s, e in pairs])
    del a, b, c
    cleanup()
    return {
        "copy_bytes_per_s": 2.0 * COPY_BYTES / (copy_ms / 1e3),
        "bf16_flops_per_s": 2.0 * GEMM_N ** 3 / (gemm_ms / 1e3),
        "copy_bytes": COPY_BYTES,
        "copy_ms_median": copy_ms,
        "gemm_n": GEMM_N,
        "gemm_ms_median": gemm_ms,
        "reps": LIMIT_REPS,
    }


def load_hf_config(raw: dict):
    """AutoConfig from a temporary copy of the json (auto_map dropped: the native class is wanted)."""
    d = {k: v for k, v in raw.items() if k != "auto_map"}
    tmp = tempfile.mkdtemp(prefix="torch_peer_cfg_")
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(d, f)
        cfg = transformers.AutoConfig.from_pretrained(tmp, trust_remote_code=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cfg


def check_hf_config(raw: dict, cfg, notes: list) -> None:
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
                "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace", "moe_intermediate_size",
                "intermediate_size", "topk_method"):
        if key in raw and getattr(cfg, key, None) != raw[key]:
            notes.append(f"config: transformers has {key}={getattr(cfg, key, None)!r}, json has {raw[key]!r}")
    rp = getattr(cfg, "rope_parameters", None) or {}
    want = (raw.get("rope_scaling") or {}).get("type") or (raw.get("rope_scaling") or {}).get("rope_type")
    if want and rp.get("rope_type") != want:
        notes.append(f"config: rope_parameters {rp} do not carry rope_type {want!r}")


def build_model(cfg, args, notes: list):
    kwargs = dict(attn_implementation=args.attn, dtype=torch.bfloat16, experts_implementation=args.experts)
    with torch.device("cuda"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)
        except TypeError as exc:  # an older 5.x without experts_implementation
            if "experts_implementation" not in str(exc):
                raise
            notes.append(f"from_config rejected experts_implementation ({exc}); using the default")
            kwargs.pop("experts_implementation")
            model = transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)

    kinds = {p.device.type for p in model.parameters()}
    if "meta" in kinds:
        notes.append("parameters came out on the meta device: to_empty(cuda) + fresh rotary buffers")
        model.to_empty(device="cuda")
        rot = model.model.rotary_emb
        model.model.rotary_emb = type(rot)(config=model.config, device=torch.device("cuda"))
    elif kinds != {"cuda"}:
        notes.append(f"parameters came out on {sorted(kinds)}: moved to cuda")
        model.to("cuda")
    for p in model.parameters():
        if p.dtype != torch.bfloat16 and p.is_floating_point():
            notes.append("some parameters were not bf16: cast")
            for q in model.parameters():
                if q.is_floating_point() and q.dtype != torch.bfloat16:
                    q.data = q.data.to(torch.bfloat16)
            break
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def init_weights(model, seed: int) -> str:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p is emb:
                p.normal_(0.0, 1.0, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.uniform_(0.7, 1.3, generator=gen)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
    torch.cuda.synchronize()
    return ("embedding N(0,1); 1-D (norms) U(0.7,1.3); biases 0; other weights N(0, 1/fan_in), "
            f"fan_in = last dim; torch.Generator(cuda) seed {seed}")


def new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / GIB


def make_prefill_fn(model, args, vocab: int, gen, keep_kw: dict):
    def prefill_fn(n: int, budget: Budget) -> dict:
        torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, vocab, (1, n), device="cuda", generator=gen)
        times = []
        truncated = False
        for i in range(args.prefill_warmup + args.prefill_reps):
            cache = new_cache(model)
            torch.cuda.synchronize()
            s, e = event_pair()
            s.record()
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, **keep_kw)
            e.record()
            torch.cuda.synchronize()
            if i >= args.prefill_warmup:
                times.append(s.elapsed_time(e))
            del out, cache
            if times and budget.left() <= 0 and i + 1 < args.prefill_warmup + args.prefill_reps:
                truncated = True
                break
        res = {"ms_all": times, "logits_to_keep": keep_kw.get("logits_to_keep"), "peak_mem_gib": peak_gib()}
        if truncated:
            res["note"] = "fewer reps: --max-seconds reached"
        return res

    return prefill_fn


def make_decode_fn(model, args, vocab: int, gen, keep_kw: dict):
    def decode_fn(b: int, budget: Budget) -> dict:
        torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, vocab, (b, args.context), device="cuda", generator=gen)
        cache = new_cache(model)
        torch.cuda.synchronize()
        s, e = event_pair()
        s.record()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, **keep_kw)
        e.record()
        if getattr(out, "past_key_values", None) is not None:
            cache = out.past_key_values
        tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        del out, ids
        torch.cuda.synchronize()
        prefill_ms = s.elapsed_time(e)
        pairs = []
        for i in range(args.warmup + args.decode_steps):
            s, e = event_pair()
            s.record()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            if args.feed == "argmax":
                tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            else:
                tok = torch.randint(0, vocab, (b, 1), device="cuda", generator=gen)
            e.record()
            del out
            if i >= args.warmup:
                pairs.append((s, e))
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in pairs]
        res = {"ms_all": times, "prefill_ms": prefill_ms, "peak_mem_gib": peak_gib()}
        try:
            res["cache_len_end"] = int(cache.get_seq_length())
            want = args.context + args.warmup + args.decode_steps
            if res["cache_len_end"] != want:
                res["note"] = f"cache holds {res['cache_len_end']} tokens, expected {want}"
        except Exception as exc:  # noqa: BLE001 - informational only
            res["note"] = f"cache.get_seq_length() failed: {exc}"
        del cache, tok
        return res

    return decode_fn


def smoke_forward(model, keep_kw: dict, vocab: int, gen) -> None:
    """Untimed: 16-token prefill + 2 decode steps (lazy CUDA/cuBLAS init, kernel selection)."""
    ids = torch.randint(0, vocab, (1, 16), device="cuda", generator=gen)
    cache = new_cache(model)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, **keep_kw)
    cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else cache
    tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
    for _ in range(2):
        out = model(input_ids=tok, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
    torch.cuda.synchronize()
    if not torch.isfinite(out.logits.float()).all():
        raise RuntimeError("smoke forward produced non-finite logits")


def set_experts_eager(model) -> None:
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    else:
        model.config._experts_implementation = "eager"


def main(argv=None) -> int:
    global torch, transformers
    args = parse_args(argv)
    with open(args.config) as f:
        raw = json.load(f)

    import torch as _torch
    import transformers as _transformers

    torch = _torch
    transformers = _transformers
    transformers.logging.set_verbosity_error()
    if not torch.cuda.is_available():
        print("torch_peer.py needs a CUDA device", file=sys.stderr)
        return 2

    notes: list[str] = []
    doc = {
        "engine": "transformers",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "cuda": torch.version.cuda, "python": platform.python_version()},
        "gpu": torch.cuda.get_device_name(0),
        "config": args.config,
        "dtype": "bf16",
        "attn": args.attn,
        "experts_implementation": args.experts,
        "limits": None,
        "model": None,
        "settings": {k: v for k, v in vars(args).items()},
        "floor_definitions": {
            "decode": "floor_ms = floors.decode_bytes(cfg, B, kv_tokens) / limits.copy_bytes_per_s: bf16 weights read "
                      "per step (attention, dense FFN, router, shared experts, lm_head, and per MoE layer "
                      "E*(1-(1-k/E)^B) distinct routed experts) + B*kv_tokens*(kv_lora_rank+qk_rope_head_dim)*2*layers "
                      "(MLA latent cache); kv_tokens = mean tokens attended over the timed steps",
            "prefill": "floor_ms = floors.prefill_flops(cfg, N) / limits.bf16_flops_per_s: 2*active_params*N + "
                       "2*N(N+1)/2*layers*heads*(qk_head_dim+v_head_dim)",
            "ratio_to_floor": "floor_ms / measured ms (1.0 = at the floor)",
        },
        "notes": notes,
        "results": [],
        "finished": False,
    }

    def emit(results=None):
        if results is not None:
            doc["results"] = results
        doc["wall_s"] = time.monotonic() - T0
        write_json(args.out, doc)

    try:
        return run_all(args, raw, doc, notes, emit)
    except BaseException as exc:
        doc["fatal"] = short_error(exc)
        emit()
        raise


def run_all(args, raw: dict, doc: dict, notes: list, emit) -> int:
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {doc['gpu']}")
    limits = measure_limits()
    doc["limits"] = limits
    log(f"limits: copy {limits['copy_bytes_per_s'] / 1e12:.3f} TB/s, bf16 GEMM {limits['bf16_flops_per_s'] / 1e12:.1f} TFLOP/s")
    emit()

    counts = floors.param_counts(raw)
    t_build = time.monotonic()
    cfg = load_hf_config(raw)
    check_hf_config(raw, cfg, notes)
    model = build_model(cfg, args, notes)
    init_desc = init_weights(model, args.seed)
    hf_count = sum(p.numel() for p in model.parameters())
    build_s = time.monotonic() - t_build
    doc["model"] = {
        "total_params": counts["total_params"],
        "active_params": counts["active_params"],
        "hf_param_count": hf_count,
        "kv_bytes_per_token_mla": floors.kv_bytes_per_token(raw),
        "kv_bytes_per_token_hf_cache": floors.hf_kv_bytes_per_token(raw),
        "build_s": build_s,
        "init": init_desc,
        "memory_gib_after_build": torch.cuda.memory_allocated() / GIB,
    }
    if hf_count != counts["total_params"]:
        notes.append(f"transformers holds {hf_count} parameters, floors.py counts {counts['total_params']}")
    doc["experts_implementation"] = getattr(model.config, "_experts_implementation", args.experts)
    log(f"model built in {build_s:.1f} s: {hf_count / 1e9:.3f} B params "
        f"(floors.py: {counts['total_params'] / 1e9:.3f} B), {torch.cuda.memory_allocated() / GIB:.1f} GiB, "
        f"attn {getattr(model.config, '_attn_implementation', args.attn)}, experts {doc['experts_implementation']}")
    doc["attn"] = getattr(model.config, "_attn_implementation", args.attn)
    emit()

    keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    if not keep_kw:
        notes.append("model.forward has no logits_to_keep: prefill computes logits for every position")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed + 1)
    vocab = int(raw["vocab_size"])

    with torch.inference_mode():
        try:
            smoke_forward(model, keep_kw, vocab, gen)
        except Exception as exc:  # noqa: BLE001
            if doc["experts_implementation"] == "eager":
                raise
            traceback.print_exc()
            notes.append(f"experts_implementation {doc['experts_implementation']} failed the smoke forward "
                         f"({short_error(exc)}); switched to eager")
            del exc
            cleanup()
            set_experts_eager(model)
            doc["experts_implementation"] = getattr(model.config, "_experts_implementation", "eager")
            smoke_forward(model, keep_kw, vocab, gen)
        cleanup()
        log("smoke forward ok")

        run_cases(args, raw, limits, make_prefill_fn(model, args, vocab, gen, keep_kw),
                  make_decode_fn(model, args, vocab, gen, keep_kw), emit)

    doc["finished"] = True
    emit()
    print(format_table(doc), flush=True)
    for n in notes:
        print(f"note: {n}", flush=True)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
