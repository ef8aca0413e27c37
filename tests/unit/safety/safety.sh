#!/bin/sh
# safety.sh SHARDC SOURCE_DIR CASE: issue 17's reproducers, each run as a user would run shardc (or
# an executable it built) on files other people sent: nothing typed or loaded may corrupt memory,
# run a command or destroy a file. Each case works in its own scratch directory (./safety.CASE,
# under ctest's binary directory), prints what it checks, and exits 0 when every check holds, 1 at
# the first that does not (saying which). tests/unit/safety.cmake registers one ctest per case.
set -u
SHARDC=$1
SRC=$2
CASE=$3
MLP=$SRC/samples/mlp.shard
LLAMA=$SRC/tests/unit/interp/llama_small.shard
SMALL="-D batch=8 -D seq=16 -D embed=64 -D hidden=128"
MESH="h100[data: 2, model: 2]"
W=$(pwd)/safety.$CASE
rm -rf "$W"
mkdir -p "$W"
cd "$W" || exit 1

fail() {
  echo "FAIL $CASE: $*"
  exit 1
}
ok() { echo "ok: $*"; }

# expect RC PATTERN CMD...: CMD exits RC and its stdout+stderr match the grep -E PATTERN.
expect() {
  want_rc=$1 pattern=$2
  shift 2
  "$@" > out.txt 2>&1
  rc=$?
  sed 's/^/    | /' out.txt | head -20
  [ "$rc" -eq "$want_rc" ] || fail "$* exited $rc, expected $want_rc"
  [ -z "$pattern" ] || grep -Eq -- "$pattern" out.txt || fail "$* did not say /$pattern/"
  ok "$* -> $rc, /$pattern/"
}

# npy FILE HEADER NBYTES [DATA_PRINTF]: a .npy file (version 1.0) with that header, padded as NumPy
# pads it, then NBYTES of data: DATA_PRINTF's bytes (printf octal escapes), zeros for the rest.
npy() {
  file=$1 header=$2 nbytes=$3 data=${4:-}
  len=$((${#header} + 1))
  pad=$(((64 - (10 + len) % 64) % 64))
  hl=$((len + pad))
  {
    printf '\223NUMPY\001\000'
    printf "$(printf '\\%03o\\%03o' $((hl % 256)) $((hl / 256)))"
    printf '%s' "$header"
    printf "%${pad}s\n" ""
    [ -n "$data" ] && printf "$data"
  } > "$file"
  have=$(wc -c < "$file")
  want=$((10 + hl + nbytes))
  [ "$have" -lt "$want" ] && head -c $((want - have)) /dev/zero >> "$file"
  return 0
}

# A C compiler wrapper first in PATH: it records its pid and arguments, waits $FAKE_CC_SLEEP s,
# then runs the real one.
fake_cc() {
  mkdir -p fakebin
  real=$(command -v cc)
  cat > fakebin/cc <<EOF
#!/bin/sh
echo \$\$ > "$W/cc.pid"
printf '%s\n' "\$@" > "$W/cc.args"
sleep \${FAKE_CC_SLEEP:-0}
exec "$real" "\$@"
EOF
  chmod +x fakebin/cc
}

case $CASE in

# ---- .npy files and --load ----

load_fifo) # a FIFO where a .npy is expected: refused at once, never a hang
  mkdir d && mkfifo d/tokens.npy
  expect 1 "--load: d/tokens.npy: not a regular file \(a FIFO\)" \
    timeout 60 "$SHARDC" run "$LLAMA" --entry llama.forward --load d
  ;;

load_unreadable) # --load of what is not a readable directory of arrays: an error naming the path
  touch regular
  expect 1 "--load: 'missing': no such directory" "$SHARDC" run "$LLAMA" --entry llama.forward --load missing
  expect 1 "--load: 'regular': not a directory" "$SHARDC" run "$LLAMA" --entry llama.forward --load regular
  mkdir dangling loop
  ln -s nowhere.npy dangling/tokens.npy
  expect 1 "--load: dangling/tokens.npy: no such file" "$SHARDC" run "$LLAMA" --entry llama.forward --load dangling
  ln -s tokens.npy loop/tokens.npy
  expect 1 "--load: loop/tokens.npy: a symlink loop" "$SHARDC" run "$LLAMA" --entry llama.forward --load loop
  ;;

load_bad_npy) # issue 17's headers: products that overflow, a key inside a string, an int for a tuple
  for c in overflow huge saturate inside int_shape dq; do mkdir $c; done
  npy overflow/tokens.npy "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 5, 17, 257, 641, 65537, 6700417), }" 64
  npy huge/tokens.npy "{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387905,), }" 64
  npy saturate/tokens.npy "{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999,), }" 64
  npy inside/tokens.npy "{'fortran_order': False, 'shape': (4, 8), 'zz': \"'descr': '<i4'\", 'descr': '<f4'}" 128
  npy int_shape/tokens.npy "{'descr': '<i4', 'fortran_order': False, 'shape': (32), }" 128
  npy dq/tokens.npy "{'descr': \"<f4\", 'fortran_order': False, 'shape': (4, 8), }" 128
  run() { "$SHARDC" run "$LLAMA" --entry llama.forward --load "$1"; }
  expect 1 "overflow/tokens.npy: shape of more than 2\^62 elements" run overflow
  expect 1 "huge/tokens.npy: dim 4611686018427387905 is too large" run huge
  expect 1 "saturate/tokens.npy: dim 99999999999999999999 is too large" run saturate
  expect 1 "inside/tokens.npy: bad header: unexpected key 'zz'" run inside
  expect 1 "int_shape/tokens.npy: bad header: 'shape' is an int, not a tuple" run int_shape
  # "<f4" in double quotes is float32, as Python reads it: the message is about the dtype, cleanly
  expect 1 "dq/tokens.npy holds float32\[4, 8\], but 'tokens' is i32\[batch=4, seq=8\]" run dq
  ;;

