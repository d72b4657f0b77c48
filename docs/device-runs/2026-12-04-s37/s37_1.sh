#!/usr/bin/env bash
# s37-1: the eager 4K prefill's device timeline (CUPTI trace) in FP8 and bf16, and Nsight Compute's
# DRAM bytes per kernel of the FP8 prefill.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
source scripts/device/build_device.sh
timeout 300 bash -c 'source scripts/device/build_device.sh; device_build deepinfer deepinfer_kernel_trace' > $OUT/build.log 2>&1
echo "build rc=$?"; tail -3 $OUT/build.log
BIN=build-device/src/tools/deepinfer LITE=bench/configs/deepseek_v2_lite.json
LIB=$PWD/build-device/src/tools/libdeepinfer_kernel_trace.so
for dt in fp8 bf16; do
  timeout 150 env DEEPINFER_KERNEL_TRACE=$OUT/trace_$dt.tsv CUDA_INJECTION64_PATH=$LIB $BIN bench --config $LITE \
    --dtype $dt --prefill 4096 --prefill-reps 3 --decode-batch "" --json $OUT/traced_$dt.json > $OUT/traced_$dt.log 2>&1
  echo "== $dt traced rc=$?"
  timeout 150 $BIN bench --config $LITE --dtype $dt --prefill 4096 --prefill-reps 3 --decode-batch "" \
    --json $OUT/untraced_$dt.json > $OUT/untraced_$dt.log 2>&1
  echo "== $dt untraced rc=$?"
  python3 - $OUT/traced_$dt.json $OUT/untraced_$dt.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    for r in json.load(open(f)).get("results", []):
        print(f"  {f.split('/')[-1]}: ms {r.get('ms')} all {r.get('ms_all')} enqueue {r.get('enqueue_ms')} ratio {r.get('ratio_to_floor')}")
PY
  timeout 60 python3 scripts/device/prefill_trace.py $OUT/trace_$dt.tsv --label $dt --json $OUT/prefill_trace_$dt.json
  gzip -f $OUT/trace_$dt.tsv
done
BYTES=1 timeout 400 bash scripts/device/ncu_prefill.sh fp8 4096 > $OUT/ncu_bytes.txt 2>&1
echo "ncu rc=$?"; head -32 $OUT/ncu_bytes.txt
gzip -f $OUT/ncu_prefill_fp8.csv
cd $OUT && tar czf $REAL_OUT/s37_1.tgz .
