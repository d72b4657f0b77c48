#!/usr/bin/env bash
# s37-5: the final code (the FP8 quantizers' reciprocal division; RoPE and the gather back as they
# were): the GPU suites, then the FP8 4K prefill with the MoE knobs the faster quantizer could
# move (the shared experts in the routed launch, the GLU-quantize epilogue), two rounds.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
timeout 400 bash -c 'source scripts/device/build_device.sh; device_build deepinfer deepinfer_tests' > $OUT/build.log 2>&1
echo "build rc=$?"; grep -E "error" $OUT/build.log | head
T=build-device/tests/deepinfer_tests
run() { local name=$1; shift; timeout 300 "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$name.log | tr '\n' ' ' | cut -c1-300)"; grep -E "^\[  FAILED" $OUT/$name.log | head; }
run ops $T --gtest_filter='CudaOps.*:CudaMlaSublayer.*:CudaMlaPrefill.*:CudaFp8Gemm.*:CudaMoeSort.*:Fp8ScaleDiv.*'
run inv $T --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
run fixtures $T --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
ROUNDS=2 BATCHES=1 PREFILL=4096 BUILD=0 timeout 300 bash scripts/device/bench_lab.sh new8,fp8,default \
  shared8,fp8,default,DEEPINFER_CUDA_MOE_SHARED_FUSE=1 glu8,fp8,default,DEEPINFER_CUDA_FP8_GLU=1 > $OUT/knobs.txt 2>&1
echo "knobs rc=$?"; grep "^|" $OUT/knobs.txt
python3 - $OUT <<'PY'
import glob, json, sys, tarfile, io
t = tarfile.open(sys.argv[1] + "/bench_lab.tgz")
for m in t.getmembers():
    if m.name.endswith(".json"):
        d = json.load(t.extractfile(m))
        for r in d.get("results", []):
            if r.get("phase") == "prefill":
                print(m.name, "prefill ms", round(r["ms"], 3), "floor_ms", round(r["floor_ms"], 3), "flops", r["flops"], "ratio", round(r["ratio_to_floor"], 4))
        print("  limits", {k: v for k, v in d.get("limits", {}).items() if "per_s" in k})
PY
cd $OUT && tar czf $REAL_OUT/s37_5.tgz .
