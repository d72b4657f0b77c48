#!/usr/bin/env bash
# s36-2: the ring-fed FP8 GEMV (cuda_gemv_fp8_ring.cu): tests, lab A/B, model A/B, timeline.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
source scripts/device/build_device.sh
t0=$(date +%s)
device_build deepinfer deepinfer_tests decode_gemm_bench
echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests B=build-device/bench D=build-device/src/tools/deepinfer
timeout 30 $B/decode_gemm_bench --m 1 --only experts --reps 3 > $OUT/lab_first.jsonl 2>&1; rc=$?; echo "lab first rc=$rc"; grep gemv_f32a $OUT/lab_first.jsonl | grep fp8
[ $rc = 0 ] || { cd $OUT && tar czf $REAL_OUT/s36_2.tgz .; exit 1; }
timeout 150 $T --gtest_filter='CudaOps.DecodeGemv*:CudaOps.Moe*:Fixtures/GoldenFixtureCuda.*:CudaModelParity.*' > $OUT/tests.log 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests.log | tr '\n' ' ')"; grep -E "FAILED|Failure|rel_err|error" $OUT/tests.log | head -20
for r in 1; do
  for v in 1 0; do
    timeout 60 env DEEPINFER_CUDA_GEMV_RING=$v $B/decode_gemm_bench --m 1 --only experts --reps 9 > $OUT/lab_ring${v}_$r.jsonl
    echo "lab ring=$v r$r: $(grep gemv_f32a $OUT/lab_ring${v}_$r.jsonl | grep fp8 | sed -E 's/.*"name": "([a-z_]+)".*"us": ([0-9.]+).*"frac_of_copy": ([0-9.]+).*/\1 \2us \3/' | tr '\n' ' ')"
  done
done
LITE=bench/configs/deepseek_v2_lite.json
for r in 1 2; do
  for v in 1 0; do
    DEEPINFER_CUDA_GEMV_RING=$v timeout 100 $D bench --config $LITE --dtype fp8 --prefill "" --decode-batch 1,32 --context 512 --json $OUT/model_ring${v}_$r.json > $OUT/model_ring${v}_$r.log 2>&1
    echo "model fp8 ring=$v r$r: $(python3 -c "import json,sys; print(' '.join(f\"B{x.get('batch')}={x.get('ms_per_step',0):.3f}\" for x in json.load(open(sys.argv[1]))['results'] if x.get('phase')=='decode'))" $OUT/model_ring${v}_$r.json)"
  done
done
cd $OUT && tar czf $REAL_OUT/s36_2.tgz .
