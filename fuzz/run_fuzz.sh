#!/usr/bin/env bash
# Builds (incrementally) and runs one libFuzzer target for SECONDS over a scratch copy of its seed
# corpus (fuzz/corpus/<name>/, <name> = TARGET without "_fuzz") with fuzz/<name>.dict if there is
# one. Exits non-zero if the fuzzer finds a crash, leak, timeout or sanitizer report; the
# reproducer is kept in BUILD_DIR/fuzz/artifacts/.
#   usage: fuzz/run_fuzz.sh BUILD_DIR SECONDS [TARGET]     (TARGET defaults to safetensors_fuzz)
#   BUILD_DIR must be configured with: CC=clang CXX=clang++ cmake -S . -B BUILD_DIR -DDEEPINFER_FUZZ=ON
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET]" >&2
  exit 2
fi
build_dir=$1
seconds=$2
target=${3:-safetensors_fuzz}
name=${target%_fuzz}
fuzz_dir=$(cd "$(dirname "$0")" && pwd)

# Inputs larger than a real file of that kind only slow the search down.
case "$target" in
  tokenizer_load_fuzz) max_len=65536 ;;
  tokenizer_roundtrip_fuzz) max_len=4096 ;;
  *) max_len=8192 ;;
esac

cmake --build "$build_dir" --target "$target"
binary="$build_dir/fuzz/$target"
artifacts="$build_dir/fuzz/artifacts"
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp "$fuzz_dir/corpus/$name"/* "$work/corpus/"
dict=()
[[ -f "$fuzz_dir/$name.dict" ]] && dict=(-dict="$fuzz_dir/$name.dict")

# -timeout: one input taking > 10 s is a hang; -rss_limit_mb: the parser must not balloon.
"$binary" "$work/corpus" \
  "${dict[@]}" \
  -max_total_time="$seconds" \
  -max_len="$max_len" \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/"
