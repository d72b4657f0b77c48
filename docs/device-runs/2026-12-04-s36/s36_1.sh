#!/usr/bin/env bash
# s36-1: the grouped FP8 tensor-core GEMV under Nsight Compute (pipes, stalls) in its lab,
# the lab's figures, moe_one FP8 under ncu, and FP8 moe_one's host gap by the kernel trace.
set -uo pipefail
source scripts/device/build_device.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
device_build deepinfer deepinfer_kernel_trace decode_gemm_bench moe_one_bench
echo "build $(( $(date +%s) - t0 )) s"
B=build-device/bench
$B/decode_gemm_bench --m 1 --only experts --reps 9 | tee $OUT/lab_experts.jsonl | grep fp8
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
MET='regex:sm__inst_executed_pipe_.*\.sum$,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,dram__bytes_read.sum.per_second,gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active'
for shape in experts_gate_up experts_down; do
  timeout 200 $NCU --clock-control none --cache-control none -k regex:gemv_fp8_tc --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --print-details all \
    --metrics "$MET" $B/decode_gemm_bench --m 1 --only $shape --reps 3 > $OUT/ncu_$shape.log 2>&1
  echo "== ncu $shape rc=$?"
done
timeout 200 $NCU --clock-control none --cache-control none -k regex:moe_one --launch-skip 20 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --print-details all \
  --metrics "$MET" $B/moe_one_bench --fp8 --reps 3 > $OUT/ncu_moe_one_fp8.log 2>&1
echo "== ncu moe_one fp8 rc=$?"
for f in $OUT/ncu_*.log; do echo "#### $f"; grep -E "pipe|Duration|dram__|inst_executed.sum |Stall|Warp Cycles|Issued|Eligible|registers|warps_active|No Eligible" $f | grep -v "^ *$" | head -70; done
BUILD=0 UNTRACED=1 bash scripts/device/kernel_timeline.sh grouped,fp8,default moe1,fp8,default,DEEPINFER_CUDA_MOE_ONE_FP8=1 2>&1 | tail -60
cd $OUT && tar czf /tmp/s36_1.tgz --exclude='*.tgz' . && mv /tmp/s36_1.tgz $OUT/
