#!/usr/bin/env bash
# run.sh: runs every benchmark from a build directory and prints the numbers docs/benchmarks.md
# reports. Usage: bench/run.sh [BUILD_DIR=build] [LINES=1000000]
# Build first (scripts/setup.sh, a RelWithDebInfo build, no sanitizers). Generated inputs go to
# BUILD_DIR/bench/. Close other work on the machine: these are wall-clock timings.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
lines=${2:-1000000}

if grep -q 'SHARDC_\(SANITIZE\|FUZZ\|TSAN\):BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "bench: warning: $build is a sanitizer or fuzzing build; timings will be meaningless" >&2
fi
echo "bench: machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "bench: build: $(grep -m1 '^CMAKE_BUILD_TYPE' "$build/CMakeCache.txt" | cut -d= -f2), $(grep -m1 '^CMAKE_C_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)"

# ---- front end: parse a generated ~1M-line program ----
input=$build/bench/gen_${lines}.shard
if [ ! -s "$input" ] || [ "$build/bench/gen_program" -nt "$input" ]; then
  "$build/bench/gen_program" "$input" --lines "$lines" --seed 1
fi
echo "bench: frontend: $build/bench/bench_frontend $input --reps 5"
"$build/bench/bench_frontend" "$input" --reps 5

# ---- explain, stage by stage, in one process (bench/bench_explain.c) ----
if [ -x "$build/bench/bench_explain" ]; then
  echo "bench: explain stages: $build/bench/bench_explain --reps 5"
  (cd "$here" && "$build/bench/bench_explain" --reps 5)
fi

# ---- diagnostics: 1k, 10k and 100k of them, the cost of each 10x (bench/bench_diag.c) ----
if [ -x "$build/bench/bench_diag" ]; then
  echo "bench: diagnostics: $build/bench/bench_diag --reps 3"
  "$build/bench/bench_diag" --reps 3
fi

# ---- check's search for what would fit, against one check (bench/bench_fit.c) ----
if [ -x "$build/bench/bench_fit" ]; then
  for blocks in 25 50 100; do
    echo "bench: fit search: $build/bench/bench_fit --blocks $blocks --reps 3"
    "$build/bench/bench_fit" --blocks "$blocks" --reps 3
  done
  "$build/bench/bench_fit" --blocks 100 --reps 1 --out "$build/bench/fit_100.shard" >/dev/null
fi

# ---- check's pass pipeline on N unrolled matmul layers (bench/bench_propagate.c) ----
if [ -x "$build/bench/bench_propagate" ]; then
  echo "bench: propagation: $build/bench/bench_propagate --reps 3"
  "$build/bench/bench_propagate" --reps 3
fi

# ---- the runtime: GEMM vs cblas_sgemm, AllReduce vs memcpy, barriers (bench/bench_runtime.c) ----
if [ -x "$build/bench/bench_runtime" ]; then
  echo "bench: runtime: $build/bench/bench_runtime --reps 5"
  "$build/bench/bench_runtime" --reps 5
fi

# ---- command line: whole commands on real programs, best of N wall-clock runs ----
# best_of N CMD...: runs CMD N times (output discarded) and prints the best wall time. Exit status
# 0 or 1 (a program that does not fit) counts as a run; 2 (usage, or not implemented yet) skips the
# bench; anything else is a failure.
best_of() {
  local n=$1 best="" t0 t1 us status
  shift
  for _ in $(seq "$n"); do
    t0=$(date +%s%N)
    status=0
    "$@" >/dev/null 2>&1 || status=$?
    t1=$(date +%s%N)
    if [ "$status" -eq 2 ]; then
      echo "  ${*#"$build"/}: skipped (exit 2: not implemented yet?)"
      return 0
    elif [ "$status" -gt 1 ]; then
      echo "bench: failed (exit $status): $*" >&2
      return 1
    fi
    us=$(( (t1 - t0) / 1000 ))
    if [ -z "$best" ] || [ "$us" -lt "$best" ]; then best=$us; fi
  done
  local what="$*"
  awk -v what="${what#"$build"/}" -v n="$n" -v us="$best" 'BEGIN { printf "  %-60s best of %d: %9.3f ms\n", what, n, us / 1000 }'
}

shardc=$build/shardc
cd "$here"
echo "bench: command line (best of 5 wall-clock runs, process start included)"
best_of 5 "$shardc" --version   # the floor: process start, loading libLLVM
best_of 5 "$shardc" parse samples/mlp.shard
best_of 5 "$shardc" parse samples/llama3_405b.shard
# check and explain on LLaMA 3 405B over its 16,384-device meshes (h100_16k is the default).
best_of 5 "$shardc" check samples/llama3_405b.shard
best_of 5 "$shardc" explain samples/llama3_405b.shard
best_of 5 "$shardc" check samples/llama3_405b.shard --mesh v6e_16k
# check on 200 params that do not fit: the search for what would (bench_fit's program)
if [ -s "$build/bench/fit_100.shard" ]; then best_of 3 "$shardc" check "$build/bench/fit_100.shard"; fi
# sim: LLaMA 3 405B on 16,384 devices (issue 11: well under a second as a whole process), its
# pipeline layout (14 simulated devices), the largest validation pipeline (64 stages, 267k tasks),
# and a trace written.
best_of 5 "$shardc" sim samples/llama3_405b.shard
best_of 5 "$shardc" sim samples/llama3_405b.shard --mesh v6e_16k
best_of 5 "$shardc" sim samples/llama3_405b_pp.shard
best_of 5 "$shardc" sim bench/validation/megatron_gpt_1008b.shard
best_of 5 "$shardc" sim samples/llama3_405b.shard --trace "$build/bench/trace_405b.json"

# ---- sim, stage by stage, on every sample and validation program (bench/bench_sim.c) ----
if [ -x "$build/bench/bench_sim" ]; then
  echo "bench: sim stages: $build/bench/bench_sim --reps 5"
  "$build/bench/bench_sim" --reps 5
fi
# Later benches (run): one `best_of` line here and a section in docs/benchmarks.md each.
