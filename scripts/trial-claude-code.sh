#!/usr/bin/env bash
# A trial of the real Claude Code CLI against `warmctx serve`: installs the pinned
# @anthropic-ai/claude-code from npm (into the cache home), starts serve on a model (the
# generated tiny one by default), runs `claude -p` twice on one task and once on another,
# and writes what every request got: route, status, prompt tokens, tokens reused.
# The generated model never ends an answer on its own, so CLAUDE_CODE_MAX_OUTPUT_TOKENS
# bounds each answer (as against llama-server).
#
# usage: scripts/trial-claude-code.sh [OUT_DIR]   (default: bench/results/<YYYY-MM-DD>-cpu<cores>/claude-code-trial)
# env:   WARMCTX_BIN (build/warmctx), WARMCTX_TINY_MODEL (build/test-models/tiny-f16-seed1.gguf),
#        CLAUDE_CODE_VERSION (2.1.197), TRIAL_MAX_OUTPUT_TOKENS (64), TRIAL_CTX (32768)
#        TRIAL_CAPTURE=DIR  also records every request Claude Code sends (through
#                           scripts/capture-proxy.mjs) into DIR/<run>/NNN.json, for
#                           scripts/replay-messages.sh; DIR holds the CLI's own prompts, so
#                           keep it out of the repository
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/bench/results/$(date -u +%F)-cpu$(nproc)/claude-code-trial}"
bin="${WARMCTX_BIN:-$root/build/warmctx}"
model="${WARMCTX_TINY_MODEL:-$root/build/test-models/tiny-f16-seed1.gguf}"
version="${CLAUDE_CODE_VERSION:-2.1.197}"
home="${WARMCTX_HOME:-$HOME/.cache/warmctx}"
cli_dir="$home/claude-code-$version"
mkdir -p "$out"

if [ ! -x "$cli_dir/node_modules/.bin/claude" ]; then
  echo "trial: installing @anthropic-ai/claude-code@$version into $cli_dir"
  mkdir -p "$cli_dir"
  (cd "$cli_dir" && npm install --no-audit --no-fund --cache "$home/npm-cache" "@anthropic-ai/claude-code@$version" >/dev/null)
fi
claude="$cli_dir/node_modules/.bin/claude"

work="$(mktemp -d)"
srv=""
proxy=""
trap '[ -n "$proxy" ] && kill "$proxy" 2>/dev/null; [ -n "$srv" ] && { kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null; }; rm -rf "$work"' EXIT
mkdir -p "$work/project" "$work/home"
printf 'def add(a, b):\n    return a + b\n' >"$work/project/calc.py"
printf '# calc\nA tiny calculator.\n' >"$work/project/README.md"

: >"$work/serve.out"
"$bin" serve -m "$model" --port 0 --no-disk -c "${TRIAL_CTX:-32768}" -t "$(nproc)" \
  >"$work/serve.out" 2>"$out/serve.log" &
srv=$!
for _ in $(seq 600); do
  port="$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$work/serve.out" | head -1)"
  [ -n "$port" ] && break
  kill -0 "$srv" 2>/dev/null || { echo "trial: serve exited"; cat "$out/serve.log"; exit 1; }
  sleep 0.2
done
[ -n "$port" ] || { echo "trial: serve did not listen"; exit 1; }
echo "trial: serve on port $port"
client_port="$port"
capture="${TRIAL_CAPTURE:-}"
if [ -n "$capture" ]; then
  mkdir -p "$capture/all"
  node "$root/scripts/capture-proxy.mjs" "$port" "$capture/all" >"$work/proxy.out" 2>&1 &
  proxy=$!
  for _ in $(seq 100); do
    client_port="$(sed -n 's|^capture-proxy listening on \([0-9]*\)$|\1|p' "$work/proxy.out")"
    [ -n "$client_port" ] && break
    sleep 0.1
  done
  [ -n "$client_port" ] || { echo "trial: capture proxy did not start"; cat "$work/proxy.out"; exit 1; }
  echo "trial: recording requests into $capture (proxy on port $client_port)"
fi

# A run ends at the model's output-token limit ("API Error: Claude's response exceeded
# the N output token maximum", exit 1): the generated model never stops by itself.
run() {  # name prompt
  local name="$1" prompt="$2" t0 t1 rc
  t0=$(date +%s.%N)
  set +e
  (cd "$work/project" && HOME="$work/home" ANTHROPIC_BASE_URL="http://127.0.0.1:$client_port" ANTHROPIC_API_KEY=local \
     CLAUDE_CODE_MAX_OUTPUT_TOKENS="${TRIAL_MAX_OUTPUT_TOKENS:-64}" DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 \
     CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 timeout 600 "$claude" -p "$prompt" --max-turns 3 \
     >"$out/$name.stdout" 2>"$out/$name.stderr")
  rc=$?
  set -e
  t1=$(date +%s.%N)
  if [ -n "$capture" ]; then  # this run's requests into their own folder
    mkdir -p "$capture/$name"
    find "$capture/all" -name '*.json' -exec mv -t "$capture/$name" {} +
  fi
  echo "trial: $name exit $rc after $(echo "$t1 - $t0" | bc) s"
  echo "{\"run\":\"$name\",\"exit\":$rc,\"seconds\":$(echo "$t1 - $t0" | bc)}" >>"$out/runs.jsonl"
}
: >"$out/runs.jsonl"
run first "Add a subtract function to calc.py."
run again "Add a subtract function to calc.py."
run other "What does README.md say?"

# Every request the runs made: one line each from serve's request log.
grep -a '"status"' "$out/serve.log" | jq -c 'select(.route != null and .status != null) |
  {route, status, prompt_tokens, tokens_reused, tokens_prefilled, ttft_ms}' >"$out/requests.jsonl" || true
jq -s '{requests: length,
        statuses: (group_by(.status) | map({key: (.[0].status|tostring), value: length}) | from_entries),
        messages: [ .[] | select(.route == "/v1/messages") |
                    {status, prompt_tokens, tokens_reused,
                     reuse: (if (.prompt_tokens // 0) > 0 then ((.tokens_reused // 0) / .prompt_tokens) else null end)} ]}' \
  "$out/requests.jsonl" >"$out/summary.json"
cat "$out/summary.json"
