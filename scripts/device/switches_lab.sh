#!/usr/bin/env bash
# On the GPU machine: the checks and the A/B figures that decide the default of the backend
# switch written in docs/perf.md version 17 and not yet run: DEEPINFER_CUDA_FP8_STAGGER (the
# grouped FP8 GEMM's second math warpgroup one K block behind the first, so that one's MMAs run
# while the other promotes; bitwise neutral, off by default). First scripts/device/gpu_run.sh
# invariant — the whole GPU suite (its cuda_next / cuda_runtime_next runs have the switch on) and
# the standard figures —, then the grouped GEMM alone at V2-Lite's expert shapes with and
# without it, then bench_lab.sh with it off and on.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [DEVICE_TARGETS="deepinfer_tests deepinfer fp8_gemm_bench"] bash scripts/device/switches_lab.sh
# Output: $OUT/logs.tgz (the suite and figures), $OUT/bench_lab.tgz (the A/B), tables on stdout.
set -uo pipefail
DEVICE_TARGETS=${DEVICE_TARGETS:-deepinfer_tests deepinfer fp8_gemm_bench} bash "$(dirname "$0")/gpu_run.sh" invariant
rc=$?
for flag in "" --stagger; do
  timeout 120 build-device/bench/fp8_gemm_bench --model v2lite --grouped-only --m 256,4096,16384 --variants 3 $flag \
    > "$OUT/lab_grouped${flag:+_stagger}.jsonl" 2>&1
  echo "== fp8_gemm_bench grouped ${flag:-(warpgroups together)}: rc=$?"
  python3 - "$OUT/lab_grouped${flag:+_stagger}.jsonl" <<'PY2'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{") and '"name"' in line:
        r = json.loads(line)
        print("%-44s %-16s M=%6d %9.1f us %7.1f TFLOP/s" % (r["kernel"], r["name"], r["M"], r["us"], r["tflops"]))
PY2
done
PREFILL=${PREFILL:-4096} BATCHES=${BATCHES:-1,32,256} BUILD=0 bash "$(dirname "$0")/bench_lab.sh" \
  fp8,fp8,default fp8_stagger,fp8,default,DEEPINFER_CUDA_FP8_STAGGER=1 \
  fp8_inv,fp8,invariant fp8_inv_stagger,fp8,invariant,DEEPINFER_CUDA_FP8_STAGGER=1
exit $rc
