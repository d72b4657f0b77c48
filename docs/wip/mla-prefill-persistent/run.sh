#!/usr/bin/env bash
# One device call for the WIP (device `run`, carry [".device_carry"]; ~7 min on a fresh machine):
# builds main's kernel as the base, applies persistent.patch, then the tests, the kernel bench
# (base per-block, patched per-block, patched persistent) and the model's 4K FP8 prefill with
# and without DEEPINFER_CUDA_MLA_PERSISTENT, SM clocks sampled. Writes $OUT/mla_persistent.tgz.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/mla_persistent.tgz" -C $OUT . 2>/dev/null; }
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer mla_prefill_bench; echo "base build $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/base && cp build-device/src/tools/deepinfer build-device/bench/mla_prefill_bench /tmp/base/
{ git apply docs/wip/mla-prefill-persistent/persistent.patch || patch -p1 < docs/wip/mla-prefill-persistent/persistent.patch; } \
  > $OUT/patch.log 2>&1 || { cat $OUT/patch.log; exit 1; }
t0=$(date +%s); device_build deepinfer deepinfer_tests mla_prefill_bench; echo "patched build $(( $(date +%s) - t0 )) s"; save
T=build-device/tests/deepinfer_tests
run() { local name=$1; shift; local s=$(date +%s); timeout 200 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run mla "$T" --gtest_filter='CudaMlaPrefill.*:CudaOps.Mla*'
run fixtures env DEEPINFER_CUDA_MLA_PERSISTENT=1 "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run inv env DEEPINFER_CUDA_MLA_PERSISTENT=1 "$T" --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
run runtime env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_MLA_PERSISTENT=1 "$T" --gtest_filter='LLMEngine.*'
grep -E "FAILED|Failure" $OUT/mla.log $OUT/fixtures.log $OUT/inv.log $OUT/runtime.log | head -20
save
for v in base new base new; do
  B=build-device/bench/mla_prefill_bench K=1,2; [ $v = base ] && B=/tmp/base/mla_prefill_bench K=1
  timeout 60 $B --heads 16,128 --cases 1:4096:4096,1:16384:16384,8:512:512 --kernels $K 2>&1 | grep deepinfer_mla | \
    python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(f\"$v {r['variant']:17s} H={r['H']:3d} {r['seqs']}x{r['q_len']}: {r['us']:9.1f} us {r['frac_of_gemm']:.3f}\")"
done
save
CLOCKS=1 ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 200 bash scripts/device/bench_lab.sh \
  base,fp8,default,BIN=/tmp/base/deepinfer blocks,fp8,default persistent,fp8,default,DEEPINFER_CUDA_MLA_PERSISTENT=1 2>&1 | tail -14
save
