#!/bin/sh
# peak_vs_check.sh SHARDC FILE ARGS...: `shardc run --format json`'s peak_bytes_per_device against
# `shardc check --format json`'s memory.per_device.total for the same arguments: PASS within 10%
# (docs/run.md, "Memory"), else FAIL, exit 1. SHARDC_PEAK_TOLERANCE overrides the 0.10.
shardc=$1
shift
tol=${SHARDC_PEAK_TOLERANCE:-0.10}
run=$("$shardc" run "$@" --format json) || { echo "FAIL: shardc run failed"; exit 1; }
check=$("$shardc" check "$@" --format json) || { echo "FAIL: shardc check failed"; exit 1; }
peak=$(printf '%s' "$run" | tr -d '\n' | sed -n 's/.*"peak_bytes_per_device":[[:space:]]*\([0-9]*\).*/\1/p')
total=$(printf '%s' "$check" | tr -d '\n' | sed -n 's/.*"per_device":[[:space:]]*{[^}]*"total":[[:space:]]*\([0-9]*\).*/\1/p')
pass=$(printf '%s' "$run" | tr -d '\n' | sed -n 's/.*"pass":[[:space:]]*\([a-z]*\).*/\1/p')
if [ -z "$peak" ] || [ -z "$total" ] || [ "$total" -eq 0 ]; then
  echo "FAIL: no figures (run peak '$peak', check total '$total')"
  exit 1
fi
if [ "$pass" != true ]; then
  echo "FAIL: the run did not pass"
  exit 1
fi
awk -v p="$peak" -v c="$total" -v t="$tol" 'BEGIN {
  r = p / c
  printf "%s: measured peak %d B per device, check total %d B, ratio %.3f (tolerance %.2f)\n", (r >= 1 - t && r <= 1 + t) ? "PASS" : "FAIL", p, c, r, t
  exit !(r >= 1 - t && r <= 1 + t)
}'
