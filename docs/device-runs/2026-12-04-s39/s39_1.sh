#!/usr/bin/env bash
# s39-1: the kblock helpers (tests + A/B against s38 figures), the dense model-form GEMMs at 4K,
# Nsight Compute on the n192 grouped GEMM and on the q|kv_a dense GEMM.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/s39_1.tgz" -C $OUT . 2>/dev/null; }
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests fp8_gemm_bench; echo "build $(( $(date +%s) - t0 )) s"; save
T=build-device/tests/deepinfer_tests
run() { local name=$1; shift; local s=$(date +%s); timeout 300 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run ops "$T" --gtest_filter='CudaFp8Gemm.*:CudaOps.Moe*:CudaMoeSort.*'
run ops192 env DEEPINFER_CUDA_FP8_N192=1 "$T" --gtest_filter='CudaOps.Moe*'
run fixtures "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run inv "$T" --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
run runtime env DEEPINFER_TEST_DEVICE=cuda "$T" --gtest_filter='LLMEngine.*'
grep -E "FAILED|Failure" $OUT/ops*.log $OUT/fixtures.log $OUT/inv.log $OUT/runtime.log | head -20
save
B=build-device/bench/fp8_gemm_bench
timeout 120 $B --model v2lite --m 4096 --dense-only --variants 3 --clusters 1,2 --row-scales --model-form \
  --names q_kv_a,o_proj,shared2_gate_up,shared2_down,q_proj > $OUT/dense_f32.jsonl 2>&1
timeout 120 $B --model v2lite --m 4096 --dense-only --variants 3 --clusters 1,2 \
  --names q_kv_a,o_proj,shared2_gate_up,shared2_down,experts_gate_up > $OUT/dense_bf16.jsonl 2>&1
python3 - $OUT/dense_f32.jsonl $OUT/dense_bf16.jsonl <<'PY'
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        if not l.startswith('{"kernel": "deepinfer'): continue
        r=json.loads(l); print(f"{r['kernel']:34s} {r['name']:16s} M={r['M']} N={r['N']} K={r['K']} cl={r['cluster']} {r['us']:8.2f} us {r['tflops']:7.1f} TF")
PY
save
ROUNDS=2 BATCHES=32 PREFILL=4096 BUILD=0 timeout 200 bash scripts/device/bench_lab.sh helpers,fp8,default 2>&1 | tail -12
save
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
# q|kv_a model form, cluster 2: the 6th launch (after warm-up) of the first shape.
timeout 200 $NCU --clock-control none --kernel-name-base demangled -k 'regex:fp8_wgmma_kernel' --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --print-details all \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,dram__bytes_read.sum,dram__bytes_write.sum \
  $B --model v2lite --m 4096 --dense-only --variants 3 --clusters 2 --row-scales --model-form --names q_kv_a --reps 1 > $OUT/ncu_qkva.log 2>&1
echo "ncu qkva rc=$?"
grep -E "Duration|Throughput|gmma|lts__t_bytes|dram__bytes|Stall|Warp Cycles|Issued|Eligible|No Eligible|Active Warps" $OUT/ncu_qkva.log | head -50
save
BUILD=0 NCU_LINES=70 timeout 300 bash scripts/device/ncu_grouped.sh 4096
save
