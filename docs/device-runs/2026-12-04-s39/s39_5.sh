#!/usr/bin/env bash
# s39-5: what the next session's prefill work starts from — the MLA prefill kernel at 4K / 16K
# (bench and Nsight Compute's stall sampling inside the model's 4K FP8 prefill), and the SM clock
# the GPU holds during a sustained FP8 prefill against the dense GEMM bench's bursts.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
save() { tar czf "$REAL_OUT/s39_5.tgz" -C $OUT --exclude='*.ncu-rep' . 2>/dev/null; }
source scripts/device/build_device.sh
t0=$(date +%s); device_build deepinfer fp8_gemm_bench mla_prefill_bench; echo "build $(( $(date +%s) - t0 )) s"; save
timeout 120 build-device/bench/mla_prefill_bench --heads 16 --cases 1:4096:4096,1:16384:16384 --kernels 1 > $OUT/mla_prefill.jsonl 2>&1
grep -v "^$" $OUT/mla_prefill.jsonl | cut -c1-300 | tail -4
save
clocks() {  # label, command...: the SM clock and power sampled every 20 ms while it runs
  local label=$1; shift
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 20 > $OUT/clk_$label.csv 2>/dev/null &
  local pid=$!
  "$@" > $OUT/clk_$label.log 2>&1
  kill $pid; wait $pid 2>/dev/null
  python3 - $OUT/clk_$label.csv $label <<'PY'
import sys
v=[tuple(float(x) for x in l.split(',')) for l in open(sys.argv[1]) if l.strip() and l[0].isdigit()]
busy=[c for c,p in v if p > 250]
print(f"{sys.argv[2]:22s} samples {len(v)}, over 250 W: {len(busy)}, SM clock median there {sorted(busy)[len(busy)//2] if busy else 0:.0f} MHz, max power {max(p for c,p in v):.0f} W")
PY
}
clocks prefill4k_fp8 build-device/src/tools/deepinfer bench --config bench/configs/deepseek_v2_lite.json --dtype fp8 --prefill 4096 --prefill-reps 40 --decode-batch ""
clocks dense_bench build-device/bench/fp8_gemm_bench --model v2lite --m 4096 --dense-only --variants 3 --clusters 2 --row-scales --model-form --names q_kv_a,o_proj,shared2_down --reps 60
clocks grouped_bench build-device/bench/fp8_gemm_bench --model v2lite --m 4096 --grouped-only --variants 3 --n192 --reps 30
grep -E "prefill" $OUT/clk_prefill4k_fp8.log | head -3
save
bash scripts/device/ncu_source.sh mla4k 'mla_prefill_wgmma' 40 -- build-device/src/tools/deepinfer bench \
  --config bench/configs/deepseek_v2_lite.json --dtype fp8 --prefill 4096 --prefill-reps 1 --decode-batch "" 2>&1 | head -50
save
