#!/usr/bin/env bash
# One device call for the GLU form's handed-off epilogue (glu-handoff.patch; device `run`, carry
# [".device_carry"]; ~9 min on a fresh machine): applies the patch, builds, runs the GLU form's
# bitwise test alone first (timeout: a hand-off protocol error hangs), then the MoE / fixtures /
# runtime suites with DEEPINFER_CUDA_FP8_GLU=1 after the model A/B — FP8 4K prefill and decode
# B = 32, two interleaved rounds, the plain gate|up GEMM + SiLU·mul-quantize pass (GLU 0,
# main's path, unchanged by the patch) against the fused form (GLU 1) at both register splits,
# SM clocks sampled. Writes $OUT/glu_handoff.tgz.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/glu_handoff.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
git apply docs/wip/glu-handoff/glu-handoff.patch || { echo "patch does not apply"; exit 1; }
source scripts/device/build_device.sh
# The other register split (40 / 232: the math warps spill nothing, the epilogue warps 60 bytes)
# as a second binary, for the timing only (the same instructions' results: the same bits).
F=src/backend/cuda/cuda_fp8_wgmma.cu
sed -i 's/constexpr int kGluLoaderRegs = 56, kGluMathRegs = 224;/constexpr int kGluLoaderRegs = 40, kGluMathRegs = 232;/' $F
t0=$(date +%s); device_build deepinfer; echo "alt build $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/alt && cp build-device/src/tools/deepinfer /tmp/alt/
sed -i 's/constexpr int kGluLoaderRegs = 40, kGluMathRegs = 232;/constexpr int kGluLoaderRegs = 56, kGluMathRegs = 224;/' $F
t0=$(date +%s); device_build deepinfer deepinfer_tests; echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run glu 60 "$T" --gtest_filter='CudaFp8Gemm.GluQuantizeEqualsGemmThenSiluMulQuantize'
grep -E "Failure|codes|scales" $OUT/glu.log | head -10
grep -q "^\[  PASSED" $OUT/glu.log || { echo "the GLU form's bitwise test did not pass: no timing"; exit 1; }
CLOCKS=1 ROUNDS=2 BATCHES=32 PREFILL=4096 BUILD=0 timeout 170 bash scripts/device/bench_lab.sh \
  plain,fp8,default fused,fp8,default,DEEPINFER_CUDA_FP8_GLU=1 \
  fused40,fp8,default,DEEPINFER_CUDA_FP8_GLU=1,BIN=/tmp/alt/deepinfer 2>&1 | tail -14
save
run moe 150 env DEEPINFER_CUDA_FP8_GLU=1 "$T" --gtest_filter='CudaFp8Gemm.*:CudaOps.Moe*:CudaOps.Mlp*'
run fixtures 200 env DEEPINFER_CUDA_FP8_GLU=1 "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run runtime 200 env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_FP8_GLU=1 "$T" --gtest_filter='LLMEngine.*'
grep -E "FAILED|Failure" $OUT/moe.log $OUT/fixtures.log $OUT/runtime.log | head -20
save
# Next call, if the fused form holds: the per-kernel device times of a 4K prefill each way
# (docs/device-runs/2026-12-04-s37/s37_1.sh's CUPTI trace + scripts/device/prefill_trace.py).
