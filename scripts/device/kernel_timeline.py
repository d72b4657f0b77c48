#!/usr/bin/env python3
"""Where a graphed decode step's time goes, from a kernel trace (src/tools/kernel_trace.cpp).

Reads the trace's graph launches (the kernels of one cudaGraphLaunch share its correlation id),
keeps the last --steps launches with the step's usual kernel count, and for each kernel of a step
(sorted by start) computes, against the frontier F (the latest end of the kernels before it):
  advance = max(0, end - F)   the step's span this kernel adds (the advances sum to the span),
  idle    = max(0, start - F) the device idle before it (no kernel of the step running),
  early   = max(0, F - start) how long it ran beside its predecessors (PDL: its pre-wait prologue).
Output: per kernel name, medians over the steps of the per-step sums; what ran outside the graph
between steps (copies, memsets, kernels: graph id 0) and the idle gaps there; then one layer's kernels
(the span between two launches of --layer-kernel, the --layer-th of the median step) with each
kernel's start, end, duration and advance relative to the layer's start. --json writes both.

Usage: kernel_timeline.py TRACE.tsv[.gz] [--steps 10] [--layer 12] [--layer-kernel mla_sublayer]
       [--label TEXT] [--json OUT.json]
"""
import argparse
import collections
import gzip
import json
import re
import statistics
import sys


def short(name):
    """'deepinfer::cuda::(anonymous namespace)::moe_one_kernel<true, false>' -> 'moe_one_kernel<true,false>'."""
    if name.startswith("["):  # a copy or memset: "[memcpy HtoD]"
        return name
    depth, cut = 0, 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == ":" and depth == 0 and i + 1 < len(name) and name[i + 1] == ":":
            cut = i + 2
    return re.sub(r"\s+", "", name[cut:]) or name


def load(path):
    rows = []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:2] != ["start_ns", "end_ns"]:
            sys.exit(f"{path}: not a kernel trace (header {header[:3]})")
        for n, line in enumerate(f, start=2):
            p = line.rstrip("\n").split("\t")
            if len(p) < 10:
                sys.exit(f"{path}:{n}: {len(p)} fields, expected 10")
            rows.append({"start": int(p[0]), "end": int(p[1]), "corr": int(p[2]), "graph": int(p[3]),
                         "grid": int(p[6]), "name": short(p[9])})
    return rows


def between_steps(rows, steps):
    """Non-graph records (graph id 0: copies, memsets, kernels launched outside the graph) from one
    step's last end to the next step's last end, and the idle gaps between consecutive steps."""
    gaps, outside = [], collections.defaultdict(list)
    for prev, cur in zip(steps, steps[1:]):
        t0, t1 = max(r["end"] for r in prev), max(r["end"] for r in cur)
        gaps.append(cur[0]["start"] - t0)
        per = collections.defaultdict(float)
        for r in rows:
            if r["graph"] == 0 and t0 <= r["start"] < t1:
                per[r["name"]] += r["end"] - r["start"]
        for k, v in per.items():
            outside[k].append(v)
    return gaps, outside


def steps_of(rows, n_steps):
    launches = collections.defaultdict(list)
    for r in rows:
        if r["graph"] != 0:
            launches[r["corr"]].append(r)
    if not launches:
        sys.exit("no graph launches in the trace (was the step graphed?)")
    ordered = [sorted(k, key=lambda r: r["start"]) for _, k in sorted(launches.items(), key=lambda kv: min(r["start"] for r in kv[1]))]
    usual = statistics.mode(len(s) for s in ordered)
    same = [s for s in ordered if len(s) == usual]
    return same[-n_steps:], usual


