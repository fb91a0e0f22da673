#!/usr/bin/env bash
# Runs the CPU results again (one at a time: the runs are timed) into a folder of the day,
# bench/results/<YYYY-MM-DD>-cpu<cores>/ (bench/results/README.md lists the folders), or $OUT.
# usage: bench/run-cpu.sh [BUILD_DIR] [all|side-by-side]     (default: build all)
#   side-by-side: only the runs against llama-server / llama-bench (s2, trace, s3)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
b="${1:-$root/build}"
w="$b/warmctx"
wb="$b/warmctx-bench"
out="${OUT:-$root/bench/results/$(date -u +%F)-cpu$(nproc)}"
tiny="$b/test-models/tiny-f16-seed1.gguf"
which="${2:-all}"
mkdir -p "$out"
[ -f "$tiny" ] || "$w" make-model --shape tiny --type f16 --seed 1 -o "$tiny"

side_by_side() {
  # S2: cold and warm time to first token, warmctx next to llama-server (same build).
  "$wb" s2 --sizes 2048,8192 --warm-turns 3 --json > "$out/s2-qwen2.5-0.5b-q4_0-cpu2.json"
  # The multi-workspace agent trace under one KV budget: the default trace on the tiny
  # model, a smaller one on the default model.
  "$wb" trace -m "$tiny" --json > "$out/trace-tiny-f16-cpu2.json"
  "$wb" trace --workspaces 4 --turns 30 --stable-tokens 2048 --tail-tokens 300 --json \
    > "$out/trace-qwen2.5-0.5b-q4_0-cpu2.json"
  # The H200's trace on the tiny model (the cache's choices depend only on token counts):
  # the same budget in tokens (52,480 x 256 bytes), and the unlimited-budget floor.
  local big=(--flash-attn --workspaces 8 --turns 100 --stable-tokens 16384 --tail-tokens 600)
  "$wb" trace -m "$tiny" "${big[@]}" --budget-mib 12.8125 --systems warmctx-semantic,warmctx-lru --json \
    > "$out/trace-8ws-tiny-f16-cpu2.json"
  "$wb" trace -m "$tiny" "${big[@]}" --budget-mib 10000 --systems warmctx-semantic --json \
    > "$out/trace-8ws-unlimited-tiny-f16-cpu2.json"
  # S3: prefill (cold, warm) and decode per shape against llama-bench.
  "$wb" s3 --depth 1024 --reps 2 --json > "$out/s3-cpu2.json"
}
if [ "$which" = side-by-side ]; then side_by_side; exit 0; fi

# Engine adapter against llama-bench, same build and settings.
"$wb" engine -m "$tiny" --prompt-tokens 512 --gen-tokens 64 --reps 5 --json > "$out/engine-tiny-f16-cpu2.json"
"$wb" engine --prompt-tokens 512 --gen-tokens 32 --reps 3 --json > "$out/engine-qwen2.5-0.5b-q4_0-cpu2.json"

# The seed's S2 / S2.5 on the default model.
"$w" demo --prefix-tokens 2048 > "$out/demo-2k-qwen2.5-0.5b-q4_0-cpu2.txt"
"$w" demo --prefix-tokens 2048 --json > "$out/demo-2k-qwen2.5-0.5b-q4_0-cpu2.json"
"$w" demo --prefix-tokens 8192 --json > "$out/demo-8k-qwen2.5-0.5b-q4_0-cpu2.json"

# Warm-turn overhead: the tail after a reused prefix vs the same tail in a fresh sequence.
"$wb" warm-overhead --prefix-tokens 2048 --reps 5 --json > "$out/warm-overhead-2k-qwen2.5-0.5b-q4_0-cpu2.json"

# The correctness gate.
"$w" verify -m "$tiny" --scenarios 50 --json > "$out/verify-exact-tiny-50.json"
"$w" verify -m "$tiny" --scenarios 10 --kv-mode shared --json > "$out/verify-shared-tiny-10.json"
"$w" verify --scenarios 5 --stable-tokens 600 --json > "$out/verify-exact-qwen2.5-0.5b-q4_0-5.json"
"$w" verify --scenarios 1 --stable-tokens 600 --kv-mode shared --json > "$out/verify-shared-qwen2.5-0.5b-q4_0-1.json"

# Tiers: cold prefill vs restore from disk / host RAM, and the first turn after a restart.
"$wb" restore --prefix-tokens 2048,8192 --json > "$out/restore-qwen2.5-0.5b-q4_0-cpu2.json"
"$wb" restore --prefix-tokens 32768 --json > "$out/restore-32k-qwen2.5-0.5b-q4_0-cpu2.json"   # ~30 min

# The server: overhead per request and throughput with 1, 4 and 16 clients.
"$wb" http -m "$tiny" --requests 8 --json > "$out/http-tiny-f16-cpu2.json"

# The soak: 64 clients for 10 minutes, a realistic request mix; no 5xx, flat RSS
# (docs/hardening.md). One llama.cpp thread: on a shared 2-core machine two threads
# wait on each other at every barrier.
"$wb" soak -m "$tiny" -t 1 --clients 64 --duration-s 600 --json > "$out/soak-tiny-f16-cpu2.json"

side_by_side
