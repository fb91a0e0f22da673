#!/usr/bin/env bash
# A model whose memory warmctx does not cut (tiny-unsupported: LFM2's short convolutions
# beside attention with a sliding window, llama.cpp's hybrid-iswa memory) is served
# without reuse across turns, and says so: at start-up, in /health, /metrics and each
# answer's explain. Every chat answers 200 (a turn that shares the one before reuses
# nothing, never a 500), and the process stays up.
# usage: serve_unsupported_memory.sh WARMCTX_BIN MODEL
set -euo pipefail
bin="$1"; model="$2"
home="$(mktemp -d)"; out="$(mktemp)"; err="$(mktemp)"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$home" "$out" "$err"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$err"; exit 1; }

WARMCTX_HOME="$home" "$bin" serve -m "$model" -c 2048 --chunk 64 -t 1 --port 0 >"$out" 2>"$err" &
pid=$!
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's/^warmctx: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out")"
  [ -n "$port" ] && curl -sf "localhost:$port/health" >/dev/null && break
  kill -0 "$pid" 2>/dev/null || fail "serve exited early"
  sleep 0.1
done
curl -sf "localhost:$port/health" >/dev/null || fail "serve never became ready"

grep -q "^serve: memory: unsupported: .*served without reuse across turns" "$err" || fail "start-up does not say the memory is unsupported"
health="$(curl -sf "localhost:$port/health")"
echo "$health" | grep -q '"kind":"unsupported"' || fail "/health does not say unsupported: $health"
echo "$health" | grep -q '"reuse":false' || fail "/health does not say reuse is off: $health"
metrics="$(curl -sf "localhost:$port/metrics")" || fail "/metrics did not answer"
grep -q 'warmctx_model_memory{kind="unsupported",reuse="false"} 1' <<<"$metrics" || fail "/metrics does not say unsupported"

system="$(printf 'You read the repository before you answer, and you answer briefly. %.0s' $(seq 1 20))"
for q in first second third; do
  code="$(curl -s -o "$home/answer.json" -w '%{http_code}' "localhost:$port/v1/chat/completions" -H 'Content-Type: application/json' -d \
    "{\"max_tokens\":3,\"messages\":[{\"role\":\"system\",\"content\":\"$system\"},{\"role\":\"user\",\"content\":\"$q question\"}]}")"
  answer="$(cat "$home/answer.json")"
  [ "$code" = 200 ] || fail "the $q chat answered $code: $answer"
  echo "$answer" | grep -q '"cached_tokens":0' || fail "the $q chat reused something: $answer"
  echo "$answer" | grep -q '"reason":"this model.s memory is not one warmctx can save and cut' || fail "the $q chat's explain does not say why nothing was reused: $answer"
done
# Streamed too, and the process is still up and healthy after.
streamed="$(curl -sfN "localhost:$port/v1/chat/completions" -H 'Content-Type: application/json' -d \
  "{\"max_tokens\":3,\"stream\":true,\"messages\":[{\"role\":\"system\",\"content\":\"$system\"},{\"role\":\"user\",\"content\":\"stream\"}]}")" ||
  fail "the streamed chat failed"
echo "$streamed" | grep -q '^data: \[DONE\]' || fail "the stream did not end with [DONE]: $streamed"
curl -sf "localhost:$port/health" >/dev/null || fail "/health stopped answering"
kill -TERM "$pid"; wait "$pid" || fail "serve did not stop cleanly"; pid=""
echo "unsupported memory checks: all passed"
