#!/usr/bin/env bash
# On the GPU machine: where a V2-Lite prefill's time goes, kernel by kernel — Nsight Compute's
# gpu__time_duration of every kernel of the timed prefill (the one after the warm-up; the
# weights' random fills skipped), summed per kernel name, largest first. (No nsys on the image.)
# With BYTES=1 also each kernel's DRAM bytes (read + written) and their rate (TB/s over its time):
# how near the memory-bound kernels are to the copy rate.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BYTES=1] bash scripts/device/ncu_prefill.sh [DTYPES] [TOKENS]   (defaults "fp8 bf16" 4096)
# Output: the table on stdout, raw CSVs in $OUT/ncu_prefill_<dtype>.csv.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer
BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
tokens=${2:-4096}
metrics=gpu__time_duration.sum
[ "${BYTES:-0}" = 1 ] && metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum
for dt in ${1:-fp8 bf16}; do
  timeout 400 "$NCU" --clock-control none --metrics $metrics -k 'regex:^(?!fill_random)' \
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
unit = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
        "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
agg, cnt, nbytes = collections.defaultdict(float), collections.Counter(), collections.defaultdict(float)
for r in rows:
    if int(r["ID"]) < emb[1]:
        continue
    name = r["Kernel Name"].split("(")[0][:100]
    v = float(r["Metric Value"].replace(",", "")) * unit[r["Metric Unit"]]
    if r["Metric Name"] == "gpu__time_duration.sum":
        agg[name] += v
        cnt[name] += 1
    elif r["Metric Name"].startswith("dram__bytes"):
        nbytes[name] += v
print(f"{sum(cnt.values())} kernels, {sum(agg.values()) / 1e3:.2f} ms of kernel time")
for k, v in sorted(agg.items(), key=lambda x: -x[1])[:25]:
    rate = f" {nbytes[k] / 1e6 / cnt[k]:8.1f} MB {nbytes[k] / v / 1e6:5.2f} TB/s" if k in nbytes else ""
    print(f"{v / 1e3:8.3f} ms {cnt[k]:5d}x {v / cnt[k]:8.1f} us{rate}  {k}")
PY
done
