#!/usr/bin/env bash
# A test that needs both a command's exit status and its output: passes only when COMMAND
# exits with EXIT and its output (stdout and stderr together) matches REGEX, an extended
# regular expression over the whole output ('.' crosses lines). CTest's own
# PASS_REGULAR_EXPRESSION ignores the exit status, so a command that printed the expected
# line and then crashed would pass.
#
# usage: tests/expect.sh EXIT REGEX COMMAND [ARG...]
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: tests/expect.sh EXIT REGEX COMMAND [ARG...]" >&2; exit 2; }
want="$1" regex="$2"
shift 2
out="$("$@" 2>&1)"
got=$?
printf '%s\n' "$out"
ok=1
if [ "$got" != "$want" ]; then echo "expect.sh: exit status $got, expected $want" >&2; ok=0; fi
if ! printf '%s' "$out" | grep -Ezq -- "$regex"; then echo "expect.sh: the output does not match: $regex" >&2; ok=0; fi
[ "$ok" = 1 ] && { echo "expect.sh: exit $got and the output as expected"; exit 0; }
exit 1
