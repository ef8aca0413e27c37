#!/usr/bin/env bash
# run.sh: runs one libFuzzer target for a while, seeded from every .shard in the repository (the
# .npy reader's target: from every .npy under tests/, valid and malformed ones in tests/fuzz/npy/).
# Usage: [FUZZ_TARGET=fuzz_frontend|fuzz_check|fuzz_npy] tests/fuzz/run.sh BUILD_DIR [SECONDS=60] [extra flags...]
# BUILD_DIR is configured with -DCMAKE_C_COMPILER=clang-19 -DSHARDC_FUZZ=ON and has built the
# target (default fuzz_frontend: lexer + parser; fuzz_check: check/explain's whole pipeline;
# fuzz_npy: the .npy reader of `run --load`). The
# corpus is a scratch copy in BUILD_DIR/fuzz-corpus-TARGET (the repository is never written); a
# finding (crash, sanitizer report, leak, timeout, an input slower than 10 s) is saved in
# BUILD_DIR/fuzz-artifacts-TARGET/ and makes this script exit 1.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS]}" && pwd)
seconds=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
target=${FUZZ_TARGET:-fuzz_frontend}
seeds=(-name '*.shard')
dict=$here/tests/fuzz/shard.dict
seed_dirs=("$here/tests" "$here/stdlib" "$here/samples")
case $target in
  fuzz_frontend) corpus=$build/fuzz-corpus; artifacts=$build/fuzz-artifacts; extra=() ;;
  # check/explain print a few lines on stderr (e.g. "serve is not implemented"): closed, while
  # libFuzzer's and the sanitizers' reports still go to the original stderr.
  fuzz_check) corpus=$build/fuzz-corpus-check; artifacts=$build/fuzz-artifacts-check; extra=(-close_fd_mask=3) ;;
  # a header may claim 2^62 elements: anything near that much memory for a small input is a finding
  fuzz_npy) corpus=$build/fuzz-corpus-npy; artifacts=$build/fuzz-artifacts-npy; extra=(-malloc_limit_mb=64)
            seeds=(-name '*.npy'); dict=$here/tests/fuzz/npy.dict; seed_dirs=("$here/tests") ;;
  *) echo "fuzz: unknown FUZZ_TARGET $target" >&2; exit 2 ;;
esac
rm -rf "$artifacts"
mkdir -p "$corpus" "$artifacts"
# Seeds: every .shard of the tests, the stdlib and the samples, or every .npy of the tests
# (flattened; names made unique).
n=0
while IFS= read -r -d '' f; do
  rel=${f#"$here"/}
  cp "$f" "$corpus/seed-${rel//\//_}"
  n=$((n + 1))
done < <(find "${seed_dirs[@]}" "${seeds[@]}" -print0 2>/dev/null)
echo "fuzz: $target: $n seed files, $(ls "$corpus" | wc -l) in the corpus, running ${seconds}s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# libFuzzer's line per new corpus entry (thousands a minute) and its recommended dictionary are
# left out unless FUZZ_VERBOSE=1.
quiet='^#[0-9]+[[:space:]]+(NEW|REDUCE)[[:space:]]'
dict_start='^###### Recommended dictionary'
if [ "${FUZZ_VERBOSE:-0}" = 1 ]; then quiet='^$^'; dict_start='^$^'; fi
set +e
"$build/$target" "$corpus" \
  -dict="$dict" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$artifacts/" -print_final_stats=1 "${extra[@]}" "$@" 2>&1 |
  grep -avE "$quiet" | sed "/$dict_start/,/^###### End of recommended dictionary/d"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ] || [ -n "$(ls -A "$artifacts")" ]; then
  echo "fuzz: $target: FINDING (exit $status); reproduce with: $build/$target $artifacts/<file>" >&2
  ls -l "$artifacts" >&2
  exit 1
fi
echo "fuzz: $target: no findings in ${seconds}s"
