#!/usr/bin/env bash
# Runs `warmctx demo --json` on the tiny model and checks what it shows: the warm turn
# reuses the whole stable prefix and prefills less than the cold one; the edited turn
# (one line of the repository map changed) reuses up to the repository map, and its
# explain names that segment.
# usage: demo_checks.sh WARMCTX TINY_MODEL
set -euo pipefail
warmctx="$1" model="$2"
out="$(mktemp)"; trap 'rm -f "$out"' EXIT
check() { if ! jq -e "$1" "$out" >/dev/null; then echo "FAILED: $2"; jq -c "${3:-.}" "$out" | head -c 4000; echo; exit 1; fi; echo "ok: $2"; }

"$warmctx" demo -m "$model" --prefix-tokens 1500 -t 1 --json >"$out"
rows='[.rows[] | del(.explain.segments)]'
check '[.rows[].turn] == ["cold","warm","edited","edited-2","edited-3"]' "five turns: cold, warm, three edits" "$rows"
check 'all(.rows[]; .prompt_tokens > 600 and .tokens_reused + .tokens_prefilled == .prompt_tokens and .explain.tokens_reused == .tokens_reused)' \
      "each turn's reused and prefilled tokens add up to its prompt" "$rows"
check '.rows[0].tokens_reused == 0 and .rows[0].explain.result == "cold"' "the cold turn reuses nothing" '.rows[0] | del(.explain.segments)'
check '.rows[1].tokens_reused > 0 and .rows[1].tokens_prefilled < .rows[0].tokens_prefilled and .rows[1].explain.result == "full_hit" and .rows[1].explain.tier == "engine"' \
      "the warm turn reuses the prefix from the engine and prefills fewer tokens than the cold one" "$rows"
check '.rows[1].stable_prefix_hash == .rows[0].stable_prefix_hash and all(.rows[1].explain.segments[] | select(.id != "question"); .tokens_prefilled == 0)' \
      "the warm turn has the cold turn's stable prefix and reuses every stable segment whole" '.rows[1]'
check '.rows[2].explain.result == "segment_changed" and .rows[2].explain.missed_segment == "repo-map" and (.rows[2].explain.changed_segments | index("segment '"'"'repo-map'"'"' changed (content)") != null) and (.rows[2].explain.reason | contains("repo-map"))' \
      "the edited turn's explain names the repository map as the changed segment" '.rows[2].explain | del(.segments)'
check '.rows[2].stable_prefix_hash != .rows[0].stable_prefix_hash' "the edit changes the stable prefix hash" "$rows"
check '(.rows[2].explain.segments[] | select(.id == "repo-map")) as $m | .rows[2].tokens_reused >= $m.token_begin and .rows[2].tokens_reused < .rows[1].tokens_reused and $m.tokens_prefilled > 0 and all(.rows[2].explain.segments[] | select(.token_end <= $m.token_begin); .tokens_prefilled == 0)' \
      "the edited turn reuses every segment before the repository map and prefills from there" '.rows[2]'
# The learned order: the second edit of the map moves it after the pinned files (and
# explain says so); the third re-prefills only the map from its edited line on.
check '.rows[3].explain.reordered and (.rows[3].explain.order_note | contains("repo-map")) and (.rows[3].explain.reason | contains("stable order changed"))' \
      "the second edit moves the repository map after the files, and explain says why" '.rows[3].explain | del(.segments)'
check '(.rows[4].explain.segments | map(select(.class == "high")) | last | .id) == "repo-map" and (.rows[4].explain.reordered | not)' \
      "the third edit finds the map last among the stable segments of its class" '.rows[4].explain.segments'
check '(.rows[4].explain.segments[] | select(.id == "repo-map")) as $m | .rows[4].tokens_reused > $m.token_begin and all(.rows[4].explain.segments[] | select(.id != "repo-map" and .id != "question"); .tokens_prefilled == 0)' \
      "the third edit keeps the map's unchanged head and every other stable segment" '.rows[4] | del(.explain.segments)'
echo "demo checks passed"