def annotate(step):
    frontier = step[0]["start"]
    out = []
    for r in step:
        adv = max(0, r["end"] - frontier)
        idle = max(0, r["start"] - frontier)
        early = max(0, frontier - r["start"])
        out.append(dict(r, advance=adv, idle=idle, early=early, dur=r["end"] - r["start"]))
        frontier = max(frontier, r["end"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layer", type=int, default=12)
    ap.add_argument("--layer-kernel", default="mla_sublayer")
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = load(a.trace)
    steps, usual = steps_of(rows, a.steps)
    gaps, outside = between_steps(rows, steps)
    steps = [annotate(s) for s in steps]
    ends = [max(r["end"] for r in s) - s[0]["start"] for s in steps]
    print(f"== {a.label or a.trace}: {len(steps)} graph launches of {usual} kernels; span (first start to last end) "
          f"median {statistics.median(ends) / 1e3:.1f} us")
    per = collections.OrderedDict()
    for s in steps:
        sums = collections.defaultdict(lambda: [0, 0, 0, 0, 0])  # count, dur, advance, idle, early
        for r in s:
            v = sums[r["name"]]
            v[0] += 1
            v[1] += r["dur"]
            v[2] += r["advance"]
            v[3] += r["idle"]
            v[4] += r["early"]
        for k, v in sums.items():
            per.setdefault(k, []).append(v)
    table = []
    for k, vs in per.items():
        med = [statistics.median(v[i] for v in vs) for i in range(5)]
        table.append({"kernel": k, "per_step": med[0], "dur_us": med[1] / 1e3, "advance_us": med[2] / 1e3,
                      "idle_us": med[3] / 1e3, "early_us": med[4] / 1e3})
    table.sort(key=lambda t: -t["advance_us"])
    print("| kernel | per step | duration us | advance us | idle before us | beside predecessor us |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| {t['kernel'][:70]} | {t['per_step']:.0f} | {t['dur_us']:.1f} | {t['advance_us']:.1f} | "
              f"{t['idle_us']:.1f} | {t['early_us']:.1f} |")
    tot = {k: sum(t[k] for t in table) for k in ("dur_us", "advance_us", "idle_us", "early_us")}
    print(f"| (all) | {sum(t['per_step'] for t in table):.0f} | {tot['dur_us']:.1f} | {tot['advance_us']:.1f} | "
          f"{tot['idle_us']:.1f} | {tot['early_us']:.1f} |")
    if gaps:
        print(f"between steps: idle gap median {statistics.median(gaps) / 1e3:.1f} us (host-bound while traced); "
              "outside the graph: " + (", ".join(f"{k} {statistics.median(v) / 1e3:.1f} us x{len(v)}"
                                               for k, v in sorted(outside.items())) or "nothing"))
    # One layer of the median step.
    med_step = sorted(steps, key=lambda s: max(r["end"] for r in s) - s[0]["start"])[len(steps) // 2]
    marks = [i for i, r in enumerate(med_step) if a.layer_kernel in r["name"]]
    layer = []
    if len(marks) > a.layer + 1:
        i0, i1 = marks[a.layer], marks[a.layer + 1]
        t0 = med_step[i0]["start"]
        print(f"-- layer {a.layer} of the median step (us from its {a.layer_kernel} start; "
              f"{(med_step[i1]['start'] - t0) / 1e3:.1f} us to the next)")
        print("| kernel | grid | start | end | duration | advance |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in med_step[i0:i1]:
            row = {"kernel": r["name"], "grid": r["grid"], "start_us": (r["start"] - t0) / 1e3,
                   "end_us": (r["end"] - t0) / 1e3, "dur_us": r["dur"] / 1e3, "advance_us": r["advance"] / 1e3}
            layer.append(row)
            print(f"| {row['kernel'][:60]} | {row['grid']} | {row['start_us']:.2f} | {row['end_us']:.2f} | "
                  f"{row['dur_us']:.2f} | {row['advance_us']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"label": a.label, "kernels_per_step": usual, "steps": len(steps),
                       "span_us": [e / 1e3 for e in ends], "per_kernel": table, "layer": layer,
                       "gap_us": [g / 1e3 for g in gaps],
                       "outside_us": {k: [x / 1e3 for x in v] for k, v in outside.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
