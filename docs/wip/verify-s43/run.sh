#!/usr/bin/env bash
# One device call (device `run`, carry [".device_carry"]; ~7 min on a fresh machine) for what
# sessions 42 and 43 changed after the last device run (s42-2). Supersedes docs/wip/verify-s42:
#  - the FP8 sublayer kernel's default form kept to D % 512 == 0 (its scale rows' bulk copies
#    faulted at D = 256, run s42-2), o_proj's rows from the MLA epilogue on by default, the o_proj
#    rows test independent of the environment;
#  - kv_b on W8A8 timed in the model for the first time (DEEPINFER_CUDA_KVB_W8A8);
#  - session 43: q_pe's rotation in the prefill attention kernel (DEEPINFER_CUDA_MLA_Q_ROPE, the
#    same bits by construction) and the router on the norm's two-part bf16 rows
#    (DEEPINFER_CUDA_ROUTER_PARTS): their op and model tests first, then the model A/B (three
#    rounds, FP8 and bf16), the suites with every knob on (the router's from one row);
#  - the FP8 4K prefill's kernel timeline with today's defaults, and with every knob on.
# Writes $OUT/verify_s43.tgz. What to do with the figures: docs/wip/verify-s43/README.md.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/verify_s43.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests deepinfer_kernel_trace; echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run fixed 150 "$T" --gtest_filter='CudaMlaPrefill.QRopeInTheKernelEqualsRotatedQ:CudaModelParity.V2LiteQRopeInAttentionSameBits:RouterParts*:CudaModelParity.V3MoeRouterParts:CudaOps.MlaRopeKvWrite*:CudaModelParity.V2LiteAttentionFp8KvbOnW8a8:CudaMlaPrefill.OprojRowsEqualTheConsumersOwn:CudaMlaSublayer.*'
grep -E "Failure|v2_lite_fp8_kvb|router parts|DI_CHECK|differs|written" $OUT/fixed.log | head -16
save
Q=DEEPINFER_CUDA_MLA_Q_ROPE=1 V=DEEPINFER_CUDA_KVB_W8A8=1 R=DEEPINFER_CUDA_ROUTER_PARTS=1
O0=DEEPINFER_CUDA_MLA_OPROJ_ROWS=0
CLOCKS=1 ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 280 bash scripts/device/bench_lab.sh \
  base,fp8,default qrope,fp8,default,$Q kvb,fp8,default,$V rparts,fp8,default,$R all,fp8,default,$Q,$V,$R \
  no_orows,fp8,default,$O0 bf16,bf16,default bf16_all,bf16,default,$Q,$R 2>&1 | tail -12
save
run suites 200 env DEEPINFER_TEST_DEVICE=cuda "$T" \
  --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*:CudaMlaPrefill.*:CudaOps.Mla*:CudaMlaSublayer.*:CudaInvariantOps.*:CudaBatchInvariance.*:LLMEngine.*'
grep -hE "FAILED|Failure" $OUT/suites.log | head -10
save
run suites_knobs 150 env DEEPINFER_TEST_DEVICE=cuda $Q $V $R DEEPINFER_CUDA_ROUTER_PARTS_ROWS=1 "$T" \
  --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*:CudaBatchInvariance.*:LLMEngine.*'
grep -hE "FAILED|Failure" $OUT/suites_knobs.log | head -10
save
# The FP8 4K prefill's device timeline (s37-1's CUPTI trace): today's defaults, then every knob
# on — the latent write's, the attention kernel's and the router's own durations, and what is
# left to rank.
BIN=build-device/src/tools/deepinfer LIB=$PWD/build-device/src/tools/libdeepinfer_kernel_trace.so
for setting in base all; do
  envs=""; [ $setting = all ] && envs="$Q $V $R"
  timeout 120 env $envs DEEPINFER_KERNEL_TRACE=$OUT/trace_$setting.tsv CUDA_INJECTION64_PATH=$LIB $BIN bench \
    --config bench/configs/deepseek_v2_lite.json --dtype fp8 --prefill 4096 --prefill-reps 3 --decode-batch "" \
    --json $OUT/traced_$setting.json > $OUT/traced_$setting.log 2>&1
  echo "traced $setting rc=$?"
  timeout 60 python3 scripts/device/prefill_trace.py $OUT/trace_$setting.tsv --label $setting \
    --json $OUT/prefill_trace_$setting.json | head -30
  gzip -f $OUT/trace_$setting.tsv
  save
done
