#!/usr/bin/env bash
# Two `warmctx serve` on one cache home: the second is refused at start with a message
# naming the first (its pid), whether it finds the home through WARMCTX_HOME or names
# the same directory with --cache-dir; once the first stops, a server starts there again.
# (A second server used to start with no warning, then the two served different content
# for one segment and collided on its files: issue 30 item 6.)
# usage: serve_shared_home.sh WARMCTX_BIN MODEL
set -uo pipefail
bin="$1"; model="$2"
dir="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

start() {  # start NAME ARGS...: starts serve in the background, sets $pid; waits for its listening line
  local name="$1"; shift
  WARMCTX_HOME="${home:-$dir/home}" "$bin" serve -m "$model" -c 1024 --chunk 64 -t 1 --port 0 -q --no-prewarm "$@" \
    >"$dir/$name.out" 2>"$dir/$name.err" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 300); do
    grep -q '^warmctx: listening' "$dir/$name.out" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop() {  # stop PID
  kill -TERM "$1"
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$1" 2>/dev/null && fail "serve $1 did not stop on SIGTERM"
  wait "$1"
}

start first || { cat "$dir/first.err"; fail "the first server did not start"; }
first=$pid

# The same home through WARMCTX_HOME, then through --cache-dir: refused at once, exit != 0.
for how in env flag; do
  args=()
  [ "$how" = flag ] && args=(--cache-dir "$dir/home/kv")
  if start "second-$how" "${args[@]}"; then fail "a second server ($how) started on the same home"; fi
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "the second server ($how) neither listened nor exited"
  wait "$pid"; rc=$?
  [ "$rc" != 0 ] || fail "the second server ($how) exited 0"
  grep -q "another warmctx serve (pid $first" "$dir/second-$how.err" ||
    { cat "$dir/second-$how.err"; fail "the refusal ($how) does not name the first server's pid $first"; }
  echo "second server ($how) refused: $(head -1 "$dir/second-$how.err")"
done

# A different home is fine beside it; the same home again once the first has stopped.
home="$dir/other" start other || { cat "$dir/other.err"; fail "a server on another home did not start"; }
stop "$pid"
stop "$first"
start third || { cat "$dir/third.err"; fail "no server could start on the home after the first stopped"; }
stop "$pid"

# Replicas share a home on purpose (--shared-cache-dir): both start; a server without the
# flag is refused beside them, naming them; and a replica is refused beside a lone server.
home="$dir/rep" start rep1 --shared-cache-dir || { cat "$dir/rep1.err"; fail "the first replica did not start"; }
rep1=$pid
home="$dir/rep" start rep2 --shared-cache-dir || { cat "$dir/rep2.err"; fail "a second replica with --shared-cache-dir was refused"; }
rep2=$pid
if home="$dir/rep" start lone; then fail "a server without --shared-cache-dir started beside replicas"; fi
wait "$pid" 2>/dev/null
grep -q "replicas started with --shared-cache-dir use the cache directory" "$dir/lone.err" ||
  { cat "$dir/lone.err"; fail "the refusal beside replicas does not say so"; }
stop "$rep2"
stop "$rep1"
home="$dir/rep" start lone2 || { cat "$dir/lone2.err"; fail "a lone server could not start once the replicas stopped"; }
lone=$pid
if home="$dir/rep" start rep3 --shared-cache-dir; then fail "a replica started beside a lone server"; fi
wait "$pid" 2>/dev/null
grep -q "without --shared-cache-dir (pid $lone" "$dir/rep3.err" || { cat "$dir/rep3.err"; fail "the replica's refusal does not name the lone server"; }
stop "$lone"
echo "replicas share a home only with --shared-cache-dir"
echo "shared home checks: all passed"
