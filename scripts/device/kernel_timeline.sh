#!/usr/bin/env bash
# On the GPU machine: the graphed decode step's kernel timeline under several settings — `deepinfer
# bench` on V2-Lite (one batch size, context 512, graphs on) with the CUPTI kernel trace
# (src/tools/kernel_trace.cpp, loaded by CUDA_INJECTION64_PATH), each trace summarized by
# scripts/device/kernel_timeline.py: per kernel, its duration and the span it adds to the step;
# one layer's kernels start to end. The bench's own ms per step is printed beside it (traced),
# and, with UNTRACED=1, from a second untraced invocation (the trace must not move the step).
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BATCH=1] [CONTEXT=512] [LAYER=12] [LAYER_KERNEL=mla_sublayer] [BUILD=0] [UNTRACED=1] \
#     bash scripts/device/kernel_timeline.sh LABEL,DTYPE,MODE[,ENV=VALUE...] ...
# (the settings as bench_lab.sh's; BIN=path: another build's deepinfer)
# Output: the tables on stdout; $OUT/timeline_<LABEL>.json, $OUT/trace_<LABEL>.tsv.gz.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
[ "${BUILD:-1}" = 1 ] && device_build deepinfer deepinfer_kernel_trace
LIB=$PWD/build-device/src/tools/libdeepinfer_kernel_trace.so LITE=bench/configs/deepseek_v2_lite.json
[ -f "$LIB" ] || { echo "no $LIB (CUPTI not found at configure time?)"; find / -name "libcupti.so*" -o -name cupti.h 2>/dev/null | head; exit 1; }
step_ms() {  # the bench JSON's decode ms per step
  python3 - "$1" <<'PY' 2>/dev/null
import json, sys
print(" ".join(f"{r.get('ms_per_step', 0):.3f}" for r in json.load(open(sys.argv[1]))["results"] if r.get("phase") == "decode"))
PY
}
for spec in "$@"; do
  IFS=, read -r label dtype mode envs <<< "$spec"
  flag="" bin=build-device/src/tools/deepinfer
  [ "$mode" = invariant ] && flag=--batch-invariant
  for kv in ${envs//,/ }; do [[ $kv == BIN=* ]] && bin=${kv#BIN=}; done
  args=(bench --config "$LITE" --dtype "$dtype" --prefill "" --decode-batch "${BATCH:-1}" --context "${CONTEXT:-512}")
  # shellcheck disable=SC2086  # envs, flag: zero or more words
  timeout 200 env ${envs//,/ } DEEPINFER_KERNEL_TRACE="$OUT/trace_$label.tsv" CUDA_INJECTION64_PATH="$LIB" \
    "$bin" "${args[@]}" $flag --json "$OUT/bench_$label.json" > "$OUT/bench_$label.log" 2>&1
  echo "== $label ($dtype $mode ${envs//,/ }): rc=$? traced ms/step $(step_ms "$OUT/bench_$label.json")"
  if [ "${UNTRACED:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    timeout 200 env ${envs//,/ } "$bin" "${args[@]}" $flag --json "$OUT/bench_${label}_untraced.json" \
      > "$OUT/bench_${label}_untraced.log" 2>&1
    echo "   untraced ms/step $(step_ms "$OUT/bench_${label}_untraced.json")"
  fi
  python3 scripts/device/kernel_timeline.py "$OUT/trace_$label.tsv" --label "$label" --layer "${LAYER:-12}" \
    --layer-kernel "${LAYER_KERNEL:-mla_sublayer}" \
    --json "$OUT/timeline_$label.json"
  gzip -f "$OUT/trace_$label.tsv"
done
