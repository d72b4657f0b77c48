#!/usr/bin/env bash
# On the GPU machine: whole-file candidates of one CUDA source compared in one call — each copied
# over the source, its target rebuilt, the SASS of the chosen kernels summed up (instructions,
# R2UR moves, spills, the instructions of each loop holding wgmmas), then a bench command. The
# candidates are code-generation changes that keep every bit (the suite checks the committed
# one); the original source is restored at the end.
# Usage (device `run`, carry [".device_carry", "third_party", "lab"]):
#   [LAB_DIR=lab/wgmma] [LAB_SRC=src/backend/cuda/cuda_fp8_wgmma.cu] [LAB_TARGET=fp8_gemm_bench]
#   [LAB_KERNELS='regex'] [LAB_BENCH='command'] bash scripts/device/codegen_lab.sh
# Defaults: the FP8 wgmma GEMM's three forms the model runs (dense bf16 / fp32 out, grouped bf16
# out; block-form scales) and bench/fp8_gemm_bench at V2-Lite's dense and expert shapes (LAB_M,
# default 4096,16384). LAB_DIR holds the candidates (*.cu; lab/ is git-ignored, so the call carries
# it). Output: tables on stdout; $OUT/codegen_lab.tgz (each candidate's bench output and
# the chosen kernels' SASS).
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
SRC=${LAB_SRC:-src/backend/cuda/cuda_fp8_wgmma.cu}
LAB_DIR=${LAB_DIR:-lab/wgmma}
TARGET=${LAB_TARGET:-fp8_gemm_bench}
KERNELS=${LAB_KERNELS:-fp8_wgmma_kernelILb0E13__nv_bfloat16Lb0ELi1E|fp8_wgmma_kernelILb0EfLb0ELi1E|fp8_wgmma_kernelILb1E13__nv_bfloat16Lb0ELi1E}
fp8_bench() {
  timeout 150 build-device/bench/fp8_gemm_bench --model v2lite --m "${LAB_M:-4096,16384}" --variants 3 > "$1.jsonl" 2> "$1.err"
  python3 - "$1.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{") and '"name"' in line:
        r = json.loads(line)
        print("  %-16s M=%6d %9.1f us %7.1f TFLOP/s" % (r["name"], r["M"], r["us"], r["tflops"]))
PY
}
work=/tmp/codegen_lab
mkdir -p "$work"
cp "$SRC" "$work/orig.cu"
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
for cand in "$LAB_DIR"/*.cu; do
  name=$(basename "$cand" .cu)
  cp "$cand" "$SRC"
  device_build "$TARGET"
  obj=$(find build-device -name "$(basename "$SRC").o" | head -1)
  "$CUOBJDUMP" -sass "$obj" 2>/dev/null | awk -v re="$KERNELS" '/Function : /{f = ($0 ~ re)} f' > "$work/$name.sass"
  echo "== $name"
  python3 - "$work/$name.sass" <<'PY'
import re, sys
for fn in open(sys.argv[1]).read().split("Function : ")[1:]:
    label = fn.split("\n", 1)[0].strip()[-60:]
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", fn)]
    ops = [o for _, o in ins]
    count = lambda pat: sum(1 for o in ops if re.search(pat, o))
    loops = []
    for addr, op in ins:  # backward branches whose body holds wgmmas: the K loops
        m = re.search(r"BRA (?:\S+, )?0x([0-9a-f]+)", op)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            body = [o for a, o in ins if lo <= a <= addr]
            g = sum(1 for o in body if "GMMA" in o)
            spill = sum(1 for o in body if "LDL" in o or "STL" in o)
            if g and len(body) < 800:  # not the tile loops
                loops.append(f"{len(body)} ins / {g} wgmma" + (f" / {spill} LDL+STL" if spill else ""))
    print(f"  {label}\n    {len(ops)} ins, R2UR {count(r'R2UR')}, STL {count(r'STL')}, LDL {count(r'LDL')}, "
          f"loops: {'; '.join(loops)}")
PY
  if [ -n "${LAB_BENCH:-}" ]; then
    (eval "$LAB_BENCH") > "$work/$name.bench" 2>&1
    tail -"${LAB_BENCH_LINES:-20}" "$work/$name.bench"
  else
    fp8_bench "$work/$name"
  fi
done
cp "$work/orig.cu" "$SRC"
(cd "$work" && tar czf "$OUT/codegen_lab.tgz" --exclude=orig.cu ./*)
