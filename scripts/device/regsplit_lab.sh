#!/usr/bin/env bash
# On the GPU machine: the FP8 wgmma GEMM's register split (RegSplit in cuda_fp8_wgmma.cu: the
# loader warpgroup's and the math warpgroups' setmaxnreg counts) for the grouped block-scale form
# the MoE runs — each candidate patched into the device's copy of the source (nothing comes
# back), rebuilt, its ptxas spills printed, then bench/fp8_gemm_bench at V2-Lite's expert shapes.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   bash scripts/device/regsplit_lab.sh ["LOADER/MATH ..."]   (default "56/224 40/232 24/240")
# Output: tables on stdout, $OUT/regsplit_<loader>_<math>.jsonl.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
SRC=src/backend/cuda/cuda_fp8_wgmma.cu
cp "$SRC" /tmp/wgmma_orig.cu
for split in ${1:-56/224 40/232 24/240}; do
  lo=${split%/*} ma=${split#*/}
  sed "s/kRowScales ? 104 : 56;/kRowScales ? 104 : $lo;/; s/kRowScales ? 200 : 224;/kRowScales ? 200 : $ma;/" /tmp/wgmma_orig.cu > "$SRC"
  grep -q "kRowScales ? 104 : $lo;" "$SRC" || { echo "patch failed for $split"; exit 1; }
  device_build fp8_gemm_bench
  echo "== split $lo / $ma"
  # Where the grouped bf16 block-scale kernel spills: its local loads / stores among the wgmmas.
  obj=$(find build-device -name 'cuda_fp8_wgmma.cu.o' | head -1)
  CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  "$CUOBJDUMP" -sass "$obj" 2>/dev/null | awk '/Function : .*fp8_wgmma_kernelILb1E13__nv_bfloat16Lb0ELi1E/{f=1; next} /Function :/{f=0} f' \
    > "$OUT/sass_${lo}_${ma}.txt"
  echo "sass lines $(wc -l < "$OUT/sass_${lo}_${ma}.txt"): HGMMA $(grep -c HGMMA "$OUT/sass_${lo}_${ma}.txt")," \
    "LDL $(grep -c 'LDL' "$OUT/sass_${lo}_${ma}.txt"), STL $(grep -c 'STL' "$OUT/sass_${lo}_${ma}.txt")"
  grep -nE "HGMMA|LDL|STL|WARPGROUP|SYNCS|BAR" "$OUT/sass_${lo}_${ma}.txt" | awk -F'*/' '{print $1 "*/" substr($2, 1, 60)}' | head -"${SASS_LINES:-60}"
  timeout 120 build-device/bench/fp8_gemm_bench --model v2lite --grouped-only --m 256,4096,16384 --variants 3 \
    > "$OUT/regsplit_${lo}_${ma}.jsonl" 2>&1
  python3 - "$OUT/regsplit_${lo}_${ma}.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{") and '"name"' in line:
        r = json.loads(line)
        print("%-16s M=%6d %9.1f us %7.1f TFLOP/s" % (r["name"], r["M"], r["us"], r["tflops"]))
PY
done
cp /tmp/wgmma_orig.cu "$SRC"
