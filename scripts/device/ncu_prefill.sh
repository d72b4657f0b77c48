#!/usr/bin/env bash
# On the GPU machine: where a V2-Lite prefill's time goes, kernel by kernel — Nsight Compute's
# gpu__time_duration of every kernel of the timed prefill (the one after the warm-up; the
# weights' random fills skipped), summed per kernel name, largest first. (No nsys on the image.)
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   bash scripts/device/ncu_prefill.sh [DTYPES] [TOKENS]   (defaults "fp8 bf16" 4096)
# Output: the table on stdout, raw CSVs in $OUT/ncu_prefill_<dtype>.csv.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer
BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
tokens=${2:-4096}
for dt in ${1:-fp8 bf16}; do
  timeout 400 "$NCU" --clock-control none --metrics gpu__time_duration.sum -k 'regex:^(?!fill_random)' \
    --launch-count 2400 --csv --log-file "$OUT/ncu_prefill_$dt.csv" "$BIN" bench --config "$LITE" --dtype "$dt" \
    --prefill "$tokens" --prefill-reps 1 --decode-batch "" > "$OUT/ncu_prefill_$dt.log" 2>&1
  echo "== $dt prefill $tokens: ncu rc=$?"
  python3 - "$OUT/ncu_prefill_$dt.csv" <<'PY'
import collections, csv, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')))
ids = sorted({int(r["ID"]) for r in rows})
emb = sorted({int(r["ID"]) for r in rows if "embedding" in r["Kernel Name"]})
if len(emb) < 2:
    sys.exit(f"expected two prefills (warm-up, timed), found {len(emb)} embedding launches")
unit = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
agg, cnt = collections.defaultdict(float), collections.Counter()
for r in rows:
    if int(r["ID"]) < emb[1] or r["Metric Name"] != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0][:100]
    agg[name] += float(r["Metric Value"].replace(",", "")) * unit[r["Metric Unit"]]
    cnt[name] += 1
print(f"{sum(cnt.values())} kernels, {sum(agg.values()) / 1e3:.2f} ms of kernel time")
for k, v in sorted(agg.items(), key=lambda x: -x[1])[:25]:
    print(f"{v / 1e3:8.3f} ms {cnt[k]:5d}x {v / cnt[k]:8.1f} us  {k}")
PY
done
