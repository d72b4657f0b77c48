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
python3 "$(dirname "$0")/ncu_sass_summary.py" "$OUT/ncu_mla_sass.csv"
