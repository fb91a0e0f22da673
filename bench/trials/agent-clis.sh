#!/usr/bin/env bash
# Runs real coding-agent CLIs, unmodified, against `warmctx serve` and prints one JSON
# summary per CLI (route/status counts, tokens reused per request, tools sent, failures).
#
#   bench/trials/agent-clis.sh [PREFIX]        # PREFIX: where the CLIs are npm-installed (/tmp/agents)
#
# Environment: WARMCTX (./build/warmctx), PORT (18400), WORK (/tmp/agent-clis), TIMEOUT (420 s a run),
# MAX_TOKENS (32: --default-max-tokens; Codex sends no max_output_tokens, and a random-weight model
# rarely ends on its own, so without it every answer runs to the end of the context),
# CLIS ("codex codex-no-hosted-tools pi opencode qwen"), SERVE_ARGS (more `serve` options: another
# model, `-m build/test-models/tiny-hybrid-q8_0-seed1.gguf --reasoning-budget 16`), SKIP_INSTALL=1, SUMMARY_ONLY=1 (only print
# the summary of what $WORK holds from an earlier run),
# IDLE_MS (1800000: Codex's stream_idle_timeout_ms; its default, 300 s, counts only SSE events,
# not the server's keep-alive comments, and a cold 6k-token Codex prompt on a small CPU takes longer).
# pi, opencode and qwen-code are given MAX_TOKENS as their model's output limit (each sends its own
# max_tokens otherwise, 16k-32k).
# Each CLI gets its own HOME under $WORK, the same scratch project, and the same prompt twice.
# A logging proxy (node) sits between each CLI and the server, so every request body and
# response is kept in $WORK/<cli>/proxy.jsonl; the server's request log is $WORK/server.log.
# The summary goes to stdout (one JSON document); progress goes to stderr.
set -u
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
PREFIX="${1:-/tmp/agents}"
WARMCTX="${WARMCTX:-$REPO/build/warmctx}"
PORT="${PORT:-18400}"
WORK="${WORK:-/tmp/agent-clis}"
TIMEOUT="${TIMEOUT:-420}"
MAX_TOKENS="${MAX_TOKENS:-32}"
IDLE_MS="${IDLE_MS:-1800000}"
CLIS="${CLIS:-codex codex-no-hosted-tools pi opencode qwen}"
PROMPT="List the files in this directory and summarize calc.py."
MODEL_ID="qwen2.5-0.5b"
BIN="$PREFIX/node_modules/.bin"
log() { echo "[agent-clis] $*" >&2; }

if [ "${SUMMARY_ONLY:-0}" = 1 ]; then SKIP_RUNS=1; fi
# ---- install ----
if [ "${SKIP_INSTALL:-0}" != 1 ] && [ "${SKIP_RUNS:-0}" != 1 ]; then
  log "npm install into $PREFIX"
  mkdir -p "$PREFIX"
  npm install --prefix "$PREFIX" @openai/codex @mariozechner/pi-coding-agent opencode-ai @qwen-code/qwen-code >&2 || exit 1
fi

if [ "${SKIP_RUNS:-0}" != 1 ]; then
rm -rf "$WORK"; mkdir -p "$WORK/project"
printf 'def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n' > "$WORK/project/calc.py"
printf '# demo\nA tiny calculator (calc.py).\n' > "$WORK/project/README.md"

