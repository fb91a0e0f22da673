#!/usr/bin/env bash
# Replays Anthropic Messages requests recorded from a real client (scripts/trial-claude-code.sh
# with TRIAL_CAPTURE=DIR) against warmctx serve and llama-server, one fresh server each, at
# their defaults, and prints one JSON object: per request, the time the client waited for the
# whole answer (max_tokens 1, not streamed: the time to the first token plus one token), the
# prompt tokens, what each server says it read from its cache, and (`allocated`) the lines
# of each server's start-up log that say what KV it allocated, and (`counters`) warmctx's own
# counters after the last request: copies out for the disk, write-backs, parked streams,
# checkpoints (/metrics).
#
# The runs are replayed in order: every request of DIR/first/, then DIR/again/ (the same task
# in a new session), then DIR/other/ (another first prompt). The first request is cold.
#
# usage: scripts/replay-messages.sh CAPTURE_DIR
# env:   MODEL (required), WARMCTX_BIN (build/warmctx), LLAMA_SERVER_BIN (build/bin/llama-server),
#        REPLAY_CTX (32768), REPLAY_SYSTEMS ("warmctx llama-server"), WARMCTX_ARGS, LLAMA_ARGS
#        (more arguments for one system), REPLAY_LLAMA_PORT (18181), REPLAY_LOG_DIR (keep the
#        servers' logs there)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
capture="${1:?usage: scripts/replay-messages.sh CAPTURE_DIR}"
model="${MODEL:?MODEL= the gguf to serve}"
warmctx="${WARMCTX_BIN:-$root/build/warmctx}"
llama="${LLAMA_SERVER_BIN:-$root/build/bin/llama-server}"
ctx="${REPLAY_CTX:-32768}"
for tool in jq curl; do command -v "$tool" >/dev/null || { echo "replay: needs $tool" >&2; exit 1; }; done
files=()
for run in first again other; do
  [ -d "$capture/$run" ] || { echo "replay: no $capture/$run (record with TRIAL_CAPTURE)" >&2; exit 1; }
  while IFS= read -r f; do
    case "$(jq -r '.path' "$f")" in /v1/messages|/v1/messages\?*) files+=("$run/${f##*/}") ;; esac
  done < <(find "$capture/$run" -name '*.json' | sort)
done
[ ${#files[@]} -gt 0 ] || { echo "replay: no /v1/messages requests in $capture" >&2; exit 1; }

work="$(mktemp -d)"
srv=""
stop() {
  [ -n "$srv" ] && { kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null || true; }; srv=""
  if [ -n "${REPLAY_LOG_DIR:-}" ]; then mkdir -p "$REPLAY_LOG_DIR"; cp "$work"/*.log "$REPLAY_LOG_DIR"/ 2>/dev/null || true; fi
}
trap 'stop; rm -rf "$work"' EXIT

start_warmctx() {
  : >"$work/serve.out"
  WARMCTX_HOME="$work/home" "$warmctx" serve -m "$model" --port 0 -c "$ctx" ${WARMCTX_ARGS:-} \
    >"$work/serve.out" 2>"$work/warmctx.log" &
  srv=$!
  for _ in $(seq 1200); do
    port="$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$work/serve.out" | head -1)"
    [ -n "$port" ] && return
    kill -0 "$srv" 2>/dev/null || { echo "replay: warmctx serve exited" >&2; tail -20 "$work/warmctx.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "replay: warmctx did not listen" >&2; exit 1
}

start_llama() {
  port="${REPLAY_LLAMA_PORT:-18181}"
  "$llama" -m "$model" --host 127.0.0.1 --port "$port" -c "$ctx" --no-webui ${LLAMA_ARGS:-} \
    >"$work/llama.log" 2>&1 &
  srv=$!
  for _ in $(seq 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && return
    kill -0 "$srv" 2>/dev/null || { echo "replay: llama-server exited" >&2; tail -20 "$work/llama.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "replay: llama-server did not become healthy" >&2; exit 1
}

send() {  # system file -> one JSON line
  local system="$1" f="$capture/$2" hdrs=() h
  jq '.body | .max_tokens = 1 | .stream = false' "$f" >"$work/body.json"
  while IFS= read -r h; do hdrs+=(-H "$h"); done < <(jq -r '.headers | to_entries[] |
      select(.key | test("^(anthropic-|x-claude-code-session-id$|x-app$|x-api-key$)")) | "\(.key): \(.value)"' "$f")
  local t
  t="$(curl -s -o "$work/resp.json" -w '%{http_code} %{time_total}' -X POST "http://127.0.0.1:$port/v1/messages" \
        -H 'content-type: application/json' "${hdrs[@]}" --data-binary @"$work/body.json")"
  jq -c --arg system "$system" --arg req "$2" --arg code "${t%% *}" --arg s "${t##* }" \
    '{system: $system, request: $req, status: ($code|tonumber), client_ms: (($s|tonumber) * 1000),
      usage: (.usage // null), timings: (.warmctx.timings // .timings // null), error: (.error // null)}' \
    "$work/resp.json" 2>/dev/null ||
    jq -nc --arg system "$system" --arg req "$2" --arg code "${t%% *}" '{system: $system, request: $req, status: ($code|tonumber), error: "not JSON"}'
}

: >"$work/results.jsonl"
: >"$work/memory.jsonl"
memory() {  # system -> what the server says it allocated for KV, from its own start-up log
  local line
  case "$1" in
    warmctx) line="$(grep -a -E 'KV streams|device tier:' "$work/warmctx.log" | tr '\n' ' ')" ;;
    llama-server) line="$(grep -a -E 'n_slots = .*n_ctx_slot|KV buffer size|--cache-ram|cache_ram' "$work/llama.log" | head -4 | tr '\n' ' ')" ;;
  esac
  jq -nc --arg system "$1" --arg line "$line" '{system: $system, kv: $line}' >>"$work/memory.jsonl"
}
: >"$work/counters.jsonl"
counters() {  # warmctx's own counters of where the time between the requests went (/metrics)
  curl -s "http://127.0.0.1:$port/metrics" |
    grep -E '^warmctx_(disk_cop|tier_writes|write_back|pool_write_backs|deferred_writes_(parked|cut)|branches_(parked|too_costly)|stream_copies|checkpoint(s_taken|_seconds|_bytes|_size))' |
    jq -R -s --arg system warmctx 'split("\n") | map(select(length > 0) | split(" ") | {(.[0]): (.[1] | tonumber)}) | add
      | {system: $system} + .' >>"$work/counters.jsonl" || true
}
for system in ${REPLAY_SYSTEMS:-warmctx llama-server}; do
  case "$system" in
    warmctx) start_warmctx ;;
    llama-server) start_llama ;;
    *) echo "replay: unknown system $system" >&2; exit 2 ;;
  esac
  echo "replay: $system on port $port" >&2
  memory "$system"
  for f in "${files[@]}"; do
    send "$system" "$f" | tee -a "$work/results.jsonl" >&2
  done
  [ "$system" = warmctx ] && counters
  stop
done
jq -s --arg capture "$capture" --arg model "$model" --arg ctx "$ctx" --slurpfile memory "$work/memory.jsonl" \
  --slurpfile counters "$work/counters.jsonl" \
  '{capture: $capture, model: $model, ctx: ($ctx|tonumber), allocated: $memory, counters: $counters, requests: .}' \
  "$work/results.jsonl"
