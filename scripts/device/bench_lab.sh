#!/usr/bin/env bash
# On the GPU machine: `deepinfer bench` on V2-Lite under several settings, one table of ms per
# prefill / decode step across them — for A/B runs of the backend's knobs in one device call.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BATCHES=1,2,8,32,64,128,256] [PREFILL=4096] [CONTEXT=512] [BUILD=0] \
#     bash scripts/device/bench_lab.sh LABEL,DTYPE,MODE[,ENV=VALUE...] ...
# MODE: default | invariant (--batch-invariant). Example: bash scripts/device/bench_lab.sh
#   base,fp8,default w8a8rows2,fp8,default,DEEPINFER_CUDA_FP8_W8A8_ROWS=2
# An ENV=VALUE of BIN=path runs that setting on another build's deepinfer (e.g. the code before a
# change). ROUNDS=n (default 1): every setting n times, the settings interleaved round by round (one
# invocation's figure moves ±0.05 ms at B = 1 between invocations, a round's settings ±0.01:
# docs/perf.md, version 29); labels get the round as a suffix (LABEL.r), the table a median
# column per setting. CLOCKS=1: nvidia-smi samples the SM clock and power every 20 ms during
# each setting (a table row: the median clock above 250 W and the most power — a sustained FP8
# prefill sits at the 700 W cap, 1,710 MHz against 1,980 in short benches: docs/perf.md,
# version 36).
# Output: the table on stdout (ms, then each case's ratio to its floor as the run measured it);
# $OUT/bench_lab.tgz holds each setting's lab_<LABEL>.json / .log (a later call in the same $OUT
# writes bench_lab2.tgz, bench_lab3.tgz, …: run s38-4 lost its first calls' files to the last).
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
[ "${BUILD:-1}" = 1 ] && device_build deepinfer
BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
labels=()
rounds=${ROUNDS:-1}
for ((round = 1; round <= rounds; ++round)); do
  for spec in "$@"; do
    IFS=, read -r label dtype mode envs <<< "$spec"
    [ "$rounds" -gt 1 ] && label="$label.$round"
    flag="" bin=$BIN
    [ "$mode" = invariant ] && flag=--batch-invariant
    for kv in ${envs//,/ }; do [[ $kv == BIN=* ]] && bin=${kv#BIN=}; done
    clk_pid=""
    if [ "${CLOCKS:-0}" = 1 ]; then  # the SM clock and power every 20 ms while the setting runs
      nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 20 > "$OUT/lab_$label.clk" 2>/dev/null &
      clk_pid=$!
    fi
    # shellcheck disable=SC2086  # envs: zero or more ENV=VALUE words
    timeout 150 env ${envs//,/ } "$bin" bench --config "$LITE" --dtype "$dtype" --prefill "${PREFILL-4096}" \
      --decode-batch "${BATCHES:-1,2,8,32,64,128,256}" --context "${CONTEXT:-512}" $flag \
      --json "$OUT/lab_$label.json" > "$OUT/lab_$label.log" 2>&1
    echo "== $label ($dtype $mode ${envs//,/ }): rc=$?"
    [ -n "$clk_pid" ] && { kill "$clk_pid"; wait "$clk_pid" 2>/dev/null; }
    labels+=("$label")
  done
done
python3 - "$OUT" "${labels[@]}" <<'PY'
import json, statistics, sys
out, labels = sys.argv[1], sys.argv[2:]
# Settings run in rounds (LABEL.r): a median column per setting after the rounds' columns.
bases = []
for name in labels:
    base = name.rsplit(".", 1)[0] if "." in name and name.rsplit(".", 1)[1].isdigit() else None
    if base is not None and base not in bases:
        bases.append(base)
rows, ratios = {}, {}
for name in labels:
    try:
        d = json.load(open(f"{out}/lab_{name}.json"))
    except (OSError, ValueError):
        continue
    for r in d.get("results", []):
        key = f"{r.get('phase')} {r.get('tokens') or r.get('batch')}"
        rows.setdefault(key, {})[name] = r.get("ms") or r.get("ms_per_step")
        ratios.setdefault(key, {})[name] = r.get("ratio_to_floor")
for v in list(rows.values()) + list(ratios.values()):
    for base in bases:
        runs = [v[n] for n in labels if n.rsplit(".", 1)[0] == base and v.get(n)]
        if runs:
            v[base + " median"] = statistics.median(runs)
columns = labels + [base + " median" for base in bases]
print("| case | " + " | ".join(columns) + " |")
print("|---|" + "---:|" * len(columns))
for k, v in rows.items():
    print(f"| {k} | " + " | ".join(f"{v[n]:.2f}" if v.get(n) else "–" for n in columns) + " |")
clocks = {}  # CLOCKS=1: the median SM clock over the samples above 250 W, and the most power
for name in labels:
    try:
        v = [tuple(float(x) for x in l.split(",")) for l in open(f"{out}/lab_{name}.clk") if l[:1].isdigit()]
    except (OSError, ValueError):
        continue
    busy = sorted(c for c, w in v if w > 250)
    if busy:
        clocks[name] = f"{busy[len(busy) // 2]:.0f} MHz / {max(w for _, w in v):.0f} W"
if clocks:
    print("| SM clock above 250 W / max power | " + " | ".join(clocks.get(n, "–") for n in columns) + " |")
print()
print("| ratio to floor | " + " | ".join(columns) + " |")
print("|---|" + "---:|" * len(columns))
for k, v in ratios.items():
    print(f"| {k} | " + " | ".join(f"{v[n]:.3f}" if v.get(n) else "–" for n in columns) + " |")
PY
n=""
while [ -e "$OUT/bench_lab$n.tgz" ]; do n=$(( ${n:-1} + 1 )); done
(cd "$OUT" && tar czf /tmp/bench_lab.tgz lab_* 2>/dev/null; rm -f lab_*; mv /tmp/bench_lab.tgz "bench_lab$n.tgz")
