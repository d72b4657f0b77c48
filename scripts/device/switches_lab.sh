#!/usr/bin/env bash
# On the GPU machine: the checks and the A/B figures that decide the defaults of the backend
# switches still unmeasured (docs/perf.md, version 16): DEEPINFER_CUDA_W8A8_EARLY_W (the dense
# W8A8 GEMM's first weight stages before its PDL wait) and DEEPINFER_CUDA_GEMV_TC_MIN_UNITS (the
# dense FP8 GEMV's tensor-core form for V2-Lite's q | kv_a and o_proj at B = 1). First scripts/device/gpu_run.sh
# invariant — the whole GPU suite (its cuda_next / cuda_runtime_next runs have the switch on)
# and the standard figures —, then bench_lab.sh with the switch off and on at the decode sizes
# where the W8A8 linears stream each weight tile through one SM.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [DEVICE_TARGETS="deepinfer_tests deepinfer"] bash scripts/device/switches_lab.sh
# Output: $OUT/logs.tgz (the suite and figures), $OUT/bench_lab.tgz (the A/B), tables on stdout.
set -uo pipefail
DEVICE_TARGETS=${DEVICE_TARGETS:-deepinfer_tests deepinfer} bash "$(dirname "$0")/gpu_run.sh" invariant
rc=$?
PREFILL=${PREFILL:-} BATCHES=${BATCHES:-1,8,32,256} BUILD=0 bash "$(dirname "$0")/bench_lab.sh" \
  fp8,fp8,default fp8_early,fp8,default,DEEPINFER_CUDA_W8A8_EARLY_W=1 fp8_tc64,fp8,default,DEEPINFER_CUDA_GEMV_TC_MIN_UNITS=64 \
  fp8_inv,fp8,invariant fp8_inv_early,fp8,invariant,DEEPINFER_CUDA_W8A8_EARLY_W=1
exit $rc
