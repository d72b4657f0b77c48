#!/usr/bin/env bash
# Test command: the whole CPU suite (Release), the same suite under AddressSanitizer and
# UndefinedBehaviorSanitizer, the safetensors-header fuzzer and the two tokenizer fuzzers for
# short budgets.
# Assumes scripts/setup.sh has run. FUZZ_SECONDS (default 60) sets the safetensors fuzzing budget,
# TOKENIZER_FUZZ_SECONDS (default 20) each tokenizer fuzzer's.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="$(nproc)"

echo "== Release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$JOBS"
(cd build && ctest --output-on-failure -j"$JOBS")

echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
# (The Python module is left out here: an ASan-built extension needs the runtime preloaded. So
# is the CUDA backend: its kernels cannot run without a GPU, the Release build above compiles
# them, and compiling them twice more — Debug, sm_90a and sm_100a — doubled CI's time.)
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDEEPINFER_SANITIZE=address,undefined \
  -DDEEPINFER_BENCH=OFF -DDEEPINFER_PYTHON=OFF -DDEEPINFER_CUDA=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$JOBS")

echo "== libFuzzer: safetensors header parser"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DDEEPINFER_CUDA=OFF -DDEEPINFER_FUZZ=ON -DDEEPINFER_TESTS=OFF -DDEEPINFER_BENCH=OFF -DDEEPINFER_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$JOBS" --target safetensors_fuzz
bash fuzz/run_fuzz.sh build-fuzz "${FUZZ_SECONDS:-60}"

echo "== libFuzzer: tokenizer loading, encode/decode round trip (TOKENIZER_FUZZ_SECONDS each)"
cmake --build build-fuzz -j"$JOBS" --target tokenizer_load_fuzz tokenizer_roundtrip_fuzz
bash fuzz/run_fuzz.sh build-fuzz "${TOKENIZER_FUZZ_SECONDS:-20}" tokenizer_load_fuzz
bash fuzz/run_fuzz.sh build-fuzz "${TOKENIZER_FUZZ_SECONDS:-20}" tokenizer_roundtrip_fuzz
echo "all checks passed"
