#!/usr/bin/env bash
# s39-3: six stages for the dense block-scale forms (Layout::kRing) against the previous commit
# (base); Nsight Compute's stall sampling per instruction on the dense q|kv_a and the grouped
# 128 × 192 gate|up.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/s39_3.tgz" -C $OUT . 2>/dev/null; }
source scripts/device/build_device.sh
F=src/backend/cuda/cuda_fp8_wgmma.cu
cp $F /tmp/new.cu && cp docs/device-runs/2026-12-04-s39/base_fp8_wgmma.cu.txt $F
t0=$(date +%s); device_build deepinfer fp8_gemm_bench; echo "base build $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/base && cp build-device/src/tools/deepinfer build-device/bench/fp8_gemm_bench /tmp/base/
cp /tmp/new.cu $F && touch $F
t0=$(date +%s); device_build deepinfer deepinfer_tests fp8_gemm_bench; echo "new build $(( $(date +%s) - t0 )) s"; save
T=build-device/tests/deepinfer_tests
run() { local name=$1; shift; local s=$(date +%s); timeout 300 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run ops "$T" --gtest_filter='CudaFp8Gemm.*:CudaOps.Moe*:CudaMoeSort.*:CudaOps.*Linear*:CudaOps.*Mlp*'
run fixtures "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run inv "$T" --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
run runtime env DEEPINFER_TEST_DEVICE=cuda "$T" --gtest_filter='LLMEngine.*'
grep -E "FAILED|Failure" $OUT/ops*.log $OUT/fixtures.log $OUT/inv.log $OUT/runtime.log | head -20
save
summ() { python3 - "$@" <<'PY'
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        if not l.startswith('{"kernel": "deepinfer'): continue
        r=json.loads(l); print(f"{f.split('/')[-1][:14]:14s} {r['kernel'][18:]:28s} {r['name']:16s} M={r['M']} cl={r['cluster']} {r['us']:8.2f} us {r['tflops']:7.1f} TF")
PY
}
for round in 1 2; do
for v in base new; do
  B=build-device/bench/fp8_gemm_bench; [ $v = base ] && B=/tmp/base/fp8_gemm_bench
  timeout 100 $B --model v2lite --m 4096 --dense-only --variants 3 --clusters 1,2 --row-scales --model-form \
    --names q_kv_a,o_proj,shared2_down > $OUT/dense_${v}_$round.jsonl 2>&1
  timeout 100 $B --model v2lite --m 4096 --dense-only --variants 3 --clusters 1,2 \
    --names shared2_gate_up > $OUT/dense16_${v}_$round.jsonl 2>&1
done
done
summ $OUT/dense_*.jsonl $OUT/dense16_*.jsonl | sort -k3,3 -k5,5 -s
save
ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 200 bash scripts/device/bench_lab.sh base,fp8,default,BIN=/tmp/base/deepinfer six,fp8,default 2>&1 | tail -12
save
bash scripts/device/ncu_source.sh qkva 'fp8_wgmma_kernel' 3 -- build-device/bench/fp8_gemm_bench --model v2lite --m 4096 \
  --dense-only --variants 3 --clusters 2 --row-scales --model-form --names q_kv_a --reps 1 2>&1 | head -60
save
bash scripts/device/ncu_source.sh n192 'fp8_wgmma_n192' 3 -- build-device/bench/fp8_gemm_bench --model v2lite --m 4096 \
  --grouped-only --variants 3 --n192 --names experts_gate_up --reps 1 2>&1 | head -60
save
