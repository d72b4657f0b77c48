#!/usr/bin/env bash
# s37-6: the MoE combine folded into the next layer's input norm (moe_ffn_norm, combine_norm_kernel):
# its bitwise test and the GPU suites, then the model A/B (DEEPINFER_CUDA_MOE_NORM_FOLD=0 vs 1).
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { (cd $OUT && tar czf $REAL_OUT/s37_6.tgz --exclude='*.tsv' .); }
t0=$(date +%s)
timeout 330 bash -c 'source scripts/device/build_device.sh; device_build deepinfer deepinfer_tests' > $OUT/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"; grep -E "error" $OUT/build.log | head; save
T=build-device/tests/deepinfer_tests
run() { local name=$1 lim=$2; shift 2; timeout $lim "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 )) s $(grep -E '^\[  (PASSED|FAILED)' $OUT/$name.log | tr '\n' ' ' | cut -c1-300)"; grep -E "^\[  FAILED" $OUT/$name.log | head; save; }
run fold 90 $T --gtest_filter='CudaOps.MoeFfnNorm*'
run ops 150 $T --gtest_filter='CudaOps.*:CudaMlaSublayer.*:CudaFp8Gemm.*:CudaMoeSort.*'
run fixtures 120 $T --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
ROUNDS=2 BATCHES=1,32 PREFILL=4096 BUILD=0 timeout 200 bash scripts/device/bench_lab.sh fold8,fp8,default \
  apart8,fp8,default,DEEPINFER_CUDA_MOE_NORM_FOLD=0 fold16,bf16,default apart16,bf16,default,DEEPINFER_CUDA_MOE_NORM_FOLD=0 > $OUT/ab.txt 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; grep "^|" $OUT/ab.txt; save
run inv 60 $T --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
run runtime 150 env DEEPINFER_TEST_DEVICE=cuda $T --gtest_filter='LLMEngine.*'
