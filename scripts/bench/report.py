#!/usr/bin/env python3
"""Side-by-side markdown tables of benchmark results, for docs/perf.md.

Usage: python3 scripts/bench/report.py OUT_DIR

Reads every ``*.json`` in OUT_DIR written by ``deepinfer bench --json`` ("engine": "deepinfer") or
``scripts/bench/torch_peer.py --out`` ("engine": "transformers"); other JSON files are ignored.
Prints one table per model config (grouped by the config file's name): one row per case (prefill
length, decode batch size), and per run (engine + weight dtype, plus the batch-invariant mode and its
MLA policy where set) its tok/s, ms (per step for decode)
and ratio to its floor; then, for each deepinfer run, its speedup over the transformers bf16 run
(deepinfer tok/s / transformers tok/s). Each engine's ratio is against the limits it measured itself
(listed under the table). A failed or skipped case shows as "error" / "skipped", with the reason in
the notes. Pure standard library.
"""

from __future__ import annotations

import glob
import json
import os
import sys


def load_runs(out_dir: str) -> list[dict]:
    runs = []
    for path in sorted(glob.glob(os.path.join(out_dir, "*.json"))):
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"<!-- skipped {os.path.basename(path)}: {exc} -->", file=sys.stderr)
            continue
        if isinstance(doc, dict) and doc.get("engine") in ("deepinfer", "transformers") and "results" in doc:
            doc["_file"] = os.path.basename(path)
            runs.append(doc)
    return runs


def case_key(r: dict) -> tuple:
    if r.get("phase") == "prefill":
        return (0, int(r.get("tokens", 0)), 0)
    return (1, int(r.get("batch", 0)), int(r.get("context", 0)))


def case_label(key: tuple) -> str:
    return f"prefill {key[1]}" if key[0] == 0 else f"decode B={key[1]} (ctx {key[2]})"


def run_label(doc: dict) -> str:
    """Engine and weight dtype, plus the batch-invariant mode and its MLA policy where set."""
    label = f"{doc['engine']} {doc.get('dtype', '?')}"
    settings = doc.get("settings") or {}
    if settings.get("batch_invariant"):
        policy = settings.get("mla_policy")
        label += " invariant" + (f" ({policy})" if policy else "")
    return label


def measured(r: dict | None) -> bool:
    return r is not None and "error" not in r and "skipped" not in r and r.get("tok_per_s") is not None


def fmt(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def cells(r: dict | None) -> list[str]:
    if r is None:
        return ["–", "–", "–"]
    if "error" in r:
        return ["OOM" if str(r["error"]).startswith("OOM") else "error", "–", "–"]
    if "skipped" in r:
        return ["skipped", "–", "–"]
    ms = r.get("ms", r.get("ms_per_step"))
    return [fmt(r.get("tok_per_s"), ",.0f"), fmt(ms, ".2f"), fmt(r.get("ratio_to_floor"), ".3f")]


def limits_line(doc: dict) -> str:
    lim = doc.get("limits") or {}
    copy, gemm = lim.get("copy_bytes_per_s"), lim.get("bf16_flops_per_s")
    if not copy or not gemm:
        return f"{run_label(doc)} ({doc['_file']}): no limits measured (no floors)"
    fp8 = lim.get("fp8_flops_per_s")
    fp8_part = f", FP8 GEMM {fp8 / 1e12:.1f} TFLOP/s" if fp8 else ""
    return (f"{run_label(doc)} ({doc['_file']}): copy {copy / 1e12:.3f} TB/s (read + write), "
            f"bf16 GEMM {gemm / 1e12:.1f} TFLOP/s{fp8_part}")


def table(config: str, runs: list[dict]) -> str:
    # deepinfer runs first (bf16 before fp8), then transformers.
    runs = sorted(runs, key=lambda d: (d["engine"] != "deepinfer", d.get("dtype") != "bf16", d.get("dtype", "")))
    peer = next((d for d in runs if d["engine"] == "transformers" and d.get("dtype") == "bf16"), None)
    ours = [d for d in runs if d["engine"] == "deepinfer"]
    by_run = [{case_key(r): r for r in d["results"]} for d in runs]
    keys = sorted({k for m in by_run for k in m})
    peer_map = by_run[runs.index(peer)] if peer else {}

    gpus = sorted({str(d.get("gpu")) for d in runs})
    lines = [f"### {config} ({', '.join(gpus)})", ""]
    head = ["case"]
    for d in runs:
        label = run_label(d)
        head += [f"{label} tok/s", f"{label} ms", f"{label} ratio"]
    if peer:
        head += [f"speedup {run_label(d)}" for d in ours]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    notes = []
    for k in keys:
        row = [case_label(k)]
        for d, m in zip(runs, by_run):
            r = m.get(k)
            row += cells(r)
            if r is not None and ("error" in r or "skipped" in r or r.get("note")):
                why = r.get("error") or r.get("skipped") or r.get("note")
                notes.append(f"{case_label(k)}, {run_label(d)}: {str(why)[:200]}")
        if peer:
            p = peer_map.get(k)
            for d in ours:
                r = by_run[runs.index(d)].get(k)
                ok = measured(r) and measured(p) and p["tok_per_s"] > 0
                row.append(f"{r['tok_per_s'] / p['tok_per_s']:.2f}×" if ok else "–")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("tok/s: prefill N / ms, decode B / ms per step; ms: per prefill or per decode step; ratio: "
                 "floor_ms / ms against the limits the run measured itself; speedup: deepinfer tok/s / "
                 "transformers bf16 tok/s.")
    lines.append("")
    for d in runs:
        lines.append(f"- {limits_line(d)}")
    for n in notes:
        lines.append(f"- note: {n}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    runs = load_runs(argv[1])
    if not runs:
        print(f"report.py: no deepinfer or transformers results in {argv[1]}", file=sys.stderr)
        return 1
    groups: dict[str, list[dict]] = {}
    for d in runs:
        groups.setdefault(os.path.basename(str(d.get("config"))), []).append(d)
    print("\n\n".join(table(config, groups[config]) for config in sorted(groups)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