# ---- logging proxy ----
cat > "$WORK/proxy.js" <<'EOF'
// node proxy.js LISTEN_PORT UPSTREAM_PORT LOGFILE: forwards everything, logs each exchange as a JSON line
const http = require('http'); const fs = require('fs'); const zlib = require('zlib');
const [lp, up, logf] = process.argv.slice(2); let n = 0;
http.createServer((req, res) => {
  const id = ++n; const chunks = [];
  req.on('data', c => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    const rec = { id, ts: new Date().toISOString(), method: req.method, url: req.url, headers: req.headers, body: body.toString('utf8') };
    const pr = http.request({ host: '127.0.0.1', port: +up, method: req.method, path: req.url, headers: req.headers }, pres => {
      res.writeHead(pres.statusCode, pres.headers);
      const out = [];
      pres.on('data', c => { out.push(c); res.write(c); });
      pres.on('end', () => {
        res.end(); rec.status = pres.statusCode; rec.resp_headers = pres.headers;
        let raw = Buffer.concat(out); const enc = pres.headers['content-encoding'];
        try { if (enc === 'gzip') raw = zlib.gunzipSync(raw); else if (enc === 'deflate') raw = zlib.inflateSync(raw); else if (enc === 'br') raw = zlib.brotliDecompressSync(raw); }
        catch (e) { rec.decode_error = String(e); }
        rec.response = raw.toString('utf8'); fs.appendFileSync(logf, JSON.stringify(rec) + '\n');
      });
    });
    res.on('close', () => { if (!res.writableFinished) { rec.client_aborted = true; rec.status = 499; fs.appendFileSync(logf, JSON.stringify(rec) + '\n'); pr.destroy(); } });
    pr.on('error', e => { if (rec.client_aborted) return; rec.status = 502; rec.proxy_error = String(e); fs.appendFileSync(logf, JSON.stringify(rec) + '\n'); res.writeHead(502); res.end(); });
    pr.end(body);
  });
}).listen(+lp, '127.0.0.1');
EOF

# ---- server ----
log "starting $WARMCTX serve --port $PORT --no-prewarm --no-disk --default-max-tokens $MAX_TOKENS"
# shellcheck disable=SC2086
"$WARMCTX" serve --port "$PORT" --no-prewarm --no-disk --default-max-tokens "$MAX_TOKENS" ${SERVE_ARGS:-} > "$WORK/server.out" 2> "$WORK/server.log" &
SERVER_PID=$!
PIDS=("$SERVER_PID")
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 "$SERVER_PID" 2>/dev/null || { log "server exited"; cat "$WORK/server.log" >&2; exit 1; }
  sleep 1
done

# ---- per-CLI configuration ----
setup_cli() {  # $1 = cli, $2 = proxy port; prints nothing, writes config under $WORK/$1/home
  local cli="$1" pp="$2" H="$WORK/$1/home"
  mkdir -p "$H"
  case "$cli" in
    codex|codex-no-hosted-tools)
      mkdir -p "$H/.codex"
      cat > "$H/.codex/config.toml" <<EOF
model = "$MODEL_ID"
model_provider = "warmctx"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.warmctx]
name = "warmctx"
base_url = "http://127.0.0.1:$pp/v1"
wire_api = "responses"
env_key = "WARMCTX_API_KEY"
stream_idle_timeout_ms = $IDLE_MS
EOF
      ;;
    pi)
      mkdir -p "$H/.pi/agent"
      cat > "$H/.pi/agent/models.json" <<EOF
{ "providers": { "warmctx": { "baseUrl": "http://127.0.0.1:$pp/v1", "api": "openai-completions",
  "apiKey": "dummy", "models": [ { "id": "$MODEL_ID", "contextWindow": 65536, "maxTokens": $MAX_TOKENS } ] } } }
EOF
      ;;
    opencode)
      mkdir -p "$H/.config/opencode"
      cat > "$H/.config/opencode/opencode.json" <<EOF
{ "provider": { "warmctx": { "npm": "@ai-sdk/openai-compatible", "name": "warmctx",
    "options": { "baseURL": "http://127.0.0.1:$pp/v1", "apiKey": "dummy" },
    "models": { "$MODEL_ID": { "name": "$MODEL_ID (warmctx)", "limit": { "context": 65536, "output": $MAX_TOKENS } } } } },
  "model": "warmctx/$MODEL_ID", "autoupdate": false, "share": "disabled" }
EOF
      ;;
    qwen)
      mkdir -p "$H/.qwen"
      cat > "$H/.qwen/settings.json" <<EOF
{ "modelProviders": { "openai": [ { "id": "$MODEL_ID", "name": "$MODEL_ID (warmctx)",
    "baseUrl": "http://127.0.0.1:$pp/v1", "envKey": "WARMCTX_API_KEY",
    "generationConfig": { "contextWindowSize": 65536, "samplingParams": { "max_tokens": $MAX_TOKENS } } } ] },
  "security": { "auth": { "selectedType": "openai" } }, "model": { "name": "$MODEL_ID" },
  "privacy": { "usageStatisticsEnabled": false }, "telemetry": { "enabled": false } }
