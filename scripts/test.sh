#!/usr/bin/env bash
# test.sh: installs what is missing, builds shardc, and runs every test.
# Usage: scripts/test.sh [BUILD_DIR=build] [extra cmake args...]
# On Debian 12 as root it installs the missing packages itself (scripts/setup.sh); the tests are
# the ctest suites: tests/*/ cases via tests/runner, parse-all over stdlib/ and samples/, the
# runner's self-test, unit tests, and a smoke run of the benchmarks.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$here/build"}
shift || true

bash "$here/scripts/setup.sh" "$build" "$@"
cd "$build"
ctest --output-on-failure -j"$(nproc)"
