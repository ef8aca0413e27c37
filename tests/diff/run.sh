#!/bin/sh
# run.sh: the differential tester (README.md) with the repo's build: tests/diff/run.sh --cases 2000 --seed 5
# SHARDC=path overrides the shardc under test (default: build/shardc next to this tree).
here=$(cd "$(dirname "$0")" && pwd)
exec /usr/bin/python3 "$here/diff.py" --shardc "${SHARDC:-$here/../../build/shardc}" "$@"
