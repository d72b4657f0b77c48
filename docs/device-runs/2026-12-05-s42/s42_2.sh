#!/usr/bin/env bash
# Run s42-2 (device `run`, carry [".device_carry"]): session 41's two WIP patches in one call —
# docs/wip/glu-handoff/glu-handoff.patch (the GLU form's epilogue in the loader warpgroup's idle
# warps; DEEPINFER_CUDA_FP8_GLU=1) and docs/wip/mla-prefill-persistent/persistent.patch (the MLA
# prefill kernel persistent; DEEPINFER_CUDA_MLA_PERSISTENT=1; it also changes the per-block
# form's code, so main's binary is the base) — plus why the kv_b-on-W8A8 model test aborted in
# s42-1 ("misaligned address"). In order, results saved after each step:
#   1. main's deepinfer + mla_prefill_bench (the base), then both patches, one build;
#   2. the kv_b model test with launches synchronous;
#   3. each patch's first test alone (a hand-off or item-ring protocol error hangs);
#   4. the model A/B, FP8 4K + B = 32, three rounds: main / patched plain / GLU / persistent /
#      o_proj rows / gathered rows + o_proj rows / GLU + o_proj rows + persistent;
#   5. the kv_b model test under memcheck, if the image has compute-sanitizer;
#   6. mla_prefill_bench base against patched (per-block and persistent);
#   7. the suites with the knobs that passed their first test.
# (The two patches left docs/wip in this session: `git show 26f0898:docs/wip/glu-handoff/glu-handoff.patch`,
# `git show 26f0898:docs/wip/mla-prefill-persistent/persistent.patch`.)
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/s42_2.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer mla_prefill_bench; echo "base build $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/base && cp build-device/src/tools/deepinfer build-device/bench/mla_prefill_bench /tmp/base/
git apply docs/wip/glu-handoff/glu-handoff.patch || { echo "glu patch does not apply"; exit 1; }
git apply docs/wip/mla-prefill-persistent/persistent.patch || { echo "persistent patch does not apply"; exit 1; }
t0=$(date +%s); device_build deepinfer deepinfer_tests mla_prefill_bench; echo "patched build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
KT='CudaModelParity.V2LiteAttentionFp8KvbOnW8a8'
run kvb_blocking 60 env CUDA_LAUNCH_BLOCKING=1 "$T" --gtest_filter="$KT"
grep -E "DI_CHECK|Failure|misaligned|rel err" $OUT/kvb_blocking.log | head -8
save
run glu_first 60 "$T" --gtest_filter='CudaFp8Gemm.GluQuantizeEqualsGemmThenSiluMulQuantize'
grep -E "Failure|codes|scales" $OUT/glu_first.log | head -6
run persist_first 90 "$T" --gtest_filter='CudaMlaPrefill.PersistentEqualsPerBlock'
grep -E "Failure" $OUT/persist_first.log | head -6
ok_g=1 ok_p=1
grep -q "^\[  PASSED" $OUT/glu_first.log || ok_g=0
grep -q "^\[  PASSED" $OUT/persist_first.log || ok_p=0
GL=DEEPINFER_CUDA_FP8_GLU=1 P=DEEPINFER_CUDA_MLA_PERSISTENT=1
O=DEEPINFER_CUDA_MLA_OPROJ_ROWS=1 G=DEEPINFER_CUDA_FP8_GATHER_A=1
settings="main,fp8,default,BIN=/tmp/base/deepinfer plain,fp8,default orows,fp8,default,$O go,fp8,default,$G,$O"
best="best,fp8,default,$O"
[ $ok_g = 1 ] && settings+=" glu,fp8,default,$GL" best+=",$GL"
[ $ok_p = 1 ] && settings+=" persist,fp8,default,$P" best+=",$P"
settings+=" $best"
# shellcheck disable=SC2086  # settings: one word each
CLOCKS=1 ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 300 bash scripts/device/bench_lab.sh $settings 2>&1 | tail -14
save
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ]; then
  run kvb_memcheck 90 "$SAN" --tool memcheck --print-limit 3 "$T" --gtest_filter="$KT"
  grep -E -A8 "Misaligned|Invalid" $OUT/kvb_memcheck.log | head -30
else echo "no compute-sanitizer"; fi
save
if [ $ok_p = 1 ]; then
  for v in base new; do
    B=build-device/bench/mla_prefill_bench K=1,2; [ $v = base ] && B=/tmp/base/mla_prefill_bench K=1
    timeout 60 $B --heads 16 --cases 1:4096:4096,1:16384:16384,8:512:512 --kernels $K 2>&1 | grep deepinfer_mla | \
      python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(f\"$v {r['variant']:17s} H={r['H']:3d} {r['seqs']}x{r['q_len']}: {r['us']:9.1f} us {r['frac_of_gemm']:.3f}\")"
  done
  save
fi
ENVS=("$O"); [ $ok_g = 1 ] && ENVS+=("$GL"); [ $ok_p = 1 ] && ENVS+=("$P")
run kernels 150 env "${ENVS[@]}" "$T" --gtest_filter='CudaFp8Gemm.*:CudaOps.Moe*:CudaOps.Mlp*:CudaMlaPrefill.*:CudaOps.Mla*'
run fixtures 150 env "${ENVS[@]}" "$T" --gtest_filter="Fixtures/GoldenFixtureCuda.*:CudaModelParity.*:-$KT"
run runtime 120 env DEEPINFER_TEST_DEVICE=cuda "${ENVS[@]}" "$T" --gtest_filter='LLMEngine.*'
grep -hE "FAILED|Failure" $OUT/kernels.log $OUT/fixtures.log $OUT/runtime.log | head -20
save
