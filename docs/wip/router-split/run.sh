#!/usr/bin/env bash
# One device call for the split-bf16 router GEMM (main since session 40, off by default:
# DEEPINFER_CUDA_ROUTER_SPLIT; device `run`, carry [".device_carry"]; ~6 min on a fresh machine):
# the kernel's tests (a short one first, with a timeout: a wrong cluster or ring wait would hang),
# router_gemm_bench against cuBLAS's SGEMM at the models' shapes, then the model A/B — FP8 and
# bf16 4K prefill with decode B = 32 / 256 (the router's row counts above the GEMV), two
# interleaved rounds, the knob off and on, SM clocks sampled — and the suites with it on.
# Writes $OUT/router_split.tgz (also after a failed step).
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/router_split.tgz" -C $OUT . 2>/dev/null; }
trap save EXIT
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer deepinfer_tests router_gemm_bench; echo "build $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
run() { local name=$1 limit=$2; shift 2; local s=$(date +%s); timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"; }
run first 30 "$T" --gtest_filter='RouterGemmCuda.BackendMatmulTakesThePlacedImage'
grep -E "worst|Failure" $OUT/first.log | head
run router 60 "$T" --gtest_filter='RouterSplit*:RouterGemmCuda*'
grep -E "worst|Failure" $OUT/router.log | head -20
timeout 120 build-device/bench/router_gemm_bench --shapes v2lite,v3 --m 32,256,1024,4096,16384 > $OUT/bench.jsonl 2>&1
python3 -c "
import json
for l in open('$OUT/bench.jsonl'):
    r = json.loads(l)
    if r['bench'] == 'copy': print(f\"copy {r['tb_per_s']:.2f} TB/s\"); continue
    print(f\"{r['shape']:7s} M={r['M']:6d} {r['kernel']:13s} {r['us']:8.2f} us  {r['frac_of_copy']:.3f} of copy\")"
save
CLOCKS=1 ROUNDS=2 BATCHES=32,256 PREFILL=4096 BUILD=0 timeout 250 bash scripts/device/bench_lab.sh \
  cublas,fp8,default split,fp8,default,DEEPINFER_CUDA_ROUTER_SPLIT=1 \
  cublas16,bf16,default split16,bf16,default,DEEPINFER_CUDA_ROUTER_SPLIT=1 2>&1 | tail -16
save
run fixtures 200 env DEEPINFER_CUDA_ROUTER_SPLIT=1 "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run runtime 200 env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_ROUTER_SPLIT=1 "$T" --gtest_filter='LLMEngine.*'
grep -E "FAILED|Failure" $OUT/fixtures.log $OUT/runtime.log | head -20
