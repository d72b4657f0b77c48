#!/usr/bin/env bash
# On the GPU machine: `deepinfer bench` on V2-Lite under several settings, one table of ms per
# prefill / decode step across them — for A/B runs of the backend's knobs in one device call.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BATCHES=1,2,8,32,64,128,256] [PREFILL=4096] [CONTEXT=512] [BUILD=0] \
#     bash scripts/device/bench_lab.sh LABEL,DTYPE,MODE[,ENV=VALUE...] ...
# MODE: default | invariant (--batch-invariant). Example: bash scripts/device/bench_lab.sh
#   base,fp8,default w8a8rows2,fp8,default,DEEPINFER_CUDA_FP8_W8A8_ROWS=2
# Output: the table on stdout; $OUT/bench_lab.tgz holds each setting's lab_<LABEL>.json / .log.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
[ "${BUILD:-1}" = 1 ] && device_build deepinfer
BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
labels=()
for spec in "$@"; do
  IFS=, read -r label dtype mode envs <<< "$spec"
  flag=""
  [ "$mode" = invariant ] && flag=--batch-invariant
  # shellcheck disable=SC2086  # envs: zero or more ENV=VALUE words
  timeout 150 env ${envs//,/ } "$BIN" bench --config "$LITE" --dtype "$dtype" --prefill "${PREFILL-4096}" \
    --decode-batch "${BATCHES:-1,2,8,32,64,128,256}" --context "${CONTEXT:-512}" $flag --json "$OUT/lab_$label.json" > "$OUT/lab_$label.log" 2>&1
  echo "== $label ($dtype $mode ${envs//,/ }): rc=$?"
  labels+=("$label")
done
python3 - "$OUT" "${labels[@]}" <<'PY'
import json, sys
out, labels = sys.argv[1], sys.argv[2:]
rows = {}
for name in labels:
    try:
        d = json.load(open(f"{out}/lab_{name}.json"))
    except (OSError, ValueError):
        continue
    for r in d.get("results", []):
        key = f"{r.get('phase')} {r.get('tokens') or r.get('batch')}"
        rows.setdefault(key, {})[name] = r.get("ms") or r.get("ms_per_step")
print("| case | " + " | ".join(labels) + " |")
print("|---|" + "---:|" * len(labels))
for k, v in rows.items():
    print(f"| {k} | " + " | ".join(f"{v[n]:.2f}" if v.get(n) else "–" for n in labels) + " |")
PY
(cd "$OUT" && tar czf /tmp/bench_lab.tgz lab_* 2>/dev/null; rm -f lab_*; mv /tmp/bench_lab.tgz .)
