#!/usr/bin/env bash
# The models that are not plain attention on a GPU (docs/benchmarks.md, "Models that are
# not plain attention"): after `scripts/bench-h200.sh build`, generates the Qwen3.5 hybrid
# shape (real dimensions, q4_0) and the tiny test shapes, then runs a stage:
#   traces  the 12-workspace trace with ~13k-token workspaces and a window of 4 messages,
#           on each of TRACE_SHAPES (default: the hybrid shape and qwen3.5-plain, its
#           dimensions with every layer full attention; "default" is the qwen2.5-0.5b
#           shape), warmctx and llama-server each at its defaults; TRACE_SYSTEMS and
#           TRACE_BUDGET_MIB (warmctx-bench trace's --systems and --budget-mib) for an
#           equal-memory run, TRACE_TAG names its files
#   verify  warm against cold on CUDA for each of VERIFY_KINDS (VERIFY_SCENARIOS each, default 300), all
#           at once: tiny-hybrid, tiny-swa, tiny-moe, tiny-plain and tiny-plain with q8_0 KV ("tiny-plain:q8_0");
#           VERIFY_SECONDS: start no scenario after this long (each report says how many ran);
#           VERIFY_SHARDS: processes per kind (seeds BASE+1..BASE+N), VERIFY_THREADS: CPU threads each (3),
#           VERIFY_SEED_BASE: BASE (default 0; a second call with BASE=N runs other scenarios than the first);
#           VERIFY_MPS=1: the processes share the GPU through CUDA MPS (nvidia-cuda-mps-control, started
#           here and stopped when the stage ends) instead of time-slicing it: ~7x the scenarios a second on
#           an H100 (bench/results/2026-12-07-h100/memory-kinds-verify-2/); without it they are GPU-bound
# usage: bench/gpu-memory-kinds.sh STAGE...     results: $OUT (default bench/results/<YYYY-MM-DD>-<gpu>/memory-kinds,
#        the day and the GPU's model as nvidia-smi names it, h100 or h200); PACK_LOGS=1 puts the logs into
#        logs.tgz there when it ends
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
gpu_tag="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h[0-9]{3}' | head -1 | tr 'A-Z' 'a-z' || true)"
out="${OUT:-$root/bench/results/$(date -u +%F)-${gpu_tag:-gpu}/memory-kinds}"
# PACK_LOGS=1: when the script ends (done, failed or stopped), every log under the results
# folder goes into logs.tgz there: for a runner that brings back only a few files, the
# results come back beside one archive of logs.
pack_logs() {
  [ "${PACK_LOGS:-0}" = 1 ] && [ -d "$out" ] || return 0
  (cd "$out" && find . -name '*.log' -print0 | tar czf logs.tgz --null -T - --remove-files) || true
}
trap pack_logs EXIT
trap 'exit 143' TERM INT
mkdir -p "$out"
build="$root/build-cuda"
models="${WARMCTX_MODELS:-/tmp/warmctx-models}"
export WARMCTX_HOME="$root/.warmctx-home"
mkdir -p "$models"
log() { echo "[$(date +%T) +${SECONDS}s] $*"; }
gpu=(--gpu-layers -1 --flash-attn)

model() {  # shape type -> path (made once)
  local m="$models/$1-$2.gguf"
  [ -f "$m" ] || "$build/warmctx" make-model --shape "$1" --type "$2" --seed 0 -t "$(nproc)" -o "$m" >"$out/make-$1.log" 2>&1
  echo "$m"
}

for stage in "$@"; do
  case "$stage" in
    models)
      log "models"; model qwen3.5-hybrid q4_0 >/dev/null; model qwen3.5-plain q4_0 >/dev/null
      model tiny-hybrid q8_0 >/dev/null; model tiny-swa q8_0 >/dev/null
      "$build/warmctx" info -m "$(model qwen3.5-hybrid q4_0)" "${gpu[@]}" -c 16384 --json >"$out/info-qwen3.5-hybrid.json" 2>&1 || true
      log "models done" ;;
    traces)
      for shape in ${TRACE_SHAPES:-qwen3.5-hybrid qwen3.5-plain}; do
        m=default; [ "$shape" = default ] || m="$(model "$shape" q4_0)"
        name="$(basename "${m%.gguf}")"; margs=(); [ "$m" = default ] || margs=(-m "$m")
        log "trace $name"
        "$build/warmctx-bench" trace "${margs[@]}" "${gpu[@]}" --workspaces 12 --turns 60 --stable-tokens 13000 \
          --tail-tokens 600 --history-window 4 --messages plain --systems "${TRACE_SYSTEMS:-warmctx-defaults,llama-server-defaults}" \
          ${TRACE_BUDGET_MIB:+--budget-mib "$TRACE_BUDGET_MIB"} --llama-server "$build/bin/llama-server" --json \
          >"$out/trace-window4-13k-$name${TRACE_TAG:+-$TRACE_TAG}.json" 2>"$out/trace-$name${TRACE_TAG:+-$TRACE_TAG}.log" ||
          { tail -5 "$out/trace-$name${TRACE_TAG:+-$TRACE_TAG}.log"; }
      done ;;
    verify)
      # VERIFY_SHARDS=N runs each kind as N processes with seeds BASE+1..BASE+N (VERIFY_SCENARIOS
      # split between them; BASE is VERIFY_SEED_BASE, 0 by default). On an H100 with 16 cores this did
      # not speed a kind up: tiny-hybrid ran 0.31-0.33 scenarios a second as 4 processes of 1 thread,
      # 0.34 as one of 3 threads (bench/results/2026-12-07-h100/); 1.5-1.7 a second over the 5 kinds.
      mps=0
      if [ "${VERIFY_MPS:-0}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
        mps=1; log "verify: CUDA MPS started"
      fi
      pids=(); shards="${VERIFY_SHARDS:-1}"; per=$(( (${VERIFY_SCENARIOS:-300} + shards - 1) / shards ))
      base="${VERIFY_SEED_BASE:-0}"
      for k in ${VERIFY_KINDS:-tiny-hybrid tiny-swa tiny-moe tiny-plain tiny-plain:q8_0}; do
        s="${k%%:*}"; kv=(); name="$s"
        [ "$k" = "$s" ] || { kv=(--kv-type "${k#*:}"); name="$s-kv-${k#*:}"; }
        m="$(model "$s" q8_0)"
        for i in $(seq $((base + 1)) $((base + shards))); do
          sfx=""; [ "$shards" = 1 ] && [ "$base" = 0 ] || sfx="-s$i"
          log "verify $name$sfx"
          { "$build/warmctx" verify -m "$m" "${gpu[@]}" "${kv[@]}" -t "${VERIFY_THREADS:-3}" --scenarios "$per" \
              --seed "$i" --seconds "${VERIFY_SECONDS:-0}" --json \
              >"$out/verify-$name-cuda$sfx.json" 2>"$out/verify-$name$sfx.log" || tail -3 "$out/verify-$name$sfx.log"
            log "verify $name$sfx done"; } &
          pids+=($!)
        done
      done
      wait "${pids[@]}"
      [ "$mps" = 1 ] && { echo quit | nvidia-cuda-mps-control || true; log "verify: CUDA MPS stopped"; } ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
log "done"
