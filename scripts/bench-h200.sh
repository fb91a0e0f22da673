#!/usr/bin/env bash
# Builds warmctx and llama.cpp with CUDA for sm_90 and runs the benchmarks on one
# NVIDIA H200 (or any sm_90 GPU). Made for a machine with CUDA, CMake and ninja but
# no Debian packages and no network: it builds from what scripts/pack-device.sh put
# in .devcarry/ (run that first, on a machine that has them).
#
# usage: scripts/bench-h200.sh [STAGE...]     stages: build s2 trace window s3 calls contention verify render restore replay floor agents
#                                             (default: build s2 trace s3)
# environment:
#   OUT                 where results go (default: bench/results/<YYYY-MM-DD>-<gpu>/, the day and the GPU's
#                       model as nvidia-smi names it, h100 or h200; bench/results/README.md lists the folders)
#   WARMCTX_DEADLINE_S  start no bench stage after this many seconds (default: none)
#   S2_SIZES            the s2 stage's prompt sizes (default: 2048,8192,32768,47000)
#   TRACE_ARGS          more arguments for the trace and window stages (e.g. --systems warmctx-defaults,llama-server-defaults)
#   WINDOW_TAIL         the window stage's mean diff + test output per turn, tokens (default 60)
#   REPLAY_CAPTURE      the replay stage's recorded requests (default: .devcarry/claude-capture, from
#                       TRIAL_CAPTURE=... scripts/trial-claude-code.sh)
#   REPLAY_SHAPES       the replay stage's model shapes, each made once as $WARMCTX_HOME/models/<shape>-q4_0-seed0.gguf
#                       (default: qwen2.5-0.5b, written as replay-h200.json; any other shape as replay-<shape>-h200.json)
#   REPLAY_SYSTEMS      the systems replayed (scripts/replay-messages.sh; default: "warmctx llama-server"; llama-server
#                       answers 500 to these requests with the Qwen3.5 template: use warmctx for qwen3.5-*)
#   REPLAY_LOG_DIR      keep the servers' logs in REPLAY_LOG_DIR/<shape>/ (default: not kept)
#   FLOOR_SHAPES        the floor stage's shapes: llama-bench prefill (-n 0, flash attention, all layers on the GPU)
#                       into floor-<shape>-h200.json (default: qwen3.5-hybrid qwen3.5-plain)
#   FLOOR_SIZES         the floor stage's prompt sizes (default: 512,4096,16384)
#   FLOOR_DEPTH         tokens in the context before each measured prompt (llama-bench -d; default 0)
#   FLOOR_REPS          llama-bench's repetitions (default 5)
#   AGENTS              the agents stage's agent counts (default: "8 16"), each into agents<N>-h200.json: N agents
#                       at once, ~7k-token workspaces, 4 turns of 128 tokens, warmctx and llama-server at their defaults
#   PACK_LOGS           1: the logs go into logs.tgz in the results folder when the script ends
# e.g. REPLAY_SHAPES="qwen3.5-hybrid qwen3.5-plain" REPLAY_SYSTEMS=warmctx scripts/bench-h200.sh build replay floor
# Every stage writes <stage>-h200.json and a log; the build is skipped when present.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
gpu_tag="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h[0-9]{3}' | head -1 | tr 'A-Z' 'a-z' || true)"
out="${OUT:-$root/bench/results/$(date -u +%F)-${gpu_tag:-gpu}}"
mkdir -p "$out"
build="$root/build-cuda"
export WARMCTX_HOME="$root/.warmctx-home"
deadline="${WARMCTX_DEADLINE_S:-0}"
log() { echo "[$(date +%T) +${SECONDS}s] $*"; }
# PACK_LOGS=1: when the script ends (done, failed or stopped), every log under the results
# folder goes into logs.tgz there: for a runner that brings back only a few files, the
# results come back beside one archive of logs.
pack_logs() {
  [ "${PACK_LOGS:-0}" = 1 ] && [ -d "$out" ] || return 0
  (cd "$out" && find . -name '*.log' -print0 | tar czf logs.tgz --null -T - --remove-files) || true
}
trap pack_logs EXIT
trap 'exit 143' TERM INT
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build s2 trace s3)

machine() {
  {
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc)"
    nvcc --version | tail -2 || true
  } >"$out/machine.txt" 2>&1
  cat "$out/machine.txt"
}

