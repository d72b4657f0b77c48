#!/usr/bin/env bash
# s37-4: A/B of 52f1c94 against b3da232 (overlay "base") on one machine: V2-Lite 4K prefill and
# decode B = 1, 32 in FP8 and bf16, two interleaved rounds; then Nsight Compute on the glue kernels.
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/w; mkdir -p $OUT
VARIANT_TARGETS=deepinfer timeout 420 bash scripts/device/build_variants.sh base > $OUT/variants.log 2>&1
echo "variants rc=$?"; grep "==" $OUT/variants.log
B=/tmp/variants/base/deepinfer
ROUNDS=2 BATCHES=1,32 PREFILL=4096 BUILD=0 timeout 400 bash scripts/device/bench_lab.sh \
  base8,fp8,default,BIN=$B new8,fp8,default base16,bf16,default,BIN=$B new16,bf16,default > $OUT/ab.txt 2>&1
echo "ab rc=$?"; cat $OUT/ab.txt | tail -25
cp $OUT/bench_lab.tgz $OUT/ab_bench_lab.tgz 2>/dev/null
mkdir -p /tmp/gr; OUT=/tmp/gr timeout 150 bash .device_carry/s37_2.sh > $OUT/glue.txt 2>&1; grep -E "^--|Duration" $OUT/glue.txt | sed -E 's/; (Memory|Compute|Achieved|Theoretical|Registers|No Eligible|Eligible|Active|Warp Cycles|Block Size|Grid Size|L2|Mem Busy|Max|Waves|Block Limit|Dynamic)[^;]*//g' | head -40
cd $OUT && tar czf $REAL_OUT/s37_4.tgz .
