#!/usr/bin/env bash
# On the GPU machine: the checks and the A/B figures that decide the defaults of the backend
# switches still off (docs/perf.md, version 15): DEEPINFER_CUDA_FP8_GLU (the FP8 GLU-quantize
# epilogue), DEEPINFER_CUDA_ROUTER_TILED (the invariant mode's tiled router) and
# DEEPINFER_CUDA_INVARIANT_MOE_CHAIN (the invariant bf16 MoE in one K chain). First
# scripts/device/gpu_run.sh none — the whole GPU suite, including its cuda_next /
# cuda_runtime_next runs with all three on —, then bench_lab.sh with each switch off and on.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [DEVICE_TARGETS="deepinfer_tests deepinfer"] bash scripts/device/switches_lab.sh
# Output: $OUT/logs.tgz (the suite), $OUT/bench_lab.tgz (the benches), the tables on stdout.
set -uo pipefail
DEVICE_TARGETS=${DEVICE_TARGETS:-deepinfer_tests deepinfer} bash "$(dirname "$0")/gpu_run.sh" none
rc=$?
PREFILL=${PREFILL:-4096,16384} BATCHES=${BATCHES:-1,32,256} BUILD=0 bash "$(dirname "$0")/bench_lab.sh" \
  fp8,fp8,default fp8_glu,fp8,default,DEEPINFER_CUDA_FP8_GLU=1 \
  bf16_inv,bf16,invariant bf16_inv_next,bf16,invariant,DEEPINFER_CUDA_ROUTER_TILED=1,DEEPINFER_CUDA_INVARIANT_MOE_CHAIN=1 \
  fp8_inv,fp8,invariant fp8_inv_next,fp8,invariant,DEEPINFER_CUDA_ROUTER_TILED=1,DEEPINFER_CUDA_FP8_GLU=1
exit $rc
