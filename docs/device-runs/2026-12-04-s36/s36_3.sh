#!/usr/bin/env bash
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
source scripts/device/build_device.sh
device_build decode_gemm_bench
B=build-device/bench
for m in 0 1 2 0; do
  RING_LAB=$m timeout 30 $B/decode_gemm_bench --m 1 --only experts --reps 9 > $OUT/lab_m$m.jsonl
  echo "ring lab=$m: $(grep gemv_f32a $OUT/lab_m$m.jsonl | grep fp8 | sed -E 's/.*"name": "([a-z_]+)".*"us": ([0-9.]+).*"frac_of_copy": ([0-9.]+).*/\1 \2us \3/' | tr '\n' ' ')"
done
cd $OUT && tar czf $REAL_OUT/s36_3.tgz .
