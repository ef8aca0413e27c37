#!/bin/sh
# api_drift.sh CC RUNTIME_DIR: runtime/rt_api_check.c must fail to compile when rt_api.def and
# shardrt.h disagree: a parameter's type, a field's type, a field missing from the table. Each
# mutation of the table is compiled with the check; PASS when every one is refused and the table
# as it is compiles, else FAIL, exit 1.
cc=$1 dir=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
check() { # $1: a sed script for the table; $2: compile should succeed (1) or fail (0)
  sed "$1" "$dir/rt_api.def" > "$tmp/rt_api.def"
  sed "s|\"rt_api.def\"|\"$tmp/rt_api.def\"|" "$dir/rt_api_check.c" > "$tmp/check.c"
  if "$cc" -std=c11 -fsyntax-only -I"$dir" "$tmp/check.c" 2> "$tmp/err"; then ok=1; else ok=0; fi
  if [ "$ok" != "$2" ]; then echo "FAIL: '$1' compiled: $ok (want $2)"; cat "$tmp/err"; exit 1; fi
  echo "ok: '$1' $( [ "$2" = 1 ] && echo compiles || echo "is refused: $(grep -o 'rt_api.def: [^"]*' "$tmp/err" | head -1)")"
}
check 's/^//' 1
check 's/RT_FN(rt_free, int, dev, ptr)/RT_FN(rt_free, int, dev, cptr)/' 0
check 's/RT_FN(rt_nn_route, int, dev, rows, int, i64/RT_FN(rt_nn_route, int, dev, rows, int, int/' 0
check 's/RT_FIELD(RtGemm, beta, f32)/RT_FIELD(RtGemm, beta, f64)/' 0
check '/RT_FIELD(RtPipe, nsave, i32)/d' 0
check '/RT_FIELD(RtColl, shift, i32)/d' 0
check 's/RT_FIELD(RtPipeAction, row0, i64)//' 0
echo "PASS: every drift refused"
