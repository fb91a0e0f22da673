#!/usr/bin/env bash
# A short `warmctx-bench soak` on the tiny model: fails if any request got a 5xx, lost its
# connection, got an answer other than the one it must get, or a stream broke. RSS is
# sampled but not judged on a run this short (its warm-up is most of it).
# usage: soak_checks.sh WARMCTX_BENCH TINY_MODEL
set -uo pipefail
bench="$1" model="$2"
out="$(mktemp)"; trap 'rm -f "$out"' EXIT
# -t 1: llama.cpp's threads wait on each other at every barrier; on a shared 2-core
# machine one thread per decode is many times faster.
"$bench" soak -m "$model" -t 1 --clients 8 --duration-s 20 --sample-s 2 --json >"$out"
rc=$?
check() { if ! jq -e "$1" "$out" >/dev/null; then echo "FAILED: $2"; jq -c "${3:-.}" "$out" | head -c 4000; echo; exit 1; fi; echo "ok: $2"; }
check '.n_5xx == 0 and .requests.by_status_class["5xx"] == 0' "no request got a 5xx" '.failures'
check '.requests.connection_errors == 0' "no connection was lost" '.failures'
check '.requests.unexpected_status == 0' "every request got the answer it must get" '.failures'
check '.requests.stream_errors == 0' "every stream ended with [DONE] and no error event" '.failures'
check '.requests.requests >= 40' "the clients sent requests" '.requests'
check '(.by_type[] | select(.type == "bad_request") | .by_status_class["4xx"] == .requests)' "every bad request got a 4xx" '.by_type'
check '(.rss.samples | length) >= 6 and all(.rss.samples[]; .rss_mib > 0)' "RSS sampled" '.rss'
check '.failed_checks - ["rss_not_flat"] == []' "nothing else failed" '.failed_checks'
if [ "$rc" != 0 ] && ! jq -e '.failed_checks == ["rss_not_flat"]' "$out" >/dev/null; then
  echo "FAILED: warmctx-bench soak exited $rc"; exit 1
fi
echo "soak checks passed"
