#!/usr/bin/env bash
# demo.sh: installs what is missing, builds shardc, and asks it whether a sample model fits.
# Usage: scripts/demo.sh   (Debian 12; installs missing packages when run as root)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/setup.sh" "$here/build"
cd "$here"
run() {
  echo "+ $*"
  "$@"
}
run build/shardc check samples/mlp.shard
