#!/usr/bin/env bash
# On the GPU machine: the batch-invariant MLA decode's keys per split (DEEPINFER_CUDA_MLA_INVARIANT_SPLIT,
# default 64 since docs/perf.md version 30) — the identity suites with a candidate value, then the
# invariant decode steps at 512 and 4,096 keys of context with each value (version 16).
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [SPLITS="128 64 32"] [CANDIDATE=32] bash scripts/device/mla_split_lab.sh
# Output: $OUT/inv_*.log, $OUT/bench_lab.tgz (per context), the tables on stdout.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer_tests deepinfer
T=build-device/tests/deepinfer_tests
for keys in ${CANDIDATE:-32}; do
  env DEEPINFER_CUDA_MLA_INVARIANT_SPLIT="$keys" "$T" --gtest_filter='CudaBatchInvariance.*:CudaInvariantOps.*' \
    > "$OUT/inv_ops_$keys.log" 2>&1
  echo "invariance split $keys: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/inv_ops_$keys.log" | tr '\n' ' ')"
  env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_MLA_INVARIANT_SPLIT="$keys" "$T" \
    --gtest_filter='LLMEngine.BatchInvariant*:LLMEngine.ChunkedPrefill*:LLMEngine.PrefixCache*:LLMEngine.Preemption*:LLMEngine.SecondTurn*' \
    > "$OUT/inv_runtime_$keys.log" 2>&1
  echo "runtime split $keys: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/inv_runtime_$keys.log" | tr '\n' ' ')"
done
for ctx in 512 4096; do
  specs=()
  for keys in ${SPLITS:-128 64 32}; do
    specs+=("bf16_s${keys},bf16,invariant,DEEPINFER_CUDA_MLA_INVARIANT_SPLIT=$keys")
    specs+=("fp8_s${keys},fp8,invariant,DEEPINFER_CUDA_MLA_INVARIANT_SPLIT=$keys")
  done
  echo "== context $ctx"
  PREFILL="" BATCHES=${BATCHES:-1,32,256} CONTEXT=$ctx BUILD=0 bash "$(dirname "$0")/bench_lab.sh" "${specs[@]}"
  mv "$OUT/bench_lab.tgz" "$OUT/bench_lab_ctx$ctx.tgz"
done
