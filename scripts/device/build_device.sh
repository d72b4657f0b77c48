# Sourced by the scripts/device/*.sh entry points on the GPU machine: unpacks the carried Debian
# packages (.device_carry: PCRE2 and xxHash, absent from the device image) and builds
# build-device (Release, CUDA backend) — `device_build [TARGET...]` (no target: everything).
# Logs: $OUT/configure.log, $OUT/build.log. Exits the calling script on failure.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
device_build() {
  local prefix=/tmp/deb
  mkdir -p "$prefix"
  for f in .device_carry/*.deb; do dpkg -x "$f" "$prefix"; done
  cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_PYTHON=OFF -DDEEPINFER_WERROR=OFF \
    -DCMAKE_PREFIX_PATH="$prefix/usr" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build build-device -j"$(nproc)" ${1:+--target "$@"} > "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
}
