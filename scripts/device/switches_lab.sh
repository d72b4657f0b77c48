#!/usr/bin/env bash
# On the GPU machine: the checks and the A/B figures that decide the defaults of the backend
# switches new in docs/perf.md version 17: DEEPINFER_CUDA_FP8_IDLE_SKIP (the MoE's grouped FP8
# GEMMs skip a warpgroup's MMAs where none of a tile's rows are its own) and
# DEEPINFER_CUDA_W8A8_STACK (q_proj | kv_a_proj on the W8A8 form in one GEMM), both on by default
# and bitwise neutral. First scripts/device/gpu_run.sh invariant — the whole GPU suite and the
# standard figures —, then the grouped GEMM alone at V2-Lite's expert shapes with the idle MMAs
# skipped and issued, then bench_lab.sh with each switch off.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [DEVICE_TARGETS="deepinfer_tests deepinfer fp8_gemm_bench"] bash scripts/device/switches_lab.sh
# Output: $OUT/logs.tgz (the suite and figures), $OUT/bench_lab.tgz (the A/B), tables on stdout.
set -uo pipefail
DEVICE_TARGETS=${DEVICE_TARGETS:-deepinfer_tests deepinfer fp8_gemm_bench} bash "$(dirname "$0")/gpu_run.sh" invariant
rc=$?
for flag in "" --mma-idle; do
  timeout 120 build-device/bench/fp8_gemm_bench --model v2lite --grouped-only --m 256,4096,16384 --variants 3 $flag \
    > "$OUT/lab_grouped${flag:+_mma_idle}.jsonl" 2>&1
  echo "== fp8_gemm_bench grouped ${flag:-(idle MMAs skipped)}: rc=$?"
  python3 - "$OUT/lab_grouped${flag:+_mma_idle}.jsonl" <<'PY2'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{") and '"name"' in line:
        r = json.loads(line)
        print("%-40s %-16s M=%6d %9.1f us %7.1f TFLOP/s" % (r["kernel"], r["name"], r["M"], r["us"], r["tflops"]))
PY2
done
PREFILL=${PREFILL:-4096} BATCHES=${BATCHES:-1,32,256} BUILD=0 bash "$(dirname "$0")/bench_lab.sh" \
  fp8,fp8,default fp8_noskip,fp8,default,DEEPINFER_CUDA_FP8_IDLE_SKIP=0 fp8_nostack,fp8,default,DEEPINFER_CUDA_W8A8_STACK=0 \
  fp8_inv,fp8,invariant fp8_inv_noskip,fp8,invariant,DEEPINFER_CUDA_FP8_IDLE_SKIP=0 \
  fp8_inv_nostack,fp8,invariant,DEEPINFER_CUDA_W8A8_STACK=0
exit $rc
