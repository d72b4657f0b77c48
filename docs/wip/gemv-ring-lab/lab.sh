#!/usr/bin/env bash
# On the GPU machine, with ring-lab-modes.patch applied (git apply docs/wip/gemv-ring-lab/ring-lab-modes.patch):
# the ring-fed FP8 GEMV's lab modes (RING_LAB: 0 as main, 1 no dot, 2 no dot and no A staging,
# 3 the integer e4m3 widening, 4 W8A8 on e4m3 MMAs) in decode_gemm_bench at one token, and mode 3's parity tests.
# Usage (device `run`, carry [".device_carry"]): bash docs/wip/gemv-ring-lab/lab.sh
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
source scripts/device/build_device.sh
device_build decode_gemm_bench deepinfer_tests
B=build-device/bench
timeout 30 $B/decode_gemm_bench --m 1 --only experts --reps 9 > $OUT/lab_tc.jsonl  # the register-buffered form
echo "tc form: $(grep gemv_f32a $OUT/lab_tc.jsonl | grep fp8 | sed -E 's/.*"name": "([a-z_]+)".*"us": ([0-9.]+).*"frac_of_copy": ([0-9.]+).*/\1 \2us \3/' | tr '\n' ' ')"
for m in 0 3 4 0 3 4 1 2; do
  RING_LAB=$m timeout 30 $B/decode_gemm_bench --ring --m 1 --only experts --reps 9 > $OUT/lab_m$m.jsonl
  echo "ring lab=$m: $(grep gemv_f32a $OUT/lab_m$m.jsonl | grep fp8 | sed -E 's/.*"name": "([a-z_]+)".*"us": ([0-9.]+).*"frac_of_copy": ([0-9.]+).*/\1 \2us \3/' | tr '\n' ' ')"
done
RING_LAB=3 timeout 120 build-device/tests/deepinfer_tests --gtest_filter='CudaOps.DecodeGemv*' > $OUT/tests_m3.log 2>&1
echo "mode 3 tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests_m3.log | tr '\n' ' ')"
cd $OUT && tar czf $REAL_OUT/ring_lab.tgz .
