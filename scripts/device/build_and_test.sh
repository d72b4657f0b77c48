#!/usr/bin/env bash
# On the GPU machine (Ubuntu 24.04 image, gcc 13, no registry access): unpack the Debian packages
# the image lacks (carried in .device_carry/: libpcre2-dev, libxxhash-dev), build Release and run
# the CPU suite there. Writes the logs under $OUT. Usage (device `run`, carry
# [".device_carry", "third_party"]): bash scripts/device/build_and_test.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
prefix=/tmp/deb
mkdir -p "$prefix"
for f in .device_carry/*.deb; do dpkg -x "$f" "$prefix"; done
{
  nproc; gcc --version | head -1; nvcc --version | tail -1; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} > "$OUT/machine.txt" 2>&1
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_PYTHON=OFF \
  -DCMAKE_PREFIX_PATH="$prefix/usr" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-device -j"$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E "error|warning" "$OUT/build.log" | head -40; exit 1; }
(cd build-device && ctest -j"$(nproc)" --output-on-failure > "$OUT/ctest.log" 2>&1)
rc=$?
tail -5 "$OUT/ctest.log"
exit $rc