load_fortran) # a Fortran-order file is read as the array it holds, wherever 'fortran_order' stands
  mkdir c f
  # tokens[b][s] = (7 b + 3 s) % 64, shape (4, 8); C order: b-major; Fortran order: s-major
  cdata="" fdata=""
  b=0
  while [ $b -lt 4 ]; do s=0; while [ $s -lt 8 ]; do
    cdata="$cdata\\$(printf %03o $(((7 * b + 3 * s) % 64)))\\000\\000\\000"; s=$((s + 1)); done; b=$((b + 1)); done
  s=0
  while [ $s -lt 8 ]; do b=0; while [ $b -lt 4 ]; do
    fdata="$fdata\\$(printf %03o $(((7 * b + 3 * s) % 64)))\\000\\000\\000"; b=$((b + 1)); done; s=$((s + 1)); done
  npy c/tokens.npy "{'descr': '<i4', 'fortran_order': False, 'shape': (4, 8), }" 128 "$cdata"
  npy f/tokens.npy "{'descr': '<i4', 'shape': (4, 8), 'fortran_order': True}" 128 "$fdata"
  expect 0 "^PASS" "$SHARDC" run "$LLAMA" --entry llama.forward --load c --save out_c
  expect 0 "^PASS" "$SHARDC" run "$LLAMA" --entry llama.forward --load f --save out_f
  cmp out_c/output.npy out_f/output.npy || fail "the Fortran-order tokens gave another output than the C-order ones"
  ok "the same output from both orders"
  ;;

load_int32_max) # an int32 token 2147483647 stays 2147483647 (not -2147483648 through a float)
  mkdir d
  npy d/tokens.npy "{'descr': '<i4', 'fortran_order': False, 'shape': (4, 8), }" 128 '\377\377\377\177'
  expect 1 "take: index 2147483647 out of range \[0, 64\)" "$SHARDC" run "$LLAMA" --entry llama.forward --load d
  ;;

# ---- no shell, no code injection ----

