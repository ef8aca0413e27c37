#!/usr/bin/env bash
# propagate_ab.sh: two builds of bench_propagate (bench/bench_propagate.c) timed alternately, row by
# row, in one run: before/after figures for docs/benchmarks.md, the process's CPU time (which a
# loaded machine disturbs less) and the wall time. Usage:
#   bench/propagate_ab.sh BEFORE/bench_propagate AFTER/bench_propagate [REPS=1]
# To build the "before" of a commit C with this bench (the bench is newer than the code it times):
#   git archive C | tar -x -C /tmp/before && cp bench/bench_propagate.c bench/propagate.cmake /tmp/before/bench/
#   cmake -S /tmp/before -B /tmp/before/build -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build /tmp/before/build -j2 --target bench_propagate
set -euo pipefail
before=$1 after=$2 reps=${3:-1}
printf '%-8s %-8s %6s %12s %12s %8s %12s %12s\n' what layout layers cpu-before cpu-after ratio wall-before wall-after
for layout in tp fsdp_tp; do
  for spec in "forward 125" "forward 250" "forward 500" "forward 1000" "train 125" "train 250" "train 500" "train 1000"; do
    set -- $spec
    extra=(); [ "$1" = train ] && extra=(--train)
    read -r wb cb < <("$before" --layers "$2" --layout "$layout" --reps "$reps" "${extra[@]}" | awk '/layers/ {print $5, $(NF-1)}')
    read -r wa ca < <("$after" --layers "$2" --layout "$layout" --reps "$reps" "${extra[@]}" | awk '/layers/ {print $5, $(NF-1)}')
    printf '%-8s %-8s %6s %10.3f s %10.3f s %7.1fx %10.3f s %10.3f s\n' "$1" "$layout" "$2" "$cb" "$ca" \
      "$(echo "$cb / $ca" | bc -l)" "$wb" "$wa"
  done
done
