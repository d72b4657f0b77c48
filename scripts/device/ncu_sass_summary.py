#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

Reads the CSV that `ncu -i REPORT --page source --csv --print-source sass` writes (its first table:
one row per SASS instruction, a "Warp Stall Sampling (All Samples)" column and one column per
stall reason) and prints the sampled totals per reason and the most-sampled instructions with
their top reasons. Used by scripts/device/ncu_source.sh and ncu_mla.sh.

Usage: ncu_sass_summary.py CSV [--top 30] [--reasons 14]
"""
import argparse
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--reasons", type=int, default=14)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv, errors="replace")))
    hdr = next((i for i, r in enumerate(rows) if "Source" in r or "SASS" in r), None)
    if hdr is None:
        sys.exit(f"{args.csv}: no SASS table (no 'Source' header row)")
    head = rows[hdr]
    all_col = next((i for i, h in enumerate(head) if "Warp Stall Sampling (All" in h), None)
    if all_col is None:
        sys.exit(f"{args.csv}: no 'Warp Stall Sampling (All Samples)' column")
    src_col = head.index("Source") if "Source" in head else head.index("SASS")
    # Per-reason columns (stall_*); the sampling totals ("Warp Stall Sampling (...)") are not reasons.
    reason_cols = [i for i, h in enumerate(head)
                   if "Warp Stall Sampling" not in h and (h.startswith("stall_") or "Stall" in h)]
    # The first table only: it ends at the first row of another width or without a sample count.
    body = []
    for r in rows[hdr + 1:]:
        if len(r) != len(head) or num(r[all_col]) is None:
            break
        body.append(r)
    total = sum(num(r[all_col]) for r in body) or 1.0
    print(f"instructions {len(body)}, stall samples {total:.0f}")
    sums = {head[i]: sum(num(r[i]) or 0.0 for r in body) for i in reason_cols}
    for k, v in sorted(sums.items(), key=lambda kv: -kv[1])[: args.reasons]:
        print(f"  {k:60s} {v:10.0f} {100 * v / total:5.1f} %")
    for r in sorted(body, key=lambda r: -num(r[all_col]))[: args.top]:
        top = sorted(((head[i], num(r[i]) or 0.0) for i in reason_cols), key=lambda kv: -kv[1])[:3]
        print(f"{num(r[all_col]):8.0f} {100 * num(r[all_col]) / total:5.1f}%  {r[0]:>6s}  {r[src_col][:70]:70s} "
              + ", ".join(f"{k.replace('stall_', '')}={v:.0f}" for k, v in top if v > 0))


if __name__ == "__main__":
    main()
