#!/usr/bin/env bash
# On the GPU machine: the checks and the A/B figures for DEEPINFER_CUDA_INVARIANT_FUSED_SMALL (the
# batch-invariant mode's decode-sized bf16 linears and fp32 router in one launch each:
# small_m_gemm_f32a, gemm_f32_ordered_fused; the same bits as the conversion + GEMM + split sum).
# Builds deepinfer_tests and deepinfer, runs the bitwise kernel tests and the invariance suites,
# then `deepinfer bench` decode steps in the invariant mode with the switch on and off (and the
# default mode for the overhead), bf16 and FP8.
# DEEPINFER_CUDA_INVARIANT_FUSED_ROUTER likewise for the router alone.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BATCHES=1,8,32] [EXTRA="label,dtype,mode,ENV=V ..."] bash scripts/device/fused_small_lab.sh
# Output: $OUT/tests.log, $OUT/bench_lab.tgz, tables on stdout.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
t0=$(date +%s)
device_build deepinfer_tests deepinfer
echo "build: $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
"$T" --gtest_filter='CudaTiledGemmV3.*:CudaInvariantOps.*:CudaBatchInvariance.*' > "$OUT/tests.log" 2>&1
rc=$?
echo "tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|differ' "$OUT/tests.log" | head -20
# shellcheck disable=SC2086  # EXTRA: zero or more settings
PREFILL="" BATCHES=${BATCHES:-1,8,32} BUILD=0 bash "$(dirname "$0")/bench_lab.sh" \
  bf16,bf16,default bf16_inv,bf16,invariant bf16_inv_nosmall,bf16,invariant,DEEPINFER_CUDA_INVARIANT_FUSED_SMALL=0 \
  bf16_inv_norouter,bf16,invariant,DEEPINFER_CUDA_INVARIANT_FUSED_ROUTER=0 \
  bf16_inv_off,bf16,invariant,DEEPINFER_CUDA_INVARIANT_FUSED_SMALL=0,DEEPINFER_CUDA_INVARIANT_FUSED_ROUTER=0 \
  fp8,fp8,default fp8_inv,fp8,invariant fp8_inv_off,fp8,invariant,DEEPINFER_CUDA_INVARIANT_FUSED_ROUTER=0 ${EXTRA:-}
exit $rc
