#!/usr/bin/env bash
# On the GPU machine: Nsight Compute's warp-state breakdown of one launch of the one-token
# attention sublayer kernel (bench/mla_sublayer_bench.cpp) per flag set — where its warps stall
# (per issued instruction: no instruction = instruction fetch, barrier, long scoreboard = memory,
# math pipe throttle, …). Needs build-device/bench/mla_sublayer_bench (sublayer_lab.sh builds it).
# Usage: [CONTEXTS=512] bash scripts/device/ncu_sublayer.sh "FLAGS" ["FLAGS"...]
# Output: $OUT/ncu_sublayer_<n>.log per flag set; a table of the largest stall reasons on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/out}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
n=0
for flags in "$@"; do
  n=$((n + 1))
  # shellcheck disable=SC2086  # flags: zero or more words
  timeout 200 "$NCU" --clock-control none -k regex:mla_sublayer --launch-skip 5 --launch-count 1 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum,sm__cycles_elapsed.avg" \
    build-device/bench/mla_sublayer_bench --contexts "${CONTEXTS:-512}" --reps 1 $flags > "$OUT/ncu_sublayer_$n.log" 2>&1
  echo "== '$flags': rc=$?"
  python3 - "$OUT/ncu_sublayer_$n.log" <<'PY'
import re, sys
m = dict(re.findall(r"\n\s+(\S+)\s+\S*\s+([\d.,]+)\s*(?=\n)", open(sys.argv[1]).read()))
val = lambda k: float(m[k].replace(",", "")) if k in m else float("nan")
stalls = {k.split("stalled_")[1].split("_per_issue")[0]: val(k) for k in m if "issue_stalled_" in k}
top = sorted(stalls.items(), key=lambda kv: -kv[1])[:8]
print(f"  time {val('gpu__time_duration.sum')} ns, instructions {val('smsp__inst_executed.sum'):.0f}, "
      f"cycles {val('sm__cycles_elapsed.avg'):.0f}")
print("  stalls per issued instruction: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
PY
done
