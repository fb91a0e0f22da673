#!/usr/bin/env bash
# Builds everything (scripts/setup.sh) and runs the test suite; after the whole suite,
# every libFuzzer harness for a short time (scripts/fuzz.sh, docs/hardening.md).
#   scripts/test.sh                 all tests, then each fuzzer for 15 s, two at a time
#   scripts/test.sh -L unit         only the tests that need no model (no fuzzing)
#   scripts/test.sh -L model        only the tests on the generated tiny model (no fuzzing)
# environment:
#   WARMCTX_FUZZ_SECONDS   seconds per harness after the whole suite (default 15; 0: none)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${WARMCTX_BUILD_DIR:-build}"
cd "$root"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900 "$@"

fuzz_s="${WARMCTX_FUZZ_SECONDS:-15}"
if [ $# -eq 0 ] && [ "$fuzz_s" != 0 ]; then
  # setup.sh installs clang on Debian; elsewhere it may be missing, and then say so.
  if command -v clang++ >/dev/null; then
    t0=$(date +%s)
    CC=clang CXX=clang++ bash "$root/scripts/fuzz.sh" --time "$fuzz_s"
    echo "test.sh: the fuzzers (build and runs) took $(( $(date +%s) - t0 )) s"
  else
    echo "test.sh: clang++ not found, so the fuzzers did not run (apt-get install clang libclang-rt-dev)"
  fi
fi
