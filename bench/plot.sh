#!/usr/bin/env bash
# Draws one PNG chart per benchmark result (gnuplot, jq; both Debian packages) into
# docs/img/. Reads the JSON that `warmctx-bench s2|trace|s3|soak --json` writes.
# usage: bench/plot.sh [RESULTS_DIR] [IMG_DIR]   (default: bench/results docs/img)
# RESULTS_DIR's JSON files and those one folder down (bench/results/<date>-<machine>/) are read.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
res="${1:-$root/bench/results}"
img="${2:-$root/docs/img}"
command -v gnuplot >/dev/null || { echo "plot: gnuplot is not installed (apt-get install gnuplot-nox)" >&2; exit 1; }
command -v jq >/dev/null || { echo "plot: jq is not installed (apt-get install jq)" >&2; exit 1; }
mkdir -p "$img"
shopt -s nullglob
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
term='set terminal pngcairo size 960,540 font "DejaVu Sans,11" noenhanced; set grid ytics; set key top left'

# Earlier runs kept for reference (NAME-run1, NAME-before-..., NAME-classfirst) and
# unlimited-budget floors are not drawn.
earlier() { case "$(basename "$1")" in *-run[0-9]*|*-before-*|*-classfirst*|*-unlimited*) return 0;; *) return 1;; esac; }

where_of() {  # the machine a result file is from, for titles
  case "$1" in *h200*) echo "one H200";; *cpu2*) echo "2-core CPU";; *) echo "";; esac
}

# S2: cold and warm time to first token per prompt size, per system (log scale).
for f in "$res"/s2-*.json "$res"/*/s2-*.json; do
  earlier "$f" && continue
  [ -s "$f" ] && jq -e ".rows // .systems" "$f" >/dev/null 2>&1 || { echo "plot: skipping $f (not a finished result)"; continue; }
  name="$(basename "$f" .json)"
  jq -r '.rows[] | [(.prompt_tokens|tostring),
        .warmctx.cold_ttft_ms, ."llama-server".cold_ttft_ms, .warmctx.warm_ttft_ms, ."llama-server".warm_ttft_ms,
        (.llama_bench.prefill_ms // 0)] | @tsv' "$f" >"$tmp/s2.tsv"
  gnuplot <<GP
$term
set output "$img/$name.png"
set title "S2: time to first token, cold and warm ($(where_of "$f"), $(jq -r .model_desc "$f"))"
set style data histograms; set style histogram clustered gap 1; set style fill solid 0.85 border -1
set logscale y; set ylabel "ms at the client (log scale)"; set xlabel "prompt tokens"
set yrange [1:*]
plot "$tmp/s2.tsv" using 2:xtic(1) title "warmctx cold" lc rgb "#1f77b4", \
     '' using 3 title "llama-server cold" lc rgb "#ff7f0e", \
     '' using 6 title "llama-bench prefill" lc rgb "#7f7f7f", \
     '' using 4 title "warmctx warm" lc rgb "#aec7e8", \
     '' using 5 title "llama-server warm" lc rgb "#ffbb78"
GP
  echo "plot: $img/$name.png"
done

# Trace: time to first token per turn per system, and prefilled tokens per system.
for f in "$res"/trace-*.json "$res"/*/trace-*.json; do
  earlier "$f" && continue
  [ -s "$f" ] && jq -e ".rows // .systems" "$f" >/dev/null 2>&1 || { echo "plot: skipping $f (not a finished result)"; continue; }
  name="$(basename "$f" .json)"
  n=$(jq '.systems | length' "$f")
  plots=""
  colors=("#1f77b4" "#2ca02c" "#ff7f0e")
  for ((i = 0; i < n; i++)); do
    jq -r ".systems[$i].per_turn.ttft_ms | to_entries[] | [.key, .value] | @tsv" "$f" >"$tmp/t$i.tsv"
    sys="$(jq -r ".systems[$i].name" "$f")"
    plots+="${plots:+, }\"$tmp/t$i.tsv\" using 1:2 with linespoints pt 7 ps 0.5 lc rgb \"${colors[$i]}\" title \"$sys\""
  done
  gnuplot <<GP
$term
set output "$img/$name-ttft.png"
set title "Agent trace: time to first token per turn ($(where_of "$f"), $(jq -r '"\(.trace.workspaces) workspaces, \(.trace.turns) turns, KV budget \(.budget.mib) MiB"' "$f"))"
set logscale y; set ylabel "ms at the client (log scale)"; set xlabel "turn"
set key outside bottom center horizontal
plot $plots
GP
  jq -r '.systems[] | [.name, .prefilled_tokens, .cached_tokens] | @tsv' "$f" >"$tmp/p.tsv"
  gnuplot <<GP
