#!/usr/bin/env bash
# Decode at depth through `warmctx serve`, the way a client meets it: one chat request of a
# long user message (PROMPT_WORDS random words, seeded), greedy, MAX_TOKENS tokens, drafts off
# for the request ("speculative.n_max": 0) so every step decodes a lone row; prints one JSON
# line with the server's own decode_ms and first_token_ms.
# usage: bench/decode-at-depth.sh WARMCTX_BINARY [serve flags...]
#   env: MODEL (default: the generated qwen2.5-0.5b q4_0 under ~/.cache/warmctx/models),
#        PROMPT_WORDS (1400: ~2,100 tokens), MAX_TOKENS (64), PORT (18190), THREADS (2)
set -euo pipefail
bin="$1"; shift
model="${MODEL:-$HOME/.cache/warmctx/models/qwen2.5-0.5b-q4_0-seed0.gguf}"
port="${PORT:-18190}"
log="$(mktemp)"
"$bin" serve -m "$model" -t "${THREADS:-2}" --port "$port" -q "$@" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 300); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 1; done
python3 - "$port" "${PROMPT_WORDS:-1400}" "${MAX_TOKENS:-64}" "$*" <<'PY'
import json, random, sys, time, urllib.request
port, words, n, flags = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
random.seed(1)
vocab = ['alpha', 'build', 'cache', 'delta', 'error', 'file', 'graph', 'index', 'json', 'kernel',
         'log', 'merge', 'node', 'patch', 'query', 'retry', 'state', 'token', 'value', 'write']
prompt = ' '.join(random.choice(vocab) + str(random.randint(0, 99)) for _ in range(words))
body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
        "ignore_eos": True, "speculative.n_max": 0}
req = urllib.request.Request(f"http://localhost:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
t = time.time()
r = json.load(urllib.request.urlopen(req))
w = r["warmctx"]
print(json.dumps({"flags": flags, "prompt_tokens": r["usage"]["prompt_tokens"],
                  "completion_tokens": r["usage"]["completion_tokens"], "first_token_ms": round(w["first_token_ms"], 1),
                  "decode_ms": round(w["decode_ms"], 1),
                  "ms_per_token": round(w["decode_ms"] / max(1, r["usage"]["completion_tokens"] - 1), 2),
                  "client_s": round(time.time() - t, 2)}))
PY
