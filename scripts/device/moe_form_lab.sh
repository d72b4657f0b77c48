#!/usr/bin/env bash
# On the GPU machine: the MoE GEMM forms (CudaBackend::set_moe_gemm, DEEPINFER_CUDA_MOE_FORM) at
# every decode size and at prefill 4096 on V2-Lite, in the default and the batch-invariant mode:
# the size-picked form against the wgmma forms forced (4: bf16, 5: FP8 W8A8) — runs s17-4/5.
# Then (TESTS=1, the default) the batch-invariance suite's FP8 tests with form 5 forced.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BATCHES=1,2,8,32,64,128,256] [DTYPES="fp8 bf16"] [TESTS=0] bash scripts/device/moe_form_lab.sh
# Output: the table on stdout (scripts/device/bench_lab.sh); $OUT/bench_lab.tgz, $OUT/tests_form5.log.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer deepinfer_tests
if [ "${TESTS:-1}" = 1 ]; then
  env DEEPINFER_CUDA_MOE_FORM=5 build-device/tests/deepinfer_tests \
    --gtest_filter='CudaInvariantOps.MoeExperts*:CudaBatchInvariance.V2LiteShapeFp8*' > "$OUT/tests_form5.log" 2>&1
  echo "tests with form 5: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests_form5.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|expected|Which is" "$OUT/tests_form5.log" | head -20
fi
specs=()
for mode in default invariant; do
  for dt in ${DTYPES:-fp8 bf16}; do
    form=$([ "$dt" = fp8 ] && echo 5 || echo 4)
    specs+=("${dt}_auto_$mode,$dt,$mode" "${dt}_${form}_$mode,$dt,$mode,DEEPINFER_CUDA_MOE_FORM=$form")
  done
done
BUILD=0 bash "$(dirname "$0")/bench_lab.sh" "${specs[@]}"
