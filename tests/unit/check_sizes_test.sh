#!/usr/bin/env bash
# The size check passes on the tree, and fails on a copy with one planted file over 700
# lines and, separately, one planted function over 120 lines (at namespace scope, and in a
# class body) and one line over 120 characters; each refusal names the file.
set -euo pipefail
root="$1"
bash "$root/scripts/check-sizes.sh" "$root" || { echo "the tree itself fails the check"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
plant() {  # file, what the refusal says; the lines to append to the file on stdin
  rm -rf "$tmp/t"; mkdir -p "$tmp/t"; cp -r "$root/include" "$root/src" "$tmp/t/"
  cat >> "$tmp/t/$1"
  if bash "$root/scripts/check-sizes.sh" "$tmp/t" 2>"$tmp/err"; then
    echo "not refused: the planted lines in $1"; exit 1
  fi
  grep -q "$1.*$2" "$tmp/err" || { echo "refused without naming $1 and '$2':"; cat "$tmp/err"; exit 1; }
}
# A file of 701 lines.
for i in $(seq 701); do echo "// line $i"; done | plant src/util/planted_long_file.cpp "has 701 lines"
# A function of 121 lines (its head, 119 statements, its closing brace) in a short file.
{ echo "int planted_long_function() {"; for i in $(seq 119); do echo "    (void)$i;"; done; echo "}"; } |
  plant src/cache/planted_long_function.cpp "a function of 121 lines"
# A member function of 121 lines in a class body.
{ echo "struct planted {"; echo "    int f() {"; for i in $(seq 119); do echo "        (void)$i;"; done; echo "    }"
  echo "};"; } | plant src/cache/planted_member.cpp "a function of 121 lines"
# A line of 121 characters.
printf 'int planted_wide = 1;  // %095d\n' 0 | plant src/cache/planted_wide.cpp "wider than 120"
echo "check-sizes test passed"
