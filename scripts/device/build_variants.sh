#!/usr/bin/env bash
# On the GPU machine: builds deepinfer and mla_sublayer_bench (or the targets in VARIANT_TARGETS,
# e.g. "deepinfer moe_one_bench") for each overlay NAME of
# .device_carry/variants (scripts/device/make_variants.sh) into /tmp/variants/NAME/, then rebuilds
# the working tree as it came (every overlaid file restored, every file an overlay added removed).
# Then A/B them on one machine, interleaved: bench_lab.sh's BIN=/tmp/variants/NAME/deepinfer,
# sublayer_lab.sh's @/tmp/variants/NAME/mla_sublayer_bench.
# Usage (device `run`, carry [".device_carry", "third_party"]):
#   [VARIANT_TARGETS="deepinfer moe_one_bench"] bash scripts/device/build_variants.sh A B C
set -uo pipefail
read -r -a targets <<< "${VARIANT_TARGETS:-deepinfer mla_sublayer_bench}"
# A target's binary: the CLI under src/tools, the benches under bench/.
target_bin() { [ "$1" = deepinfer ] && echo build-device/src/tools/deepinfer || echo "build-device/bench/$1"; }
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
  device_build "${targets[@]}"
  mkdir -p "/tmp/variants/$name"
  for tg in "${targets[@]}"; do cp "$(target_bin "$tg")" "/tmp/variants/$name/"; done
  echo "== variant $name built"
done
restore
device_build "${targets[@]}"
echo "== working tree rebuilt"
