#!/usr/bin/env bash
# On the GPU machine: builds `deepinfer` and profiles the decode kernels of one V2-Lite step with
# Nsight Compute (per-kernel duration, DRAM and SM throughput), eager (no graphs).
# Usage: bash scripts/device/ncu_decode.sh [KERNEL_REGEX] [BATCHES] [DTYPE] [COUNT] [SKIP]
#        (defaults: "mla|gemv|route", "1 256", bf16, 60 launches after skipping 200)
# NCU_CACHE=all flushes the caches before each kernel (session 6's figures); the default, none,
# keeps them warm, closer to a graph replay (session 7's). BENCH_FLAGS adds `deepinfer bench`
# flags (e.g. --batch-invariant); LOG_TAG names the logs apart ($OUT/ncu_<dtype>_b<B><tag>.log).
# NCU_SECTIONS adds Nsight sections to the metrics (e.g. "WarpStateStats MemoryWorkloadAnalysis":
# the stall reasons and the memory pipes; their tables are in the log, not in the summary).
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer
regex=${1:-mla|gemv|route}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
echo "ncu: $NCU"
for b in ${2:-1 256}; do
  # Skip the first SKIP matching launches (limits measurement and warm-up), profile COUNT.
  timeout 240 "$NCU" --clock-control none --cache-control "${NCU_CACHE:-none}" -k "regex:$regex" \
    --launch-skip "${5:-200}" --launch-count "${4:-60}" \
    $(for sec in ${NCU_SECTIONS:-}; do printf -- '--section %s ' "$sec"; done) \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread \
    build-device/src/tools/deepinfer bench --config bench/configs/deepseek_v2_lite.json --dtype "${3:-bf16}" \
    --prefill "" \
    --decode-batch "$b" --steps 2 --warmup 2 --no-graphs ${BENCH_FLAGS:-} > "$OUT/ncu_${3:-bf16}_b$b${LOG_TAG:-}.log" 2>&1
  echo "== B=$b rc=$?"
  python3 - "$OUT/ncu_${3:-bf16}_b$b${LOG_TAG:-}.log" <<'PY'
import re, sys, collections
txt = open(sys.argv[1]).read()
blocks = re.split(r'\n  (?=\S.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))', txt)
agg = collections.OrderedDict()
for b in blocks[1:]:
    name = b.split('(')[0].strip()
    name = re.sub(r'<.*', '', name)[-60:]
    m = {k: v for k, v in re.findall(r'\n\s+(\S+)\s+\S*\s+([\d.,]+)', b)}
    d = agg.setdefault(name, collections.defaultdict(list))
    for k, v in m.items():
        try: d[k].append(float(v.replace(',', '')))
        except ValueError: pass
for name, d in agg.items():
    t = d.get('gpu__time_duration.sum', [0])
    avg = lambda k: sum(d.get(k, [0])) / max(1, len(d.get(k, [0])))
    print(f"{name:60s} n={len(t):3d} mean {sum(t)/max(1,len(t)):10.1f} (ns/us as ncu prints) dram% {avg('dram__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} sm% {avg('sm__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} read {avg('dram__bytes_read.sum'):10.1f} grid {avg('launch__grid_size'):8.0f} regs {avg('launch__registers_per_thread'):4.0f}")
PY
done
