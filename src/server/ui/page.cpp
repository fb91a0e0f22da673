// The page at / and /ui (ui.h): one HTML document with its styles and script. It reads
// GET /v1/status every two seconds and draws what it says; every value from the server
// goes into the page as text (textContent), never as markup.
#include "ui.h"

namespace warmctx::server_detail {

namespace {

constexpr const char k_page[] = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>warmctx</title>
<style>
  :root { --fg: #1d232b; --muted: #68717d; --line: #dde2e8; --bg: #f6f7f9; --card: #fff;
          --reused: #2f9e6e; --prefilled: #e08a2e; --gen: #5b7fd6; --other: #a9b1bc; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
  header { display: flex; gap: 16px; align-items: baseline; padding: 14px 24px; background: #1d232b; color: #fff; }
  header h1 { font-size: 18px; margin: 0; }
  header .muted { color: #b8c0ca; }
  main { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 16px; padding: 16px 24px; }
  section { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; }
  section.wide { grid-column: 1 / -1; }
  h2 { font-size: 14px; margin: 0 0 10px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
  th { font-weight: 600; color: var(--muted); font-size: 12px; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
  #turns td:first-child { white-space: nowrap; }
  .muted { color: var(--muted); }
  .bar { display: flex; height: 18px; border-radius: 4px; overflow: hidden; background: #eef1f4; }
  .bar div { height: 100%; }
  .row { display: grid; grid-template-columns: 150px 1fr 170px; gap: 10px; align-items: center; margin: 6px 0; }
  .legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
  .legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
  .hit { color: var(--reused); font-weight: 600; } .miss { color: var(--prefilled); font-weight: 600; }
  #key { display: none; } #key.show { display: block; }
  #error { color: #b3261e; }
</style>
</head>
<body>
<header><h1>warmctx</h1><span id="model" class="muted"></span><span id="live" class="muted"></span>
  <span id="error"></span></header>
<main>
  <section id="key" class="wide"><h2>API key</h2>
    <p>This server needs its API key to show what it holds.</p>
    <input id="keyin" type="password" size="40" aria-label="API key"> <button id="keybtn">Show</button></section>
  <section><h2>Memory by tier</h2><div id="memory"></div></section>
  <section><h2>The last turn's time</h2><div id="phases" class="muted">no turn yet</div></section>
  <section class="wide"><h2>Reuse over the last turns</h2>
    <div class="legend"><span><i style="background:var(--reused)"></i>tokens reused</span>
      <span><i style="background:var(--prefilled)"></i>tokens prefilled</span></div>
    <svg id="chart" width="100%" height="160" role="img" aria-label="tokens reused and prefilled per turn"></svg>
  </section>
  <section class="wide"><h2>Workspaces</h2><table id="workspaces"><thead><tr><th>workspace</th>
    <th class="num">turns</th><th class="num">reused</th><th class="num">prefilled</th><th>last turn</th>
    <th>its prefix is now in</th><th>stored segments</th><th>misses</th></tr></thead><tbody></tbody></table></section>
  <section class="wide"><h2>Last turns</h2><table id="turns"><thead><tr><th>time</th><th>workspace</th>
    <th>result</th><th class="num">prompt</th><th class="num">reused</th><th class="num">prefilled</th>
    <th class="num">first token</th><th class="num">total</th><th>reused from</th><th>why</th></tr></thead>
    <tbody></tbody></table></section>
  <section class="wide"><h2>Running now</h2><table id="jobs"><thead><tr><th>workspace</th><th>state</th>
    <th class="num">prompt</th><th class="num">cached</th><th class="num">prefilled</th><th class="num">written</th>
    </tr></thead><tbody></tbody></table></section>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
// The key: typed into the page, or given once in the address as #key=... (never sent to
// the server in the address: a fragment stays in the browser); kept for this tab only.
let key = sessionStorage.getItem("warmctx-key") || "";
if (location.hash.startsWith("#key=")) {
  key = decodeURIComponent(location.hash.slice(5)); sessionStorage.setItem("warmctx-key", key);
  history.replaceState(null, "", location.pathname);
}
const PHASES = [["request", "request (parse, prompt)", "#8d6cc4"], ["queue", "queue", "#a9b1bc"],
  ["lookup", "lookup", "#6aa7c9"], ["restore", "restore (disk)", "#3d7bb3"], ["copy", "copy", "#2c5d8f"],
  ["prefill", "prefill", "#e08a2e"], ["write_back", "write-back", "#c05a4a"],
  ["first_token_other", "first token (other)", "#d8c36a"], ["decode", "decode", "#5b7fd6"]];

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function num(n) { return Number(n || 0).toLocaleString("en-US"); }
function ms(v) { return v >= 1000 ? (v / 1000).toFixed(2) + " s" : Number(v || 0).toFixed(1) + " ms"; }
function bytes(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; b = Number(b || 0);
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + u[i];
}
function source(t) {
  if (!t || t.tier === "none") return "nothing reused";
  if (t.tier === "disk") return "disk";
  return t.in_place ? "work stream (in place)" : "RAM pool or a stream copy";
}
// Where a workspace's last prefix is now: a work stream (on the GPU when the model is),
// the RAM pool, a file of the disk tier, or nowhere.
function heldIn(w, onDevice) {
  const n = w.held_tokens ? " (" + num(w.held_tokens) + " tokens)" : "";
  if (w.held_in === "stream") return (onDevice ? "device (a KV stream)" : "RAM (a KV stream)") + n;
  if (w.held_in === "pool") return "RAM pool" + n;
  if (w.held_in === "disk") return "disk";
  if (w.held_in === "none") return "nowhere (evicted)";
  return "-";
}
function fillRows(table, rows) {
  const body = $(table).tBodies[0];
  body.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const c of cells) tr.append(c instanceof Node ? c : el("td", c));
    return tr;
  }));
}
function td(text, cls) { return el("td", text, cls); }
function resultCell(t) {
  const cell = el("td", t.result + (t.miss === "full_hit" ? "" : " (" + t.miss.replace("_", " ") + ")"),
    t.result === "warm" ? "hit" : "miss");
  return cell;
}

function drawMemory(m) {
  const box = $("memory");
  if (!m) { box.replaceChildren(el("p", "nothing published yet", "muted")); return; }
  const device = m.streams_on_device ? "device (GPU)" : "host RAM";
  const rows = [
    ["work streams", m.streams_used_bytes, m.streams_allocated_bytes,
     m.streams + " streams in " + device + ", " + m.resident_streams + " resident"],
    ["RAM pool", m.pool_bytes, Math.max(m.pool_allocated_bytes, m.pool_bytes), m.pool_entries + " prefixes"],
    ["checkpoints", m.checkpoint_bytes, m.checkpoint_bytes, "recurrent / window states"],
    ["disk tier", m.disk_bytes, m.disk_bytes, m.disk_files + " files"]];
  const max = Math.max(1, ...rows.map((r) => r[2]));
  box.replaceChildren(...rows.map(([name, used, alloc, note]) => {
    const row = el("div", null, "row");
    const bar = el("div", null, "bar");
    const a = el("div"); a.style.width = (100 * alloc / max) + "%"; a.style.background = "#cdd6e0";
    const u = el("div"); u.style.width = (100 * used / max) + "%"; u.style.background = "var(--reused)";
    u.title = name + ": " + bytes(used) + " used of " + bytes(alloc) + " allocated";
    bar.append(u); a.style.width = Math.max(0, 100 * (alloc - used) / max) + "%"; bar.append(a);
    row.append(el("div", name), bar, el("div", bytes(used) + " / " + bytes(alloc), "muted"));
    row.title = note;
    return row;
  }), el("p", "model memory: " + m.kind + (m.reuse_across_turns ? ", reused across turns" :
        ", served without reuse across turns"), "muted"));
}

function drawPhases(t) {
  const box = $("phases");
  if (!t) return;
  const p = t.phases_ms;
  const total = Math.max(1e-6, PHASES.reduce((s, [k]) => s + (p[k] || 0), 0));
  const bar = el("div", null, "bar");
  const legend = el("div", null, "legend");
  for (const [k, label, color] of PHASES) {
    const v = p[k] || 0;
    if (v <= 0) continue;
    const seg = el("div"); seg.style.width = (100 * v / total) + "%"; seg.style.background = color;
    seg.title = label + ": " + ms(v);
    bar.append(seg);
    const item = el("span"); const sw = el("i"); sw.style.background = color;
    item.append(sw, document.createTextNode(label + " " + ms(v))); legend.append(item);
  }
  box.className = "";
  box.replaceChildren(el("p", t.workspace + ": " + ms(t.total_ms) + " in all, first token after " +
    ms(t.ttft_ms)), bar, legend);
}

function drawChart(turns) {
  const svg = $("chart");
  const NS = "http://www.w3.org/2000/svg";
  const w = svg.clientWidth || 900, h = 160, n = Math.max(turns.length, 1);
  const max = Math.max(1, ...turns.map((t) => t.reused + t.prefilled));
  const bw = Math.max(2, Math.min(24, (w - 80) / n - 2));
  const nodes = [];
  turns.forEach((t, i) => {
    const x = 70 + i * (bw + 2);
    const hr = (h - 20) * t.reused / max, hp = (h - 20) * t.prefilled / max;
    for (const [y, hh, color] of [[h - 10 - hr, hr, "var(--reused)"], [h - 10 - hr - hp, hp, "var(--prefilled)"]]) {
      const r = document.createElementNS(NS, "rect");
      r.setAttribute("x", x); r.setAttribute("y", y); r.setAttribute("width", bw);
      r.setAttribute("height", Math.max(0, hh)); r.setAttribute("fill", color);
      const title = document.createElementNS(NS, "title");
      title.textContent = t.workspace + ": " + t.result + " (" + t.miss + "), " + num(t.reused) + " reused, " +
        num(t.prefilled) + " prefilled" + (t.reason ? " - " + t.reason : "");
      r.append(title); nodes.push(r);
    }
  });
  const axis = document.createElementNS(NS, "text");
  axis.setAttribute("x", 0); axis.setAttribute("y", 16); axis.setAttribute("font-size", "11");
  axis.setAttribute("fill", "#68717d"); axis.textContent = num(max) + " tokens";
  nodes.push(axis);
  svg.replaceChildren(...nodes);
}

function draw(s) {
  $("model").textContent = s.model.name + " - " + s.model.description + ", " + s.model.backend + ", " +
    num(s.model.n_ctx) + " tokens per sequence, " + s.model.parallel + " at once";
  $("live").textContent = "live, " + new Date(s.unix_ms).toLocaleTimeString();
  drawMemory(s.memory);
  drawPhases(s.turns[s.turns.length - 1]);
  drawChart(s.turns.slice(-60));
  const last = (w) => (w.last || {}).unix_ms || 0;
  const ws = Object.entries(s.workspaces).sort((a, b) => last(b[1]) - last(a[1]));
  fillRows("workspaces", ws.map(([id, w]) => [td(id), td(num(w.turns), "num"), td(num(w.reused), "num"),
    td(num(w.prefilled), "num"), w.last ? resultCell(w.last) : td("-"),
    td(heldIn(w, s.memory && s.memory.streams_on_device)),
    td(w.segments ? w.segments.map((g) => g.kind + ":" + g.id).join(", ") : "-"),
    td(Object.entries(w.misses || {}).map(([k, v]) => k + " " + v).join(", "))]));
  fillRows("turns", s.turns.slice(-20).reverse().map((t) => [td(new Date(t.unix_ms).toLocaleTimeString()),
    td(t.workspace), resultCell(t), td(num(t.prompt_tokens), "num"), td(num(t.reused), "num"),
    td(num(t.prefilled), "num"), td(ms(t.ttft_ms), "num"), td(ms(t.total_ms), "num"),
    td(source(t)), td(t.reason)]));
  fillRows("jobs", s.jobs.map((j) => [td(j.workspace), td(j.state), td(num(j.prompt_tokens), "num"),
    td(num(j.cached_tokens), "num"), td(num(j.prefill_pos), "num"), td(num(j.generated), "num")]));
}

async function poll() {
  try {
    const r = await fetch("/v1/status", { headers: key ? { Authorization: "Bearer " + key } : {} });
    if (r.status === 401) { $("key").className = "wide show"; $("error").textContent = "the API key is needed"; }
    else if (!r.ok) { $("error").textContent = "status " + r.status; }
    else { $("key").className = "wide"; $("error").textContent = ""; draw(await r.json()); }
  } catch (e) {
    $("error").textContent = "the server does not answer";
  }
  setTimeout(poll, 2000);
}
$("keybtn").addEventListener("click", () => {
  key = $("keyin").value; sessionStorage.setItem("warmctx-key", key); $("error").textContent = "";
});
poll();
</script>
</body>
</html>
)HTML";

}  // namespace

std::string_view ui_page_html() { return {k_page, sizeof k_page - 1}; }

}  // namespace warmctx::server_detail
