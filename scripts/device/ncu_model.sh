#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on the kernels matching a regex inside the model — `deepinfer
# bench` on V2-Lite, one-token decode steps at context 512, eager (--no-graphs: ncu serializes
# launches, so a kernel's pre-wait prologue no longer overlaps its predecessor; compare settings
# with each other, not with graphed step times) — per setting: each profiled launch's time,
# instructions executed and the stall on instruction fetch (no_instruction per issued
# instruction: a kernel's code missing in the SM's caches, which a lab's back-to-back launches of
# one kernel hide — perf.md, version 30). Needs build-device (bench_lab.sh's BUILD=1 builds it).
# Usage: [KERNEL=regex:moe_one] [SKIP=60] [COUNT=4] bash scripts/device/ncu_model.sh \
#          LABEL,DTYPE,MODE[,ENV=VALUE...] ...   (as bench_lab.sh; BIN=path: another build)
# Output: $OUT/ncu_model_<LABEL>.log per setting; one line per setting on stdout.
# SKIP counts matching launches from the process's start: a regex matching every kernel (one
# layer's launches: KERNEL=regex:. COUNT=6) counts the weight loader's random fills too — bf16 at
# SKIP=400 reached the decode steps in run s34-3, FP8 (more fill launches: codes and scales) did not.
set -uo pipefail
OUT=${OUT:-/tmp/out}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu 2>/dev/null)
LITE=bench/configs/deepseek_v2_lite.json
for spec in "$@"; do
  IFS=, read -r label dtype mode envs <<< "$spec"
  flag="" bin=build-device/src/tools/deepinfer
  [ "$mode" = invariant ] && flag=--batch-invariant
  for kv in ${envs//,/ }; do [[ $kv == BIN=* ]] && bin=${kv#BIN=}; done
  # shellcheck disable=SC2086  # envs, flag: zero or more words
  timeout 300 env ${envs//,/ } "$NCU" --clock-control none --cache-control none -k "${KERNEL:-regex:moe_one}" \
    --launch-skip "${SKIP:-60}" --launch-count "${COUNT:-4}" \
    --metrics "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__inst_executed.sum,gpu__time_duration.sum" \
    "$bin" bench --config "$LITE" --dtype "$dtype" --prefill "" --decode-batch 1 --context 512 --no-graphs $flag \
    > "$OUT/ncu_model_$label.log" 2>&1
  rc=$?
  python3 - "$OUT/ncu_model_$label.log" "$label" "$rc" <<'PY'
import re, sys
text, label, rc = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
short = {"gpu__time_duration.sum": "us", "smsp__inst_executed.sum": "inst",
         "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio": "no_inst",
         "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "barrier",
         "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "long_sb"}
print(f"== {label} (rc={rc})")
# One section per profiled launch: its header line "  name(args) (grid)x(block), Context …", then
# its metrics as "    metric  unit  value".
for sec in re.split(r"\n(?=  \S[^\n]*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", text)[1:]:
    name = re.sub(r"<.*", "", sec.split("(", 1)[0].strip()).split("::")[-1]
    parts = []
    for k, unit, v in re.findall(r"\n\s+(\S+)\s+(\S*)\s+([\d.,]+)\s*(?=\n|$)", sec):
        if k in short:
            x = float(v.replace(",", ""))
            if short[k] == "us":
                x = x / 1000 if unit.startswith("ns") or unit.startswith("nsecond") else x * 1000 if unit.startswith("ms") or unit.startswith("msecond") else x
            parts.append(f"{short[k]} {x:.4g}")
    print(f"  {name}: " + ", ".join(parts))
PY
done