build() {
  if [ -x "$build/warmctx" ] && [ -x "$build/warmctx-bench" ] && [ -x "$build/bin/llama-server" ] && [ -x "$build/bin/llama-bench" ]; then
    log "build: already built"; return
  fi
  if [ ! -f third_party/llama.cpp/CMakeLists.txt ]; then
    [ -f .devcarry/llama-src.tar.gz ] || { echo "no .devcarry/llama-src.tar.gz: run scripts/pack-device.sh first" >&2; exit 1; }
    mkdir -p third_party/llama.cpp
    tar -xzf .devcarry/llama-src.tar.gz -C third_party/llama.cpp
  fi
  log "build: configuring (CUDA, sm_90)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWARMCTX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DWARMCTX_BUILD_TESTS=OFF -DWARMCTX_VENDORED_DEPS=ON -DXXHASH_INCLUDE="$root/.devcarry/include" \
        -DSIMDJSON_INCLUDE="$root/.devcarry/include" -DSIMDJSON_LIBRARY="$root/.devcarry/lib/libsimdjson.so.14" \
        -DCMAKE_CXX_FLAGS="-I$root/.devcarry/include" >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
  log "build: compiling warmctx, warmctx-bench, llama-server, llama-bench"
  cmake --build "$build" -j"$(nproc)" --target warmctx warmctx-bench llama-server llama-bench >"$out/build.log" 2>&1 ||
    { grep -E "error|Error" "$out/build.log" | head -30; tail -20 "$out/build.log"; exit 1; }
  log "build: done"
}

run_bench() {  # name, args...
  run_bench_as "$1" "$@"
}

run_bench_as() {  # result name, bench name, args...
  local as="$1" name="$2"; shift 2
  if [ "$deadline" -gt 0 ] && [ "$SECONDS" -gt "$deadline" ]; then log "$as: skipped (past the ${deadline}s deadline)"; return; fi
  log "$as: warmctx-bench $name $*"
  if "$build/warmctx-bench" "$name" "$@" --json >"$out/$as-h200.json" 2>"$out/$as-h200.log"; then
    log "$as: done"; tail -3 "$out/$as-h200.log"
  else
    log "$as: FAILED"; tail -30 "$out/$as-h200.log"
  fi
}

shape_model() {  # shape -> the path of its q4_0 seed-0 model, made once
  local shape="$1" model="$WARMCTX_HOME/models/$1-q4_0-seed0.gguf" mlog="$out/make-$1.log"
  [ "$shape" = qwen2.5-0.5b ] && mlog="$out/make-0.5b.log"
  if [ ! -f "$model" ]; then
    mkdir -p "$WARMCTX_HOME/models"
    log "make-model: $shape q4_0" >&2
    "$build/warmctx" make-model --shape "$shape" --type q4_0 --seed 0 -t "$(nproc)" -o "$model" >"$mlog" 2>&1 ||
      { log "make-model: $shape FAILED" >&2; tail -20 "$mlog" >&2; return 1; }
    log "make-model: $shape done" >&2
  fi
  echo "$model"
}

