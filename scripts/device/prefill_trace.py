#!/usr/bin/env python3
"""Where an eager (ungraphed) prefill's device time goes, from a kernel trace (src/tools/kernel_trace.cpp).

A prefill is the kernels from one embedding launch to the next; the last --runs of them (the timed
ones) are read. For each, against the frontier F (the latest end of the kernels before it, sorted
by start), a kernel's advance max(0, end - F) is the span it adds and its idle max(0, start - F)
the device's idle time before it (no kernel running: launch gaps, host waits). Output: per run the
span, the kernels' summed duration and the idle total; per kernel name (median run) its count,
duration, advance and idle, largest advance first.

Usage: prefill_trace.py TRACE.tsv[.gz] [--runs 3] [--top 30] [--label TEXT] [--json OUT.json]
"""
import argparse
import collections
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_timeline import annotate, load  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = sorted((r for r in load(a.trace) if not r["name"].startswith("[")), key=lambda r: r["start"])
    starts = [i for i, r in enumerate(rows) if r["name"].startswith("embedding_kernel")]
    if len(starts) < 2:
        sys.exit(f"{a.trace}: {len(starts)} embedding launches; need a prefill after the first")
    bounds = list(zip(starts, starts[1:] + [len(rows)]))[-a.runs:]
    runs = []
    for i0, i1 in bounds:
        # a run ends at the last kernel before the next embedding; drop fills after the bench's last run
        run = [r for r in rows[i0:i1] if not r["name"].startswith("fill_random")]
        runs.append(annotate(run))
    summary = []
    for run in runs:
        span = max(r["end"] for r in run) - run[0]["start"]
        summary.append({"span_us": span / 1e3, "kernel_us": sum(r["dur"] for r in run) / 1e3,
                        "idle_us": sum(r["idle"] for r in run) / 1e3, "kernels": len(run)})
        s = summary[-1]
        print(f"== {a.label or a.trace}: span {s['span_us'] / 1e3:.3f} ms, kernels {s['kernel_us'] / 1e3:.3f} ms "
              f"({s['kernels']}), idle {s['idle_us'] / 1e3:.3f} ms")
    med = sorted(runs, key=lambda run: max(r["end"] for r in run) - run[0]["start"])[len(runs) // 2]
    per = collections.defaultdict(lambda: [0, 0, 0, 0])  # count, dur, advance, idle (ns)
    for r in med:
        v = per[r["name"][:90]]
        v[0] += 1
        v[1] += r["dur"]
        v[2] += r["advance"]
        v[3] += r["idle"]
    table = sorted(per.items(), key=lambda kv: -kv[1][2])
    print(f"{'advance ms':>10} {'dur ms':>8} {'idle ms':>8} {'n':>5} {'us each':>8}  kernel (median run)")
    for name, (n, dur, adv, idle) in table[:a.top]:
        print(f"{adv / 1e6:10.3f} {dur / 1e6:8.3f} {idle / 1e6:8.3f} {n:5d} {dur / n / 1e3:8.1f}  {name}")
    if a.json:
        json.dump({"label": a.label, "runs": summary,
                   "kernels": [{"name": k, "count": v[0], "dur_us": v[1] / 1e3, "advance_us": v[2] / 1e3,
                                "idle_us": v[3] / 1e3} for k, v in table]}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
