#!/usr/bin/env bash
# On the GPU machine: where one kernel's warps wait, instruction by instruction — Nsight Compute's
# warp-stall sampling (SourceCounters) of one launch, exported per SASS instruction; prints the
# most-sampled instructions with their stall reasons, and the sampled totals per reason.
# Usage: bash scripts/device/ncu_source.sh NAME KERNEL_REGEX LAUNCH_SKIP -- COMMAND...
# Output: $OUT/ncu_src_NAME.{ncu-rep,csv,txt}, _details.txt (speed of light, warp states); the
# summary on stdout (scripts/device/ncu_sass_summary.py).
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
python3 "$(dirname "$0")/ncu_sass_summary.py" "$OUT/ncu_src_$name.csv" | tee "$OUT/ncu_src_$name.txt"
