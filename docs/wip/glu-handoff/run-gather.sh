#!/usr/bin/env bash
# The next call if run.sh finds the handed-off GLU form faster (device `run`, carry
# [".device_carry"]; ~8 min on a fresh machine): glu-handoff.patch, then glu-gather.patch (the GLU
# kernel's loader warp gathering the A rows itself, as main's DEEPINFER_CUDA_FP8_GATHER_A does
# for the plain gate|up GEMM — the two forms compose only with this), built; the gathered-rows
# test first (timeout: a wrong arrival count hangs), then the model A/B at FP8 4K and B = 32 —
# GLU alone, GLU with the gathered rows, the plain forms with the gathered rows — and the MoE /
# fixtures / runtime suites with both knobs on. Writes $OUT/glu_gather.tgz.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/glu_gather.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
{ git apply docs/wip/glu-handoff/glu-handoff.patch && git apply docs/wip/glu-handoff/glu-gather.patch; } ||
  { echo "the patches do not apply"; exit 1; }
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests; echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run gathered 90 "$T" --gtest_filter='CudaFp8Gemm.GatheredRowsEqualGatheringFirst:CudaFp8Gemm.GluQuantizeEqualsGemmThenSiluMulQuantize'
grep -E "Failure|GLU|gathered A" $OUT/gathered.log | head -8
grep -q "^\[  PASSED" $OUT/gathered.log || { echo "the gathered GLU form's tests did not pass: no timing"; exit 1; }
G=DEEPINFER_CUDA_FP8_GATHER_A=1 F=DEEPINFER_CUDA_FP8_GLU=1
CLOCKS=1 ROUNDS=2 BATCHES=32 PREFILL=4096 BUILD=0 timeout 230 bash scripts/device/bench_lab.sh \
  plain,fp8,default glu,fp8,default,$F glu_gather,fp8,default,$F,$G gather,fp8,default,$G 2>&1 | tail -16
save
run moe 150 env "$F" "$G" "$T" --gtest_filter='CudaFp8Gemm.*:CudaOps.Moe*:CudaOps.Mlp*'
run fixtures 150 env "$F" "$G" "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run runtime 150 env DEEPINFER_TEST_DEVICE=cuda "$F" "$G" "$T" --gtest_filter='LLMEngine.*'
grep -hE "FAILED|Failure" $OUT/moe.log $OUT/fixtures.log $OUT/runtime.log | head -20
save
