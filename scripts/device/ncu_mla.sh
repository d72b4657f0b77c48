#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on one MLA decode call of bench/mla_decode_bench (H=16, one
# row × 32K keys by default): per-kernel duration, DRAM throughput, warp-state (stall) statistics,
# and the SASS lines with the most stall samples of the split kernel.
# Usage: bash scripts/device/ncu_mla.sh [CASE] [HEADS]   (defaults 1:32768 16)
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build mla_decode_bench
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
case=${1:-1:32768}
heads=${2:-16}
timeout 300 "$NCU" --clock-control none -k "regex:mla" --launch-skip 6 --launch-count 3 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters --import-source no \
  -o "$OUT/ncu_mla" -f build-device/bench/mla_decode_bench --heads "$heads" --cases "$case" --reps 1 \
  > "$OUT/ncu_mla_run.log" 2>&1
echo "ncu rc=$?"; tail -3 "$OUT/ncu_mla_run.log"
"$NCU" --import "$OUT/ncu_mla.ncu-rep" --print-units base > "$OUT/ncu_mla_details.txt" 2>&1
grep -E "^  [a-z_].*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Eligible Warps" "$OUT/ncu_mla_details.txt" | head -80
"$NCU" --import "$OUT/ncu_mla.ncu-rep" --page source --csv --print-source sass -k "regex:split" > "$OUT/ncu_mla_sass.csv" 2>&1
python3 - "$OUT/ncu_mla_sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if "Source" in r), None)
if hdr is None: print("no SASS table"); sys.exit()
h = rows[hdr]
col = next((i for i, c in enumerate(h) if "Warp Stall Sampling (All" in c), None)
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return None
body = [r for r in rows[hdr + 1:] if len(r) == len(h) and num(r[col]) is not None]
src = h.index("Source")
reasons = [i for i, c in enumerate(h) if c.startswith("stall_") or "Stall" in c and i != col]
tot = sum(num(r[col]) for r in body) or 1
print(f"SASS lines {len(body)}, stall samples {tot:.0f}; top 30:")
for r in sorted(body, key=lambda r: -num(r[col]))[:30]:
    print(f"{num(r[col])/tot*100:5.1f}%  {r[src][:90]}")
PY
