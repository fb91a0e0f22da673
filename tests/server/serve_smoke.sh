#!/usr/bin/env bash
# `warmctx serve` as a process: it listens (announcing the port), answers /health, and a
# SIGTERM stops it cleanly (exit 0) within a few seconds.
# usage: serve_smoke.sh WARMCTX_BIN MODEL
set -euo pipefail
bin="$1"; model="$2"
out="$(mktemp)"; err="$(mktemp)"; home="$(mktemp -d)"
trap 'rm -rf "$out" "$err" "$home"' EXIT
# A fresh cache home: a server holds its home's lock, so one on the default home would
# refuse (or be refused by) any other server there.
WARMCTX_HOME="$home" "$bin" serve -m "$model" -c 1024 --chunk 64 -t 1 --port 0 -q >"$out" 2>"$err" &
pid=$!
port=""
for _ in $(seq 1 300); do
  port="$(sed -n 's/^warmctx: listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out")"
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "serve exited early:"; cat "$err"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "serve never listened"; cat "$err"; kill "$pid"; exit 1; }
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
reply="$(cat <&3)"
exec 3<&-
echo "$reply" | head -1
echo "$reply" | grep -q '"status":"ok"' || { echo "unexpected /health reply: $reply"; kill "$pid"; exit 1; }
kill -TERM "$pid"
for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then echo "serve did not stop on SIGTERM"; kill -KILL "$pid"; exit 1; fi
wait "$pid"; rc=$?
grep -q "serve: stopped" "$err" || { echo "no clean-stop line:"; cat "$err"; exit 1; }
echo "serve stopped cleanly (exit $rc)"
exit "$rc"
