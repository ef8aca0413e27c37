#!/usr/bin/env bash
# run_native.sh: `shardc run` figures per sample (docs/benchmarks.md, "Native runs"): lowering + O2 +
# JIT time, the sharded and one-device step times from the same run, and the measured peak per
# device against check's per-device total. Reports only; never fails on a figure.
# Usage: bench/run_native.sh [BUILD_DIR=build]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
shardc=$build/shardc
mesh="h100[data: 2, model: 2]"
lm_dims="-D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=2"
lm="-D batch=8 $lm_dims" # (a dim given two sizes is a usage error: gpt3 below takes lm_dims)
field() { sed -n "s/.*\"$1\":[[:space:]]*\([^,]*\),*/\1/p" | head -1; }
row() { # name, file, args...
  local name=$1 file=$2
  shift 2
  local j c
  j=$("$shardc" run "$here/$file" "$@" --mesh "$mesh" --format json 2>/dev/null)
  c=$("$shardc" check "$here/$file" "$@" --mesh "$mesh" --format json 2>/dev/null | tr -d '\n' | sed -n 's/.*"per_device":[^}]*"total":[[:space:]]*\([0-9]*\).*/\1/p')
  printf "  %-28s %5s %9.1f ms %10.3f ms %10.3f ms %12s B %12s B\n" "$name" "$(echo "$j" | field pass)" \
    "$(echo "$j" | field compile_s | awk '{print $1 * 1000}')" "$(echo "$j" | field step_time_s | awk '{print $1 * 1000}')" \
    "$(echo "$j" | field reference_step_time_s | awk '{print $1 * 1000}')" "$(echo "$j" | field peak_bytes_per_device)" "${c:-?}"
}
echo "run_native: $(nproc) cores; mesh $mesh; small sizes"
printf "  %-28s %5s %12s %13s %13s %14s %14s\n" sample pass compile "step (4 dev)" "step (1 dev)" "peak measured" "check total"
row "mlp forward" samples/mlp.shard -D batch=8 -D seq=16 -D embed=64 -D hidden=128 --entry mlp.forward
row "mlp train" samples/mlp.shard -D batch=8 -D seq=16 -D embed=64 -D hidden=128
for s in llama3_8b llama2_13b llama3_70b; do
  row "$s forward" samples/$s.shard $lm -D kv_heads=2 --entry llama.forward
  row "$s train" samples/$s.shard $lm -D kv_heads=2
done
row "gpt3_175b train (no stage)" samples/gpt3_175b.shard $lm_dims -D batch=256
echo "run_native: a fused chain of 6 elementwise ops over f32[4096, 1024] (16 MiB in, 16 MiB out), one device, mean of 200 warm steps (the first, cold run pays the page faults of every buffer)"
for i in 1 2 3; do "$shardc" run "$here/bench/native/chain.shard" --steps 200 2>/dev/null | grep "step time"; done
echo "run_native: the same unfused (SHARDC_NO_FUSION=1)"
SHARDC_NO_FUSION=1 "$shardc" run "$here/bench/native/chain.shard" --steps 200 2>/dev/null | grep "step time"
echo "run_native: a fused chain with exp, tanh and gelu (erf) over f32[4096, 1024] (bench/native/chain_math.shard), one device"
for i in 1 2 3; do "$shardc" run "$here/bench/native/chain_math.shard" --steps 200 2>/dev/null | grep "step time"; done
echo "run_native: memcpy of the chains' 16 MiB into a buffer touched before (NumPy's copyto), best of 5"
/usr/bin/python3 -c '
import time, numpy as np
a = np.ones(1 << 22, np.float32); b = np.zeros_like(a); best = 1e9
for i in range(5):
    t = time.perf_counter(); np.copyto(b, a); best = min(best, time.perf_counter() - t)
print("  memcpy         %.3f ms (%.1f GB/s of the 32 MiB read and written)" % (best * 1e3, 2 * a.nbytes / best / 1e9))' 2>/dev/null ||
  echo "  (python3-numpy missing)"
echo "run_native: mlp train step, 2 device threads (dp: batch over (data, model) = 2 x 1) vs 1, batch 16 x seq 256, embed 512, hidden 2048"
"$shardc" run "$here/samples/mlp.shard" -D batch=16 -D seq=256 -D embed=512 -D hidden=2048 --layout dp \
  --mesh "h100[data: 2, model: 1]" --steps 3 2>/dev/null | grep -E "PASS|FAIL|step time"
