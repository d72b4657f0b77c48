#!/usr/bin/env bash
# On the GPU machine: Nsight Compute's view of the MoE's grouped FP8 GEMMs inside a V2-Lite FP8
# prefill (the gate|up and down launches of one layer): speed of light (SM, L2, DRAM
# throughput), the tensor pipe's activity, the memory pipes and the warps' stall reasons — what
# bounds the kernel at the model's shapes (docs/perf.md, version 17). From 16,384 routed rows
# the model runs the 128 × 192 form (fp8_wgmma_n192_kernel, version 35): either kernel matches.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BUILD=0] [NCU_DETAIL=1] [NCU_LINES=80] bash scripts/device/ncu_grouped.sh [TOKENS]
# Output: $OUT/ncu_grouped.log (the sections' tables), a summary on stdout.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
[ "${BUILD:-1}" = 1 ] && device_build deepinfer
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
# NCU_DETAIL=1: the gate|up launch only, with the scheduler's and the warps' stall breakdown and
# the sampled stall locations (SourceCounters), every table printed.
if [ "${NCU_DETAIL:-0}" = 1 ]; then
  sections="--launch-count 1 --section WarpStateStats --section SchedulerStats --section SourceCounters --print-details all"
else
  sections="--launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
    --section WarpStateStats --section Occupancy --section LaunchStats"
fi
# shellcheck disable=SC2086  # $sections: several flags
timeout 300 "$NCU" --clock-control none --cache-control none --kernel-name-base demangled \
  -k 'regex:fp8_wgmma_(kernel<\(bool\)1|n192_kernel)' --launch-skip 2 $sections \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,sm__cycles_elapsed.avg.per_second \
  build-device/src/tools/deepinfer bench --config bench/configs/deepseek_v2_lite.json --dtype fp8 \
  --prefill "${1:-4096}" --prefill-reps 1 --decode-batch "" > "$OUT/ncu_grouped.log" 2>&1
echo "== ncu grouped rc=$?"
grep -E "fp8_wgmma_kernel|fp8_wgmma_n192_kernel|Duration|Throughput|gmma|lts__t_bytes|cycles_elapsed|Stall|Warp Cycles|Issued|Eligible|Registers|Achieved Occupancy" \
  "$OUT/ncu_grouped.log" | head -"${NCU_LINES:-80}"
