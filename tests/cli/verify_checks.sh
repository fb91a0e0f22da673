#!/usr/bin/env bash
# `warmctx verify` from the outside: its exit code and what its JSON says.
# usage: verify_checks.sh WARMCTX TINY_MODEL [exit|shared]
#   exit   - 0 when everything holds; 1 (with the JSON still printed) on an expectation
#            failure; 2 on bad input
#   shared - shared mode (one unified KV) reports the tiny model's logit drift and, since
#            shared mode promises no bit-exactness, still exits 0
set -euo pipefail
warmctx="$1" model="$2" which="${3:-exit}"
out="$(mktemp)"; err="$(mktemp)"; trap 'rm -f "$out" "$err"' EXIT
check() { if ! jq -e "$1" "$out" >/dev/null; then echo "FAILED: $2"; jq -c "${3:-.}" "$out" | head -c 4000; echo; exit 1; fi; echo "ok: $2"; }
# Runs verify with the given flags; RC is its exit code.
run() { RC=0; "$warmctx" verify -m "$model" -t 1 "$@" >"$out" 2>"$err" || RC=$?; }
expect_rc() { if [ "$RC" != "$1" ]; then echo "FAILED: $2: exit code $RC, expected $1"; tail -c 2000 "$err"; head -c 2000 "$out"; exit 1; fi; echo "ok: $2"; }
summary='del(.failures)'

case "$which" in
exit)
  run --scenarios 1 --json
  expect_rc 0 "a clean run exits 0"
  check '.mode == "exact" and .mismatches == 0 and .turn_mismatches == 0 and .expectation_failures == 0 and .max_logit_diff == 0 and .turns >= 7' \
        "exact mode: every warm turn equal to its cold reference, every expectation held" "$summary"
  # The device tier's path, here on the CPU: a prefix another stream holds is copied
  # stream to stream, an edit's trimmed stable blocks are parked in a free stream and
  # copied back when the edit is undone - and every warm turn still equals the cold one.
  run --scenarios 2 --stream-copies on --json
  expect_rc 0 "with stream copies, a clean run exits 0"
  check '.stream_copies and .n_stream_copies >= 4 and .n_branches_parked >= 1 and .mismatches == 0 and .expectation_failures == 0 and .max_logit_diff == 0' \
        "with stream copies: copies and parked branches, every warm turn equal to its cold reference" "$summary"
  run --scenarios 1 --stream-copies off --json
  check '(.stream_copies | not) and .n_stream_copies == 0 and .n_pool_loads >= 1' \
        "without stream copies, another stream is served through the pool" "$summary"
  # A one-token budget admits nothing into the pool and no tier keeps a copy: the work
  # stream still serves the next question in place, but the turn in another stream,
  # which on the CPU expects the stable prefix through the pool, misses it.
  run --scenarios 1 --tiers false --budget-tokens 1 --json
  expect_rc 1 "an expectation failure exits 1"
  check '.expectation_failures > 0 and (.failures | length) == .expectation_failures and (.failures[0] | test("^scenario-0 another stream: expected a hit of at least [0-9]+ tokens"))' \
        "the failures are in the JSON, each with its scenario, step and reason" '.failures'
  run --scenarios 0
  expect_rc 2 "bad input exits 2"
  grep -q "error: --scenarios must be >= 1" "$err" && echo "ok: and says why" || { echo "FAILED: no error message"; cat "$err"; exit 1; }
  ;;
shared)
  run --scenarios 2 --kv-mode shared --json
  expect_rc 0 "shared mode exits 0 even when warm differs from cold in the last bits"
  check '.mode == "shared" and .max_logit_diff > 0 and .turn_mismatches > 0 and .mismatches > 0' \
        "shared mode reports the logit drift of reusing cells in place" "$summary"
  check '.expectation_failures == 0 and .token_agreement > 0' "the cache's expectations still hold" "$summary"
  ;;
*) echo "unknown check '$which'"; exit 2 ;;
esac
echo "verify checks passed"
