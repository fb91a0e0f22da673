#!/usr/bin/env bash
# Starts N `warmctx serve` replicas and HAProxy in front of them on this machine, sharing one
# cache directory (disk tier and workspace store), and runs until SIGINT/SIGTERM, which stops
# them all. docs/scale-out.md says how to run the same across machines.
#
# usage: scripts/cluster.sh [options] [-- serve flags...]
#   -n N            replicas (default 3)
#   --port P        HAProxy's port, the one clients use (default 8080)
#   --first-port Q  replica i listens on Q+i-1 (default P+1)
#   --stats-port S  HAProxy's Prometheus metrics (/metrics) and stats page (/stats) (default 8404)
#   --dir DIR       the shared cache directory, and where logs, pids and haproxy.cfg go
#                   (default $WARMCTX_HOME/cluster or ~/.cache/warmctx/cluster)
#   --bin PATH      the warmctx binary (default: build/warmctx, else warmctx on PATH)
#   --balance-factor F  HAProxy's hash-balance-factor (default: the shipped config's)
# Every flag after -- goes to each replica's serve (e.g. -m model.gguf -c 8192).
#
# Files under DIR: kv/ (the shared disk tier; kv/workspaces the shared store), haproxy.cfg,
# pids ("NAME PID PORT" per line, haproxy last), logs/NAME.{out,err}. Prints
# "cluster: ready http://127.0.0.1:P" on stdout once every replica answers /health and
# HAProxy routes to it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
n=3 port=8080 first_port="" stats_port=8404 dir="" bin="" factor=""
serve_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --first-port) first_port="$2"; shift 2 ;;
    --stats-port) stats_port="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --balance-factor) factor="$2"; shift 2 ;;
    --) shift; serve_args=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
first_port="${first_port:-$((port + 1))}"
if [ -z "$dir" ]; then dir="${WARMCTX_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/warmctx}/cluster"; fi
if [ -z "$bin" ]; then
  if [ -x "$root/build/warmctx" ]; then bin="$root/build/warmctx"; else bin="$(command -v warmctx || true)"; fi
fi
[ -x "$bin" ] || { echo "cluster: no warmctx binary (build it, or pass --bin)" >&2; exit 2; }
command -v haproxy >/dev/null || { echo "cluster: haproxy is not installed (apt-get install haproxy)" >&2; exit 2; }
mkdir -p "$dir/logs" "$dir/kv"
: >"$dir/pids"

pids=()
stop_all() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'exit 0' INT TERM

# HAProxy's configuration: the shipped one with these replicas and ports.
servers=""
for i in $(seq 1 "$n"); do servers+="    server r$i 127.0.0.1:$((first_port + i - 1)) check"$'\n'; done
awk -v servers="$servers" -v port="$port" -v stats="$stats_port" -v factor="$factor" '
  /^ +# servers:begin$/ { print; printf "%s", servers; skip = 1; next }
  /^ +# servers:end$/ { skip = 0 }
  skip { next }
  /# bind:warmctx/ { sub(/bind [^ ]+/, "bind 127.0.0.1:" port) }
  /# bind:stats/ { sub(/bind [^ ]+/, "bind 127.0.0.1:" stats) }
  factor != "" && /^ *hash-balance-factor / { sub(/hash-balance-factor [0-9]+/, "hash-balance-factor " factor) }
  { print }' "$root/deploy/haproxy/warmctx.cfg" >"$dir/haproxy.cfg"
haproxy -c -q -f "$dir/haproxy.cfg"

for i in $(seq 1 "$n"); do
  p=$((first_port + i - 1))
  "$bin" serve --host 127.0.0.1 --port "$p" --cache-dir "$dir/kv" --shared-cache-dir --replica "r$i" \
    "${serve_args[@]}" >"$dir/logs/r$i.out" 2>"$dir/logs/r$i.err" &
  pids+=($!)
  echo "r$i $! $p" >>"$dir/pids"
done
haproxy -db -f "$dir/haproxy.cfg" >"$dir/logs/haproxy.out" 2>"$dir/logs/haproxy.err" &
pids+=($!)
echo "haproxy $! $port" >>"$dir/pids"

# Ready: every replica's /health is 200 and HAProxy counts every server up.
health() { python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('$1', timeout=2).status == 200 else 1)" 2>/dev/null; }
for _ in $(seq 1 600); do
  ok=1
  for i in $(seq 1 "$n"); do health "http://127.0.0.1:$((first_port + i - 1))/health" || { ok=0; break; }; done
  if [ "$ok" = 1 ] && python3 - "$stats_port" "$n" <<'EOF'
import sys, urllib.request
port, n = sys.argv[1], int(sys.argv[2])
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
up = [l for l in text.splitlines() if l.startswith("haproxy_server_status{") and 'state="UP"' in l and l.endswith(" 1")]
sys.exit(0 if len(up) >= n else 1)
EOF
  then
    echo "cluster: ready http://127.0.0.1:$port ($n replicas, shared directory $dir/kv, HAProxy metrics http://127.0.0.1:$stats_port/metrics)"
    break
  fi
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "cluster: process $p exited; see $dir/logs" >&2; exit 1; }; done
  sleep 0.2
done
# A replica that dies is HAProxy's to route around (the others serve its workspaces, from the
# shared disk tier); the cluster ends when HAProxy does, or on SIGINT/SIGTERM.
wait "${pids[-1]}" || true
echo "cluster: haproxy exited; stopping the replicas (see $dir/logs)" >&2
exit 1
