#!/usr/bin/env bash
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
B=build-device/bench
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
MET='regex:sm__inst_executed_pipe_.*\.sum$,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,dram__bytes_read.sum.per_second,gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active'
$B/decode_gemm_bench --m 1 --only experts --reps 9 > $OUT/lab_experts.jsonl; grep fp8 $OUT/lab_experts.jsonl
for shape in experts_gate_up experts_down; do
  timeout 200 $NCU --clock-control none --cache-control none -k regex:gemv_fp8_tc --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --print-details all \
    --metrics "$MET" $B/decode_gemm_bench --m 1 --only $shape --reps 3 > $OUT/ncu_$shape.log 2>&1
  echo "== ncu $shape rc=$?"
done
for f in $OUT/ncu_experts*.log; do echo "#### $f"; grep -E "inst_executed_pipe_(alu|fma|fmaheavy|lsu|tensor_op_hmma|xu|adu|cbu|uniform)\.sum|cycles_active|Duration|dram__|inst_executed.sum |Stall|Warp Cycles|Issued Warp|Eligible Warps|registers|warps_active|No Eligible" $f | grep -v "^ *$" | grep -v " 0$" | head -60; done
cp build-device/src/backend/CMakeFiles/di_backend.dir/cuda/cuda_gemv_fp8_tc.cu.o $OUT/ 2>/dev/null
cuobjdump -sass $OUT/cuda_gemv_fp8_tc.cu.o > $OUT/gemv_fp8_tc.sass 2>&1; grep -c F2FP $OUT/gemv_fp8_tc.sass
cd $OUT && tar czf $REAL_OUT/s36_1b.tgz .
