#!/usr/bin/env bash
# Many large bodies at once, each valid but for an unknown field holding [{},{},...]
# (the shape that costs the most memory per byte once parsed), against `warmctx serve`
# under a 6 GB address-space cap: 24 bodies of 8 MiB (~250 MB each as parsed values)
# and 24 of 3 MiB (~90 MB each) at once. Every request must be answered (413 for a body
# that alone would take more than the per-body bound, 503 with Retry-After while the
# bodies already being read hold the rest, else the request's own answer), the server
# must stay up and answer a chat after. 24 such bodies at once used to abort it
# (std::bad_alloc inside the parsed value's destructor).
# usage: serve_body_memory.sh WARMCTX_BIN MODEL
set -uo pipefail
bin="$1"; model="$2"
work="$(mktemp -d)"; home="$work/home"; mkdir -p "$home"
pid=""
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$work"' EXIT
fails=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

body() {  # body FILE BYTES: a chat with a junk field of empty objects, BYTES long
  python3 - "$1" "$2" <<'PY'
import sys
path, n = sys.argv[1], int(sys.argv[2])
head = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"junk":['
items = (n - len(head) - 2) // 3
with open(path, "wb") as f:
    f.write(head + b",".join([b"{}"] * items) + b"]}")
PY
}
body "$work/big.json" $((8 * 1024 * 1024 - 64))
body "$work/mid.json" $((3 * 1024 * 1024))

(ulimit -v 6000000; exec env WARMCTX_HOME="$home" "$bin" serve -m "$model" -c 1024 -t 1 --port 0 -q >/dev/null 2>"$work/err") &
pid=$!
port=""
for _ in $(seq 1 600); do
  port="$(sed -n 's/^serve: bound http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/err")"
  [ -n "$port" ] && curl -s "http://127.0.0.1:$port/health" | grep -q '"ok"' && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { echo "serve did not start"; cat "$work/err"; exit 1; }
url="http://127.0.0.1:$port"

for kind in big mid; do
  for i in $(seq 1 24); do
    curl -s -o /dev/null -D "$work/$kind-$i.h" -w '%{http_code}\n' -H 'Content-Type: application/json' \
      --data-binary @"$work/$kind.json" "$url/v1/chat/completions" >"$work/$kind-$i.code" &
  done
  wait $(jobs -p | grep -v "^$pid$") 2>/dev/null
  codes="$(cat "$work"/$kind-*.code | sort | uniq -c | tr '\n' ' ')"
  echo "$kind bodies: $codes"
  check "$kind: every request answered 200, 413 or 503" \
    "[ \"\$(cat \"$work\"/$kind-*.code | grep -cvE '^(200|413|503)$')\" = 0 ]"
  check "$kind: the server is up" "kill -0 $pid 2>/dev/null"
done
check "big: every 8 MiB body is 413 (over the per-body bound)" "[ \"\$(cat \"$work\"/big-*.code | grep -c '^413$')\" = 24 ]"
check "mid: some 3 MiB bodies were read (200)" "[ \"\$(cat \"$work\"/mid-*.code | grep -c '^200$')\" -ge 1 ]"
busy="$(grep -l '^503$' "$work"/mid-*.code | head -1)"
if [ -n "$busy" ]; then
  check "mid: a 503 carries Retry-After" "grep -qi '^retry-after:' \"${busy%.code}.h\""
fi
chat="$(curl -s -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"hello"}],"max_tokens":2}' "$url/v1/chat/completions")"
check "a chat is answered after" "echo '$chat' | grep -q '\"choices\"'"
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=""
check "serve exits 0 on SIGTERM" "[ $rc = 0 ]"
if [ "$fails" = 0 ]; then echo "body memory checks: all passed"; else echo "$fails body memory checks failed"; exit 1; fi
