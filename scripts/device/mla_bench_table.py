#!/usr/bin/env python3
"""bench/mla_decode_bench's JSON lines (a file or stdin) as a table: time, bytes per second
against the copy rate and FLOPs per second against the bf16 GEMM rate of the same run."""
import json
import sys

src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
for line in src:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r["kernel"] != "deepinfer_mla_decode":
        print("  " + line.strip())
        continue
    print("  H %3d  %3d x %6d  %9.2f us  %6.1f GB/s (%.3f of copy)  %6.1f TFLOP/s (%.3f of gemm)" % (
        r["H"], r["rows"], r["context"], r["us"], r["gbps"], r["frac_of_copy"], r["tflops"], r["frac_of_gemm"]))
