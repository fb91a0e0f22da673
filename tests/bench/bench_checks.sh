#!/usr/bin/env bash
# Runs the side-by-side benchmarks small on the tiny model and checks what their JSON
# says (structure and cache behaviour; never timings, which are the benches' job).
# usage: bench_checks.sh WARMCTX_BENCH TINY_MODEL trace|trace_window|s2|s3|calls|contention|render|edits|splits|agents
set -euo pipefail
bench="$1" model="$2" which="$3"
out="$(mktemp)"; trap 'rm -f "$out"' EXIT
check() { if ! jq -e "$1" "$out" >/dev/null; then echo "FAILED: $2"; jq -c "${3:-.}" "$out" | head -c 4000; echo; exit 1; fi; echo "ok: $2"; }

# The TTFT distribution and warm turns of every system, and for the warmctx systems ($1, a
# jq array of indices) the sums of their warmctx.timings phases and the unaccounted rest.
ttft_and_phase_checks() {
  local n; n="$(jq '.trace.turns' "$out")"
  check "all(.systems[]; .ttft_max_ms >= .ttft_p95_ms and (.ttft_histogram.counts | add) == $n and (.ttft_histogram.counts | length) == (.ttft_histogram.le_ms | length))" \
        "TTFT max and histogram" '.systems[] | {name, ttft_p50_ms, ttft_p95_ms, ttft_max_ms, ttft_histogram}'
  check "all(.systems[]; .warm_turns >= 0 and .warm_turns <= $n and ([.per_turn.prompt_tokens, .per_turn.cached_tokens] | transpose | map(select(.[0] - .[1] <= 300)) | length) == .warm_turns and (.warm_turns == 0 or (.warm_ttft_p95_ms >= .warm_ttft_p50_ms and .warm_ttft_max_ms >= .warm_ttft_p95_ms)))" \
        "warm turns (<= 300 tokens prefilled): their count and TTFT p50/p95" '.systems[] | {name, warm_turns, warm_ttft_p50_ms, warm_ttft_p95_ms}'
  check "all(.systems[$1[]]; .phases.turns == $n and (.phases.sum_ms | has(\"assemble_ms\") and has(\"prefill_ms\")) and all(.phases.sum_ms[]; type == \"number\") and ((.phases.sum_ms | add) - .phases.total_ms | fabs) < 0.001)" \
        "warmctx systems: the sum of every warmctx.timings phase" ".systems[$1[]] | {name, phases}"
  check "all(.systems[$1[]]; (.per_turn.unaccounted_ms | length) == $n and ((.per_turn.ttft_ms | add) - .phases.total_ms - .unaccounted.sum_ms | fabs) < 0.01 and .unaccounted.max_ms >= .unaccounted.p95_ms and .unaccounted.p95_ms >= .unaccounted.p50_ms and .unaccounted.p50_ms >= .unaccounted.min_ms)" \
        "warmctx systems: TTFT - phases, unaccounted, per turn and summed" ".systems[$1[]] | {name, phases, unaccounted}"
}

