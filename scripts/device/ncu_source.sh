#!/usr/bin/env bash
# On the GPU machine: where one kernel's warps wait, instruction by instruction — Nsight Compute's
# warp-stall sampling (SourceCounters) of one launch, exported per SASS instruction; prints the
# most-sampled instructions with their stall reasons, and the sampled totals per reason.
# Usage: bash scripts/device/ncu_source.sh NAME KERNEL_REGEX LAUNCH_SKIP -- COMMAND...
# Output: $OUT/ncu_src_NAME.{ncu-rep,csv,txt}, _details.txt (speed of light, warp states); the
# summary on stdout.
set -uo pipefail
name=$1 regex=$2 skip=$3; shift 4
OUT=${OUT:-/tmp/out}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
timeout 240 "$NCU" --clock-control none --kernel-name-base demangled -k "regex:$regex" --launch-skip "$skip" \
  --launch-count 1 --section SpeedOfLight --section SourceCounters --section WarpStateStats -f -o "$OUT/ncu_src_$name" \
  "$@" > "$OUT/ncu_src_$name.log" 2>&1
echo "== ncu source $name rc=$?"
"$NCU" -i "$OUT/ncu_src_$name.ncu-rep" --page details > "$OUT/ncu_src_${name}_details.txt" 2>&1
grep -E "Duration|Throughput|Eligible|Issued Warp|Warp Cycles Per Issued" "$OUT/ncu_src_${name}_details.txt" | head -12
"$NCU" -i "$OUT/ncu_src_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_src_$name.csv" 2>&1
python3 - "$OUT/ncu_src_$name.csv" <<'PY' | tee "$OUT/ncu_src_$name.txt"
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"#') or l.startswith('"Address') or 'Source' in l[:40]), 0)
rows = list(csv.reader(lines[start:]))
if not rows:
    sys.exit("no rows")
head = rows[0]
print("columns:", [h for h in head][:60])
def num(x):
    try: return float(x.replace(",", ""))
    except Exception: return 0.0
all_col = next((i for i, h in enumerate(head) if "Warp Stall Sampling (All" in h), None)
src_col = next((i for i, h in enumerate(head) if h in ("Source", "SASS")), 1)
if all_col is None:
    sys.exit("no stall sampling column")
stall_cols = [i for i, h in enumerate(head) if h.startswith("stall_") or "Stall" in h and i != all_col]
body = [r for r in rows[1:] if len(r) == len(head)]
total = sum(num(r[all_col]) for r in body)
print(f"instructions {len(body)}, samples {total:.0f}")
sums = {head[i]: sum(num(r[i]) for r in body) for i in stall_cols}
for k, v in sorted(sums.items(), key=lambda kv: -kv[1])[:14]:
    print(f"  {k:60s} {v:10.0f} {100 * v / max(total, 1):5.1f} %")
for r in sorted(body, key=lambda r: -num(r[all_col]))[:30]:
    top = sorted(((head[i], num(r[i])) for i in stall_cols), key=lambda kv: -kv[1])[:3]
    print(f"{num(r[all_col]):8.0f} {100 * num(r[all_col]) / max(total, 1):5.1f}%  {r[0]:>6s}  {r[src_col][:70]:70s} " +
          ", ".join(f"{k.replace('stall_', '')}={v:.0f}" for k, v in top if v > 0))
PY
