#!/usr/bin/env bash
# Builds (incrementally) and runs safetensors_fuzz for SECONDS over a scratch copy of the seed
# corpus. Exits non-zero if the fuzzer finds a crash, leak, timeout or sanitizer report; the
# reproducer is kept in BUILD_DIR/fuzz/artifacts/.
#   usage: fuzz/run_fuzz.sh BUILD_DIR SECONDS
#   BUILD_DIR must be configured with: CC=clang CXX=clang++ cmake -S . -B BUILD_DIR -DDEEPINFER_FUZZ=ON
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build_dir=$1
seconds=$2
fuzz_dir=$(cd "$(dirname "$0")" && pwd)

cmake --build "$build_dir" --target safetensors_fuzz
binary="$build_dir/fuzz/safetensors_fuzz"
artifacts="$build_dir/fuzz/artifacts"
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp "$fuzz_dir"/corpus/safetensors/* "$work/corpus/"

# -timeout: one input taking > 10 s is a hang; -rss_limit_mb: the parser must not balloon.
"$binary" "$work/corpus" \
  -dict="$fuzz_dir/safetensors.dict" \
  -max_total_time="$seconds" \
  -max_len=8192 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/"
