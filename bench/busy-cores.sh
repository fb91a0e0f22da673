#!/usr/bin/env bash
# A 256-token answer (greedy, the tiny model) from `warmctx serve` and from llama-server,
# each at its defaults but -t (all cores), with the cores idle and while as many busy loops
# as there are cores keep every core busy (other processes: an editor, a build, tests).
# Each measurement REPS times, one system after the other; prints one JSON object.
# usage: bench/busy-cores.sh [MODEL]     env: REPS (3), WARMCTX_BIN, LLAMA_SERVER_BIN,
#   WARMCTX_ARGS (more serve flags, e.g. "--draft-max 0": decode without drafts)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${1:-$root/build/test-models/tiny-f16-seed1.gguf}"
warmctx="${WARMCTX_BIN:-$root/build/warmctx}"
llama="${LLAMA_SERVER_BIN:-$root/build/bin/llama-server}"
reps="${REPS:-3}"
cores="$(nproc)"
home="$(mktemp -d)"; pid=""; busy=()
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; for b in "${busy[@]}"; do kill "$b" 2>/dev/null; done; rm -rf "$home"; }
trap cleanup EXIT
start() {  # system port
  if [ "$1" = warmctx ]; then
    # shellcheck disable=SC2086
    WARMCTX_HOME="$home" "$warmctx" serve -m "$model" -t "$cores" --port "$2" --no-disk -q ${WARMCTX_ARGS:-} >/dev/null 2>&1 &
  else
    "$llama" -m "$model" -t "$cores" --port "$2" >"$home/llama.log" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 1 300); do curl -sf "localhost:$2/health" >/dev/null && return; sleep 0.1; done
  echo "busy-cores: $1 did not start" >&2; exit 1
}
ask() {  # port tag -> seconds (and the token count in $home/n)
  local t
  t="$(curl -s "localhost:$1/v1/chat/completions" -H 'Content-Type: application/json' -o "$home/a.json" -w '%{time_total}' \
    -d '{"max_tokens":256,"temperature":0,"messages":[{"role":"user","content":"Tell me a long story, '"$2"'."}]}')"
  sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$home/a.json" >"$home/n"
  echo "$t"
}
json="{\"model\":\"$model\",\"warmctx_args\":\"${WARMCTX_ARGS:-}\",\"cores\":$cores,\"busy_loops\":$cores,\"max_tokens\":256,\"systems\":{"
first=1
port=18140
for sys in warmctx llama-server; do
  port=$((port + 1))
  start "$sys" "$port"
  ask "$port" warm-up >/dev/null
  idle=(); loaded=(); tokens=()
  for r in $(seq 1 "$reps"); do
    idle+=("$(ask "$port" "idle $r")")
    for _ in $(seq 1 "$cores"); do yes >/dev/null & busy+=($!); done
    sleep 0.5
    loaded+=("$(ask "$port" "busy $r")")
    tokens+=("$(cat "$home/n")")
    for b in "${busy[@]}"; do kill "$b" 2>/dev/null; done; busy=()
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  [ $first = 1 ] || json+=","
  first=0
  json+="\"$sys\":{\"idle_s\":[$(IFS=,; echo "${idle[*]}")],\"busy_s\":[$(IFS=,; echo "${loaded[*]}")],\"tokens\":[$(IFS=,; echo "${tokens[*]}")]}"
  echo "busy-cores: $sys idle ${idle[*]} s, busy ${loaded[*]} s" >&2
done
echo "$json}}" | python3 -c '
import json, statistics, sys
d = json.load(sys.stdin)
for s in d["systems"].values():
    s["idle_median_s"] = statistics.median(s["idle_s"]); s["busy_median_s"] = statistics.median(s["busy_s"])
w, l = d["systems"]["warmctx"], d["systems"]["llama-server"]
d["busy_ratio_warmctx_over_llama_server"] = round(w["busy_median_s"] / l["busy_median_s"], 3)
d["idle_ratio_warmctx_over_llama_server"] = round(w["idle_median_s"] / l["idle_median_s"], 3)
print(json.dumps(d, indent=1))'
