#!/usr/bin/env bash
# s37-2: Nsight Compute detail on the FP8 4K prefill's memory-bound glue kernels (one layer's worth).
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
timeout 300 bash -c 'source scripts/device/build_device.sh; device_build deepinfer' > $OUT/build.log 2>&1
echo "build rc=$?"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
timeout 300 $NCU --clock-control none -k 'regex:silu_mul_quantize_g16|add_rms_norm_vec_kernel|combine_kernel|gather_quantized|mla_kv_write|sm80_xmma|quantize_bf16_rows' \
  --launch-skip 12 --launch-count 14 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats \
  --page details --csv --log-file $OUT/ncu_glue.csv $BIN bench --config $LITE --dtype fp8 --prefill 4096 \
  --prefill-reps 1 --decode-batch "" > $OUT/ncu_glue.log 2>&1
echo "ncu rc=$?"
python3 - $OUT/ncu_glue.csv <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')))
want = ["Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Achieved Occupancy",
        "Theoretical Occupancy", "Registers Per Thread", "Issue Slots Busy", "Executed Ipc Active",
        "No Eligible", "Eligible Warps Per Scheduler", "Active Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
        "Executed Instructions", "Block Size", "Grid Size", "L2 Hit Rate", "Mem Busy", "Max Bandwidth", "Waves Per SM",
        "Block Limit Registers", "Block Limit Shared Mem", "Block Limit Warps", "Dynamic Shared Memory Per Block"]
per = collections.OrderedDict()
for r in rows:
    key = (r["ID"], r["Kernel Name"].split("(")[0][:60])
    if r["Metric Name"] in want:
        per.setdefault(key, {})[r["Metric Name"]] = r["Metric Value"] + " " + r["Metric Unit"]
for (i, k), m in per.items():
    print(f"-- {i} {k}")
    print("   " + "; ".join(f"{n}={m[n]}" for n in want if n in m))
PY
cd $OUT && gzip -f ncu_glue.csv && tar czf $REAL_OUT/s37_2.tgz .
