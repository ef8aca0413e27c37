#!/bin/sh
# compile_time.sh BUILD [REPS]: how long `shardc run` takes to compile llama3_8b's train step at the
# README's small sizes (issue 23's case) and the MLP and LLaMA block of bench/torch_step.py, cold
# (--no-cache) at the tier the rule picks, at each tier forced, with default<O2> as the tier 2
# pipeline (the pipeline before this one), and from the object cache (found by the inputs before
# lowering: `cached`; by the lowered module: `modkey`); the step time beside it.
# Configurations interleaved, REPS rounds (default 3), the median of each; the load average before
# and after (on a shared machine only same-run ratios mean anything). docs/benchmarks.md.
set -eu
B=${1:-build}
REPS=${2:-3}
SHARDC=$B/shardc
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT
LLAMA="samples/llama3_8b.shard -D seq=8 -D embed=32 -D hidden=64 -D heads=4 -D head=8 -D vocab=64 -D layers=2 -D batch=8 -D kv_heads=2"
MESH4="h100[data: 2, model: 2]"
MLP="samples/mlp.shard -D batch=16 -D seq=256 -D embed=512 -D hidden=2048 --layout dp"
BLOCK="bench/native/llama_block.shard --layout dp"
MESH1="h100[data: 1, model: 1]"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
OUT=$(mktemp)
one() { # case config env... -- args...: prints case config compile_ms opt_ms step_ms tier
  c=$1 cfg=$2
  shift 2
  env SHARDC_RUN_TIMING=1 SHARDC_CACHE_DIR="$CACHE" "$@" > "$OUT.o" 2> "$OUT.e" || { cat "$OUT.o" "$OUT.e"; exit 1; }
  comp=$(sed -n 's/.*compile time *\([0-9.]*\) ms.*/\1/p' "$OUT.o")
  opt=$(sed -n 's/.*code generation (tier [0-9], [0-9] parts\{0,1\}[^)]*) \([0-9.]*\) ms.*/\1/p' "$OUT.e")
  tier=$(sed -n 's/.*(tier \([0-9]\),.*/\1/p' "$OUT.e")
  step=$(sed -n 's/.*step time *\([0-9.]*\) ms sharded.*/\1/p' "$OUT.o")
  echo "$c $cfg $comp $opt $step $tier" >> "$OUT.all"
}
: > "$OUT.all"
for r in $(seq "$REPS"); do
  for case in llama mlp block; do
    case $case in
      llama) set -- $LLAMA --mesh "$MESH4" --steps 3 ;;
      mlp) set -- $MLP --mesh "$MESH1" --steps 3 ;;
      block) set -- $BLOCK --mesh "$MESH1" --steps 3 ;;
    esac
    one $case rule env "$SHARDC" run "$@" --no-cache
    one $case tier0 env SHARDC_TIER=0 "$SHARDC" run "$@" --no-cache
    one $case tier2 env SHARDC_TIER=2 "$SHARDC" run "$@" --no-cache
    one $case tier2-O2 env SHARDC_TIER=2 "SHARDC_PASSES=default<O2>" "$SHARDC" run "$@" --no-cache
    rm -rf "$CACHE"/*
    one $case store env "$SHARDC" run "$@"
    one $case cached env "$SHARDC" run "$@"
    # a SHARDC_* variable the compiler does not read changes the inputs' key, not the module's:
    # the objects found by the module's key (lowered, bitcode hashed, nothing compiled)
    one $case modkey env SHARDC_BENCH_NONCE="$r" "$SHARDC" run "$@"
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-9s %5s %14s %28s %16s\n' case config tier "compile (ms)" "optimisation + codegen (ms)" "step (ms)"
/usr/bin/python3 - "$OUT.all" <<'PY'
import sys, statistics, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    c, cfg, comp, opt, step, tier = line.split()
    rows.setdefault((c, cfg), []).append((float(comp), float(opt), float(step), tier))
for (c, cfg), v in rows.items():
    med = lambda i: statistics.median(x[i] for x in v)
    print(f"{c:6} {cfg:9} {v[0][3]:>5} {med(0):14.1f} {med(1):28.1f} {med(2):16.2f}")
PY
rm -f "$OUT" "$OUT.o" "$OUT.e" "$OUT.all"
