#!/usr/bin/env bash
# Keeps the numbers docs/architecture.md names true to the code.
#
# The map ends with a table, "Numbers this map names": one row per number it takes from the
# code, `| number | file | text |`, where text (in backticks) is a fixed string that file
# must contain, or after "re:" an extended regular expression. This script fails, naming
# the claim, when
#   - a row's file is missing or no longer contains its text (the code changed: fix the
#     map's prose and the row together);
#   - the prose names a number with a unit (16 KiB, 512 tokens, 250 ms, 64 holders, ...)
#     that has no row;
#   - a row names a number the prose no longer states.
#
# ARCH_NUMBERS_DEBUG=1 also prints every number with a unit found in the prose.
#
# usage: tests/docs/architecture_numbers.sh [ROOT]               check ROOT (default: this tree)
#        tests/docs/architecture_numbers.sh --self-test [ROOT]   check ROOT, then that broken
#                                                                 copies of it are refused
set -uo pipefail

self_test=0
if [ "${1:-}" = "--self-test" ]; then self_test=1; shift; fi
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
map_rel="docs/architecture.md"
section="## Numbers this map names"
# Units a number of the prose is checked with (a plural counts as its singular).
units='KiB|MiB|GiB|TiB|KB|MB|GB|bytes?|tokens?|ms|s|seconds?|minutes?|holders?|streams?|threads?|files?|workspaces?|turns?|lookups?|cells?|rows?|jobs?|answers?|entries|entry|chunks?|%'

# "8,388,608 tokens" -> "8388608 token"; "192-byte" -> "192 byte".
normalize() {
  sed -E -e 's/^[[:space:]]+|[[:space:]]+$//g' -e 's/,//g' -e 's/^([0-9.]+)[ -]?/\1 /' \
         -e 's/ (bytes|tokens|seconds|minutes|holders|streams|threads|files|workspaces|turns|lookups|cells|rows|jobs|answers|chunks)$/ \1@/' \
         -e 's/s@$//' -e 's/ entries$/ entry/'
}

# Checks the map of tree $1; prints what does not hold on stderr; returns 1 if anything.
check() {
  local tree="$1" map="$1/$map_rel" bad=0 n_rows=0
  [ -f "$map" ] || { echo "architecture_numbers: $map_rel is missing under $tree" >&2; return 1; }
  grep -qxF "$section" "$map" || { echo "architecture_numbers: $map_rel has no section '$section'" >&2; return 1; }
  local tmp; tmp="$(mktemp -d)"
  # The table's rows (number, file, text), and the prose: every line outside the section.
  awk -v s="$section" '
    $0 == s { inside = 1; next }
    inside && /^## / { inside = 0 }
    inside && /^\|/ { if ($0 !~ /^\|[- |]*\|$/ && $0 !~ /^\| *number *\|/) print > "'"$tmp"'/rows"; next }
    { printf "%d\t%s\n", NR, $0 > "'"$tmp"'/prose" }
  ' "$map"
  touch "$tmp/rows" "$tmp/prose"

  # (a) every row's file holds its text.
  while IFS= read -r row; do
    n_rows=$((n_rows + 1))
    local number file text
    number="$(printf '%s' "$row" | awk -F'|' '{print $2}' | sed -E 's/^[[:space:]]+|[[:space:]]+$//g')"
    file="$(printf '%s' "$row" | awk -F'|' '{print $3}' | sed -E 's/^[[:space:]]+|[[:space:]]+$//g; s/^`//; s/`$//')"
    text="$(printf '%s' "$row" | sed -E 's/^([^|]*\|){3}[[:space:]]*//; s/[[:space:]]*\|[[:space:]]*$//; s/^`//; s/`$//')"
    if [ -z "$number" ] || [ -z "$file" ] || [ -z "$text" ]; then
      echo "architecture_numbers: a row of '$section' is not | number | file | \`text\` |: $row" >&2; bad=1; continue
    fi
    printf '%s\n' "$number" | normalize >> "$tmp/row_numbers"
    if [ ! -f "$tree/$file" ]; then
      echo "architecture_numbers: $map_rel claims $number from $file, which does not exist" >&2; bad=1; continue
    fi
    if [[ "$text" == re:* ]]; then
      grep -Eq -- "${text#re:}" "$tree/$file"
    else
      grep -Fq -- "$text" "$tree/$file"
    fi || { echo "architecture_numbers: $map_rel claims $number from $file, which no longer contains: $text" >&2; bad=1; }
  done < "$tmp/rows"
  touch "$tmp/row_numbers"
  [ "$n_rows" -gt 0 ] || { echo "architecture_numbers: '$section' has no rows" >&2; bad=1; }

  # (b) every number with a unit in the prose has a row. A line is read with the first word
  # of the next one, so that a number wrapped away from its unit is still seen.
  awk -F'\t' -v units="$units" '
    { no[NR] = $1; sub(/^[^\t]*\t/, ""); text[NR] = $0 }
    END {
      re = "(^|[^0-9A-Za-z_.,-])[0-9][0-9,]*(\\.[0-9]+)?[ -]?(" units ")([^0-9A-Za-z_]|$)"
      for (i = 1; i <= NR; i++) {
        s = text[i]
        if (i < NR) { m = text[i + 1]; sub(/^[ \t]+/, "", m); sub(/[ \t].*$/, "", m); if (m != "") s = s " " m }
        while (match(s, re)) {
          hit = substr(s, RSTART, RLENGTH)
          s = substr(s, RSTART + RLENGTH - 1)
          sub(/^[^0-9]/, "", hit); sub(/[^0-9A-Za-z%]$/, "", hit)
          print no[i] "\t" hit
        }
      }
    }' "$tmp/prose" > "$tmp/hits"
  cut -f2 "$tmp/hits" | normalize > "$tmp/prose_numbers"
  paste <(cut -f1 "$tmp/hits") "$tmp/prose_numbers" > "$tmp/keyed"
  while IFS=$'\t' read -r line_no key; do
    grep -qxF -- "$key" "$tmp/row_numbers" ||
      { echo "architecture_numbers: $map_rel:$line_no names \"$key\", which has no row in '$section'" >&2; bad=1; }
  done < <(sort -t$'\t' -k2,2 -u "$tmp/keyed" | sort -n)

  # (c) every row's number is still in the prose.
  while IFS= read -r key; do
    grep -qxF -- "$key" "$tmp/prose_numbers" ||
      { echo "architecture_numbers: the row \"$key\" of '$section' names a number the prose no longer states" >&2; bad=1; }
  done < <(sort -u "$tmp/row_numbers")

  [ -n "${ARCH_NUMBERS_DEBUG:-}" ] && cat "$tmp/keyed" >&2
  rm -rf "$tmp"
  [ "$bad" = 0 ] && echo "architecture numbers: all $n_rows rows hold, and every number with a unit has one"
  return "$bad"
}

