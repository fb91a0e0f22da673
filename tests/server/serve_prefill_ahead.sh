#!/usr/bin/env bash
# `warmctx serve --prefill-ahead always` on the CPU: a cold chat whose prompt has a small
# system prompt and more than 64 KiB of new text after it has its system prompt prefilled
# ahead (warmctx.prewarm.ahead), and its cached_tokens count it. With the default (gpu),
# the same chat on the CPU is not prefilled ahead.
# usage: serve_prefill_ahead.sh WARMCTX_BIN MODEL
set -euo pipefail
bin="$1"; model="$2"
dir="$(mktemp -d)"
pid=""
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$dir"' EXIT

# ~70 KiB of new text in long words (few tokens, so the tiny model prefills it quickly).
words=(implementation configuration documentation international administration communication responsibility
       understanding environmental organization relationship performance development information)
for i in $(seq 1 1250); do
  echo "${words[$((i % 14))]} ${words[$((i * 3 % 14))]} ${words[$((i * 5 % 14))]} ${words[$((i * 11 % 14))]}"
done >"$dir/map.txt"
jq -n --rawfile map "$dir/map.txt" '{max_tokens: 1, temperature: 0,
  messages: [{role: "system", content: "You answer in one word."}, {role: "user", content: "Which file is largest?"}],
  segments: [{id: "map", kind: "repo_map", content: $map}]}' >"$dir/body.json"

run() {  # run MODE: starts serve, sends the chat, prints warmctx.prewarm.ahead and cached_tokens
  local mode="$1"
  # Each run its own log files: the first run's "listening on" line must never be read
  # for the second's port (the background shell may not have truncated a shared file yet).
  local out="$dir/out-${mode:-default}" err="$dir/err-${mode:-default}"
  : >"$out"
  WARMCTX_HOME="$dir/home-$mode" "$bin" serve -m "$model" -c 16384 -t 1 --port 0 -q --no-disk \
    ${mode:+--prefill-ahead "$mode"} >"$out" 2>"$err" &
  pid=$!
  local port=""
  for _ in $(seq 1 300); do
    port="$(sed -n 's/^warmctx: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out")"
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "serve exited early:"; cat "$err"; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "serve never listened"; cat "$err"; exit 1; }
  curl -sS --max-time 240 -H 'Content-Type: application/json' --data-binary @"$dir/body.json" \
    "http://127.0.0.1:$port/v1/chat/completions" >"$dir/reply.json"
  kill -TERM "$pid"; wait "$pid" || true; pid=""
  jq -e '.warmctx' "$dir/reply.json" >/dev/null || { echo "no warmctx object: $(head -c 2000 "$dir/reply.json")"; exit 1; }
  jq -r '"\(.warmctx.prewarm.ahead // false) \(.usage.prompt_tokens_details.cached_tokens) \(.usage.prompt_tokens)"' "$dir/reply.json"
}

read -r ahead cached total <<<"$(run always)"
echo "--prefill-ahead always: ahead=$ahead cached_tokens=$cached of $total"
[ "$ahead" = "true" ] || { echo "FAILED: the system prompt was not prefilled ahead"; exit 1; }
[ "$cached" -gt 0 ] && [ "$cached" -lt $((total / 10)) ] || { echo "FAILED: cached_tokens should count the lead only"; exit 1; }
read -r ahead cached total <<<"$(run "")"
echo "default (gpu) on the CPU: ahead=$ahead cached_tokens=$cached of $total"
[ "$ahead" = "false" ] && [ "$cached" = "0" ] || { echo "FAILED: the default prefilled ahead on the CPU"; exit 1; }
echo "prefill ahead checks: all passed"
