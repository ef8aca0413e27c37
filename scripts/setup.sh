#!/usr/bin/env bash
# Installs the Debian packages shardc needs (when missing), then configures and builds it.
# Usage: scripts/setup.sh [BUILD_DIR] [extra cmake args...]   (run as root on Debian 12)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$here/build"}
shift || true

pkgs=(cmake make gcc re2c lemon llvm-19-dev clang-19 libclang-rt-19-dev
      libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin libcjson-dev python3 python3-numpy
      chromium)  # chromium: tests/report renders `shardc report`'s page headless
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages and not root; run as root or install: ${missing[*]}" >&2
    exit 2
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