case "$which" in
trace)
  "$bench" trace --quick -m "$model" -t 1 --json >"$out"
  check '[.systems[].name] == ["warmctx-semantic","warmctx-lru","llama-server","warmctx-defaults","llama-server-defaults"]' "one entry per system, in order"
  check 'all(.systems[]; .prefilled_tokens > 0 and .cached_ratio > 0 and .cached_ratio < 1 and .ttft_p50_ms > 0 and .ttft_p95_ms >= .ttft_p50_ms and .wall_ms > 0)' \
        "each system reports prefilled tokens, cached ratio, TTFT p50/p95 and wall time" '.systems[] | del(.per_turn)'
  check '([.systems[].prompt_tokens] | unique | length) == 1 and .systems[0].prompt_tokens == .trace.prompt_tokens_total' \
        "every system was sent the same prompt tokens" '[.systems[].prompt_tokens, .trace.prompt_tokens_total]'
  check 'all(.systems[]; (.per_turn.ttft_ms | length) == 24)' "per-turn series for the charts"
  check '.systems[0].prefilled_tokens <= .systems[1].prefilled_tokens' "semantic eviction prefills no more than LRU" '[.systems[] | {name, prefilled_tokens}]'
  check '.ratios.semantic_over_lru_prefilled > 0 and .ratios.semantic_over_llama_server_ttft_p50 > 0' "target ratios reported" '.ratios'
  check '.budget.bytes > 0 and .systems[0].config.budget_bytes == .budget.bytes and .systems[1].config.budget_bytes == .budget.bytes' \
        "both warmctx systems run under the KV budget" '[.budget, .systems[].config]'
  check '.budget as $b | all(.systems[0,1]; .config.kv_allocated_bytes_bound == $b.warmctx_allocated_bytes and .end_state.kv_allocated_bytes <= $b.allocated_bytes + 65536 * .end_state.pool_entries and .end_state.streams_allocated_bytes == $b.stream_bytes)' \
        "warmctx allocates one stream and a pool within the same bytes" '[.budget, (.systems[0,1] | .config, .end_state)]'
  check '.systems[2].config.cache_ram_mib == .budget.llama_server_cache_ram_mib and .budget.llama_server_allocated_bytes <= .budget.allocated_bytes and .budget.llama_server_allocated_bytes > .budget.allocated_bytes - 1048576' \
        "llama-server: its slot plus --cache-ram allocate the same bytes" '[.budget, .systems[2].config]'
  check '.systems[2].config.kv_allocated_bytes_bound == .budget.llama_server_allocated_bytes' \
        "llama-server reports the allocation the budget gave it" '[.budget, .systems[2].config]'
  check '(.systems[4].config.command | test(" -c | --cache-ram | -np ") | not) and .systems[3].end_state.kv_allocated_bytes > 0' \
        "each system also at its own defaults" '[.systems[3,4].config, .systems[3].end_state]'
  check '.trace.history_window == 0 and .trace.messages == "segments" and all(.trace.history_messages_of_turn[]; . == 0)' \
        "no history window by default" '.trace | del(.workspace_of_turn)'
  ttft_and_phase_checks '[0,1,3]'
  ;;
trace_window)
  # The sliding window, sent as plain chat messages (no workspace, no segments).
  "$bench" trace --quick -m "$model" -t 1 --history-window 4 --messages plain \
    --systems warmctx-defaults,llama-server-defaults --json >"$out"
  check '[.systems[].name] == ["warmctx-defaults","llama-server-defaults"]' "one entry per system, in order"
  check '.trace.history_window == 4 and .trace.messages == "plain" and .trace.history_messages_of_turn[0] == 0 and all(.trace.history_messages_of_turn[]; . <= 4) and (.trace.history_messages_of_turn | max) == 4' \
        "each turn carries at most the last 4 history messages, and some carry 4" '.trace | del(.workspace_of_turn)'
  check '([.systems[].prompt_tokens] | unique | length) == 1 and .systems[0].prompt_tokens == .trace.prompt_tokens_total and all(.systems[]; .prompt_token_mismatches == 0)' \
        "both systems were sent the prompt warmctx assembles from the messages, turn by turn" '[.systems[] | {name, prompt_tokens, prompt_token_mismatches}, .trace.prompt_tokens_total]'
  ttft_and_phase_checks '[0]'
  check '(.systems[1] | has("phases") | not) and (.systems[1] | has("unaccounted") | not)' "llama-server has no warmctx timings" '.systems[1] | del(.per_turn)'
  ;;
