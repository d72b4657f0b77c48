#!/usr/bin/env bash
# One device call (device `run`, carry [".device_carry"]; ~5 min on a fresh machine) for what
# session 42 changed after its last device run: the FP8 sublayer kernel's default form kept to
# D % 512 == 0 (its scale rows' bulk copies faulted at D = 256, run s42-2), o_proj's rows from the
# MLA epilogue on by default, the o_proj rows test independent of the environment — then kv_b on
# W8A8 timed in the model for the first time (its model test aborted on the sublayer fault before),
# o_proj's rows' effect on bf16 too, and the FP8 4K prefill's kernel timeline with the new defaults.
# Writes $OUT/verify_s42.tgz. What to do with the figures: docs/wip/verify-s42/README.md.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/verify_s42.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests deepinfer_kernel_trace; echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run fixed 90 "$T" --gtest_filter='CudaModelParity.V2LiteAttentionFp8KvbOnW8a8:CudaMlaPrefill.OprojRowsEqualTheConsumersOwn:CudaMlaSublayer.*'
grep -E "Failure|v2_lite_fp8_kvb|DI_CHECK" $OUT/fixed.log | head -8
save
V=DEEPINFER_CUDA_KVB_W8A8=1 O0=DEEPINFER_CUDA_MLA_OPROJ_ROWS=0
CLOCKS=1 ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 200 bash scripts/device/bench_lab.sh \
  base,fp8,default kvb,fp8,default,$V no_orows,fp8,default,$O0 \
  bf16,bf16,default bf16_no_orows,bf16,default,$O0 2>&1 | tail -10
save
run suites 200 env DEEPINFER_TEST_DEVICE=cuda "$T" \
  --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*:CudaMlaPrefill.*:CudaOps.Mla*:CudaMlaSublayer.*:CudaInvariantOps.*:CudaBatchInvariance.*:LLMEngine.*'
grep -hE "FAILED|Failure" $OUT/suites.log | head -10
save
# The FP8 4K prefill's device timeline with today's defaults (s37-1's CUPTI trace): what is left
# to rank for point 4.
BIN=build-device/src/tools/deepinfer LIB=$PWD/build-device/src/tools/libdeepinfer_kernel_trace.so
timeout 150 env DEEPINFER_KERNEL_TRACE=$OUT/trace_fp8.tsv CUDA_INJECTION64_PATH=$LIB $BIN bench \
  --config bench/configs/deepseek_v2_lite.json --dtype fp8 --prefill 4096 --prefill-reps 3 --decode-batch "" \
  --json $OUT/traced_fp8.json > $OUT/traced_fp8.log 2>&1
echo "traced rc=$?"
timeout 60 python3 scripts/device/prefill_trace.py $OUT/trace_fp8.tsv --label fp8 --json $OUT/prefill_trace_fp8.json | head -40
gzip -f $OUT/trace_fp8.tsv
save
