#!/usr/bin/env bash
# s39-4: the next tile's scales into L1 (DEEPINFER_CUDA_FP8_PREFETCH_SCALES: bit 0 the 128-wide
# kernel, bit 1 the 128 × 192 one) — bits, kernels, the model.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/s39_4.tgz" -C $OUT . 2>/dev/null; }
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests fp8_gemm_bench; echo "build $(( $(date +%s) - t0 )) s"; save
T=build-device/tests/deepinfer_tests
run() { local name=$1; shift; local s=$(date +%s); timeout 300 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
export -f run
run ops3 env DEEPINFER_CUDA_FP8_PREFETCH_SCALES=3 "$T" --gtest_filter='CudaFp8Gemm.*:CudaOps.Moe*'
run ops3_192 env DEEPINFER_CUDA_FP8_PREFETCH_SCALES=3 DEEPINFER_CUDA_FP8_N192=1 "$T" --gtest_filter='CudaOps.Moe*'
run fixtures3 env DEEPINFER_CUDA_FP8_PREFETCH_SCALES=3 "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run inv3 env DEEPINFER_CUDA_FP8_PREFETCH_SCALES=3 "$T" --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
grep -E "FAILED|Failure" $OUT/*3*.log | head -20
save
B=build-device/bench/fp8_gemm_bench
for round in 1 2; do
for pf in 0 3; do
  DEEPINFER_CUDA_FP8_PREFETCH_SCALES=$pf timeout 100 $B --model v2lite --m 4096 --dense-only --variants 3 --clusters 2 --row-scales --model-form \
    --names q_kv_a,o_proj,shared2_down > $OUT/dense_pf${pf}_$round.jsonl 2>&1
  DEEPINFER_CUDA_FP8_PREFETCH_SCALES=$pf timeout 100 $B --model v2lite --m 4096 --dense-only --variants 3 --clusters 2 \
    --names shared2_gate_up > $OUT/dense16_pf${pf}_$round.jsonl 2>&1
  DEEPINFER_CUDA_FP8_PREFETCH_SCALES=$pf timeout 100 $B --model v2lite --m 4096 --grouped-only --variants 3 --n192 \
    > $OUT/grouped_pf${pf}_$round.jsonl 2>&1
  DEEPINFER_CUDA_FP8_PREFETCH_SCALES=$pf timeout 100 $B --model v2lite --m 1024 --grouped-only --variants 3 --stagger \
    > $OUT/grouped128_pf${pf}_$round.jsonl 2>&1
done
done
python3 - $OUT/dense*_pf*.jsonl $OUT/grouped*_pf*.jsonl <<'PY' | sort -k2,2 -k3,3 -k1,1
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        if not l.startswith('{"kernel": "deepinfer'): continue
        r=json.loads(l); print(f"{f.split('/')[-1][:-6]:18s} {r['name']:16s} M={r['M']} {r['us']:8.2f} us {r['tflops']:7.1f} TF")
PY
save
ROUNDS=3 BATCHES=32 PREFILL=4096 BUILD=0 timeout 200 bash scripts/device/bench_lab.sh pf0,fp8,default pf3,fp8,default,DEEPINFER_CUDA_FP8_PREFETCH_SCALES=3 2>&1 | tail -12
save