edits)
  "$bench" edits -m "$model" -t 1 --files 4 --file-tokens 200 --map-tokens 400 --turns 14 --json >"$out"
  check '[.systems[].name] == ["warmctx","warmctx-fixed","llama-server"] and all(.systems[]; .edited_turns == 13 and (.per_turn.prefilled_tokens | length) == 14)' \
        "one entry per system, every turn" '.systems[] | del(.per_turn)'
  check '(.workload.edited_segment_of_turn[0] == "") and all(.workload.edited_segment_of_turn[1:][]; . != "")' "every turn after the first edits a segment" '.workload'
  check '([.systems[].cold_prefilled_tokens] | unique | length) == 1' "every system prefilled the same cold prompt" '[.systems[] | {name, cold_prefilled_tokens}]'
  check '.systems[0].edited_prefilled_tokens_total <= .systems[1].edited_prefilled_tokens_total' \
        "the learned order and finer blocks prefill no more than the fixed order" '[.systems[] | {name, edited_prefilled_tokens_total}]'
  check '.ratios.warmctx_over_llama_server_prefilled_total > 0 and .ratios.warmctx_over_fixed_prefilled_total > 0' "ratios reported" '.ratios'  # Real files: the pinned files come from this repository's sources, each edit's place is
  # reported, and a directory without enough source files is refused (exit 2).
  src="$(cd "$(dirname "$0")/../.." && pwd)/src"
  "$bench" edits -m "$model" -t 1 --files 3 --file-tokens 150 --map-tokens 200 --turns 5 --systems warmctx --files-from "$src" --json >"$out"
  check '.workload.files_from != "" and (.systems[0].per_turn.prefilled_tokens | length) == 5 and all(.workload.edited_line_at_fraction_of_turn[]; . >= 0 and . < 1) and all(.workload.edited_segment_bytes_of_turn[1:][]; . > 0)' \
        "--files-from: real files, each edit's place" '.workload'
  empty="$(mktemp -d)"
  set +e; err="$("$bench" edits -m "$model" -t 1 --files-from "$empty" --systems warmctx 2>&1)"; rc=$?; set -e
  rmdir "$empty"
  if [ "$rc" != 2 ] || ! grep -q "^error: --files-from" <<<"$err"; then echo "FAILED: --files-from an empty directory: exit $rc: $err"; exit 1; fi
  echo "ok: --files-from an empty directory refused (exit 2)"
  ;;
s2)
  "$bench" s2 -m "$model" -t 1 --sizes 600,1200 --warm-turns 2 --json >"$out"
  check '(.rows | length) == 2 and all(.rows[]; .prompt_tokens > 600)' "one row per size"
  check 'all(.rows[]; .warmctx.cold_cached_tokens == 0 and .warmctx.warm_cached_tokens > 0.5 * .prompt_tokens)' \
        "warmctx: the cold turn reuses nothing, the warm turn most of the prompt" '.rows'
  check 'all(.rows[]; .["llama-server"].warm_cached_tokens > 0.5 * .prompt_tokens)' "llama-server: its prompt cache reuses the prefix" '.rows'
  check 'all(.rows[]; .warmctx.cold_prompt_tokens == .prompt_tokens and .["llama-server"].cold_prompt_tokens == .prompt_tokens)' \
        "both systems prefill the same prompt" '.rows'
  check 'all(.rows[]; .llama_bench.pp_tps > 0 and .warmctx.cold_over_llama_bench > 0)' "llama-bench reference" '.rows'
  check 'all(.rows[]; .kv_allocated_bytes_bound.warmctx > 0 and .kv_allocated_bytes_bound["llama-server"] > 0)' \
        "each system's allocated KV is reported" '[.rows[].kv_allocated_bytes_bound]'
  ;;
s3)
  export WARMCTX_HOME="$(mktemp -d)"; trap 'rm -rf "$out" "$WARMCTX_HOME"' EXIT
  "$bench" s3 --shapes tiny -t 1 --type f16 --prompt-tokens 128 --gen-tokens 8 --depth 512 --reps 1 --json >"$out"
  check '(.rows | length) == 1 and .rows[0].shape == "tiny"' "one row per shape"
  check '.rows[0].warmctx.cold_pp_tps > 0 and .rows[0].warmctx.warm_pp_tps > 0 and .rows[0].warmctx.tg_tps > 0' "warmctx rates" '.rows[0]'
  check '.rows[0].llama_bench.cold_pp_tps > 0 and .rows[0].llama_bench.warm_pp_tps > 0 and .rows[0].llama_bench.tg_tps > 0' "llama-bench rates" '.rows[0]'
  check 'all(.rows[0].ratio[]; . > 0)' "ratios" '.rows[0].ratio'
  check '.rows[0].warmctx.kv_allocated_bytes > 0 and .rows[0].llama_bench.kv_allocated_bytes.warm_pp > .rows[0].llama_bench.kv_allocated_bytes.cold_pp' \
        "each system's allocated KV is reported" '[.rows[0].warmctx.kv_allocated_bytes, .rows[0].llama_bench.kv_allocated_bytes]'
  ;;
