#!/usr/bin/env bash
# Here, not on the GPU machine: the overlays build_variants.sh builds there — for each NAME=REF,
# the files under src/, bench/ and tests/ in which REF differs from HEAD, as REF has them, in
# .device_carry/variants/NAME/ (carried with .device_carry). A/B of code versions on one machine
# (perf.md version 30: a sublayer change that won in its lab lost in the model).
# Usage: bash scripts/device/make_variants.sh A=wip/x~2 B=wip/x~1 C=wip/x
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .device_carry/variants
for spec in "$@"; do
  name=${spec%%=*} ref=${spec#*=}
  [[ $name =~ ^[A-Za-z0-9_-]+$ && $spec == *=* ]] || { echo "make_variants: NAME=REF, got '$spec'" >&2; exit 2; }
  mkdir -p ".device_carry/variants/$name"
  if git diff --name-only --diff-filter=D HEAD "$ref" -- src bench tests | grep -q .; then
    echo "make_variants: $ref deletes files; an overlay can only add or replace them" >&2
    exit 2
  fi
  git diff --name-only HEAD "$ref" -- src bench tests | while read -r f; do
    mkdir -p ".device_carry/variants/$name/$(dirname "$f")"
    git show "$ref:$f" > ".device_carry/variants/$name/$f"
  done
  echo "$name ($ref): $(find ".device_carry/variants/$name" -type f | wc -l) files"
done
