#!/usr/bin/env bash
# On the GPU machine: where a V2-Lite prefill's wall time goes beyond its kernels. Runs
# `deepinfer bench` prefills (3 timed runs each) while nvidia-smi samples the SM clock, power and
# clock-event reasons every 50 ms, then prints per run its wall time and host enqueue time
# (`enqueue_ms`: until the forward call returned — near the wall time, the host bounds the step)
# and the clock / power distribution while the GPU was busy (a power-capped clock under sustained
# FP8 GEMMs slows every kernel against the isolated kernels Nsight Compute times).
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [DTYPES="fp8 bf16"] [TOKENS=4096,16384] [NCU_TOKENS=4096] bash scripts/device/prefill_timeline.sh
# NCU_TOKENS also runs scripts/device/ncu_prefill.sh fp8 at that length. Output: $OUT/prefill_<dtype>.json,
# $OUT/smi.csv, the summary on stdout.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer
BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
for dt in ${DTYPES:-fp8 bf16}; do
  timeout 200 "$BIN" bench --config "$LITE" --dtype "$dt" --prefill "${TOKENS:-4096,16384}" --prefill-reps 3 \
    --decode-batch "" --json "$OUT/prefill_$dt.json" > "$OUT/prefill_$dt.log" 2>&1
  echo "== $dt: rc=$?"
done
kill "$smi" 2>/dev/null
python3 - "$OUT" <<'PY'
import collections, glob, json, sys
out = sys.argv[1]
for f in sorted(glob.glob(out + "/prefill_*.json")):
    d = json.load(open(f))
    for r in d.get("results", []):
        print(f"{d['dtype']:5s} prefill {r.get('tokens')}: ms {r.get('ms')} (runs {r.get('ms_all')}), "
              f"enqueue_ms {r.get('enqueue_ms')}, ratio {r.get('ratio_to_floor')}")
rows = []
for line in open(out + "/smi.csv"):
    p = [x.strip() for x in line.split(",")]
    if len(p) < 6 or not p[1].split()[0].isdigit():
        continue
    rows.append((int(p[1].split()[0]), float(p[2].split()[0]), p[4], p[5]))
busy = [r for r in rows if r[2].split()[0].isdigit() and int(r[2].split()[0]) >= 90]
print(f"{len(rows)} samples, {len(busy)} with the GPU >= 90 % busy")
if busy:
    clocks = sorted(r[0] for r in busy)
    print(f"busy SM clock MHz: min {clocks[0]} median {clocks[len(clocks) // 2]} max {clocks[-1]}; "
          f"power W max {max(r[1] for r in busy):.0f}")
    for reason, n in collections.Counter(r[3] for r in busy).most_common(6):
        print(f"  clock-event reasons {reason}: {n} samples")
PY
if [ -n "${NCU_TOKENS:-}" ]; then bash scripts/device/ncu_prefill.sh fp8 "$NCU_TOKENS" | head -40; fi