EOF
      ;;
  esac
}

cli_command() {  # the exact command line (run in $WORK/project with HOME=$WORK/<cli>/home)
  case "$1" in
    codex) echo "$BIN/codex exec --skip-git-repo-check --ephemeral --color never \"$PROMPT\"" ;;
    codex-no-hosted-tools) echo "$BIN/codex exec --skip-git-repo-check --ephemeral --color never -c web_search=\\\"disabled\\\" \"$PROMPT\"" ;;
    pi) echo "$BIN/pi --provider warmctx --model $MODEL_ID --no-session -p \"$PROMPT\"" ;;
    opencode) echo "$BIN/opencode run --model warmctx/$MODEL_ID \"$PROMPT\"" ;;
    qwen) echo "$BIN/qwen --approval-mode yolo --output-format json \"$PROMPT\"" ;;
  esac
}

cli_version() {
  case "$1" in
    codex|codex-no-hosted-tools) node -p "require('$PREFIX/node_modules/@openai/codex/package.json').version" ;;
    pi) node -p "require('$PREFIX/node_modules/@mariozechner/pi-coding-agent/package.json').version" ;;
    opencode) node -p "require('$PREFIX/node_modules/opencode-ai/package.json').version" ;;
    qwen) node -p "require('$PREFIX/node_modules/@qwen-code/qwen-code/package.json').version" ;;
  esac
}

pp=$((PORT + 1))
for cli in $CLIS; do
  D="$WORK/$cli"; mkdir -p "$D"
  setup_cli "$cli" "$pp"
  node "$WORK/proxy.js" "$pp" "$PORT" "$D/proxy.jsonl" 2>>"$WORK/proxy.err" &
  PIDS+=("$!"); sleep 0.5
  cmd="$(cli_command "$cli")"; prev_want=0
  cli_version "$cli" > "$D/version" 2>/dev/null
  echo "$cmd" > "$D/command"
  for run in 1 2; do
    log "$cli run $run: $cmd"
    start_line=$(wc -l < "$WORK/server.log"); t0=$(date +%s.%N)
    ( cd "$WORK/project" && HOME="$D/home" CODEX_HOME="$D/home/.codex" WARMCTX_API_KEY=dummy \
        OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 NO_COLOR=1 \
        timeout "$TIMEOUT" bash -c "$cmd" < /dev/null > "$D/run$run.out" 2>&1 )
    echo $? > "$D/run$run.rc"
    t1=$(date +%s.%N)
    # wait (up to 60 s) for the server to log every request the proxy saw: a request whose
    # client went away is logged when the server notices it, after its current prefill chunk
    want=$(wc -l < "$D/proxy.jsonl" 2>/dev/null || echo 0)
    for _ in $(seq 1 60); do
      got=$(tail -n +$((start_line + 1)) "$WORK/server.log" | grep -c '"route":"/v1/[a-z/]*","status"')
      [ "$got" -ge $((want - ${prev_want:-0})) ] && break
      sleep 1
    done
    prev_want=$want
    tail -n +$((start_line + 1)) "$WORK/server.log" > "$D/run$run.server.log"
    echo "$t0 $t1" > "$D/run$run.time"
    wc -l < "$D/proxy.jsonl" 2>/dev/null > "$D/run$run.proxy_lines" || echo 0 > "$D/run$run.proxy_lines"
  done
  pp=$((pp + 1))
done

fi  # SKIP_RUNS

