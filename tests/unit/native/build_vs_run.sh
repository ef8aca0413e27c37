#!/bin/sh
# build_vs_run.sh SHARDC EXE STEPS FILE ARGS...: `shardc build FILE ARGS -o EXE`, then the executable
# and `shardc run FILE ARGS` for STEPS steps, both --format json: PASS when both pass and print the
# same losses (the built executable places its blocks by the same descriptions as run: the runtime's
# block placement over the device program's RtPlace), else FAIL, exit 1.
shardc=$1 exe=$2 steps=$3
shift 3
"$shardc" build "$@" -o "$exe" || { echo "FAIL: shardc build failed"; exit 1; }
built=$("./$exe" --steps "$steps" --format json) || { echo "FAIL: the built executable failed: $built"; exit 1; }
run=$("$shardc" run "$@" --steps "$steps" --format json) || { echo "FAIL: shardc run failed"; exit 1; }
lb=$(printf '%s' "$built" | tr -d '\n' | sed -n 's/.*"loss":[[:space:]]*\[\([^]]*\)\].*/\1/p')
lr=$(printf '%s' "$run" | tr -d '\n' | sed -n 's/.*"loss":[[:space:]]*\[\([^]]*\)\].*/\1/p')
pb=$(printf '%s' "$built" | tr -d '\n' | sed -n 's/.*"pass":[[:space:]]*\([a-z]*\).*/\1/p')
pr=$(printf '%s' "$run" | tr -d '\n' | sed -n 's/.*"pass":[[:space:]]*\([a-z]*\).*/\1/p')
if [ "$pb" != true ] || [ "$pr" != true ]; then echo "FAIL: pass is '$pb' built, '$pr' run"; exit 1; fi
if [ -z "$lb" ]; then echo "FAIL: no losses"; exit 1; fi
awk -v a="$lb" -v b="$lr" 'BEGIN {
  n = split(a, x, /[, ]+/); m = split(b, y, /[, ]+/)
  ok = n == m
  for (i = 1; ok && i <= n; i++) ok = (x[i] - y[i] <= 1e-6 * (1 + (y[i] < 0 ? -y[i] : y[i]))) && (y[i] - x[i] <= 1e-6 * (1 + (y[i] < 0 ? -y[i] : y[i])))
  printf "%s: built losses [%s], run [%s]\n", ok ? "PASS" : "FAIL", a, b
  exit !ok
}'
