#!/usr/bin/env python3
"""How far transformers itself lands from the fp32 fixtures when it computes in bfloat16.

Usage (on the GPU machine):
    python3 scripts/golden/bf16_reference_error.py [--fixtures tests/fixtures] [--device cuda] [--out FILE.json]

For every fixture the model is loaded with dtype=bfloat16 (weights as stored; FP8 checkpoints as
transformers loads them), and the prompt followed by the fixture's 16 greedy tokens is run once
(teacher forcing: every row conditions on the same tokens as the golden rows). Each logits row is
compared with the fixture's fp32 row as DeepInfer's GPU tests do: relative L2 error
||ours - ref|| / ||ref|| per row (worst row reported with its place) and over each whole tensor
(prompt logits [n_prompt, V], greedy-step logits [16, V]). The figures put DeepInfer's CUDA
numbers (tests/model/golden_fixture_cuda_test.cpp) next to the reference's own bf16 error.
Expected values come from the committed fixtures (transformers in fp32), never from DeepInfer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm((a - ref).double()) / torch.linalg.vector_norm(ref.double()).clamp_min(1e-30))


@torch.no_grad()
def fixture_errors(fixture_dir: str, device: str) -> dict:
    golden = json.load(open(os.path.join(fixture_dir, "golden.json")))
    ref = load_file(os.path.join(fixture_dir, "golden.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(fixture_dir, dtype=torch.bfloat16, attn_implementation="eager")
    model.to(device).eval()
    out = {"prompts": []}
    for i, p in enumerate(golden["prompts"]):
        prompt, greedy = p["prompt_ids"], p["greedy_ids"]
        ids = torch.tensor([prompt + greedy[:-1]], dtype=torch.long, device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0].float().cpu()
        n = len(prompt)
        ours = {"prompt_logits": logits[:n], "greedy_logits": logits[n - 1 : n - 1 + len(greedy)]}
        rec = {}
        for kind, mine in ours.items():
            r = ref[f"p{i}.{kind}"].float()
            rows = [rel(mine[k], r[k]) for k in range(r.shape[0])]
            worst = max(range(len(rows)), key=lambda k: rows[k])
            rec[kind] = {"tensor_rel_err": rel(mine, r), "worst_row_rel_err": rows[worst], "worst_row": worst}
        rec["greedy_same_argmax"] = int((ours["greedy_logits"].argmax(-1) == torch.tensor(greedy)).sum())
        out["prompts"].append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/fixtures")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    args = ap.parse_args()
    dirs = sorted(d for d in os.listdir(args.fixtures) if os.path.exists(os.path.join(args.fixtures, d, "golden.json")))
    if not dirs:
        print(f"no fixtures under {args.fixtures}", file=sys.stderr)
        return 1
    result = {"torch": torch.__version__, "device": args.device, "fixtures": {}}
    for d in dirs:
        try:
            result["fixtures"][d] = fixture_errors(os.path.join(args.fixtures, d), args.device)
        except Exception as e:  # one fixture transformers cannot run in bf16 must not hide the others
            result["fixtures"][d] = {"error": f"{type(e).__name__}: {e}"}
        r = result["fixtures"][d]
        if "error" in r:
            print(f"{d:28s} error: {r['error'][:200]}")
            continue
        for i, p in enumerate(r["prompts"]):
            print(f"{d:28s} p{i}: prompt tensor {p['prompt_logits']['tensor_rel_err']:.3e} worst row "
                  f"{p['prompt_logits']['worst_row_rel_err']:.3e} | greedy tensor {p['greedy_logits']['tensor_rel_err']:.3e} "
                  f"worst row {p['greedy_logits']['worst_row_rel_err']:.3e} (@{p['greedy_logits']['worst_row']}), "
                  f"argmax same {p['greedy_same_argmax']}/16")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
