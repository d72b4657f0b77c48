#!/usr/bin/env bash
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build fp8_gemm_bench deepinfer_tests
timeout 120 build-device/tests/deepinfer_tests --gtest_filter='CudaFp8Gemm.*:CudaOps.MoeW8a8*' > "$OUT/fp8_tests.log" 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/fp8_tests.log" | tr '\n' ' ')"
grep -E "Failure" -A3 "$OUT/fp8_tests.log" | head -20
timeout 100 build-device/bench/fp8_gemm_bench --m 4096,16384 --variants 3 --clusters 1 --grouped-only --row-scales > $OUT/rows.jsonl 2>/dev/null
timeout 150 build-device/bench/fp8_gemm_bench --m 2048,4096,16384 --variants 3 --clusters 1 > $OUT/dense.jsonl 2>/dev/null
for f in rows dense; do python3 - $OUT/$f.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "name" in r: print(f"{r['kernel'][-9:]:9s} {r['model']:7s} {r['name']:16s} {r['M']:5d} {r['us']:8.1f} us {r['tflops']:7.1f}")
PY
done