build_no_shell) # -o with shell syntax is a file name, nothing more
  out="x'\$(touch PWNED)'\"\$(touch PWNED2)\""
  expect 0 "" "$SHARDC" build "$MLP" $SMALL --mesh "$MESH" --entry mlp.forward -o "$out"
  [ ! -e PWNED ] && [ ! -e PWNED2 ] || fail "a command ran"
  [ -x "$out" ] || fail "no executable named $out"
  expect 0 "^PASS" "./$out"
  ;;

build_quoted_path) # a source path with */, a trigraph (??/), a quote, a backslash and a newline in it
  dir='c*/??'
  name=$(printf 'q"x\\n\nz.shard')
  mkdir -p "$dir" && cp "$MLP" "$dir/$name"
  expect 0 "" "$SHARDC" build "$dir/$name" $SMALL --mesh "$MESH" --entry mlp.forward -o exe
  expect 0 '^PASS: c\*/\?\?/q"x\\n$' ./exe
  ;;

no_shell_in_source) # no shell anywhere in shardc: neither system() nor popen() in its sources
  if grep -rnE '(^|[^a-z_])(system|popen) *\(' "$SRC/compiler" "$SRC/runtime" --include='*.c' --include='*.h'; then
    fail "a shell is started above"
  fi
  ok "no system( or popen( in compiler/ and runtime/"
  ;;

# ---- no file destroyed ----

output_is_input) # an output that is an input is refused, the input left as it was
  cp "$MLP" x.shard && cp "$MLP" keep.shard && ln x.shard hard.shard && ln -s x.shard sym.shard
  expect 1 "build: -o 'x.shard' is an input of this command" "$SHARDC" build x.shard $SMALL --mesh "$MESH" -o x.shard
  expect 1 "build: -o 'x.shard' is the input 'hard.shard'" "$SHARDC" build hard.shard $SMALL --mesh "$MESH" -o x.shard
  expect 1 "sim: --trace: 'x.shard' is an input of this command" "$SHARDC" sim x.shard --trace x.shard
  expect 1 "sim: --trace: 'sym.shard' is the input 'x.shard'" "$SHARDC" sim x.shard --trace sym.shard
  cmp x.shard keep.shard || fail "x.shard changed"
  ok "x.shard unchanged"
  ;;

save_into_load) # --save would overwrite an array --load reads: refused before the run
  expect 0 "^PASS" "$SHARDC" run "$MLP" $SMALL --mesh "$MESH" --save d
  cp -r d keep
  expect 1 "--save: 'd/w_in.npy' is an input of this command" "$SHARDC" run "$MLP" $SMALL --mesh "$MESH" --load d --save d --seed 3
  grep -q "^PASS" out.txt && fail "it ran before refusing"
  diff -r d keep || fail "d changed"
  ok "d unchanged"
  cp "$MLP" notadir
  expect 1 "--save: 'notadir' is not a directory" "$SHARDC" run "$MLP" $SMALL --mesh "$MESH" --save notadir
  cmp notadir "$MLP" || fail "notadir changed"
  ;;

build_intermediates) # build -o keep leaves keep.o and keep.main.c alone; -o /dev/null makes no /dev/null.o
  fake_cc
  mkdir tmp
  printf 'mine\n' > keep.o && printf 'mine too\n' > keep.main.c
  expect 0 "" env TMPDIR="$W/tmp" PATH="$W/fakebin:$PATH" "$SHARDC" build "$MLP" $SMALL --mesh "$MESH" -o keep
  [ "$(cat keep.o)" = mine ] && [ "$(cat keep.main.c)" = "mine too" ] || fail "keep.o or keep.main.c changed"
  ok "keep.o and keep.main.c unchanged"
  grep -q "^$W/tmp/" cc.args || fail "cc was not given files in \$TMPDIR: $(tr '\n' ' ' < cc.args)"
  ok "cc's files are in \$TMPDIR"
  [ -z "$(ls -A tmp)" ] || fail "\$TMPDIR still holds $(ls -A tmp)"
  expect 0 "" env TMPDIR="$W/tmp" PATH="$W/fakebin:$PATH" "$SHARDC" build "$MLP" $SMALL --mesh "$MESH" -o /dev/null
  grep -q "^/dev/null" cc.args && fail "cc was given /dev/null...: $(tr '\n' ' ' < cc.args)"
  [ -c /dev/null ] || fail "/dev/null is no longer a device"
  [ -z "$(ls -A tmp)" ] || fail "\$TMPDIR still holds $(ls -A tmp)"
  ok "-o /dev/null: written through, intermediates in \$TMPDIR and removed"
  ;;

