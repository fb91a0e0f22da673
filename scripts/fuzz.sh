#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, ASan+UBSan, no llama.cpp) in their own
# build directory and runs each for a while. docs/hardening.md says what each covers.
#
#   scripts/fuzz.sh                       every harness for 20 s (CI)
#   scripts/fuzz.sh --time 600 snapshot   one harness for 10 minutes
#   scripts/fuzz.sh --runs 10000000       every harness for 10 million executions
#   scripts/fuzz.sh --runs 10000000 --workers 4 --jobs 16 snapshot chat_request
#                                         4 processes per harness sharing its corpus, each
#                                         running a quarter of the executions, 16 at once
#   scripts/fuzz.sh --build-only          build, run nothing
#
# Options: --time S (per harness; 20 unless --runs is given), --runs N (stop after N
# executions in all; with --time, whichever comes first), --workers N (processes per harness,
# sharing its corpus directory; --runs is split between them; default 1), --jobs N (processes
# run side by side, default 2), --build-only, --no-build (run the harnesses already built). Environment: WARMCTX_FUZZ_BUILD_DIR (default build-fuzz), CC/CXX (default
# clang/clang++), WARMCTX_LLAMA_DIR.
#
# Inputs the fuzzer finds go to <build>/fuzz-corpus/<harness>/ (fuzz/corpus/ holds the
# seeds and is only read); a crash is saved as <build>/fuzz-artifacts/<harness>-crash-*
# and makes the script exit 1 after every harness has run. Reproduce one with
#   <build>/fuzz/fuzz_<harness> <file>
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

time_s=""
runs=""
jobs=2
workers=1
build_only=0
no_build=0
harnesses=()
while [ $# -gt 0 ]; do
  case "$1" in
    --time) time_s="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --no-build) no_build=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
all=(json chat_request workspace_routes snapshot kind_table profile manifest seq_state)
[ ${#harnesses[@]} -gt 0 ] || harnesses=("${all[@]}")
[ -n "$time_s$runs" ] || time_s=20

build="${WARMCTX_FUZZ_BUILD_DIR:-build-fuzz}"
cc="${CC:-clang}"
cxx="${CXX:-clang++}"
llama="${WARMCTX_LLAMA_DIR:-$root/third_party/llama.cpp}"
if [ "$no_build" = 0 ] && ! command -v "$cxx" > /dev/null; then
  echo "fuzz.sh: $cxx not found (the harnesses need clang and its libFuzzer: apt-get install clang)" >&2
  exit 2
fi
# ccache: the same objects whatever the checkout's path (CI's fresh clone included).
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1

t0=$(date +%s)
if [ "$no_build" = 1 ]; then :
elif [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DWARMCTX_LLAMA_DIR="$llama" \
    -DWARMCTX_FUZZ=ON -DWARMCTX_BUILD_TESTS=OFF > "$build/configure.log" 2>&1 \
    || { cat "$build/configure.log"; exit 1; }
fi
[ "$no_build" = 1 ] || cmake --build "$build" -j 2 --target warmctx_fuzzers
[ "$no_build" = 1 ] || echo "fuzz.sh: harnesses built in $(( $(date +%s) - t0 )) s"
[ "$build_only" = 0 ] || exit 0

mkdir -p "$build/fuzz-logs" "$build/fuzz-artifacts"
# One task = one process: harness h, worker w of $workers.
run_one() {
  local h="${1%:*}" w="${1#*:}" dict="$root/fuzz/dict/json.dict"
  [ "$h" = snapshot ] && dict="$root/fuzz/dict/snapshot.dict"
  mkdir -p "$build/fuzz-corpus/$h"
  local args=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1
              -dict="$dict" -artifact_prefix="$build/fuzz-artifacts/$h-" -seed=$((1000 + w)))
  [ -n "$time_s" ] && args+=(-max_total_time="$time_s")
  [ -n "$runs" ] && args+=(-runs="$(( (runs + workers - 1) / workers ))")
  [ "$workers" -gt 1 ] && args+=(-reload=1)
  local rc=0
  "$build/fuzz/fuzz_$h" "${args[@]}" "$build/fuzz-corpus/$h" "$root/fuzz/corpus/$h" \
    > "$build/fuzz-logs/$h.$w.log" 2>&1 || rc=$?
  echo "$rc" > "$build/fuzz-logs/$h.$w.rc"
}
export -f run_one
export build root time_s runs workers

tasks=()
for h in "${harnesses[@]}"; do
  [ -x "$build/fuzz/fuzz_$h" ] || { echo "fuzz.sh: no harness '$h' (have: ${all[*]})" >&2; exit 2; }
  rm -f "$build/fuzz-logs/$h".*
  for w in $(seq 1 "$workers"); do tasks+=("$h:$w"); done
done
t1=$(date +%s)
printf '%s\n' "${tasks[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}

# The summary: executions summed over a harness's workers, seconds of the slowest.
failed=0
printf '%-18s %12s %8s %10s  %s\n' harness executions seconds exec/s result
for h in "${harnesses[@]}"; do
  execs=0 secs=0 result=ok
  for w in $(seq 1 "$workers"); do
    log="$build/fuzz-logs/$h.$w.log"
    rc=$(cat "$build/fuzz-logs/$h.$w.rc" 2>/dev/null || echo 99)
    e=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    s=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | awk '{print $5}' | tail -1)
    execs=$(( execs + ${e:-0} ))
    [ "${s:-0}" -gt "$secs" ] && secs=${s:-0}
    if [ "$rc" != 0 ]; then result="FAILED (worker $w: exit $rc)"; failed=1; fi
  done
  rate=$(( secs > 0 ? execs / secs : 0 ))
  printf '%-18s %12s %8s %10s  %s\n' "$h" "$execs" "$secs" "$rate" "$result"
done
echo "fuzz.sh: ran in $(( $(date +%s) - t1 )) s"
if [ "$failed" != 0 ]; then
  for h in "${harnesses[@]}"; do
    for w in $(seq 1 "$workers"); do
      [ "$(cat "$build/fuzz-logs/$h.$w.rc")" = 0 ] && continue
      echo "---- $h worker $w: the end of $build/fuzz-logs/$h.$w.log"
      tail -40 "$build/fuzz-logs/$h.$w.log"
    done
  done
  ls -l "$build/fuzz-artifacts" || true
  exit 1
fi
echo "fuzz.sh: no crash"
