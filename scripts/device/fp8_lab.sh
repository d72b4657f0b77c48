#!/usr/bin/env bash
# On the GPU machine: the FP8 GEMM lab — its tests (CudaFp8Gemm.*, incl. the wgmma form), then
# bench/fp8_gemm_bench (mma.sync variant 2 and wgmma variant 3, dense and grouped) against
# torch's blockwise scaled_mm on the same dense shapes, with a per-shape ratio table.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [VARIANTS=2,3] [CLUSTERS=1,2] bash scripts/device/fp8_lab.sh [M_LIST]
# (CLUSTERS: the wgmma form's blocks per A-sharing cluster, each timed.)
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer_tests fp8_gemm_bench
ms=${1:-128,512,2048,4096,8192}
timeout 180 build-device/tests/deepinfer_tests --gtest_filter='CudaFp8Gemm.*' > "$OUT/fp8_tests.log" 2>&1
echo "fp8 tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/fp8_tests.log" | tr '\n' ' ')"
grep -E "wgmma|FAILED|Failure|error" "$OUT/fp8_tests.log" | head -30
timeout 200 build-device/bench/fp8_gemm_bench --m "$ms" --variants "${VARIANTS:-2,3}" \
  --clusters "${CLUSTERS:-1,2}" > "$OUT/fp8_ours.jsonl" 2> "$OUT/fp8_ours.err"
echo "ours rc=$?"; tail -3 "$OUT/fp8_ours.err"
timeout 200 python3 scripts/bench/fp8_gemm_torch.py --m "$ms" > "$OUT/fp8_torch.jsonl" 2> "$OUT/fp8_torch.err"
echo "torch rc=$?"; tail -3 "$OUT/fp8_torch.err"
python3 - "$OUT/fp8_ours.jsonl" "$OUT/fp8_torch.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
torch = {(r["model"], r["name"], r["M"]): r for r in (json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")) if "name" in r}
print(f"{'model':7s} {'name':16s} {'M':>6s} {'v':>2s} {'cl':>2s} {'us':>9s} {'TFLOP/s':>8s} {'torch':>8s} {'ratio':>6s}")
for r in rows:
    if "name" not in r: print(r); continue
    t = torch.get((r["model"], r["name"], r["M"]))
    tt = t["tflops"] if t and "grouped" not in r["kernel"] else float("nan")
    print(f"{r['model']:7s} {r['name']:16s} {r['M']:6d} {r['variant']:2d} {r.get('cluster', 0):2d} {r['us']:9.1f} {r['tflops']:8.1f} {tt:8.1f} {r['tflops']/tt if tt == tt else float('nan'):6.2f}")
PY
