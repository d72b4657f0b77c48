#!/usr/bin/env bash
# On the GPU machine: the absorbed MLA decode's split kernels in one call — their tests
# (CudaMlaTc.*, CudaOps.Mla*), the SASS of the wgmma split kernel summed up (instructions,
# wgmmas, warpgroup waits and arrives, spills), and bench/mla_decode_bench at V2-Lite's 16 heads
# and V3's 128 (and 64) for each split kernel (MLA_KERNELS; 1: the automatic tensor-core choice —
# warp-specialized at H < 64, wgmma at H ≥ 64 —, 2: the one-row mma.sync kernel).
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [MLA_HEADS=128,64] [MLA_CASES=1:4096,...] [MLA_KERNELS="1 2"] [MLA_TESTS=0] bash scripts/device/mla_decode_lab.sh
# Output: tables on stdout; $OUT/mla_tests.log, $OUT/mla_bench_k<kernel>.jsonl, $OUT/mla_wgmma.sass.gz.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
t0=$(date +%s)
device_build deepinfer_tests mla_decode_bench
echo "build: $(( $(date +%s) - t0 )) s"
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
obj=$(find build-device -name "cuda_mla_split_wgmma.cu.o" | head -1)
"$CUOBJDUMP" -sass "$obj" 2>/dev/null | awk '/Function : /{f = ($0 ~ /mla_split_wgmma/)} f' > /tmp/mla_wgmma.sass
python3 - /tmp/mla_wgmma.sass <<'PY'
import re, sys
for fn in open(sys.argv[1]).read().split("Function : ")[1:]:
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", fn)
    count = lambda pat: sum(1 for o in ops if re.search(pat, o))
    print(f"mla_split_wgmma_kernel SASS: {len(ops)} ins, HGMMA {count(r'HGMMA')}, "
          f"WARPGROUP.DEPBAR {count(r'WARPGROUP.DEPBAR')}, WARPGROUP.ARRIVE {count(r'WARPGROUP.ARRIVE')}, "
          f"STL {count(r'STL')}, LDL {count(r'LDL')}, R2UR {count(r'R2UR')}")
PY
gzip -c /tmp/mla_wgmma.sass > "$OUT/mla_wgmma.sass.gz"
T=build-device/tests/deepinfer_tests
status=0
if [ "${MLA_TESTS:-1}" != 0 ]; then
  s=$(date +%s)
  "$T" --gtest_filter='CudaMlaTc.*:CudaOps.Mla*' > "$OUT/mla_tests.log" 2>&1 || status=1
  echo "tests: rc=$status $(( $(date +%s) - s )) s  $(grep -E '^\[  (PASSED|FAILED)' "$OUT/mla_tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|error|rel" "$OUT/mla_tests.log" | head -30
fi
for k in ${MLA_KERNELS:-1 2}; do
  timeout 240 build-device/bench/mla_decode_bench --heads "${MLA_HEADS:-128,64}" --kernel "$k" \
    --cases "${MLA_CASES:-1:4096,1:32768,1:131072,8:32768,32:16384,64:8192,128:4096,128:16384}" \
    > "$OUT/mla_bench_k$k.jsonl" 2> "$OUT/mla_bench_k$k.err"
  echo "== kernel $k (rc $?)"
  python3 scripts/device/mla_bench_table.py "$OUT/mla_bench_k$k.jsonl"
done
exit $status
