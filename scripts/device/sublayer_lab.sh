#!/usr/bin/env bash
# On the GPU machine: the one-token attention sublayer kernel (bench/mla_sublayer_bench.cpp) under
# several flag sets, one table: µs per launch and the phase timeline's medians / latest blocks.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [BUILD=0] [CONTEXTS=512,4096,32768] [ROUNDS=n] bash scripts/device/sublayer_lab.sh "FLAGS" ["FLAGS"...]
# e.g. bash scripts/device/sublayer_lab.sh "" "--invariant" "@/tmp/ob/mla_sublayer_bench --invariant"
# FLAGS may start with @BINARY (another build's mla_sublayer_bench, e.g. the code before a change:
# perf.md version 30 built it from the changed files' previous versions carried in .device_carry).
# ROUNDS=n runs the flag sets n times, interleaved round by round; the table adds each case's
# median µs over the rounds.
# Output: the table on stdout; every line of JSON in $OUT/sublayer_lab.jsonl.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
[ "${BUILD:-1}" = 1 ] && device_build mla_sublayer_bench
BIN=build-device/bench/mla_sublayer_bench
: > "$OUT/sublayer_lab.jsonl"
for ((round = 1; round <= ${ROUNDS:-1}; ++round)); do
  for spec in "$@"; do
    bin=$BIN flags=$spec
    if [[ $spec == @* ]]; then
      bin=${spec%% *} bin=${bin#@} flags=${spec#"@$bin"}
    fi
    echo "{\"spec\": \"$spec\"}" >> "$OUT/sublayer_lab.jsonl"
    # shellcheck disable=SC2086  # flags: zero or more words
    timeout 120 "$bin" --contexts "${CONTEXTS:-512,4096,32768}" $flags >> "$OUT/sublayer_lab.jsonl" 2>&1 ||
      echo "== '$spec': rc=$?"
  done
done
python3 - "$OUT/sublayer_lab.jsonl" <<'PY'
import json, sys
import statistics
rows, spec = [], ""
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if "spec" in d:
        spec = d["spec"]
    elif d.get("kernel") == "deepinfer_mla_sublayer":
        d["spec"] = spec
        rows.append(d)
if not rows:
    sys.exit("no results")
show = ("waited", "P1 rows", "P1", "B1", "B2", "P3", "B3", "B4", "P5 rows", "exit")
print("| spec | form | keys | µs | " + " | ".join(f"{m} med / last" for m in show) + " |")
print("|---|---|---:|---:|" + "---:|" * len(show))
for r in rows:
    # "P1 rows" / "P5 rows": marks of perf.md version 30's lab build (its weight rows arrived);
    # a build without them shows "–" there.
    marks = [m.strip() for m in r["marks"].split(",")]
    cells = [f"{r['median_us'][marks.index(m)]:.2f} / {r['latest_us'][marks.index(m)]:.2f}" if m in marks else "–"
             for m in show]
    print(f"| {r['spec']} | {r['form']} | {r['context']} | "
          f"{r['us']:.2f} | " + " | ".join(cells) + " |")
cases = {}
for r in rows:
    cases.setdefault((r["spec"], r["context"]), []).append(r["us"])
if any(len(v) > 1 for v in cases.values()):
    print("\n| spec | keys | µs per round | median |\n|---|---:|---|---:|")
    for (sp, c), v in cases.items():
        print(f"| {sp} | {c} | {', '.join(f'{x:.2f}' for x in v)} | {statistics.median(v):.2f} |")
PY
