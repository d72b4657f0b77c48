#!/usr/bin/env bash
# On the GPU machine: the one-token persistent kernels' lab in one device call — build, their
# parity tests, their micro-benchmarks (timelines included; moe_one in bf16, FP8, its chain
# form and its W8A8 form, the sublayer in its default, FP8, invariant and invariant FP8 forms), then V2-Lite decode
# steps with each kernel on and off (bench_lab.sh; bf16, and FP8 with moe_one's opt-in FP8 form
# off and on and the sublayer's FP8 form off; the batch-invariant mode with moe_one's chain form on
# and off, and the sublayer's invariant form off; the mode in FP8 with the sublayer's invariant FP8
# form on and off, and moe_one's W8A8 form on and off; the default mode in FP8 with the W8A8 form).
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [CONTEXTS=512,4096,32768] [BATCHES=1,32] [LAB=1] bash scripts/device/persistent_lab.sh
# Output: the tests' verdicts, the benches' JSON lines and the step table on stdout; logs in $OUT.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer_tests deepinfer moe_one_bench mla_sublayer_bench
T=build-device/tests/deepinfer_tests
timeout 180 "$T" --gtest_filter='CudaMlaSublayer.*:CudaOps.MoeOne*:CudaOps.MoeFfn*:CudaOps.MoeRoute*:CudaInvariantOps.*:CudaModelParity.*:CudaBatchInvariance.*' \
  > "$OUT/persistent_tests.log" 2>&1
echo "== tests rc=$?"
grep -E "^\[  (FAILED|PASSED) |Failure|rel err" "$OUT/persistent_tests.log" | grep -v "^\[mla sublayer\]" | head -40
for f in "" --fp8 --chain --w8a8; do
  # shellcheck disable=SC2086  # f: zero or one flag
  timeout 60 build-device/bench/moe_one_bench $f
done > "$OUT/moe_one_bench.jsonl" 2>&1
echo "== moe_one_bench rc=$?"
cat "$OUT/moe_one_bench.jsonl"
for f in "" --fp8 --invariant "--invariant --fp8"; do
  # shellcheck disable=SC2086  # f: zero, one or two flags
  timeout 90 build-device/bench/mla_sublayer_bench $f --contexts "${CONTEXTS:-512,4096,32768}"
done > "$OUT/mla_sublayer_bench.jsonl" 2>&1
echo "== mla_sublayer_bench rc=$?"
cat "$OUT/mla_sublayer_bench.jsonl"
if [ "${LAB:-1}" = 1 ]; then
  BUILD=0 PREFILL='' BATCHES="${BATCHES:-1,32}" bash "$(dirname "$0")/bench_lab.sh" both,bf16,default \
    attn,bf16,default,DEEPINFER_CUDA_MOE_ONE=0 none,bf16,default,DEEPINFER_CUDA_MOE_ONE=0,DEEPINFER_CUDA_MLA_SUBLAYER=0 \
    fp8,fp8,default fp8_one,fp8,default,DEEPINFER_CUDA_MOE_ONE_FP8=1 \
    fp8_ops,fp8,default,DEEPINFER_CUDA_MLA_SUBLAYER_FP8=0 \
    inv,bf16,invariant inv_grouped,bf16,invariant,DEEPINFER_CUDA_MOE_ONE=0 \
    inv_ops,bf16,invariant,DEEPINFER_CUDA_MLA_SUBLAYER=0 \
    inv_fp8,fp8,invariant inv_fp8_ops,fp8,invariant,DEEPINFER_CUDA_MLA_SUBLAYER_FP8=0 \
    inv_fp8_grouped,fp8,invariant,DEEPINFER_CUDA_MOE_ONE_W8A8=0 fp8_w8a8,fp8,default,DEEPINFER_CUDA_MOE_ONE_W8A8=1
fi