contention)
  "$bench" contention -m "$model" -t 1 --cold-tokens 4000 --warm-tokens 400 --warm-turns 2 --delay-ms 200 --scrape-ms 20 \
    --prewarm-tokens 2000 --json >"$out"
  check '[.rows[].system] == ["warmctx","llama-server"]' "one row per system, in order"
  check 'all(.rows[]; .solo_warm_ttft_ms > 0 and .cold_ttft_ms > 0 and .one_chunk_ms > 0 and .cold_prompt_tokens >= 3500)' \
        "solo warm TTFT, the cold prompt and one chunk's time" '.rows[] | del(.config)'
  check 'all(.rows[]; .scrapes_during_cold > 0 and .scrapes_failed == 0 and .scrape_ms_p99 >= .scrape_ms_p50)' \
        "scrapes during the cold prefill, all answered" '.rows[] | {system, scrapes_during_cold, scrapes_failed, scrape_ms_p50, scrape_ms_p99}'
  check 'all(.rows[]; (.warm_turns_during_cold == 0) or (.warm_ttft_during_cold_ms > 0 and .target_ms > .solo_warm_ttft_ms))' \
        "warm turns during the cold prefill, when there were any, with their target" '.rows[] | del(.config)'
  check '.prewarm.chat_after_prewarm_target_met and .prewarm.chat_after_prewarm.prewarm.complete' \
        "a chat after the pre-warm reuses >= 95% and says it was served from it" '.prewarm.chat_after_prewarm'
  check '.prewarm.chat_during_prewarm.ok and .prewarm.chat_during_prewarm.tokens_reused > 0' \
        "a chat during a pre-warm reuses what it has done" '.prewarm.chat_during_prewarm'
  check '.prewarm.chat_after_restart_target_met' \
        "after a restart the first chat, with no PUT, is served from the disk tier" '.prewarm.chat_after_restart'
  ;;
calls)
  # Two sizes, two splits, in a layout of more and larger streams than the prefix needs.
  "$bench" calls -m "$model" -t 1 --depth 512 --sizes 3,40 --splits 1,2 --reps 2 --streams 3 --cells 2048 --json >"$out"
  check '.depth == 512 and .warmctx_layout.streams == 3 and .warmctx_layout.cells_per_stream == 2048 and (.warmctx_layout.usable_cells_per_stream == 2048 or (.warmctx_layout.pads_small_batches and .warmctx_layout.usable_cells_per_stream == 1984)) and .warmctx_layout.kv_allocated_bytes > 0' \
        "the layout it was asked for" '.warmctx_layout'
  check '[.rows[].tokens] == [3,40] and all(.rows[]; ([.warmctx[].calls] == [1,2]) and .llama_bench_ms > 0 and .llama_bench_kv_allocated_bytes > 0)' \
        "a row per size, a result per split, and llama-bench beside it (with its allocated KV)" '.rows'
  check 'all(.rows[].warmctx[]; .total_ms > 0 and .host_ms > 0 and .host_ms <= .total_ms and (.per_call_ms * .calls - .total_ms | fabs) < 1e-9)' \
        "host share within each total" '.rows'
  # Bad input: a clear error and exit 2, never a crash.
  for bad in "--sizes 0" "--sizes 600" "--depth 100" "--splits 0" "--cells 100 --depth 512 --sizes 40"; do
    set +e; err="$("$bench" calls -m "$model" -t 1 --no-llama-bench $bad 2>&1)"; rc=$?; set -e
    if [ "$rc" != 2 ] || ! grep -q "^error: " <<<"$err"; then echo "FAILED: calls $bad: exit $rc: $err"; exit 1; fi
    echo "ok: calls $bad refused (exit 2)"
  done
  ;;
