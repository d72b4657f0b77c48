#!/usr/bin/env bash
# Runs the DeepInfer-vs-transformers benchmark on the GPU machine and prints the markdown report.
#
#   scripts/bench/run_gpu_bench.sh OUT_DIR [all|deepinfer|peer|serve|profile|report]
#
# Expects `deepinfer` built in build-device/ (cmake -B build-device ... && ninja -C build-device deepinfer).
#   deepinfer: `deepinfer bench` on deepseek_v2_lite.json (bf16, fp8) and deepseek_v2_lite_8l_q1536.json (bf16)
#   peer:      scripts/bench/torch_peer.py on the same two configs (bf16)
#   serve:     `deepinfer bench --serve 64` on deepseek_v2_lite.json: the serving loop (scheduler,
#              device sampling) synchronous and overlapped, with the device timeline (not in "all")
#   profile:   `deepinfer bench --op-times` on deepseek_v2_lite.json, bf16 and fp8: device time per op
#              kind for prefill 4096 and decode B=1/32/256 (not in "all")
#   invariant: `deepinfer bench` on deepseek_v2_lite.json, bf16 and fp8, default and --batch-invariant
#              (prefill 4096, decode B=1/32/256): the batch-invariant mode's overhead (its MLA policy
#              by_origin; INVARIANT_ABSORBED=1 adds a run with DEEPINFER_CUDA_INVARIANT_NAIVE=0, every
#              row absorbed); then prefill 16384 (default mode) and, where built,
#              bench/mla_prefill_bench (not in "all")
#   report:    scripts/bench/report.py OUT_DIR, also saved as OUT_DIR/report.md
# Each command runs under `timeout` (seconds: DI_TIMEOUT, default 180; PEER_TIMEOUT, default 280, with
# the peer's own budget PEER_MAX_SECONDS, default 180); a failed or timed-out command is reported
# and the rest still run (both writers leave valid JSON of what they measured). Exit status 1 if any
# command failed. Worst case about 9 minutes per part: where one command may run at most 10 minutes,
# run "deepinfer", "peer" and "report" as separate commands.
set -u -o pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 OUT_DIR [all|deepinfer|peer|serve|profile|invariant|report]" >&2
  exit 2
fi
OUT=$1
WHAT=${2:-all}
case "$WHAT" in all|deepinfer|peer|serve|profile|invariant|report) ;; *) echo "$0: unknown part '$WHAT'" >&2; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$ROOT/build-device/src/tools/deepinfer
DI_TIMEOUT=${DI_TIMEOUT:-180}
PEER_TIMEOUT=${PEER_TIMEOUT:-280}
PEER_MAX_SECONDS=${PEER_MAX_SECONDS:-180}
LITE=bench/configs/deepseek_v2_lite.json
LITE8=bench/configs/deepseek_v2_lite_8l_q1536.json
mkdir -p "$OUT"
cd "$ROOT"
failed=0

# run NAME SECONDS CMD...: runs CMD under timeout, its output in OUT/NAME.log and on stdout.
run() {
  local name=$1 seconds=$2
  shift 2
  echo "== $name: $*"
  local start=$SECONDS
  timeout --kill-after=15 "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "== $name: TIMED OUT after ${seconds}s" || echo "== $name: FAILED (exit $rc)"
    failed=1
  fi
  echo "== $name: $((SECONDS - start))s"
}

if [ "$WHAT" = all ] || [ "$WHAT" = deepinfer ]; then
  if [ ! -x "$BIN" ]; then
    echo "$0: $BIN not found: build it first (ninja -C build-device deepinfer)" >&2
    exit 2
  fi
  run deepinfer_v2_lite_bf16 "$DI_TIMEOUT" "$BIN" bench --config "$LITE" --dtype bf16 --json "$OUT/deepinfer_v2_lite_bf16.json"
  run deepinfer_v2_lite_fp8 "$DI_TIMEOUT" "$BIN" bench --config "$LITE" --dtype fp8 --json "$OUT/deepinfer_v2_lite_fp8.json"
  run deepinfer_v2_lite_8l_q1536_bf16 "$DI_TIMEOUT" "$BIN" bench --config "$LITE8" --dtype bf16 \
    --json "$OUT/deepinfer_v2_lite_8l_q1536_bf16.json"
fi

if [ "$WHAT" = serve ]; then
  run deepinfer_v2_lite_serve "$DI_TIMEOUT" "$BIN" bench --config "$LITE" --dtype bf16 --prefill "" --decode-batch "" \
    --serve 64 --context 512 --steps 64 --json "$OUT/deepinfer_v2_lite_serve.json"
fi

if [ "$WHAT" = profile ]; then
  for dt in bf16 fp8; do
    run "deepinfer_v2_lite_${dt}_ops" "$DI_TIMEOUT" "$BIN" bench --config "$LITE" --dtype "$dt" --prefill 4096 \
      --decode-batch 1,32,256 --op-times --json "$OUT/deepinfer_v2_lite_${dt}_ops.json"
  done
fi

if [ "$WHAT" = invariant ]; then
  for dt in bf16 fp8; do
    # invariant_absorbed: the batch-invariant mode with every row absorbed (MlaPolicy::kAbsorbed).
    for mode in default invariant ${INVARIANT_ABSORBED:+invariant_absorbed}; do
      flag="" naive=1
      [ "$mode" != default ] && flag=--batch-invariant
      [ "$mode" = invariant_absorbed ] && naive=0
      run "deepinfer_v2_lite_${dt}_${mode}" "$DI_TIMEOUT" env DEEPINFER_CUDA_INVARIANT_NAIVE=$naive "$BIN" bench \
        --config "$LITE" --dtype "$dt" --prefill 4096 --decode-batch 1,32,256 --op-times $flag \
        --json "$OUT/deepinfer_v2_lite_${dt}_${mode}.json"
    done
    run "deepinfer_v2_lite_${dt}_prefill16k" "$DI_TIMEOUT" "$BIN" bench --config "$LITE" --dtype "$dt" --prefill 16384 \
      --decode-batch "" --op-times --json "$OUT/deepinfer_v2_lite_${dt}_prefill16k.json"
  done
  MLA_BENCH=$ROOT/build-device/bench/mla_prefill_bench
  if [ -x "$MLA_BENCH" ]; then
    run mla_prefill_bench "$DI_TIMEOUT" bash -c "\"$MLA_BENCH\" > \"$OUT/mla_prefill_bench.jsonl\""
  fi
fi

if [ "$WHAT" = all ] || [ "$WHAT" = peer ]; then
  run transformers_v2_lite_bf16 "$PEER_TIMEOUT" python3 scripts/bench/torch_peer.py --config "$LITE" \
    --max-seconds "$PEER_MAX_SECONDS" --out "$OUT/transformers_v2_lite_bf16.json"
  run transformers_v2_lite_8l_q1536_bf16 "$PEER_TIMEOUT" python3 scripts/bench/torch_peer.py --config "$LITE8" \
    --max-seconds "$PEER_MAX_SECONDS" --out "$OUT/transformers_v2_lite_8l_q1536_bf16.json"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = report ]; then
  python3 scripts/bench/report.py "$OUT" | tee "$OUT/report.md" || failed=1
fi
exit $failed
