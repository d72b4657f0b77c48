#!/usr/bin/env bash
# On the GPU machine: the A/B figures that decide the defaults of the backend switches still off
# (docs/perf.md, versions 15–16), each switch on its own: DEEPINFER_CUDA_ROUTER_TILED (the
# invariant router's tiled kernel, from 1,024 rows), DEEPINFER_CUDA_INVARIANT_MOE_CHAIN (the
# invariant bf16 MoE in one K chain), and the lab knob DEEPINFER_CUDA_MOE_SHARED_FUSE (the
# shared experts in the routed launch: 0 never, 1 always). First the invariant op tests
# (CudaInvariantOps.*: the tiled router's bits), then bench_lab.sh.
# Usage (device `run`, carry [".device_carry", "third_party"]): bash scripts/device/switches_lab.sh
# Output: $OUT/inv_ops.log, $OUT/bench_lab.tgz, the table on stdout.
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
device_build deepinfer_tests deepinfer
build-device/tests/deepinfer_tests --gtest_filter='CudaInvariantOps.*' > "$OUT/inv_ops.log" 2>&1
echo "inv_ops: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/inv_ops.log" | tr '\n' ' ')"
PREFILL=${PREFILL:-4096,16384} BATCHES=${BATCHES:-1,32,256} BUILD=0 bash "$(dirname "$0")/bench_lab.sh" \
  bf16,bf16,default bf16_inv,bf16,invariant \
  bf16_inv_router,bf16,invariant,DEEPINFER_CUDA_ROUTER_TILED=1 \
  bf16_inv_chain,bf16,invariant,DEEPINFER_CUDA_INVARIANT_MOE_CHAIN=1 \
  bf16_inv_both,bf16,invariant,DEEPINFER_CUDA_ROUTER_TILED=1,DEEPINFER_CUDA_INVARIANT_MOE_CHAIN=1 \
  fp8,fp8,default fp8_inv,fp8,invariant fp8_inv_router,fp8,invariant,DEEPINFER_CUDA_ROUTER_TILED=1 \
  fp8_fuse0,fp8,default,DEEPINFER_CUDA_MOE_SHARED_FUSE=0 fp8_fuse1,fp8,default,DEEPINFER_CUDA_MOE_SHARED_FUSE=1 \
  bf16_fuse1,bf16,default,DEEPINFER_CUDA_MOE_SHARED_FUSE=1