render)
  "$bench" render -m "$model" -t 1 --size 4000 --turns 5 --json >"$out"
  check '.jinja.prompt_tokens > 4000 and .builtin.prompt_tokens > 4000 and .jinja.cold_ms > 0' \
        "both modes assembled the agent turn" '{jinja: .jinja.prompt_tokens, builtin: .builtin.prompt_tokens}'
  check '(.jinja.warm_ms_all | length) == 5 and .jinja.warm_ms_median > 0 and .builtin.warm_ms_median > 0 and (.warm_overhead_ms | type) == "number"' \
        "warm assembly timed in both modes, and the overhead reported" '{jinja, builtin, warm_overhead_ms} | del(.jinja.warm_ms_all, .builtin.warm_ms_all)'
  check '.parse.format != null and .parse.answer_tokens > 5 and .parse.whole_ms_median > 0 and .parse.streamed_total_ms_median >= .parse.whole_ms_median' \
        "a tool call parsed whole and as a stream" '.parse'
  ;;
splits)
  # Three splits of the same 512 tokens; the first is the reference.
  "$bench" splits -m "$model" -t 1 --plans 256+256,128+128+256,200+300+12 --json >"$out"
  check '.tokens == 512 and [.rows[].plan] == ["256+256","128+128+256","200+300+12"] and [.rows[].smallest_call] == [256,128,12]' \
        "a row per plan, in order, with its smallest call" '.rows'
  check '.rows[0].bit_identical and .rows[0].max_logit_diff == 0 and all(.rows[]; (.max_logit_diff | type) == "number" and .max_logit_diff >= 0 and (.bit_identical == (.max_logit_diff == 0)) and .padded_calls >= 0)' \
        "each plan against the reference: its largest logit difference, the same bits where it is 0" '.rows'
  # On this CPU with flash attention the engine measured free splits: every plan, the one
  # with a call of 12 rows (padded) among them, gives the same bits, each call its own.
  check '.splits_freely and all(.rows[]; .bit_identical) and [.rows[].padded_calls] == [0,0,1]' \
        "free splits: the same bits whatever the calls" '{splits_freely, rows}'
  # Bad input: a clear error and exit 2, never a crash.
  for bad in "--plans 256+256,100" "--plans 256+x" "--plans 512" "--plans 600+10,610"; do
    set +e; err="$("$bench" splits -m "$model" -t 1 $bad 2>&1)"; rc=$?; set -e
    if [ "$rc" != 2 ] || ! grep -q "^error: " <<<"$err"; then echo "FAILED: splits $bad: exit $rc: $err"; exit 1; fi
  done
  echo "ok: bad plans are refused"
  ;;
agents)
  # Three agents at once, two turns each: every turn answered, each system's warm turns
  # (the second) counted, warmctx's reusing its workspace.
  "$bench" agents -m "$model" -t 1 --agents 3 --turns 2 --size 300 -n 8 --json >"$out"
  check '(.systems | keys) == ["llama-server","warmctx"]' "both systems"
  check 'all(.systems[]; .failed == 0 and (.turns | length) == 6 and all(.turns[]; .ok and .completion_tokens > 0))' \
        "every agent's every turn answered" '.systems[] | {failed, turns: [.turns[] | {agent, turn, ok, error}]}'
  check 'all(.systems[]; .tokens_per_s > 0 and .wall_s > 0 and .warm_turn_ttft_ms.p95 >= .warm_turn_ttft_ms.p50 and .warm_turn_ttft_ms.max >= .warm_turn_ttft_ms.p95)' \
        "tokens/s and warm-turn TTFT p50 <= p95 <= max" '.systems[] | del(.turns)'
  check 'all(.systems.warmctx.turns[] | select(.turn == 1); .cached_tokens > 0 and .timings.queue_ms >= 0)' \
        "warmctx's second turns reuse their workspace and say where their time went" '[.systems.warmctx.turns[] | {agent, turn, cached_tokens, timings}]'
  check '.warmctx_vs_llama_server.tokens_per_s > 0 and .warmctx_vs_llama_server.warm_turn_ttft_p95 > 0' "ratios reported" '.warmctx_vs_llama_server'
  ;;
*) echo "unknown check $which"; exit 2 ;;
esac
echo "bench checks passed: $which"
