#!/bin/sh
# same_as_threads.sh SHARDC NAME RUN_ARGS... -- MPI_ARGS...
# Runs `shardc run RUN_ARGS --save` on the threads backend and again with MPI_ARGS added (--backend
# mpi, maybe --threads-per-rank T), both must PASS, and every file the first saved (the output, or a
# train step's params and losses) must be byte for byte the file the second saved: the collectives
# reduce in rank order whatever the transport, so the bits are the same.
set -u
shardc=$1 name=$2
shift 2
run_args=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do run_args="$run_args '$1'"; shift; done
[ $# -gt 0 ] && shift
mpi_args=""
for a in "$@"; do mpi_args="$mpi_args '$a'"; done
dir=${TMPDIR:-/tmp}/shardc-mpi-same-$name-$$
rm -rf "$dir"
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
eval "\"$shardc\" run $run_args --save \"$dir/threads\"" > "$dir/threads.txt" 2>&1
t=$?
eval "\"$shardc\" run $run_args $mpi_args --save \"$dir/mpi\"" > "$dir/mpi.txt" 2>&1
m=$?
cat "$dir/threads.txt" "$dir/mpi.txt"
if [ $t -ne 0 ] || [ $m -ne 0 ]; then echo "FAIL: threads exited $t, mpi $m"; exit 1; fi
grep -q "^PASS: .* in [0-9]* MPI ranks" "$dir/mpi.txt" || { echo "FAIL: the MPI run did not PASS on MPI ranks"; exit 1; }
n=0
for f in "$dir/threads"/*.npy; do
  b=$(basename "$f")
  if ! cmp -s "$f" "$dir/mpi/$b"; then echo "FAIL: $b differs between threads and mpi"; cmp "$f" "$dir/mpi/$b"; exit 1; fi
  n=$((n + 1))
done
[ $n -gt 0 ] || { echo "FAIL: nothing was saved"; exit 1; }
echo "SAME: $n files byte for byte"
