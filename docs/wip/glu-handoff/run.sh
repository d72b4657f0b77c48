#!/usr/bin/env bash
# One device call for the GLU form's handed-off epilogue (glu-handoff.patch; device `run`, carry
# [".device_carry"]; ~6 min on a fresh machine): applies the patch, builds, runs the GLU form's
# bitwise test alone first (timeout: a hand-off protocol error hangs), then the MoE / fixtures /
# runtime suites with DEEPINFER_CUDA_FP8_GLU=1, then the model A/B — FP8 4K prefill and decode
# B = 32, three interleaved rounds, the plain gate|up GEMM + SiLU·mul-quantize pass (GLU 0,
# main's path, unchanged by the patch) against the fused form (GLU 1), SM clocks sampled — and a
# CUPTI trace of one 4K prefill each way (per-kernel times). Writes $OUT/glu_handoff.tgz.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/glu_handoff.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
git apply docs/wip/glu-handoff/glu-handoff.patch || { echo "patch does not apply"; exit 1; }
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests; echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run glu 60 "$T" --gtest_filter='CudaFp8Gemm.GluQuantizeEqualsGemmThenSiluMulQuantize'
grep -E "Failure|codes|scales" $OUT/glu.log | head -10
run moe 200 env DEEPINFER_CUDA_FP8_GLU=1 "$T" --gtest_filter='CudaFp8Gemm.*:CudaOps.Moe*:CudaOps.Mlp*'
run fixtures 200 env DEEPINFER_CUDA_FP8_GLU=1 "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run runtime 200 env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_FP8_GLU=1 "$T" --gtest_filter='LLMEngine.*'
grep -E "FAILED|Failure" $OUT/moe.log $OUT/fixtures.log $OUT/runtime.log | head -20
save
CLOCKS=1 ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 200 bash scripts/device/bench_lab.sh \
  plain,fp8,default fused,fp8,default,DEEPINFER_CUDA_FP8_GLU=1 2>&1 | tail -12
save
# Per-kernel device times of 4K prefills each way (CUPTI trace, scripts/device/prefill_trace.py).
timeout 200 bash -c 'source scripts/device/build_device.sh; device_build deepinfer_kernel_trace' > $OUT/build_trace.log 2>&1
LIB=$PWD/build-device/src/tools/libdeepinfer_kernel_trace.so
for g in 0 1; do
  timeout 120 env DEEPINFER_CUDA_FP8_GLU=$g DEEPINFER_KERNEL_TRACE=$OUT/trace_glu$g.tsv CUDA_INJECTION64_PATH=$LIB \
    build-device/src/tools/deepinfer bench --config bench/configs/deepseek_v2_lite.json --dtype fp8 --prefill 4096 \
    --prefill-reps 3 --decode-batch "" > $OUT/traced_glu$g.log 2>&1
  timeout 60 python3 scripts/device/prefill_trace.py $OUT/trace_glu$g.tsv --label glu$g --top 14 --json $OUT/prefill_trace_glu$g.json
  gzip -f $OUT/trace_glu$g.tsv
done
