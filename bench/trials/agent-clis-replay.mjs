// Replays the first successful request each CLI sent (captured by agent-clis.sh's proxy in
// $WORK/<cli>/proxy.jsonl) with tool_choice "required", a small max token count and the same
// stream setting, against a running `warmctx serve`, and checks that a tool call comes back
// parsed, that it names one of the request's tools, and that a streamed answer is well formed.
// Then, for the Responses API, it sends Codex's next turn: the same input plus the
// function_call item and a function_call_output, as Codex would after running the tool.
//
//   node bench/trials/agent-clis-replay.mjs [WORK=/tmp/agent-clis] [PORT=18400]
import fs from 'node:fs';
import path from 'node:path';

const work = process.argv[2] || '/tmp/agent-clis';
const port = process.argv[3] || '18400';
const base = `http://127.0.0.1:${port}`;

function parseSSE(text) {
  const events = [];
  let bad = 0;
  for (const block of text.split('\n\n')) {
    const data = block.split('\n').filter(l => l.startsWith('data: ')).map(l => l.slice(6)).join('\n');
    if (!data) continue;
    if (data === '[DONE]') { events.push('[DONE]'); continue; }
    try { events.push(JSON.parse(data)); } catch { bad++; }
  }
  return { events, bad };
}

function callsFrom(route, body, text) {
  const calls = [];
  if (!body.stream) {
    const j = JSON.parse(text);
    if (route.includes('/responses')) for (const it of j.output || []) { if (it.type === 'function_call') calls.push({ name: it.name, arguments: it.arguments, call_id: it.call_id }); }
    else for (const t of j.choices?.[0]?.message?.tool_calls || []) calls.push({ name: t.function.name, arguments: t.function.arguments, call_id: t.id });
    return { calls, stream: null, final: j };
  }
  const { events, bad } = parseSSE(text);
  let final = null;
  const acc = [];
  for (const e of events) {
    if (e === '[DONE]') continue;
    if (route.includes('/responses')) {
      if (e.type === 'response.output_item.done' && e.item?.type === 'function_call') calls.push({ name: e.item.name, arguments: e.item.arguments, call_id: e.item.call_id });
      if (e.type === 'response.completed' || e.type === 'response.incomplete' || e.type === 'response.failed') final = e.response;
    } else {
      for (const t of e.choices?.[0]?.delta?.tool_calls || []) {
        const k = t.index ?? 0;
        acc[k] = acc[k] || { name: '', arguments: '', call_id: null };
        if (t.id) acc[k].call_id = t.id;
        if (t.function?.name) acc[k].name += t.function.name;
        if (t.function?.arguments) acc[k].arguments += t.function.arguments;
      }
      if (e.warmctx) final = e;
    }
  }
  if (!route.includes('/responses')) calls.push(...acc.filter(Boolean));
  const terminated = route.includes('/responses') ? !!final : events[events.length - 1] === '[DONE]';
  return { calls, stream: { events: events.length, unparsable: bad, terminated }, final };
}

async function post(route, body, headers) {
  const r = await fetch(base + route, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer dummy', ...headers }, body: JSON.stringify(body) });
  return { status: r.status, text: await r.text() };
}

const results = [];
for (const cli of fs.readdirSync(work).filter(d => fs.existsSync(path.join(work, d, 'proxy.jsonl'))).sort()) {
  const recs = fs.readFileSync(path.join(work, cli, 'proxy.jsonl'), 'utf8').split('\n').filter(Boolean).map(l => JSON.parse(l));
  const rec = recs.find(r => r.status === 200 && r.method === 'POST' && /\/(chat\/completions|responses)$/.test(r.url) && JSON.parse(r.body || '{}').tools);
  if (!rec) { results.push({ cli, skipped: 'no successful request with tools was captured' }); continue; }
  const route = rec.url;
  const body = JSON.parse(rec.body);
  body.tool_choice = 'required';
  if (route.includes('/responses')) body.max_output_tokens = 96;
  else { delete body.max_completion_tokens; body.max_tokens = 96; }
  const toolNames = (body.tools || []).map(t => t.name || t.function?.name);
  const t0 = Date.now();
  const r = await post(route, body, {});
  const out = { cli, route, stream: !!body.stream, status: r.status, tools_sent: toolNames, ms: Date.now() - t0 };
  if (r.status !== 200) { out.error = r.text.slice(0, 800); results.push(out); continue; }
  try {
    const { calls, stream, final } = callsFrom(route, body, r.text);
    out.tool_calls = calls;
    out.calls_name_a_sent_tool = calls.length > 0 && calls.every(c => toolNames.includes(c.name));
    out.arguments_are_json = calls.every(c => { try { JSON.parse(c.arguments); return true; } catch { return false; } });
    out.stream_check = stream;
    out.warmctx = final?.warmctx ? { tokens_reused: final.warmctx.tokens_reused, tokens_prefilled: final.warmctx.tokens_prefilled, result: final.warmctx.result } : null;
    out.status_field = final?.status ?? final?.choices?.[0]?.finish_reason ?? null;
    // Codex's next turn: the call and its output appended to the input.
    if (route.includes('/responses') && calls.length) {
      const next = JSON.parse(rec.body);
      next.max_output_tokens = 16;
      next.input = [...next.input,
        ...calls.map(c => ({ type: 'function_call', name: c.name, arguments: c.arguments, call_id: c.call_id })),
        ...calls.map(c => ({ type: 'function_call_output', call_id: c.call_id, output: 'calc.py\nREADME.md\n' }))];
      const r2 = await post(route, next, {});
      const o2 = { status: r2.status };
      if (r2.status === 200) { const p = callsFrom(route, next, r2.text); o2.stream_check = p.stream; o2.warmctx = p.final?.warmctx ? { tokens_reused: p.final.warmctx.tokens_reused, tokens_prefilled: p.final.warmctx.tokens_prefilled, result: p.final.warmctx.result } : null; }
      else o2.error = r2.text.slice(0, 800);
      out.next_turn_with_function_call_output = o2;
    }
  } catch (e) { out.parse_error = String(e); out.body_head = r.text.slice(0, 500); }
  results.push(out);
}
console.log(JSON.stringify(results, null, 1));
