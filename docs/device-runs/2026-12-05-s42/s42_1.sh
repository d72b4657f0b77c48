#!/usr/bin/env bash
# One device call for main's four FP8-prefill forms that are off until measured (device `run`,
# carry [".device_carry"]; ~10 min on a fresh machine): the split-bf16 router GEMM
# (DEEPINFER_CUDA_ROUTER_SPLIT, perf.md version 37), the grouped gate|up GEMM gathering its own
# A rows (DEEPINFER_CUDA_FP8_GATHER_A, version 38), kv_b's prefill decompression on W8A8
# (DEEPINFER_CUDA_KVB_W8A8, version 38) and o_proj's rows from the MLA prefill epilogue
# (DEEPINFER_CUDA_MLA_OPROJ_ROWS, version 38). One build serves all four. In order — each step
# under a timeout, the results saved after each:
#   1. each form's first test alone (a wrong cluster, ring or barrier count hangs);
#   2. the model A/B: FP8 4K prefill + decode B = 32, base / router / gather / kvb / orows / all,
#      two interleaved rounds, SM clocks sampled;
#   3. the kernels' whole test groups, then the MoE ops, fixtures and runtime with all on (kvb
#      does not reach the v3_fp8 fixture, r = 144: its model check is in step 1);
#   4. the kernels' benches (router_gemm_bench at 4,096 rows; the grouped gate|up at 4K with and
#      without --gather, 128-wide and 128 × 192) — last: the call's time may run out there.
# Writes $OUT/off_knobs.tgz. What to do with the figures: docs/wip/off-knobs/README.md.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/off_knobs.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests router_gemm_bench fp8_gemm_bench; echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run router_first 30 "$T" --gtest_filter='RouterGemmCuda.BackendMatmulTakesThePlacedImage'
grep -E "worst|Failure" $OUT/router_first.log | head -5
run gather_first 60 "$T" --gtest_filter='CudaFp8Gemm.GatheredRowsEqualGatheringFirst'
grep -E "Failure|differs|gathered A" $OUT/gather_first.log | head -5
run kvb_first 90 "$T" --gtest_filter='CudaMlaPrefill.KvbOnW8a8MatchesReference:CudaModelParity.V2LiteAttentionFp8KvbOnW8a8'
grep -E "Failure|worst row|did not run|depend" $OUT/kvb_first.log | head -5
run orows_first 60 "$T" --gtest_filter='CudaMlaPrefill.OprojRowsEqualTheConsumersOwn'
grep -E "Failure|of row" $OUT/orows_first.log | head -5
R=DEEPINFER_CUDA_ROUTER_SPLIT=1 G=DEEPINFER_CUDA_FP8_GATHER_A=1 V=DEEPINFER_CUDA_KVB_W8A8=1
O=DEEPINFER_CUDA_MLA_OPROJ_ROWS=1
ok_r=1 ok_g=1 ok_v=1 ok_o=1
grep -q "^\[  PASSED" $OUT/router_first.log || ok_r=0
grep -q "^\[  PASSED" $OUT/gather_first.log || ok_g=0
grep -q "^\[  PASSED" $OUT/kvb_first.log || ok_v=0
grep -q "^\[  PASSED" $OUT/orows_first.log || ok_o=0
settings="base,fp8,default" all="all,fp8,default"
[ $ok_r = 1 ] && settings+=" router,fp8,default,$R" all+=",$R"
[ $ok_g = 1 ] && settings+=" gather,fp8,default,$G" all+=",$G"
[ $ok_v = 1 ] && settings+=" kvb,fp8,default,$V" all+=",$V"
[ $ok_o = 1 ] && settings+=" orows,fp8,default,$O" all+=",$O"
[ "$all" != "all,fp8,default" ] && settings+=" $all"
# shellcheck disable=SC2086  # settings: one word each
CLOCKS=1 ROUNDS=2 BATCHES=32 PREFILL=4096 BUILD=0 timeout 330 bash scripts/device/bench_lab.sh $settings 2>&1 | tail -20
save
[ $ok_r = 1 ] && run router 60 "$T" --gtest_filter='RouterSplit*:RouterGemmCuda*'
[ $ok_g = 1 ] && run moe 120 "$T" --gtest_filter='CudaFp8Gemm.Grouped*:CudaOps.Moe*'
ENVS=(); [ $ok_r = 1 ] && ENVS+=("$R"); [ $ok_g = 1 ] && ENVS+=("$G"); [ $ok_v = 1 ] && ENVS+=("$V")
[ $ok_o = 1 ] && ENVS+=("$O")
run fixtures 150 env "${ENVS[@]}" "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run runtime 150 env DEEPINFER_TEST_DEVICE=cuda "${ENVS[@]}" "$T" --gtest_filter='LLMEngine.*'
grep -hE "FAILED|Failure" $OUT/router.log $OUT/moe.log $OUT/fixtures.log $OUT/runtime.log 2>/dev/null | head -20
save
[ $ok_r = 1 ] && timeout 40 build-device/bench/router_gemm_bench --shapes v2lite --m 4096,16384 > $OUT/router_bench.jsonl 2>&1 &&
  python3 -c "
import json
for l in open('$OUT/router_bench.jsonl'):
    r = json.loads(l)
    if r['bench'] == 'copy': print(f\"copy {r['tb_per_s']:.2f} TB/s\"); continue
    print(f\"{r['shape']:7s} M={r['M']:6d} {r['kernel']:13s} {r['us']:8.2f} us  {r['frac_of_copy']:.3f} of copy\")"
if [ $ok_g = 1 ]; then
  for f in "" "--n192" "--gather" "--n192 --gather"; do
    # shellcheck disable=SC2086
    timeout 40 build-device/bench/fp8_gemm_bench --model v2lite --names experts_gate_up --m 4096 --variants 3 --grouped-only $f 2>&1 |
      grep grouped | python3 -c "
import json,sys
for l in sys.stdin:
    r = json.loads(l); print(f\"{r['kernel']:45s} {r['us']:8.1f} us {r['tflops']:7.1f} TFLOP/s\")"
  done
fi
save
