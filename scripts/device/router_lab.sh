#!/usr/bin/env bash
# On the GPU machine: the default mode's fp32 router GEMM, 3xTF32 kernel against cuBLAS — its
# tests (CudaRouterGemm, and the counting sort's CudaMoeSort), the CUDA fixtures with the kernel
# from one row, a bench_lab A/B at prefill 4K / 16K in FP8 and bf16, and the kernel's Nsight
# Compute time at 4K (FP8).
# Usage (device `run`, carry [".device_carry", "third_party"]): bash scripts/device/router_lab.sh
# Output: $OUT/router_tests.log, $OUT/router_fixtures.log, $OUT/bench_lab.tgz, $OUT/ncu_router.log.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer_tests deepinfer
T=build-device/tests/deepinfer_tests
"$T" --gtest_filter='CudaRouterGemm.*:CudaMoeSort.*' > "$OUT/router_tests.log" 2>&1
echo "router tests: rc=$?"; grep -E "3xTF32|^\[  (PASSED|FAILED)|Failure" "$OUT/router_tests.log" | head -20
DEEPINFER_CUDA_ROUTER_TC_ROWS=1 "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*:CudaOps.Moe*' \
  > "$OUT/router_fixtures.log" 2>&1
echo "fixtures with the 3xTF32 router from one row: rc=$?"; grep -E "^\[  (PASSED|FAILED)" "$OUT/router_fixtures.log"
PREFILL=4096,16384 BATCHES=256 BUILD=0 bash "$(dirname "$0")/bench_lab.sh" fp8,fp8,default \
  fp8_cublas,fp8,default,DEEPINFER_CUDA_ROUTER_TC_ROWS=0 bf16,bf16,default bf16_cublas,bf16,default,DEEPINFER_CUDA_ROUTER_TC_ROWS=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 120 "$NCU" --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  -k 'regex:3xtf32|xmma_gemm_f32' --launch-skip 26 --launch-count 8 build-device/src/tools/deepinfer bench \
  --config bench/configs/deepseek_v2_lite.json --dtype fp8 --prefill 4096 --prefill-reps 1 --decode-batch "" \
  > "$OUT/ncu_router.log" 2>&1
echo "ncu: rc=$?"; grep -E "3xtf32|xmma|duration|dram__" "$OUT/ncu_router.log" | head -24
