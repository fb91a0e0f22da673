// The Anthropic SDK against /v1/messages: a tool loop (whole and streamed) with
// tool_use / tool_result blocks, count_tokens, errors in Anthropic's shape, and cache
// usage from the second turn on.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './server.mjs';
import {
  TURNS, MAX_TOKENS, TOOL_DEFS, systemPrompt, QUESTION, checkToolCall, toolResult, checkReuse,
} from './common.mjs';

let server;
let client;

before(async () => {
  server = await startServer();
  client = new Anthropic({ baseURL: server.baseURL.replace(/\/v1$/, ''), apiKey: 'x', maxRetries: 0, timeout: 300_000 });
});

after(async () => { await server?.stop(); });

function tools() {
  return Object.entries(TOOL_DEFS).map(([name, d]) => ({ name, description: d.description, input_schema: d.parameters }));
}

function request(tag, messages, extra = {}) {
  return {
    model: 'claude-local',
    max_tokens: MAX_TOKENS,
    // As Claude Code sends it: an attribution block first, then the system text.
    system: [
      { type: 'text', text: `x-anthropic-billing-header: cc_version=2.1.0.${tag.length.toString(16)}; cc_entrypoint=sdk-cli;` },
      { type: 'text', text: systemPrompt(tag), cache_control: { type: 'ephemeral' } },
    ],
    messages,
    tools: tools(),
    tool_choice: { type: 'any', disable_parallel_tool_use: true },
    temperature: 0,
    metadata: { user_id: `user_0000_account__session_${tag}` },
    ...extra,
  };
}

function usageOf(label, u) {
  for (const k of ['input_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens', 'output_tokens'])
    assert.ok(Number.isInteger(u[k]) && u[k] >= 0, `${label}: usage.${k} = ${u[k]}`);
  return { prompt: u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens, cached: u.cache_read_input_tokens };
}

// A reasoning model's reasoning comes first, as a thinking block (Qwen3.5's answers always
// open one: on the hybrid model every answer has it).
function checkThinking(label, content) {
  const thinking = content.filter((b) => b.type === 'thinking');
  if (thinking.length > 0) {
    assert.equal(content[0].type, 'thinking', `${label}: the thinking block first in ${JSON.stringify(content)}`);
    assert.equal(typeof thinking[0].thinking, 'string', `${label}: thinking text`);
    assert.equal(typeof thinking[0].signature, 'string', `${label}: signature`);
  }
  if ((process.env.WARMCTX_TINY_MODEL ?? '').includes('hybrid'))
    assert.equal(thinking.length, 1, `${label}: one thinking block in ${JSON.stringify(content)}`);
}

// The assistant's content back as the next request's assistant message, and one
// tool_result per tool_use in a user message.
function appendTurn(messages, content) {
  messages.push({ role: 'assistant', content });
  const results = [];
  for (const b of content) {
    if (b.type !== 'tool_use') continue;
    const args = checkToolCall(b.name, b.input);
    results.push({ type: 'tool_result', tool_use_id: b.id, content: toolResult(b.name, args) });
  }
  messages.push({ role: 'user', content: results });
}

test('anthropic messages.create: 5-turn tool loop, tool_choice any', async (t) => {
  const messages = [{ role: 'user', content: QUESTION }];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const r = await client.messages.create(request('anthropic-whole', messages));
    assert.equal(r.type, 'message');
    assert.equal(r.role, 'assistant');
    assert.ok(r.id.startsWith('msg_'), `turn ${turn}: id ${r.id}`);
    assert.equal(r.stop_reason, 'tool_use', `turn ${turn}: stop_reason`);
    const uses = r.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, `turn ${turn}: one tool_use (disable_parallel_tool_use) in ${JSON.stringify(r.content)}`);
    assert.ok(typeof uses[0].id === 'string' && uses[0].id.length > 0, `turn ${turn}: tool_use id`);
    checkThinking(`turn ${turn}`, r.content);
    usages.push(usageOf(`turn ${turn}`, r.usage));
    t.diagnostic(`turn ${turn}: ${uses.map((b) => `${b.name}(${JSON.stringify(b.input)})`).join(', ')}`);
    appendTurn(messages, r.content);
  }
  checkReuse(t, 'anthropic whole', usages);
});

test('anthropic messages.stream: events in order, 5-turn tool loop', async (t) => {
  const messages = [{ role: 'user', content: QUESTION }];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const events = [];
    const stream = client.messages.stream(request('anthropic-stream', messages));
    stream.on('streamEvent', (e) => events.push(e.type));
    const r = await stream.finalMessage();
    assert.equal(events[0], 'message_start', `turn ${turn}: first event ${events[0]}`);
    assert.equal(events.at(-1), 'message_stop', `turn ${turn}: last event ${events.at(-1)}`);
    assert.equal(events.at(-2), 'message_delta', `turn ${turn}: message_delta before message_stop`);
    const starts = events.filter((e) => e === 'content_block_start').length;
    const stops = events.filter((e) => e === 'content_block_stop').length;
    assert.ok(starts >= 1 && starts === stops, `turn ${turn}: ${starts} block starts, ${stops} stops`);
    assert.equal(r.stop_reason, 'tool_use', `turn ${turn}: stop_reason`);
    const uses = r.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1, `turn ${turn}: ${JSON.stringify(r.content)}`);
    checkThinking(`turn ${turn} (streamed)`, r.content);
    usages.push(usageOf(`turn ${turn}`, r.usage));
    appendTurn(messages, r.content);
  }
  checkReuse(t, 'anthropic stream', usages);
});

test('anthropic: another session with another attribution suffix reuses the tools and the system text', async (t) => {
  const a = await client.messages.create(request('anthropic-sess', [{ role: 'user', content: QUESTION }]));
  const other = request('anthropic-sess', [{ role: 'user', content: 'And the weather in Rome?' }]);
  other.system[0].text = 'x-anthropic-billing-header: cc_version=2.1.0.f3e; cc_entrypoint=sdk-cli;';
  other.metadata = { user_id: 'user_0000_account__session_another' };
  const b = await client.messages.create(other);
  const ua = usageOf('first', a.usage);
  const ub = usageOf('second', b.usage);
  t.diagnostic(`first session: prompt ${ua.prompt}; another session: prompt ${ub.prompt}, cached ${ub.cached}`);
  assert.ok(ub.cached >= 0.8 * ua.prompt, `the second session reused ${ub.cached} of ${ua.prompt} tokens`);
});

test('anthropic messages.countTokens', async () => {
  const r = await client.messages.countTokens({
    model: 'claude-local', system: systemPrompt('count'), messages: [{ role: 'user', content: QUESTION }], tools: tools(),
  });
  assert.ok(Number.isInteger(r.input_tokens) && r.input_tokens > 100, `input_tokens ${r.input_tokens}`);
});

test('anthropic errors: shape, status and type', async () => {
  await assert.rejects(
    client.messages.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error'
      && /max_tokens/.test(e.error.error.message),
  );
  await assert.rejects(
    client.messages.create({
      model: 'm', max_tokens: 4,
      messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }],
    }),
    (e) => e.status === 400 && /image blocks are not supported/.test(e.error?.error?.message ?? ''),
  );
});
