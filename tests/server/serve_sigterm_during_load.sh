#!/usr/bin/env bash
# `warmctx serve` gets SIGTERM while its model loads, at ten delays after the port is
# bound (the tiny model loads in a second or less on an idle machine): every time it must exit 0 within
# 30 s. (It used to hang in about 4 of 10 tries, answering 503 and ignoring further
# signals.) The port is bound before the load: /health answers at once, 503 "loading"
# or, once the model is in, 200.
# usage: serve_sigterm_during_load.sh WARMCTX_BIN MODEL
set -uo pipefail
bin="$1"; model="$2"
err="$(mktemp)"; home="$(mktemp -d)"
trap 'rm -rf "$err" "$home"' EXIT
fails=0
for d in 0 0.005 0.01 0.02 0.04 0.06 0.1 0.15 0.2 0.3; do
  : >"$err"
  WARMCTX_HOME="$home" "$bin" serve -m "$model" -c 1024 --chunk 64 -t 1 --port 0 -q >/dev/null 2>"$err" &
  pid=$!
  port=""
  for _ in $(seq 1 1000); do
    port="$(sed -n 's/^serve: bound http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$err")"
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.005
  done
  if [ -z "$port" ]; then
    echo "delay $d: no 'serve: bound' line"; cat "$err"; kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    fails=$((fails + 1)); continue
  fi
  health="$(exec 3<>"/dev/tcp/127.0.0.1/$port" &&
            printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3 && timeout 5 cat <&3 | tr -d '\r')"
  case "$health" in
    *'"status":"loading"'* | *'"status":"ok"'*) ;;
    *) echo "delay $d: /health did not answer loading or ok: $health"; fails=$((fails + 1)) ;;
  esac
  sleep "$d"
  kill -TERM "$pid"
  stopped=0
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || { stopped=1; break; }; sleep 0.1; done
  if [ "$stopped" = 1 ]; then
    wait "$pid"; rc=$?
  else
    kill -KILL "$pid"; wait "$pid" 2>/dev/null; rc=hung
  fi
  echo "delay $d: exit $rc (/health before the signal: $(echo "$health" | head -1), $(echo "$health" | tail -1))"
  if [ "$rc" != 0 ]; then fails=$((fails + 1)); cat "$err"; fi
done
if [ "$fails" = 0 ]; then echo "all 10 stopped cleanly"; else echo "$fails of 10 did not stop cleanly"; exit 1; fi
