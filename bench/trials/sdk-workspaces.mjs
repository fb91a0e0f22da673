// A user-style trial: the official openai SDK (npm install openai@4), unmodified, with
// tools; three workspaces whose context is stored server-side; then the server is
// restarted and each workspace chats again with no PUT. See docs/benchmarks.md.
//
//   warmctx serve -m MODEL --port 8090 &
//   PORT=8090 node sdk-workspaces.mjs put       # PUT, wait for the pre-warms, chat
//   PORT=8090 node sdk-workspaces.mjs again     # the same chats again
//   (restart the server)
//   PORT=8090 node sdk-workspaces.mjs restart   # chats with no PUT
import OpenAI from "openai";
const port = process.env.PORT, base = `http://127.0.0.1:${port}`;
const phase = process.argv[2];
const tools = [{type: "function", function: {name: "read_file", description: "Read a file", parameters: {type: "object", properties: {path: {type: "string"}}, required: ["path"]}}}];
async function put(ws, id, kind, content) {
  const r = await fetch(`${base}/v1/workspaces/${ws}/segments/${id}`, {method: "PUT", headers: {"Content-Type": "application/json"}, body: JSON.stringify({kind, content})});
  if (r.status >= 300) throw new Error(`PUT ${ws}/${id}: ${r.status} ${await r.text()}`);
  return r.json();
}
function clientFor(ws) { return new OpenAI({apiKey: "none", baseURL: `${base}/v1/workspaces/${ws}`}); }
const wss = ["alpha", "beta", "gamma"];
if (phase === "put") {
  for (const [i, ws] of wss.entries()) {
    await put(ws, "sys", "system", `You are a coding agent for project ${ws}.`);
    // The tools the SDK will send, stored too (pretty-printed: stored as canonical JSON),
    // so the pre-warm renders them as the first chat does.
    await put(ws, "tools", "tools", JSON.stringify(tools, null, 2));
    let map = ""; for (let k = 0; k < 600 * (i + 1); k++) map += `src/${ws}/file${k}.ts `;
    const r = await put(ws, "map", "repo_map", map);
    console.log(`PUT ${ws}: prewarm=${r.prewarm}`);
  }
  await new Promise(r => setTimeout(r, 3000));
}
for (const ws of wss) {
  const t0 = Date.now();
  const r = await clientFor(ws).chat.completions.create({model: "any", messages: [{role: "user", content: "Which file defines main?"}], tools, max_tokens: 8, temperature: 0});
  const w = r.warmctx;
  console.log(`${phase} ${ws}: ${Date.now() - t0} ms, finish=${r.choices[0].finish_reason}, reused ${w.tokens_reused}/${w.tokens_cacheable} (${w.result}, tier ${w.tier}), prewarm=${w.prewarm ? JSON.stringify({complete: w.prewarm.complete, found_in: w.prewarm.found_in, prefilled: w.prewarm.tokens_prefilled}) : null}`);
  // a streamed follow-up with the tool result in history
  const stream = await clientFor(ws).chat.completions.create({model: "any", stream: true, max_tokens: 8, tools, messages: [
    {role: "user", content: "Which file defines main?"},
    {role: "assistant", content: null, tool_calls: [{id: "c1", type: "function", function: {name: "read_file", arguments: "{\"path\":\"src/main.ts\"}"}}]},
    {role: "tool", tool_call_id: "c1", content: "export function main() {}"}]});
  let n = 0; for await (const ch of stream) n++;
  console.log(`${phase} ${ws}: streamed follow-up, ${n} chunks`);
}
