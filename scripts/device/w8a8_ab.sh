#!/usr/bin/env bash
# On the GPU machine: the dense W8A8 switch (DEEPINFER_CUDA_FP8_W8A8, CudaBackend::linear_w8a8) —
# its tests, the FP8 golden fixtures with the switch on, then V2-Lite FP8 prefill 4,096 and
# decode B = 256 (graphs: M > 64 takes the form) with the switch off / on / off / on (same-machine
# A/B), op times of the prefill with it on. Logs and JSON under $OUT.
# Usage (device `run`, carry [".device_carry", "third_party"]): bash scripts/device/w8a8_ab.sh
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer_tests deepinfer
T=build-device/tests/deepinfer_tests BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
timeout 200 "$T" --gtest_filter='CudaOps.LinearW8a8*:CudaOps.MoeW8a8*:CudaFp8Gemm.*' > "$OUT/w8a8_tests.log" 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/w8a8_tests.log" | tr '\n' ' ')"
grep -E "linear w8a8|Failure" "$OUT/w8a8_tests.log" | head -10
DEEPINFER_CUDA_FP8_W8A8=1 timeout 300 "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*' \
  > "$OUT/w8a8_fixtures.log" 2>&1
echo "fixtures with W8A8 rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/w8a8_fixtures.log" | tr '\n' ' ')"
for i in 1 2; do
  for mode in 0 1; do
    DEEPINFER_CUDA_FP8_W8A8=$mode timeout 150 "$BIN" bench --config "$LITE" --dtype fp8 --prefill 4096 \
      --decode-batch 256 --json "$OUT/w8a8_${mode}_$i.json" > "$OUT/w8a8_${mode}_$i.log" 2>&1
    echo "W8A8=$mode run $i: $(grep -E '^(prefill|decode) ' "$OUT/w8a8_${mode}_$i.log" | tr -s ' ' | tr '\n' '|')"
  done
done
DEEPINFER_CUDA_FP8_W8A8=1 timeout 150 "$BIN" bench --config "$LITE" --dtype fp8 --prefill 4096 --decode-batch "" \
  --op-times --json "$OUT/w8a8_ops.json" > "$OUT/w8a8_ops.log" 2>&1
grep -A12 "^prefill" "$OUT/w8a8_ops.log" | head -14
