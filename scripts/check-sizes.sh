#!/usr/bin/env bash
# Checks the size rules of CONTRIBUTING.md over src/ and include/: no source file over
# 700 lines, no function over 120 lines (a function here: a definition that starts in
# column 0 and ends at the next "}" in column 0; tests and generated code are not checked).
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
max_file=700 max_fn=120
fail=0
while IFS= read -r f; do
  n=$(wc -l <"$f")
  if [ "$n" -gt "$max_file" ]; then echo "check-sizes: $f has $n lines (at most $max_file)" >&2; fail=1; fi
  awk -v f="$f" -v max="$max_fn" '
    # A definition: its head starts in column 0 (not a comment, preprocessor line,
    # namespace or type) and may run over several lines up to the "{" that ends one.
    !infn && !cand && /^[A-Za-z_][^;]*\(/ && !/^(namespace|struct|class|enum|union|extern|using|template)/ {
      cand = NR; name = $0 }
    !infn && cand && /;[[:space:]]*$/ { cand = 0 }
    !infn && cand && /\{[[:space:]]*$/ { infn = 1; start = cand; cand = 0; next }
    infn && /^\}/ { if (NR - start + 1 > max) { printf "check-sizes: %s:%d: a function of %d lines (at most %d): %s\n", f, start, NR - start + 1, max, name > "/dev/stderr"; bad = 1 }
                    infn = 0 }
    END { exit bad }' "$f" || fail=1
done < <(find src include -name '*.cpp' -o -name '*.h' | sort)
[ "$fail" = 0 ] || { echo "check-sizes: split the files or functions above" >&2; exit 1; }
