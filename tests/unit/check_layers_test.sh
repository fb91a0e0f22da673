#!/usr/bin/env bash
# The layering check passes on the tree, and fails on a copy with one wrong include
# planted in each of these ways: a lower layer including a higher one and a sibling, by a
# public header ("warmctx/x.h") and by a header private to the project ("<layer>/x.h");
# a public header including a private one; and llama.cpp outside src/engine.
set -euo pipefail
root="$1"
bash "$root/scripts/check-layers.sh" "$root" || { echo "the tree itself fails the check"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
plant() {  # file line
  rm -rf "$tmp/t"; mkdir -p "$tmp/t"; cp -r "$root/include" "$root/src" "$tmp/t/"
  printf '%s\n' "$2" >> "$tmp/t/$1"
  if bash "$root/scripts/check-layers.sh" "$tmp/t" 2>"$tmp/err"; then
    echo "not refused: $2 in $1"; exit 1
  fi
  grep -q "$1" "$tmp/err" || { echo "refused without naming $1:"; cat "$tmp/err"; exit 1; }
}
plant include/warmctx/assembler.h '#include "warmctx/engine.h"'
plant src/cache/prefix_cache.cpp '#include "warmctx/context_engine.h"'
plant src/store/snapshot.cpp '#include "warmctx/engine.h"'
plant src/store/snapshot.cpp '#include "runtime/kv_pool.h"'
plant src/workload/workload.cpp '#include "engine/seq_state.h"'
plant src/util/status.cpp '#include "server/completion.h"'
plant include/warmctx/engine.h '#include "engine/seq_state.h"'
plant src/runtime/scheduler.cpp '#include "llama.h"'
echo "check-layers test passed"