# ---- summary ----
node - "$WORK" "$CLIS" <<'EOF'
const fs = require('fs'); const path = require('path');
const [work, clis] = process.argv.slice(2);
const read = (f, d = '') => { try { return fs.readFileSync(f, 'utf8'); } catch { return d; } };
const jsonl = f => read(f).split('\n').filter(Boolean).map(l => { try { return JSON.parse(l); } catch { return null; } }).filter(Boolean);
function toolsOf(body) {
  if (!Array.isArray(body.tools)) return null;
  return body.tools.map(t => t.type === 'function' ? (t.name || (t.function && t.function.name)) : `${t.type}:${t.name || ''}`);
}
function callsIn(resp) {  // tool calls the server answered with (chat or responses, streamed or not)
  const calls = [];
  for (const line of resp.split('\n')) {
    const s = line.startsWith('data: ') ? line.slice(6) : line;
    if (!s.startsWith('{')) continue;
    let j; try { j = JSON.parse(s); } catch { continue; }
    if (j.type === 'response.output_item.done' && j.item && j.item.type === 'function_call') calls.push(j.item.name);
    if (j.choices) for (const c of j.choices) {
      const tc = (c.message && c.message.tool_calls) || (c.delta && c.delta.tool_calls) || [];
      for (const t of tc) if (t.function && t.function.name) calls.push(t.function.name);
    }
    if (Array.isArray(j.output)) for (const it of j.output) if (it.type === 'function_call') calls.push(it.name);
  }
  return calls;
}
function sseCheck(resp, route) {  // is a streamed answer well-formed?
  const datas = resp.split('\n').filter(l => l.startsWith('data: ')).map(l => l.slice(6));
  let bad = 0, errors = 0;
  for (const d of datas) { if (d === '[DONE]') continue; try { const j = JSON.parse(d); if (j.error || j.type === 'error' || j.type === 'response.failed') errors++; } catch { bad++; } }
  const done = route.includes('/responses') ? datas.some(d => d.includes('"response.completed"') || d.includes('"response.incomplete"')) : datas[datas.length - 1] === '[DONE]';
  return { events: datas.length, unparsable: bad, error_events: errors, terminated: done };
}
const out = [];
for (const cli of clis.split(/\s+/).filter(Boolean)) {
  const D = path.join(work, cli);
  const proxy = jsonl(path.join(D, 'proxy.jsonl'));
  const res = { cli, version: read(path.join(D, 'version')).trim(), command: read(path.join(D, 'command')).trim(), runs: [] };
  let p0 = 0;
  for (const run of [1, 2]) {
    const p1 = parseInt(read(path.join(D, `run${run}.proxy_lines`), '0')) || 0;
    const srv = jsonl(path.join(D, `run${run}.server.log`)).filter(l => l.route && l.status !== undefined && !l.event && l.route.startsWith('/v1'));
    const [t0, t1] = read(path.join(D, `run${run}.time`), '0 0').trim().split(' ').map(Number);
    const counts = {};
    for (const l of srv) { const k = `${l.method} ${l.route} ${l.status}`; counts[k] = (counts[k] || 0) + 1; }
    const exchanges = proxy.slice(p0, p1).map(x => {
      let body = {}; try { body = JSON.parse(x.body || '{}'); } catch {}
      const e = { method: x.method, url: x.url, status: x.status, stream: body.stream ?? null,
        tool_choice: body.tool_choice ?? null, tools: toolsOf(body), tool_calls_answered: callsIn(x.response || '') };
      if (body.stream && x.status === 200) e.stream_check = sseCheck(x.response || '', x.url);
      if (x.status >= 400) e.error_response = (x.response || '').slice(0, 1000);
      return e;
    });
    p0 = p1;
    const outText = read(path.join(D, `run${run}.out`));
    res.runs.push({ run, exit_code: parseInt(read(path.join(D, `run${run}.rc`), '-1')), wall_s: +(t1 - t0).toFixed(1),
      route_status_counts: counts,
      requests: srv.map(l => ({ route: l.route, status: l.status, error: l.error, workspace: l.workspace,
        prompt_tokens: l.prompt_tokens, tokens_reused: l.tokens_reused, tokens_prefilled: l.tokens_prefilled,
        completion_tokens: l.completion_tokens, duration_ms: l.duration_ms })),
      exchanges, output_tail: outText.slice(-1500) });
  }
  const reused = r => r.requests.filter(q => q.prompt_tokens).map(q => q.tokens_reused);
  res.tokens_reused = { run1: reused(res.runs[0]), run2: reused(res.runs[1]) };
  res.all_requests_ok = res.runs.every(r => r.requests.length > 0 && r.requests.every(q => q.status === 200));
  out.push(res);
}
console.log(JSON.stringify(out, null, 1));
EOF