build_sigterm) # SIGTERM during linking: the compiler is killed, nothing is left, nothing appears later
  fake_cc
  mkdir tmp
  TMPDIR=$W/tmp PATH=$W/fakebin:$PATH FAKE_CC_SLEEP=4 "$SHARDC" build "$MLP" $SMALL --mesh "$MESH" -o exe &
  pid=$!
  i=0
  while [ ! -s cc.pid ]; do sleep 0.1; i=$((i + 1)); [ $i -gt 600 ] && fail "cc never started"; done
  sleep 0.5
  kill -TERM $pid
  wait $pid
  rc=$?
  [ $rc -eq 143 ] || fail "shardc exited $rc, expected 143 (SIGTERM)"
  ok "shardc ended by SIGTERM"
  kill -0 "$(cat cc.pid)" 2> /dev/null && fail "cc (pid $(cat cc.pid)) still runs"
  ok "cc is gone"
  [ -z "$(ls -A tmp)" ] || fail "\$TMPDIR still holds $(ls -A tmp)"
  ok "\$TMPDIR is empty"
  sleep 5
  [ ! -e exe ] || fail "exe appeared after shardc ended"
  [ -z "$(ls -A . | grep -v -e '^fakebin$' -e '^tmp$' -e '^cc\.')" ] || fail "left behind: $(ls -A)"
  ok "no exe, no temporary file"
  ;;

full_disk) # writes that fail (a file size limit) leave every old output intact; the report comes first
  cp "$MLP" m.shard
  expect 0 "^PASS" "$SHARDC" run m.shard $SMALL --mesh "$MESH" --save d
  expect 0 "" "$SHARDC" sim m.shard --trace t.json
  expect 0 "" "$SHARDC" build m.shard $SMALL --mesh "$MESH" -o exe
  cp -r d d.keep && cp t.json t.keep && cp exe exe.keep
  # 4 blocks (2 KiB in dash, 4 in bash): below each output's size (the trace: 4.5 KB); SIGXFSZ
  # ignored so that writes fail with EFBIG
  limited() { (trap '' XFSZ; ulimit -f 4; "$@"); }
  expect 1 "run: --save: cannot write 'd/[a-z_]+\.npy': File too large \(the files already in 'd' are unchanged\)" \
    limited "$SHARDC" run m.shard $SMALL --mesh "$MESH" --save d --seed 5
  grep -q "^PASS" out.txt || fail "no report before the failed save"
  # with --format json the one object says the set was not saved (and exit 1)
  expect 1 '"saved":[[:space:]]*false' limited "$SHARDC" run m.shard $SMALL --mesh "$MESH" --save d --seed 5 --format json
  grep -Eq '"pass":[[:space:]]*true' out.txt || fail "no verdict in the json of a failed save"
  expect 1 "sim: --trace: cannot write 't.json': File too large" limited "$SHARDC" sim m.shard --trace t.json
  expect 1 "build: " limited "$SHARDC" build m.shard $SMALL --mesh "$MESH" -o exe --seed 5
  diff -r d d.keep && cmp t.json t.keep && cmp exe exe.keep || fail "an old output changed"
  [ "$(ls -A d | wc -l)" -eq 3 ] || fail "d holds more than its 3 files: $(ls -A d)"
  [ -z "$(ls -A | grep '\.tmp$')" ] || fail "temporary files left: $(ls -A)"
  ok "old outputs intact, no temporary files"
  ;;

