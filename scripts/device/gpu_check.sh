#!/usr/bin/env bash
# On the GPU machine: build with the CUDA backend (sm_90a) and run everything that needs the GPU,
# plus the CPU suite with the device's compiler. Logs under $OUT (see the summary at the end).
# Usage (device `run`, carry [".device_carry", "third_party"]): bash scripts/device/gpu_check.sh [bench]
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
{
  nproc; gcc --version | head -1; nvcc --version | tail -1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
} > "$OUT/machine.txt" 2>&1
t0=$(date +%s)
device_build ${DEVICE_TARGETS:-}
echo "build: $(( $(date +%s) - t0 )) s"
T=build-device/tests/deepinfer_tests
status=0
run() {  # name, command...
  local name=$1; shift
  local s=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  echo "$name: rc=$rc $(( $(date +%s) - s )) s  $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200)"
}
run cuda_ops "$T" --gtest_filter='CudaOps.*:CudaMlaSublayer.*:CudaSampling.*:CudaMlaTc.*:CudaMlaPrefill.*:CudaFp8Gemm.*:CudaTiledGemmV3.*:CudaMoeSort.*'
grep -E 'v[23] |TFLOP' "$OUT/cuda_ops.log" | head -12
run cuda_invariance "$T" --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*'
grep -E "^\[invariance\]" "$OUT/cuda_invariance.log"
run cuda_fixtures "$T" --gtest_filter='Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
grep -E "\[cuda (fixture|parity)\]" "$OUT/cuda_fixtures.log" | sed 's|/.*/fixtures/||' | head -60
run cuda_runtime env DEEPINFER_TEST_DEVICE=cuda "$T" --gtest_filter='LLMEngine.*'
grep -c "\[tolerant\]" "$OUT/cuda_runtime.log" | sed 's/^/tolerant divergences: /'
grep -E "\[(timeline|graphs)\]" "$OUT/cuda_runtime.log"
# The batch-invariant mode's identity tests again with every row absorbed (kAbsorbed, the policy
# DEEPINFER_CUDA_INVARIANT_NAIVE=0 selects).
run cuda_runtime_absorbed env DEEPINFER_TEST_DEVICE=cuda DEEPINFER_CUDA_INVARIANT_NAIVE=0 "$T" \
  --gtest_filter='LLMEngine.BatchInvariant*:LLMEngine.ChunkedPrefill*:LLMEngine.PrefixCache*:LLMEngine.Preemption*:LLMEngine.SecondTurn*'
# The backend's switches away from their defaults (docs/perf.md, versions 16–18): the FP8
# GLU-quantize epilogue, the invariant mode's tiled router, the W8A8 GEMM's early weights, the
# grouped FP8 GEMM's staggered warpgroups on (measured no faster, off by default), 2-block FP8
# clusters for every wgmma GEMM (the default: dense ones from 2,048 rows only), the invariant bf16 MoE's K-split structure instead of one K chain (the default
# since version 16) and the invariant router's two-launch form (the one-launch form is the
# default since version 18), the one-token MoE kernel's FP8 form (version 23, off: slower), and
# a one-token MoE layer's norm, router and routing as one launch and the layer's input norm folded
# into the sublayer kernel in every mode (by default only where each measured faster, version 29).
# Their own tests set them; here the model-level suites run with them.
NEXT="DEEPINFER_CUDA_FP8_GLU=1 DEEPINFER_CUDA_ROUTER_TILED=1 DEEPINFER_CUDA_INVARIANT_MOE_CHAIN=0 DEEPINFER_CUDA_W8A8_EARLY_W=1
  DEEPINFER_CUDA_FP8_STAGGER=1 DEEPINFER_CUDA_FP8_CLUSTER=2 DEEPINFER_CUDA_INVARIANT_FUSED_ROUTER=0
  DEEPINFER_CUDA_MOE_ONE_FP8=1 DEEPINFER_CUDA_NORM_ROUTE=1 DEEPINFER_CUDA_SUBLAYER_NORM=1"
run cuda_next env $NEXT "$T" \
  --gtest_filter='CudaInvariantOps.*:CudaBatchInvariance.*:CudaOps.Moe*:Fixtures/GoldenFixtureCuda.*:CudaModelParity.*'
run cuda_runtime_next env DEEPINFER_TEST_DEVICE=cuda $NEXT "$T" \
  --gtest_filter='LLMEngine.BatchInvariant*:LLMEngine.ChunkedPrefill*:LLMEngine.PrefixCache*:LLMEngine.Preemption*:LLMEngine.SecondTurn*'
run bf16_reference env PYTHONUNBUFFERED=1 python3 scripts/golden/bf16_reference_error.py --out "$OUT/bf16_reference.json"
cat "$OUT/bf16_reference.log"
run cli_generate build-device/src/tools/deepinfer generate --device cuda --prompt "The capital of France is" --max-tokens 24
tail -3 "$OUT/cli_generate.log"
run cpu_suite bash -c "cd build-device && ctest -j$(nproc) --output-on-failure -E 'Cuda'"
tail -3 "$OUT/cpu_suite.log"
grep -E "FAILED|Failure|error" "$OUT"/cuda_*.log | head -60
if [ "${1:-}" = bench ]; then
  bash scripts/bench/run_gpu_bench.sh "$OUT/bench"
fi
exit $status
