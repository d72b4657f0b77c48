#!/usr/bin/env bash
# On the GPU machine: builds deepinfer and mla_sublayer_bench for each overlay NAME of
# .device_carry/variants (scripts/device/make_variants.sh) into /tmp/variants/NAME/, then rebuilds
# the working tree as it came (every overlaid file restored, every file an overlay added removed).
# Then A/B them on one machine, interleaved: bench_lab.sh's BIN=/tmp/variants/NAME/deepinfer,
# sublayer_lab.sh's @/tmp/variants/NAME/mla_sublayer_bench.
# Usage (device `run`, carry [".device_carry", "third_party"]): bash scripts/device/build_variants.sh A B C
set -uo pipefail
source "$(dirname "$0")/build_device.sh"
keep=/tmp/variants/.orig
rm -rf /tmp/variants && mkdir -p "$keep"
for d in .device_carry/variants/*/; do (cd "$d" && find . -type f | sed 's|^\./||'); done | sort -u > /tmp/variants/.files
while read -r f; do
  if [ -f "$f" ]; then mkdir -p "$keep/$(dirname "$f")" && cp -p "$f" "$keep/$f"; fi
done < /tmp/variants/.files
restore() {
  while read -r f; do [ -f "$keep/$f" ] || rm -f "$f"; done < /tmp/variants/.files
  cp -r "$keep/." .
  find "$keep" -type f | sed "s|^$keep/||" | xargs -r touch  # newer than the overlays' objects
}
for name in "$@"; do
  restore
  cp -r ".device_carry/variants/$name/." .
  device_build deepinfer mla_sublayer_bench
  mkdir -p "/tmp/variants/$name"
  cp build-device/src/tools/deepinfer build-device/bench/mla_sublayer_bench "/tmp/variants/$name/"
  echo "== variant $name built"
done
restore
device_build deepinfer mla_sublayer_bench
echo "== working tree rebuilt"
