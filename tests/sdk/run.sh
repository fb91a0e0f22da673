#!/usr/bin/env bash
# The SDK client tests (openai, Vercel AI SDK, LangChain) against `warmctx serve` on the
# tiny model. Installs the pinned packages (package-lock.json) when node_modules is missing
# or older than the lock file, then runs every *.test.mjs here with node's test runner.
# env: WARMCTX_BIN (default: build/warmctx), WARMCTX_TINY_MODEL (default:
#      build/test-models/tiny-f16-seed1.gguf), WARMCTX_HOME (the npm cache goes under it).
# usage: run.sh [extra node --test arguments]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export WARMCTX_BIN="${WARMCTX_BIN:-$root/build/warmctx}"
export WARMCTX_TINY_MODEL="${WARMCTX_TINY_MODEL:-$root/build/test-models/tiny-f16-seed1.gguf}"

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "sdk tests: '$tool' is not installed (node >= 20 is needed)"; exit 1; }
done
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 20 ] || { echo "sdk tests: node $(node --version) is too old (>= 20 is needed)"; exit 1; }
[ -x "$WARMCTX_BIN" ] || { echo "sdk tests: WARMCTX_BIN '$WARMCTX_BIN' is not an executable"; exit 1; }
[ -f "$WARMCTX_TINY_MODEL" ] || { echo "sdk tests: WARMCTX_TINY_MODEL '$WARMCTX_TINY_MODEL' is missing"; exit 1; }

# npm writes node_modules/.package-lock.json on every install: it stands for node_modules.
# ctest runs the three SDK tests (one per model shape) side by side, and `npm ci` first
# removes node_modules: one install at a time, and the others wait for it (a lock file
# beside the lock file) instead of deleting what a running test loads.
stamp="$here/node_modules/.package-lock.json"
exec 9>"$here/.install.lock"
flock 9
if [ ! -f "$stamp" ] || [ "$here/package-lock.json" -nt "$stamp" ]; then
  cache="${WARMCTX_HOME:-$HOME/.cache/warmctx}/npm-cache"
  echo "sdk tests: installing the pinned packages (npm ci, cache $cache)"
  if ! (cd "$here" && npm ci --no-audit --no-fund --prefer-offline --cache "$cache"); then
    echo "sdk tests: FAILED to install the pinned npm packages (is the npm registry reachable?)."
    echo "sdk tests: the SDK tests cannot run without them; run 'npm ci' in $here to retry."
    exit 1
  fi
  touch "$stamp"
fi
flock -u 9

cd "$here"
exec node --test --test-concurrency=1 "$@" ./*.test.mjs
