#!/usr/bin/env bash
# The page at /ui in a real browser (headless Chromium): behind the API key it shows
# nothing of what the server holds and asks for the key; with the key (given as #key=...)
# it draws the workspaces, each turn's result and the last turn's phases from
# GET /v1/status. With a third argument, saves a screenshot there (docs/img/ui.png).
# usage: ui_page.sh WARMCTX_BIN MODEL [SCREENSHOT]
set -euo pipefail
bin="$1"; model="$2"; shot="${3:-}"
browser="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$browser" ] || { echo "ui page: no chromium (apt-get install chromium; scripts/setup.sh installs it)"; exit 1; }
work="$(mktemp -d)"
log="$work/serve.log"
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
key="k-$RANDOM$RANDOM"
"$bin" serve -m "$model" --port 0 -c 2048 -t 1 --no-disk --no-prewarm --api-key "$key" >"$work/out" 2>"$log" &
pid=$!
for _ in $(seq 200); do
  port="$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$work/out" | grep -o '[0-9]*$' || true)"
  [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.1
done
[ -n "${port:-}" ] || { echo "ui page: the server did not start"; cat "$log"; exit 1; }
url="http://127.0.0.1:$port"
system="You review the code of project ui-page-test. $(printf 'A line of the repository map. %.0s' $(seq 40))"
for q in one two three; do
  curl -sf -o /dev/null -H "Authorization: Bearer $key" -H 'content-type: application/json' \
    -d "{\"messages\":[{\"role\":\"system\",\"content\":\"$system\"},{\"role\":\"user\",\"content\":\"question $q\"}],\"max_tokens\":4}" \
    "$url/v1/chat/completions"
done
dom() {
  timeout 60 "$browser" --headless=new --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
    --virtual-time-budget=5000 --dump-dom "$1" 2>/dev/null
}
fail() { echo "ui page: $*"; exit 1; }
ws="$(curl -sf -H "Authorization: Bearer $key" "$url/v1/status" | jq -r '.turns[-1].workspace')"
[ -n "$ws" ] && [ "$ws" != null ] || fail "/v1/status has no turn"
# Without the key: asked for, nothing shown.
dom "$url/ui" >"$work/nokey.html"
grep -q 'the API key is needed' "$work/nokey.html" || fail "without the key the page does not ask for it"
grep -q "$ws" "$work/nokey.html" && fail "without the key the page shows a workspace"
# With the key: the workspace, its turns' results, the phases of the last turn.
dom "$url/ui#key=$key" >"$work/page.html"
grep -q "$ws" "$work/page.html" || fail "the workspace $ws is not on the page"
grep -q '>warm<' "$work/page.html" || fail "no turn shows warm"
grep -q '>cold (cold)<' "$work/page.html" || fail "the first turn does not show cold"
grep -q 'prefill [0-9.]* ms' "$work/page.html" || fail "the last turn's phases are not drawn"
grep -q 'RAM (a KV stream) ([0-9,]* tokens)' "$work/page.html" || fail "where the workspace's prefix is now is not shown"
grep -q 'work stream (in place)' "$work/page.html" || fail "where a turn's reuse came from is not shown"
grep -q 'live, ' "$work/page.html" || fail "the page did not draw the status"
if [ -n "$shot" ]; then
  timeout 60 "$browser" --headless=new --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile2" \
    --hide-scrollbars --window-size=1400,1100 --virtual-time-budget=5000 --screenshot="$shot" "$url/ui#key=$key" \
    >/dev/null 2>&1 || fail "no screenshot"
fi
echo "ui page checks: all passed"
