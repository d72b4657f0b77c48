#!/usr/bin/env bash
# On the GPU machine: a session's closing call — scripts/device/gpu_run.sh invariant (the whole GPU
# suite and the standard figures), then a bench_lab.sh A/B of the backend switches named in
# SETTINGS (bench_lab's LABEL,DTYPE,MODE[,ENV=VALUE...] words; none: skipped), then, with NCU=1,
# the 4K FP8 prefill's kernel times (ncu_prefill.sh).
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   SETTINGS="fp8,fp8,default glu,fp8,default,DEEPINFER_CUDA_FP8_GLU=1" [PREFILL=4096] \
#     [BATCHES=1,32,256] [NCU=1] [DEVICE_TARGETS="deepinfer_tests deepinfer fp8_gemm_bench"] \
#     bash scripts/device/switches_lab.sh
# Output: $OUT/logs.tgz (the suite and figures), $OUT/bench_lab.tgz (the A/B), $OUT/ncu_prefill_fp8.csv;
# tables on stdout.
set -uo pipefail
DEVICE_TARGETS=${DEVICE_TARGETS:-deepinfer_tests deepinfer fp8_gemm_bench} bash "$(dirname "$0")/gpu_run.sh" invariant
rc=$?
# shellcheck disable=SC2086  # SETTINGS: zero or more bench_lab words
[ -n "${SETTINGS:-}" ] && PREFILL=${PREFILL-4096} BATCHES=${BATCHES:-1,32,256} BUILD=0 \
  bash "$(dirname "$0")/bench_lab.sh" $SETTINGS
[ "${NCU:-0}" = 1 ] && bash "$(dirname "$0")/ncu_prefill.sh" fp8 4096
exit $rc
