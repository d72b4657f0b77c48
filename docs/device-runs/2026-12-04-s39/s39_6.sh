#!/usr/bin/env bash
# s39-6: the MLA prefill kernel's Q rows loaded before they are converted (every load in flight at
# once) against the previous commit's kernel (base): bits (tests), kernel, model.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/s39_6.tgz" -C $OUT . 2>/dev/null; }
source scripts/device/build_device.sh
F=src/backend/cuda/cuda_mla_prefill_wgmma.cu
cp $F /tmp/new.cu && cp docs/device-runs/2026-12-04-s39/base_mla_prefill_wgmma.cu.txt $F
t0=$(date +%s); device_build deepinfer mla_prefill_bench; echo "base build $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/base && cp build-device/src/tools/deepinfer build-device/bench/mla_prefill_bench /tmp/base/
cp /tmp/new.cu $F && touch $F
t0=$(date +%s); device_build deepinfer deepinfer_tests mla_prefill_bench; echo "new build $(( $(date +%s) - t0 )) s"; save
T=build-device/tests/deepinfer_tests
run() { local name=$1; shift; local s=$(date +%s); timeout 200 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run mla "$T" --gtest_filter='CudaMlaPrefill.*:CudaOps.Mla*'
run fixtures "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run inv "$T" --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
run runtime env DEEPINFER_TEST_DEVICE=cuda "$T" --gtest_filter='LLMEngine.*'
grep -E "FAILED|Failure" $OUT/mla.log $OUT/fixtures.log $OUT/inv.log $OUT/runtime.log | head -20
save
for v in base new base new; do
  B=build-device/bench/mla_prefill_bench; [ $v = base ] && B=/tmp/base/mla_prefill_bench
  timeout 60 $B --heads 16,128 --cases 1:4096:4096,1:16384:16384,8:512:512 --kernels 1 2>&1 | grep deepinfer_mla | \
    python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(f\"$v H={r['H']} {r['seqs']}x{r['q_len']}: {r['us']:9.1f} us {r['frac_of_gemm']:.3f}\")"
done
save
ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 150 bash scripts/device/bench_lab.sh base,fp8,default,BIN=/tmp/base/deepinfer new,fp8,default 2>&1 | tail -12
save