$term
set output "$img/$name-prefilled.png"
set title "Agent trace: tokens prefilled and reused per system, same KV budget ($(where_of "$f"))"
set style data histograms; set style histogram rowstacked; set style fill solid 0.85 border -1; set boxwidth 0.6
set ylabel "tokens"; set format y "%.1s%c"; set key outside bottom center horizontal; set yrange [0:*]
plot "$tmp/p.tsv" using 2:xtic(1) title "prefilled" lc rgb "#d62728", '' using 3 title "reused from cache" lc rgb "#2ca02c"
GP
  echo "plot: $img/$name-ttft.png $img/$name-prefilled.png"
done

# S3: warmctx vs llama-bench tok/s per shape, one panel per test.
for f in "$res"/s3-*.json "$res"/*/s3-*.json; do
  earlier "$f" && continue
  [ -s "$f" ] && jq -e ".rows // .systems" "$f" >/dev/null 2>&1 || { echo "plot: skipping $f (not a finished result)"; continue; }
  name="$(basename "$f" .json)"
  for t in cold_pp warm_pp tg; do
    jq -r ".rows[] | [(.shape | sub(\"qwen2.5-\"; \"\")), .warmctx.${t}_tps, .llama_bench.${t}_tps] | @tsv" "$f" >"$tmp/$t.tsv"
  done
  gnuplot <<GP
set terminal pngcairo size 1200,450 font "DejaVu Sans,11" noenhanced
set output "$img/$name.png"
set multiplot layout 1,3 title "S3: warmctx engine vs llama-bench, same build ($(where_of "$f"), $(jq -r .type "$f"))"
set style data histograms; set style histogram clustered gap 1; set style fill solid 0.85 border -1
set grid ytics; set key top right; set ylabel "tokens/s"; set format y "%.1s%c"; set yrange [0:*]
set title "cold prefill, $(jq -r .n_prompt "$f") tokens"
plot "$tmp/cold_pp.tsv" using 2:xtic(1) title "warmctx" lc rgb "#1f77b4", '' using 3 title "llama-bench" lc rgb "#7f7f7f"
set title "warm prefill, $(jq -r .n_prompt "$f") after $(jq -r .depth "$f")"
plot "$tmp/warm_pp.tsv" using 2:xtic(1) title "warmctx" lc rgb "#1f77b4", '' using 3 title "llama-bench" lc rgb "#7f7f7f"
set title "decode, $(jq -r .n_gen "$f") tokens"
plot "$tmp/tg.tsv" using 2:xtic(1) title "warmctx" lc rgb "#1f77b4", '' using 3 title "llama-bench" lc rgb "#7f7f7f"
unset multiplot
GP
  echo "plot: $img/$name.png"
done

# Soak: RSS over time (and the heap in use), the warm-up third shaded.
for f in "$res"/soak-*.json "$res"/*/soak-*.json; do
  earlier "$f" && continue
  [ -s "$f" ] && jq -e ".rss.samples" "$f" >/dev/null 2>&1 || { echo "plot: skipping $f (not a finished result)"; continue; }
  name="$(basename "$f" .json)"
  jq -r '.rss.samples[] | [.t_s, .rss_mib] | @tsv' "$f" >"$tmp/rss.tsv"
  n=$(jq '.rss.samples | length' "$f")
  warm=$(jq ".rss.samples[$((n / 3))].t_s" "$f")
  gnuplot <<GP
$term
set output "$img/$name.png"
set title "soak: RSS of the process, $(jq -r .clients "$f") clients for $(jq -r .duration_s "$f") s ($(where_of "$f")); $(jq -r '.requests.requests' "$f") requests, $(jq -r .n_5xx "$f") 5xx"
set xlabel "seconds since the clients started"; set ylabel "MiB"; set yrange [0:*]
set object 1 rect from 0, graph 0 to $warm, graph 1 fc rgb "#eeeeee" fs solid 1.0 noborder behind
set label 1 "warm-up (not judged)" at graph 0.01, graph 0.95; set key bottom right
plot "$tmp/rss.tsv" using 1:2 with linespoints pt 7 ps 0.5 lc rgb "#1f77b4" title "VmRSS"
GP
  echo "plot: $img/$name.png"
done
