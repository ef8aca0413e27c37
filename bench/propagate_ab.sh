#!/usr/bin/env bash
# propagate_ab.sh: two builds of bench_propagate (bench/bench_propagate.c) timed alternately, row by
# row, in one run: before/after figures for docs/benchmarks.md. Usage:
#   bench/propagate_ab.sh BEFORE/bench_propagate AFTER/bench_propagate [REPS=1]
# To build the "before" of a commit C with this bench (the bench is newer than the search it times):
#   git archive C | tar -x -C /tmp/before && cp bench/bench_propagate.c bench/propagate.cmake /tmp/before/bench/
#   cmake -S /tmp/before -B /tmp/before/build -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build /tmp/before/build -j2 --target bench_propagate
set -euo pipefail
before=$1 after=$2 reps=${3:-1}
printf '%-8s %-8s %6s %12s %12s %8s\n' what layout layers before after ratio
for layout in tp fsdp_tp; do
  for spec in "forward 125" "forward 250" "forward 500" "forward 1000" "train 125" "train 250" "train 500" "train 1000"; do
    set -- $spec
    extra=(); [ "$1" = train ] && extra=(--train)
    tb=$("$before" --layers "$2" --layout "$layout" --reps "$reps" "${extra[@]}" | awk '/layers/ {print $5}')
    ta=$("$after" --layers "$2" --layout "$layout" --reps "$reps" "${extra[@]}" | awk '/layers/ {print $5}')
    printf '%-8s %-8s %6s %10.3f s %10.3f s %7.1fx\n' "$1" "$layout" "$2" "$tb" "$ta" "$(echo "$tb / $ta" | bc -l)"
  done
done
