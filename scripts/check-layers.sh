#!/usr/bin/env bash
# Checks that includes follow the layers of docs/architecture.md; run by every build.
#   util -> context -> cache -> {store, engine, workload} -> runtime -> server -> cli
# A file may include headers of its own layer and of the layers below it, never of a layer
# above it or of a sibling, in either form: a public header, "warmctx/x.h"
# (include/warmctx/, installed; every one must be listed below with its layer), or a
# header private to the project, "<layer>/x.h" (src/<layer>/x.h). A public header includes
# only public ones (it is installed, src/ is not). Only src/engine may include llama.cpp's
# headers. A folder's own headers, included by their name alone, are its own business.
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"

declare -A layer_of_header=(
  [status.h]=util [hash.h]=util [types.h]=util [fs.h]=util
  [segments.h]=context [kind_table.h]=context [chunking.h]=context [assembler.h]=context [text_model.h]=context [manifest.h]=context [profile.h]=context [conversation.h]=context [volatility.h]=context
  [prefix_cache.h]=cache [eviction_policy.h]=cache
  [engine.h]=engine [sampling.h]=engine [drafts.h]=engine [chat_template.h]=engine
  [context_engine.h]=runtime [context_options.h]=runtime [context_counters.h]=runtime [explain_report.h]=runtime
  [scheduler.h]=runtime
  [server.h]=server
)
declare -A rank=([util]=0 [context]=1 [cache]=2 [store]=3 [engine]=3 [workload]=3 [runtime]=4 [server]=5 [cli]=6)

fail=0
complain() { echo "check-layers: $*" >&2; fail=1; }

for h in include/warmctx/*.h; do
  [ -n "${layer_of_header[$(basename "$h")]:-}" ] || complain "$h: a public header with no layer (add it to scripts/check-layers.sh)"
done

may_include() {  # from-layer to-layer
  local a="$1" b="$2"
  [ "$a" = "$b" ] && return 0
  [ "${rank[$b]}" -lt "${rank[$a]}" ] && return 0
  return 1
}

while IFS= read -r f; do
  case "$f" in
    include/warmctx/*) from="${layer_of_header[$(basename "$f")]:-}" ;;
    src/*) from="$(echo "$f" | cut -d/ -f2)" ;;
  esac
  [ -n "$from" ] && [ -n "${rank[$from]:-}" ] || { complain "$f: in no known layer"; continue; }
  while IFS=: read -r line inc; do
    # llama.h, llama-cpp.h, ggml-cpu.h, gguf.h, common.h, ... (not llama_server.h, a name of ours)
    if [[ "$inc" =~ ^#include[[:space:]]*[\<\"]((llama|ggml|gguf)([-./][-./a-z0-9_]*)?|(common|chat|sampling|log)[-./a-z0-9_]*)\.h[\>\"] ]]; then
      [ "$from" = engine ] || complain "$f:$line: includes llama.cpp ($inc) outside src/engine"
    fi
    if [[ "$inc" =~ ^#include[[:space:]]*\"warmctx/([a-z_0-9]+\.h)\" ]]; then
      to="${layer_of_header[${BASH_REMATCH[1]}]:-}"
      [ -n "$to" ] || { complain "$f:$line: includes unknown public header ${BASH_REMATCH[1]}"; continue; }
      may_include "$from" "$to" || complain "$f:$line: layer '$from' may not include warmctx/${BASH_REMATCH[1]} (layer '$to')"
    fi
    # "store/snapshot_store.h": src/store/snapshot_store.h, a header of the store layer
    if [[ "$inc" =~ ^#include[[:space:]]*\"(([a-z_0-9]+)/[-./a-z_0-9]+\.h)\" ]] && [ -n "${rank[${BASH_REMATCH[2]}]:-}" ]; then
      path="${BASH_REMATCH[1]}" to="${BASH_REMATCH[2]}"
      case "$f" in include/warmctx/*)
        complain "$f:$line: a public header includes $path, a header private to the project (src/ is not installed)"
        continue ;;
      esac
      [ -e "src/$path" ] || { complain "$f:$line: includes $path, which is not in src/"; continue; }
      may_include "$from" "$to" || complain "$f:$line: layer '$from' may not include $path (layer '$to')"
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include' "$f" | sed 's/^\([0-9]*\):[[:space:]]*#[[:space:]]*/\1:#/')
done < <(find include/warmctx src -name '*.h' -o -name '*.cpp' | sort)

[ "$fail" = 0 ] || { echo "check-layers: the layering of docs/architecture.md is broken (see above)" >&2; exit 1; }
