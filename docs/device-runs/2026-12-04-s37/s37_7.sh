#!/usr/bin/env bash
# s37-7: the fold from 512 tokens only; FP8 and bf16 4K prefill, fold vs apart, three rounds.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w7; mkdir -p $OUT
timeout 200 bash -c 'source scripts/device/build_device.sh; device_build deepinfer deepinfer_tests' > $OUT/build.log 2>&1
echo "build rc=$?"
timeout 90 build-device/tests/deepinfer_tests --gtest_filter='CudaOps.MoeFfnNorm*' > $OUT/fold.log 2>&1
echo "fold rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/fold.log | tr '\n' ' ')"
ROUNDS=3 BATCHES=1 PREFILL=4096 BUILD=0 timeout 330 bash scripts/device/bench_lab.sh fold8,fp8,default \
  apart8,fp8,default,DEEPINFER_CUDA_MOE_NORM_FOLD=0 fold16,bf16,default apart16,bf16,default,DEEPINFER_CUDA_MOE_NORM_FOLD=0 > $OUT/ab.txt 2>&1
echo "ab rc=$?"; grep "^|" $OUT/ab.txt
cd $OUT && tar czf $REAL_OUT/s37_7.tgz .
