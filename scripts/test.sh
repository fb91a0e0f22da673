#!/usr/bin/env bash
# Builds everything (scripts/setup.sh) and runs the test suite.
#   scripts/test.sh                 all tests
#   scripts/test.sh -L unit         only the tests that need no model
#   scripts/test.sh -L model        only the tests on the generated tiny model
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
build="${WARMCTX_BUILD_DIR:-build}"
cd "$root"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900 "$@"
