#!/bin/sh
# fake_shardc.sh: a stand-in for shardc that does what its input file says, so that the runner's
# self-test can show it catches crashes, hangs, sanitizer reports and every kind of mismatch
# without needing a broken compiler. Usage (as the runner calls shardc): fake_shardc.sh CMD FILE ARGS...
# It obeys the input's lines of these forms, in order:
#   #> out: TEXT      print TEXT on stdout
#   #> err: TEXT      print TEXT on stderr, with FILE replaced by the file argument
#   #> args           print its arguments on stdout
#   #> sleep: N       sleep N seconds
#   #> signal: NAME   kill itself with signal NAME
#   #> exit: N        exit with status N at the end (default 0)
file=$2
status=0
while IFS= read -r line; do
  case $line in
    '#> out: '*) printf '%s\n' "${line#'#> out: '}" ;;
    '#> err: '*) printf '%s\n' "${line#'#> err: '}" | sed "s|FILE|$file|g" >&2 ;;
    '#> args') printf '%s\n' "$*" ;;
    '#> sleep: '*) sleep "${line#'#> sleep: '}" ;;
    '#> signal: '*) kill -s "${line#'#> signal: '}" $$ ;;
    '#> exit: '*) status=${line#'#> exit: '} ;;
  esac
done < "$file"
exit "$status"
