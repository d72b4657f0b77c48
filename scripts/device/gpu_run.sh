#!/usr/bin/env bash
# One device call: scripts/device/gpu_check.sh, then the chosen benchmark parts, then every log
# packed into $OUT/logs.tgz (a call brings back at most 8 files).
# Usage: bash scripts/device/gpu_run.sh [deepinfer|peer|serve|profile|invariant|all|none]
# It packs and then deletes everything under $OUT, the caller's own files too: a caller that logs
# its output writes it outside $OUT (e.g. > /tmp/run.txt) and prints it afterwards.
OUT=${OUT:-/tmp/out}
bash scripts/device/gpu_check.sh
rc=$?
part=${1:-none}
if [ "$part" != none ]; then
  DI_TIMEOUT=${DI_TIMEOUT:-140} bash scripts/bench/run_gpu_bench.sh "$OUT/bench" "$part" 2>&1 | grep -vE '^\s*$' | tail -40
  bash scripts/bench/run_gpu_bench.sh "$OUT/bench" report > /dev/null 2>&1
  cat "$OUT/bench/report.md" 2>/dev/null | head -60
fi
(cd "$OUT" && tar czf /tmp/logs.tgz . ; find . -mindepth 1 -delete; mv /tmp/logs.tgz .)
exit $rc