check "$root" || { echo "architecture_numbers: $map_rel names numbers the code no longer holds (see above)" >&2; exit 1; }
[ "$self_test" = 1 ] || exit 0

# Self-test: copies of the tree with one claim broken each must be refused, naming it.
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
copy() {  # a fresh copy of the map and of every file its table names
  rm -rf "$tmp/t"; mkdir -p "$tmp/t/docs"; cp "$root/$map_rel" "$tmp/t/$map_rel"
  awk -v s="$section" '$0 == s {i = 1; next} i && /^## / {i = 0} i && /^\| / {print}' "$root/$map_rel" |
    awk -F'|' '{gsub(/^[ \t`]+|[ \t`]+$/, "", $3); print $3}' | sort -u | grep -v '^file$' |
    while IFS= read -r f; do mkdir -p "$tmp/t/$(dirname "$f")"; cp "$root/$f" "$tmp/t/$f"; done
}
refused() {  # what the refusal must say
  if check "$tmp/t" >/dev/null 2>"$tmp/err"; then echo "self-test: not refused: $1"; exit 1; fi
  grep -qF -- "$2" "$tmp/err" || { echo "self-test: refused without saying '$2':"; cat "$tmp/err"; exit 1; }
}
copy
check "$tmp/t" >/dev/null || { echo "self-test: the copy of the tree is refused"; exit 1; }
# A source that no longer holds a row's text: the first fixed-string row.
row="$(awk -v s="$section" '$0 == s {i = 1; next} i && /^## / {i = 0} i && /^\| / && !/^\| *number/ && !/`re:/ {print; exit}' "$root/$map_rel")"
file="$(printf '%s' "$row" | awk -F'|' '{gsub(/^[ \t`]+|[ \t`]+$/, "", $3); print $3}')"
text="$(printf '%s' "$row" | sed -E 's/^([^|]*\|){3}[[:space:]]*//; s/[[:space:]]*\|[[:space:]]*$//; s/^`//; s/`$//')"
grep -vF -- "$text" "$tmp/t/$file" > "$tmp/f" && cp "$tmp/f" "$tmp/t/$file"
refused "$file without '$text'" "which no longer contains: $text"
# A number with a unit in the prose that has no row.
copy
sed -i "0,/^## Layers\$/s//A bound of 777 tokens.\n\n&/" "$tmp/t/$map_rel"
refused "a prose number without a row" "names \"777 token\", which has no row"
# A row whose number the prose no longer states.
copy
printf '| 4242 holders | %s | `%s` |\n' "$file" "$text" >> "$tmp/t/$map_rel"
refused "a row the prose does not state" "the row \"4242 holder\""
echo "architecture numbers self-test passed"
