#!/usr/bin/env bash
# Checks the size rules of CONTRIBUTING.md over src/ and include/: no source file over
# 700 lines, no function over 120 lines, no line wider than 120 characters. A function
# here: from its head (a definition at namespace scope, a member function in a class body,
# a lambda: code that ends in "{" after a ")") to the brace that closes it; strings and
# comments do not count as braces. Tests and generated code are not checked.
set -euo pipefail
rules="$(cd "$(dirname "$0")" && pwd)/check-sizes.awk"
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
max_file=700 max_fn=120 max_width=120
fail=0
while IFS= read -r f; do
  n=$(wc -l <"$f")
  if [ "$n" -gt "$max_file" ]; then echo "check-sizes: $f has $n lines (at most $max_file)" >&2; fail=1; fi
  awk -v f="$f" -v max="$max_fn" -f "$rules" "$f" || fail=1
  # Characters, not bytes (a diagram's box-drawing characters are one column each).
  if LC_ALL=C.UTF-8 grep -n ".\{$((max_width + 1)),\}" "$f" >/tmp/check-sizes.$$ 2>/dev/null; then
    sed "s|^\([0-9]*\):.*|check-sizes: $f:\1: a line wider than $max_width characters|" /tmp/check-sizes.$$ >&2
    fail=1
  fi
  rm -f /tmp/check-sizes.$$
done < <(find src include -name '*.cpp' -o -name '*.h' | sort)
[ "$fail" = 0 ] || { echo "check-sizes: split the files or functions above" >&2; exit 1; }
