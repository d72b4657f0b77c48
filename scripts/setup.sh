#!/usr/bin/env bash
# Set-up command: installs the Debian 12 packages DeepInfer needs and builds it (Release) into
# build/. Safe to re-run. Needs root or sudo for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake g++ clang libclang-rt-14-dev pkg-config
  nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev
  python3
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

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
echo "built: build/src/tools/deepinfer"
