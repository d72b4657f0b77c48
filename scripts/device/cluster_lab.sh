#!/usr/bin/env bash
# On the GPU machine: whether 2-block clusters (A tiles multicast to both blocks: a quarter less
# L2 traffic, the same bits) pay in the model's sustained, power-capped FP8 prefill — the
# isolated GEMM benchmarks (short bursts, higher clocks) found no gain (docs/perf.md version 11).
# Runs the FP8 GEMM tests (clusters 1 and 2, bitwise), the grouped GEMM at V2-Lite's expert
# shapes per cluster size, `deepinfer bench` FP8 prefills and a decode step with
# DEEPINFER_CUDA_FP8_CLUSTER=0 / 2 (± DEEPINFER_CUDA_FP8_STAGGER), then the 4K FP8 prefill's
# kernel times (ncu_prefill.sh).
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [PREFILL=4096,16384] [BATCHES=32] [NCU=1] bash scripts/device/cluster_lab.sh
# Output: $OUT/tests.log, $OUT/lab_grouped_clusters.jsonl, $OUT/bench_lab.tgz,
# $OUT/ncu_prefill_fp8.csv; tables on stdout.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
t0=$(date +%s)
device_build deepinfer_tests deepinfer fp8_gemm_bench
echo "build: $(( $(date +%s) - t0 )) s"
build-device/tests/deepinfer_tests --gtest_filter='CudaFp8Gemm.*:CudaTiledGemmV3.Fused*' > "$OUT/tests.log" 2>&1
rc=$?
echo "tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
timeout 150 build-device/bench/fp8_gemm_bench --model v2lite --grouped-only --m 4096,16384 --variants 3 --clusters 1,2 \
  > "$OUT/lab_grouped_clusters.jsonl" 2>&1
python3 - "$OUT/lab_grouped_clusters.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{") and '"name"' in line:
        r = json.loads(line)
        print("%-16s M=%6d cluster %d %9.1f us %7.1f TFLOP/s" % (r["name"], r["M"], r["cluster"], r["us"], r["tflops"]))
PY
PREFILL=${PREFILL:-4096,16384} BATCHES=${BATCHES:-32} BUILD=0 bash "$(dirname "$0")/bench_lab.sh" \
  fp8,fp8,default fp8_c2,fp8,default,DEEPINFER_CUDA_FP8_CLUSTER=2 \
  fp8_stagger,fp8,default,DEEPINFER_CUDA_FP8_STAGGER=1 \
  fp8_c2_stagger,fp8,default,DEEPINFER_CUDA_FP8_CLUSTER=2,DEEPINFER_CUDA_FP8_STAGGER=1
[ "${NCU:-1}" = 1 ] && bash "$(dirname "$0")/ncu_prefill.sh" fp8 4096
exit $rc
