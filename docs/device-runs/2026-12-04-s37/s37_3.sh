#!/usr/bin/env bash
# s37-3: the GPU suites touched by 52f1c94 (quantizers, RoPE, the quantized gather).
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
timeout 400 bash -c 'source scripts/device/build_device.sh; device_build deepinfer_tests' > $OUT/build.log 2>&1
echo "build rc=$?"; grep -E "error" $OUT/build.log | head
T=build-device/tests/deepinfer_tests
run() { local name=$1; shift; timeout 300 "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$name.log | tr '\n' ' ' | cut -c1-300)"; grep -E "^\[  FAILED" $OUT/$name.log | head; }
run ops $T --gtest_filter='CudaOps.*:CudaMlaSublayer.*:CudaMlaPrefill.*:CudaFp8Gemm.*:CudaMoeSort.*:Fp8ScaleDiv.*'
grep -E "silu_mul_quantize|moe w8a8" $OUT/ops.log | head
run inv $T --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
run fixtures $T --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
cd $OUT && tar czf $REAL_OUT/s37_3.tgz .