gpu=(--gpu-layers -1 --flash-attn)
machine
for s in "${stages[@]}"; do
  case "$s" in
    build) build ;;
    s2)    run_bench s2 "${gpu[@]}" --sizes "${S2_SIZES:-2048,8192,32768,47000}" --warm-turns 5 ;;
    trace) run_bench trace "${gpu[@]}" --workspaces 12 --turns 60 --stable-tokens 13000 --tail-tokens 600 ${TRACE_ARGS:-} ;;
    window)  # an agent that keeps the last four messages, plain OpenAI messages, each system at its defaults
      run_bench_as window trace "${gpu[@]}" --workspaces 12 --turns 60 --stable-tokens 13000 \
        --tail-tokens "${WINDOW_TAIL:-60}" --history-window 4 --messages plain \
        --systems warmctx-defaults,llama-server-defaults ${TRACE_ARGS:-} ;;
    s3)    run_bench s3 "${gpu[@]}" --prompt-tokens 2048 --gen-tokens 128 --depth 8192 --reps 5 ;;
    contention) run_bench contention "${gpu[@]}" --cold-tokens 32000 --warm-tokens 4096 --warm-turns 5 --delay-ms 100 \
                  --scrape-ms 20 --prewarm-tokens 16000 ;;
    verify)  # exact mode on CUDA, every layer offloaded, flash attention on (the defaults of a CUDA build)
      tiny="$WARMCTX_HOME/tiny-f16-seed1.gguf"
      [ -f "$tiny" ] || "$build/warmctx" make-model --shape tiny --type f16 --seed 1 -o "$tiny" >"$out/make-tiny.log" 2>&1
      log "verify: warmctx verify --scenarios ${VERIFY_SCENARIOS:-2000} on the tiny model, CUDA"
      if "$build/warmctx" verify -m "$tiny" --gpu-layers -1 --scenarios "${VERIFY_SCENARIOS:-2000}" --json \
           >"$out/verify-h200.json" 2>"$out/verify-h200.log"; then log "verify: exit 0"; else log "verify: FAILED (exit $?)"; fi
      tail -3 "$out/verify-h200.log" ;;
    calls)  # one decode call at 16k depth by size and split, host and device apart: a small KV layout
            # beside llama-bench, the same without flash attention, and serve's layout (work + resident streams)
      model="$WARMCTX_HOME/models/qwen2.5-0.5b-q4_0-seed0.gguf"
      [ -f "$model" ] || "$build/warmctx" make-model --shape qwen2.5-0.5b --type q4_0 --seed 0 -o "$model" >"$out/make-0.5b.log" 2>&1
      sizes=(--depth 16384 --sizes 3,32,96,280,512 --splits 1,3 --reps 9)
      run_bench_as calls-small calls -m "$model" "${gpu[@]}" "${sizes[@]}"
      run_bench_as calls-small-nofa calls -m "$model" --gpu-layers -1 --no-flash-attn "${sizes[@]}" --no-llama-bench
      run_bench_as calls-serve calls -m "$model" "${gpu[@]}" "${sizes[@]}" --streams 4 --resident -1 --cells 65536 --no-llama-bench ;;
    render) run_bench render --size 47000 --turns 30 ;;  # CPU work: the host's cores
    restore) run_bench restore "${gpu[@]}" --prefix-tokens 2048,13000 ;;  # pool loads into device KV
    replay)  # recorded Claude Code requests against serve (and llama-server), each at its defaults, shape by shape
      for shape in ${REPLAY_SHAPES:-qwen2.5-0.5b}; do
        name="replay-$shape-h200"; [ "$shape" = qwen2.5-0.5b ] && name=replay-h200
        model="$(shape_model "$shape")" || { log "replay $shape: no model"; continue; }
        log "replay $shape: scripts/replay-messages.sh ${REPLAY_CAPTURE:-.devcarry/claude-capture} (${REPLAY_SYSTEMS:-warmctx llama-server})"
        if MODEL="$model" WARMCTX_BIN="$build/warmctx" LLAMA_SERVER_BIN="$build/bin/llama-server" \
             REPLAY_LOG_DIR="${REPLAY_LOG_DIR:+$REPLAY_LOG_DIR/$shape}" \
             bash scripts/replay-messages.sh "${REPLAY_CAPTURE:-$root/.devcarry/claude-capture}" \
             >"$out/$name.json" 2>"$out/$name.log"; then log "replay $shape: done"; else log "replay $shape: FAILED"; tail -20 "$out/$name.log"; fi
      done ;;
    floor)  # llama.cpp's own prefill rate on the same models: the floor serve's cold prompts are compared with
      for shape in ${FLOOR_SHAPES:-qwen3.5-hybrid qwen3.5-plain}; do
        model="$(shape_model "$shape")" || { log "floor $shape: no model"; continue; }
        log "floor $shape: llama-bench -p ${FLOOR_SIZES:-512,4096,16384} -d ${FLOOR_DEPTH:-0} -n 0 -fa 1 -ngl 99"
        if "$build/bin/llama-bench" -m "$model" -p "${FLOOR_SIZES:-512,4096,16384}" -d "${FLOOR_DEPTH:-0}" \
             -r "${FLOOR_REPS:-5}" -n 0 -fa 1 -ngl 99 -o json \
             >"$out/floor-$shape-h200.json" 2>"$out/floor-$shape-h200.log"; then
          log "floor $shape: done"; jq -r '.[] | "  pp\(.n_prompt): \(.avg_ts) tok/s"' "$out/floor-$shape-h200.json" || true
        else log "floor $shape: FAILED"; tail -20 "$out/floor-$shape-h200.log"; fi
      done ;;
    agents)  # many agents at once: a warm turn's wait while the others write (the 0.5B shape, each system at its defaults)
      for n in ${AGENTS:-8 16}; do
        run_bench_as "agents$n" agents "${gpu[@]}" --agents "$n" --turns 4 --size 7000 -n 128
      done ;;
    *) echo "unknown stage $s (build s2 trace window s3 calls contention verify render restore replay floor agents)" >&2; exit 2 ;;
  esac
done
log "all stages done; results in $out"
