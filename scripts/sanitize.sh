#!/usr/bin/env bash
# Builds the model-free tests (label unit: util, context, cache, store, workload and the
# server's parsing, routes and store) with AddressSanitizer and UndefinedBehaviorSanitizer
# in their own build directory, and runs them. Any report fails the run.
#
#   scripts/sanitize.sh                    build and run
#   scripts/sanitize.sh -R Snapshot        extra arguments go to ctest
#
# Only warmctx's own code is instrumented (cmake/warmctx_hardening.cmake): llama.cpp,
# which the server tests link, is built exactly as in the regular build, so ccache serves
# its objects. Environment: WARMCTX_SANITIZE_BUILD_DIR (default build-sanitize),
# WARMCTX_SANITIZERS (default address,undefined,float-cast-overflow), CC/CXX (default:
# the regular build's compiler), WARMCTX_LLAMA_DIR.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

build="${WARMCTX_SANITIZE_BUILD_DIR:-build-sanitize}"
sanitizers="${WARMCTX_SANITIZERS:-address,undefined,float-cast-overflow}"
llama="${WARMCTX_LLAMA_DIR:-$root/third_party/llama.cpp}"
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1

# The test executables of label unit (the CLI's unit tests need the whole binary and
# run in the regular build; the layering check is a script).
targets=(warmctx_unit_tests warmctx_context_tests warmctx_cache_tests warmctx_store_tests
         warmctx_server_unit_tests)

t0=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWARMCTX_LLAMA_DIR="$llama" \
    -DWARMCTX_SANITIZE="$sanitizers" > "$build/configure.log" 2>&1 \
    || { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j 2 --target "${targets[@]}"
t1=$(date +%s)
echo "sanitize.sh: built in $(( t1 - t0 )) s"

# Leaks count; every report aborts the test that made it.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
ctest --test-dir "$build" --output-on-failure -j 2 --timeout 300 -L unit -E '^(cli_|check_layers)' "$@"
echo "sanitize.sh: tests ran in $(( $(date +%s) - t1 )) s; no sanitizer report"
