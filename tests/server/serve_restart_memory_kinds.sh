#!/usr/bin/env bash
# A model that is not plain attention keeps its prefix across a restart: `serve` on it (a
# hybrid's recurrent state, or a sliding window) answers a chat, stops, starts again on the
# same cache home, and the next chat with the same system prompt reuses it from the disk
# tier: the state of every part of the model's memory (a window's two KV caches, or the
# attention KV and the recurrent state) was written and read back. /health and /metrics
# name the model's memory.
# usage: serve_restart_memory_kinds.sh WARMCTX_BIN MODEL KIND
set -euo pipefail
bin="$1"; model="$2"; kind="$3"
home="$(mktemp -d)"; out="$(mktemp)"; err="$(mktemp)"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$home" "$out" "$err"' EXIT
fail() { echo "FAIL: $*"; cat "$err" | tail -20; exit 1; }

start() {
  : >"$out"
  WARMCTX_HOME="$home" "$bin" serve -m "$model" -c 2048 --chunk 64 -t 1 --port 0 -q >"$out" 2>"$err" &
  pid=$!
  port=""
  for _ in $(seq 1 300); do
    port="$(sed -n 's/^warmctx: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out")"
    [ -n "$port" ] && curl -sf "localhost:$port/health" >/dev/null && return
    kill -0 "$pid" 2>/dev/null || fail "serve exited early"
    sleep 0.1
  done
  fail "serve never became ready"
}
stop() {
  kill -TERM "$pid"
  wait "$pid" || fail "serve did not stop cleanly"
  pid=""
}
system="$(printf 'You read the repository before you answer, and you answer briefly. %.0s' $(seq 1 20))"
chat() {
  curl -sf "localhost:$port/v1/chat/completions" -H 'Content-Type: application/json' -d \
    "{\"max_tokens\":2,\"messages\":[{\"role\":\"system\",\"content\":\"$system\"},{\"role\":\"user\",\"content\":\"$1\"}]}"
}

start
health="$(curl -sf "localhost:$port/health")"
echo "$health" | grep -q "\"kind\":\"$kind\"" || fail "/health does not say $kind: $health"
# Read whole first: grep -q stops at its match, and under pipefail curl's broken pipe
# would fail the check.
metrics="$(curl -sf "localhost:$port/metrics")" || fail "/metrics did not answer"
grep -q "warmctx_model_memory{kind=\"$kind\",reuse=\"true\"} 1" <<<"$metrics" || fail "/metrics does not say $kind"
first="$(chat "first question")" || fail "the first chat failed"
echo "$first" | grep -q '"cached_tokens":0' || fail "the first chat reused something: $first"
# Qwen3.5's generation prompt opens a reasoning block (<think>): the answer's reasoning is
# returned apart, and streamed as delta.reasoning_content as it grows. (gpt-oss's opens
# only when the model writes its analysis channel.)
if [ "$kind" = hybrid ]; then
  echo "$first" | grep -q '"reasoning_content":"' || fail "the answer's reasoning is not apart: $first"
  streamed="$(curl -sfN "localhost:$port/v1/chat/completions" -H 'Content-Type: application/json' -d \
    '{"max_tokens":3,"stream":true,"reasoning_budget_tokens":-1,"messages":[{"role":"user","content":"stream"}]}')" ||
    fail "the streamed chat failed"
  [ "$(echo "$streamed" | grep -c '"reasoning_content":"')" -ge 1 ] || fail "no reasoning was streamed: $streamed"
  # Log-probabilities are per token of the text as generated: such a request is not parsed.
  lp="$(curl -sfN "localhost:$port/v1/chat/completions" -H 'Content-Type: application/json' -d \
    '{"max_tokens":3,"stream":true,"logprobs":true,"messages":[{"role":"user","content":"stream"}]}')" ||
    fail "the streamed chat with logprobs failed"
  [ "$(echo "$lp" | grep -c '"logprobs":{"content":\[{')" -ge 1 ] || fail "no logprobs were streamed: $lp"
  # An answer that opens with reasoning cannot continue a given start of the answer (a
  # last assistant message): a 400 naming that message, as llama-server refuses it.
  code="$(curl -s -o "$home/prefill.json" -w '%{http_code}' "localhost:$port/v1/messages" -H 'Content-Type: application/json' \
    -d '{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure,"}]}')"
  [ "$code" = 400 ] && grep -q 'messages\[1\]' "$home/prefill.json" || fail "a prefill on a reasoning model: $code $(cat "$home/prefill.json")"
fi
stop

start
second="$(chat "second question")" || fail "the chat after the restart failed"
cached="$(echo "$second" | sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p')"
[ "${cached:-0}" -gt 100 ] || fail "after the restart only ${cached:-0} tokens were reused: $second"
echo "$second" | grep -q '"tier":"disk"' || fail "the reuse did not come from the disk tier: $second"
stop
echo "restart checks ($kind): all passed ($cached tokens reused from disk)"
