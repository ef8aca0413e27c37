#!/bin/sh
# run_mpi.sh BUILD_DIR [RANKS]: the runtime over MPI against threads and against Open MPI's own
# (docs/benchmarks.md, "The runtime over MPI"):
#   1. bench_mpi under mpirun -np RANKS (default 4): AllReduce and AllGather per collective and
#      bytes/s, on the MPI backend, Open MPI's MPI_Allreduce / MPI_Allgather, the threads backend
#      and the hybrid (2 device threads per rank)
#   2. the MLP's train step on 4 devices (h100[data: 2, model: 2], batch 16 x seq 256, embed 512,
#      hidden 2048, fsdp_tp): the step time under threads, over MPI (4 ranks) and the hybrid (2
#      ranks of 2 threads), each the mean of 5 steps, best of 3 runs
set -eu
build=${1:-build}
ranks=${2:-4}
here=$(cd "$(dirname "$0")/.." && pwd)
shardc="$build/shardc"
root=$([ "$(id -u)" = 0 ] && echo --allow-run-as-root || true)
echo "== bench_mpi: $ranks ranks (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
mpirun $root --oversubscribe -np "$ranks" "$build/bench/bench_mpi" --reps 5
MLP="-D batch=16 -D seq=256 -D embed=512 -D hidden=2048"
step() { # the best of 3 runs' mean step time, in ms
  best=""
  for i in 1 2 3; do
    t=$("$shardc" run "$here/samples/mlp.shard" $MLP --layout fsdp_tp --mesh 'h100[data: 2, model: 2]' --steps 5 --no-reference \
          --format json "$@" | tr -d '\n' | sed -n 's/.*"step_time_s":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
    best=$(awk -v a="$best" -v b="$t" 'BEGIN { print (a == "" || b < a) ? b : a }')
  done
  awk -v t="$best" 'BEGIN { printf "%.2f ms", t * 1e3 }'
}
echo "== mlp train step, h100[data: 2, model: 2], $MLP, mean of 5 steps, best of 3 (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "  threads (4 device threads)   $(step)"
echo "  mpi (4 ranks)                $(step --backend mpi)"
echo "  mpi (2 ranks x 2 threads)    $(step --backend mpi --threads-per-rank 2)"