save_symlink) # a symlink planted at DIR/loss.npy is replaced, not followed
  mkdir d && printf 'victim\n' > victim && ln -s ../victim d/loss.npy
  expect 0 "^PASS" "$SHARDC" run "$MLP" $SMALL --mesh "$MESH" --save d
  [ "$(cat victim)" = victim ] || fail "the symlink's target was written"
  [ -f d/loss.npy ] && [ ! -L d/loss.npy ] || fail "d/loss.npy is not a regular file"
  ok "victim intact, d/loss.npy a new file"
  ;;

save_lock) # a save waits for the directory's lock: two saves never interleave (docs/run.md)
  expect 0 "^PASS" "$SHARDC" run "$MLP" $SMALL --mesh "$MESH" --save d
  cp -r d keep
  flock -o d sh -c 'touch held; while [ ! -e release ]; do sleep 0.1; done' &
  holder=$!
  while [ ! -e held ]; do sleep 0.1; done
  "$SHARDC" run "$MLP" $SMALL --mesh "$MESH" --save d --seed 9 > run.txt 2>&1 &
  pid=$!
  i=0
  while ! grep -q "^PASS" run.txt; do
    sleep 0.2; i=$((i + 1))
    kill -0 $pid 2> /dev/null || break
    [ $i -gt 600 ] && fail "no report after 120 s"
  done
  sleep 1
  diff -r d keep > /dev/null
  same=$?
  touch release
  wait $holder
  wait $pid
  rc=$?
  cat run.txt
  [ $same -eq 0 ] || fail "d changed while another process held its lock"
  ok "nothing written while the lock was held"
  [ $rc -eq 0 ] || fail "the save exited $rc"
  diff -r d keep > /dev/null && fail "d is unchanged after the lock was released"
  ok "written once the lock was released"
  ;;

# ---- the built executable's arguments and allocations ----

exe_args)
  expect 0 "" "$SHARDC" build "$MLP" $SMALL --mesh "$MESH" -o exe
  for bad in "--steps 0" "--steps abc" "--steps 400000000" "--steps -1" "--steps= 3" "--hbm abc" "--hbm 0" \
             "--format xml" "--timeout nan" "--timeout 0" "--timeout inf" "--seed -1" "--steps" "--bogus" "extra"; do
    # shellcheck disable=SC2086
    expect 2 "^\./exe: (bad|unknown|option)" ./exe $bad
  done
  expect 0 "--seed N +the seed inputs and params are made from \(default 0" ./exe --help
  expect 0 "\(mean of the steps\)" ./exe --steps=2 --timeout=30 --hbm=100000000 --format=text
  expect 0 '"steps": 2' ./exe --format=json --steps 2
  ;;

exe_seed) # --seed is honoured: the built executable's losses are `shardc run --seed 5`'s
  expect 0 "" "$SHARDC" build "$MLP" $SMALL --mesh "$MESH" -o exe
  expect 0 "^PASS" "$SHARDC" run "$MLP" $SMALL --mesh "$MESH" --seed 5 --steps 2
  grep "loss step" out.txt > want.txt
  expect 0 "^PASS" ./exe --seed 5 --steps 2
  grep "loss step" out.txt > got.txt
  cmp want.txt got.txt || fail "the losses differ from shardc run --seed 5"
  expect 0 "^PASS" ./exe --steps 2
  grep "loss step" out.txt > seed0.txt
  cmp -s want.txt seed0.txt && fail "--seed 5 gives the losses of seed 0"
  ok "--seed 5 gives run --seed 5's losses, not seed 0's"
  ;;

exe_host_alloc) # every host allocation of the executable may fail: an error naming it, never a crash
  expect 0 "" "$SHARDC" build "$MLP" $SMALL --mesh "$MESH" -o exe
  n=1
  while [ $n -le 16 ]; do
    expect 1 "^error: out of host memory for [a-z' -]+ \([0-9]+ x [0-9]+ bytes\)" env SHARDC_FAIL_HOST_ALLOC=$n ./exe --steps 2
    n=$((n + 1))
  done
  ;;

*)
  echo "safety.sh: unknown case $CASE" >&2
  exit 2
  ;;
esac
echo "PASS $CASE"
