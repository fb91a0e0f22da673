#!/usr/bin/env bash
# Each agent's snippet in docs/agents.md, run or read as written (its port changed to a
# test server's) and used against `warmctx serve`: Claude Code's shell lines with `claude`
# standing for a Messages request made with the variables they set; Codex's TOML parsed and
# its provider's base_url sent a Responses request; opencode's, pi's and qwen-code's JSON
# parsed and their base URLs sent a chat; Continue's YAML parsed and its Ollama apiBase sent
# /api/chat. Also: the page warns about output limits.
# usage: agent_snippets.sh WARMCTX_BIN MODEL [DOC]
set -euo pipefail
bin="$1"; model="$2"
doc="${3:-$(cd "$(dirname "$0")/../.." && pwd)/docs/agents.md}"
work="$(mktemp -d)"
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "agent snippets: $*"; exit 1; }

# The snippets: the fenced block after each "<!-- snippet: NAME -->" line.
python3 - "$doc" "$work" <<'PY'
import re, sys, pathlib
text = pathlib.Path(sys.argv[1]).read_text()
found = re.findall(r'<!-- snippet: ([a-z-]+) -->\n```[a-z]*\n(.*?)\n```', text, re.S)
for name, body in found:
    pathlib.Path(sys.argv[2], name).write_text(body + "\n")
print(" ".join(n for n, _ in found))
PY
for s in claude-code codex opencode pi qwen-code continue; do
  [ -f "$work/$s" ] || fail "docs/agents.md has no snippet '$s'"
done
grep -q -- '--default-max-tokens' "$doc" || fail "docs/agents.md does not say how to bound answers (--default-max-tokens)"

"$bin" serve -m "$model" --port 0 -c 2048 -t 1 --no-disk --no-prewarm --api-key local >"$work/out" 2>"$work/log" &
pid=$!
for _ in $(seq 200); do
  port="$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/out" | grep -o '[0-9]*$' || true)"
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.1
done
[ -n "${port:-}" ] || { cat "$work/log"; fail "the server did not start"; }
for s in "$work"/*; do sed -i "s/127\.0\.0\.1:8080/127.0.0.1:$port/g" "$s"; done
ok() {  # NAME STATUS BODY-FILE: a 200 whose body is JSON (or JSON lines)
  [ "$2" = 200 ] || { head -c 400 "$3"; echo; fail "$1: status $2"; }
  head -n1 "$3" | jq -e . >/dev/null || fail "$1: the answer is not JSON"
  echo "agent snippets: $1 connects"
}

# Claude Code: the snippet's own lines, `claude` a Messages request with what they set.
(
  claude() {
    [ -n "${ANTHROPIC_API_KEY:-}${ANTHROPIC_AUTH_TOKEN:-}" ] || { echo "no key: Claude Code would not log in"; return 1; }
    code="$(curl -s -o "$work/cc.json" -w '%{http_code}' -H "x-api-key: ${ANTHROPIC_API_KEY:-$ANTHROPIC_AUTH_TOKEN}" \
      -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' \
      -d '{"model":"claude-sonnet","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}' "$ANTHROPIC_BASE_URL/v1/messages")"
    ok claude-code "$code" "$work/cc.json"
  }
  # shellcheck disable=SC1090
  source "$work/claude-code"
) || fail "claude-code: the snippet did not connect"

# Codex: the TOML as Codex reads it: the provider `model_provider` names, with a model.
read -r base model_id wire key_env < <(python3 - "$work/codex" <<'PY'
import sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb"))
name = c.get("model_provider") or sys.exit("codex: no model_provider (Codex: provider name must not be empty)")
p = c.get("model_providers", {}).get(name) or sys.exit(f"codex: model_provider '{name}' has no [model_providers.{name}]")
c.get("model") or sys.exit("codex: no model")
print(p["base_url"], c["model"], p.get("wire_api", "chat"), p.get("env_key", ""))
PY
) || fail "codex: the TOML is not what Codex takes"
[ "$wire" = responses ] || fail "codex: wire_api is '$wire', not responses"
code="$(curl -s -o "$work/codex.json" -w '%{http_code}' -H "Authorization: Bearer local" -H 'content-type: application/json' \
  -d "{\"model\":\"$model_id\",\"input\":\"hi\",\"max_output_tokens\":4}" "$base/responses")"
ok codex "$code" "$work/codex.json"

# opencode, pi, qwen-code: their JSON, and a chat at the base URL it names.
chat() {  # NAME BASE MODEL
  code="$(curl -s -o "$work/$1.json" -w '%{http_code}' -H "Authorization: Bearer local" -H 'content-type: application/json' \
    -d "{\"model\":\"$3\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$2/chat/completions")"
  ok "$1" "$code" "$work/$1.json"
}
opencode_q='.model as $m | ($m | split("/")) as $p | .provider[$p[0]] as $v
  | if $v.models[$p[1]] == null then error("not among the models") else "\($v.options.baseURL) \($p[1])" end'
out="$(jq -r "$opencode_q" "$work/opencode")" || fail "opencode: the JSON does not name its model's provider"
read -r base model_id <<<"$out"
chat opencode "$base" "$model_id"
out="$(jq -r '.providers.warmctx | select(.api == "openai-completions") | "\(.baseUrl) \(.models[0].id)"' "$work/pi")"
[ -n "$out" ] || fail "pi: no openai-completions provider"
read -r base model_id <<<"$out"
chat pi "$base" "$model_id"
out="$(jq -r 'select(.security.auth.selectedType == "openai") | .modelProviders.openai[0] | "\(.baseUrl) \(.id)"' \
  "$work/qwen-code")"
[ -n "$out" ] || fail "qwen-code: no openai provider selected"
read -r base model_id <<<"$out"
chat qwen-code "$base" "$model_id"

# Continue: its YAML's Ollama model, at the apiBase it names.
read -r base model_id < <(python3 - "$work/continue" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
m = next(m for m in c["models"] if m["provider"] == "ollama")
print(m["apiBase"], m["model"])
PY
) || fail "continue: no ollama model in the YAML"
code="$(curl -s -o "$work/continue.json" -w '%{http_code}' -H "Authorization: Bearer local" -H 'content-type: application/json' \
  -d "{\"model\":\"$model_id\",\"stream\":false,\"options\":{\"num_predict\":4},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" \
  "$base/api/chat")"
ok continue "$code" "$work/continue.json"
echo "agent snippets: all connect"
