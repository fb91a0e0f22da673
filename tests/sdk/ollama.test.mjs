// The ollama client library against the Ollama API (/api/chat, /api/generate, /api/tags,
// /api/show, /api/ps, /api/version): whole and streamed answers, a conversation with tool
// calls in its history that reuses its prompt turn after turn, a JSON schema format, and
// errors in Ollama's shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Ollama } from 'ollama';
import { startServer } from './server.mjs';
import { TURNS, systemPrompt, QUESTION, chatTools, checkValue, toolResult, checkReuse } from './common.mjs';

let server;
let ollama;
let model;

before(async () => {
  server = await startServer();
  ollama = new Ollama({ host: server.url });
  const { models } = await ollama.list();
  model = models[0].name;
});

after(async () => { await server?.stop(); });

// Ollama's answers as its documentation shows them: every key with a value of its type.
const SHAPES = JSON.parse(readFileSync(new URL('./ollama-shapes.json', import.meta.url), 'utf8'));
function sameShape(example, got, where) {
  if (example === null) return;
  const type = (v) => (v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v);
  assert.equal(type(got), type(example), `${where}: ${JSON.stringify(got)?.slice(0, 120)} is not a ${type(example)}`);
  if (Array.isArray(example)) { if (example.length && got.length) sameShape(example[0], got[0], `${where}[0]`); return; }
  if (type(example) !== 'object') return;
  for (const [k, v] of Object.entries(example)) {
    assert.ok(Object.hasOwn(got, k), `${where}: no '${k}' in ${JSON.stringify(got).slice(0, 200)}`);
    sameShape(v, got[k], `${where}.${k}`);
  }
}
async function raw(path, body) {
  const r = await fetch(server.url + path, body === undefined ? {} : { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200, `${path}: ${r.status}`);
  return (await r.text()).split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

test('ollama answers have the shapes of Ollama\'s own, whole and line by line', async () => {
  const messages = [{ role: 'user', content: 'Why is the sky blue?' }];
  const [chat] = await raw('/api/chat', { model, messages, stream: false, options: OPTIONS });
  sameShape(SHAPES.chat, chat, 'chat');
  const lines = await raw('/api/chat', { model, messages, options: OPTIONS });
  for (const l of lines.slice(0, -1)) sameShape(SHAPES.chat_chunk, l, 'chat line');
  sameShape(SHAPES.chat_last, lines.at(-1), 'chat last line');
  sameShape(SHAPES.chat_load, (await raw('/api/chat', { model, messages: [] }))[0], 'chat load');
  sameShape(SHAPES.generate, (await raw('/api/generate', { model, prompt: 'Hi', stream: false, options: OPTIONS }))[0], 'generate');
  sameShape(SHAPES.generate_load, (await raw('/api/generate', { model }))[0], 'generate load');
  sameShape(SHAPES.tags, (await raw('/api/tags'))[0], 'tags');
  sameShape(SHAPES.show, (await raw('/api/show', { model }))[0], 'show');
  sameShape(SHAPES.ps, (await raw('/api/ps'))[0], 'ps');
  sameShape(SHAPES.version, (await raw('/api/version'))[0], 'version');
});

const OPTIONS = { temperature: 0, num_predict: 24 };

// The prompt's tokens, and of them those reused, as the answer's warmctx object says.
function usageOf(r) {
  assert.ok(r.warmctx, `no warmctx object in ${JSON.stringify(r).slice(0, 300)}`);
  return { prompt: r.warmctx.tokens_reused + r.warmctx.tokens_prefilled, cached: r.warmctx.tokens_reused };
}

function checkDone(r, where) {
  assert.equal(r.done, true, `${where}: done`);
  assert.ok(['stop', 'length'].includes(r.done_reason), `${where}: done_reason ${r.done_reason}`);
  for (const k of ['total_duration', 'prompt_eval_duration', 'eval_duration', 'eval_count', 'prompt_eval_count'])
    assert.ok(Number.isInteger(r[k]) && r[k] >= 0, `${where}: ${k} = ${r[k]}`);
  assert.ok(r.eval_count <= OPTIONS.num_predict, `${where}: eval_count ${r.eval_count}`);
  assert.ok(!Number.isNaN(Date.parse(r.created_at)), `${where}: created_at ${r.created_at}`);
}

test('ollama list, show, ps, version describe the one model served', async () => {
  const { models } = await ollama.list();
  assert.equal(models.length, 1);
  assert.match(models[0].name, /:latest$|:/);
  assert.equal(models[0].details.format, 'gguf');
  assert.ok(models[0].size > 0, 'size');
  const info = await ollama.show({ model });
  assert.ok(typeof info.template === 'string' && info.template.length > 0, 'template');
  assert.ok(info.capabilities.includes('completion'), JSON.stringify(info.capabilities));
  assert.ok(info.model_info['general.architecture'], JSON.stringify(info.model_info));
  await assert.rejects(ollama.show({ model: 'no-such-model' }),
    (e) => e.status_code === 404 && /not found/.test(e.error), 'an unknown model is 404');
  const ps = await ollama.ps();
  assert.equal(ps.models[0].name, model);
  assert.ok(ps.models[0].size > 0, 'loaded: the weights and the KV streams');
  assert.equal(ps.models[0].size_vram, 0, 'on the CPU nothing is on a GPU');
  assert.ok(ps.models[0].context_length > 0);
  const v = await ollama.version();
  assert.match(v.version, /^\d+\.\d+\.\d+$/);
});

test('ollama chat: an agent conversation of tool calls reuses its prompt every turn', async (t) => {
  // One question, then an agent's loop: each turn the model's answer (checked), then the
  // history the agent sends next: a tool call and its result (fixed, so that the
  // conversation does not depend on a random model's text).
  const tools = chatTools().map((x) => ({ type: 'function', function: { ...x.function, strict: undefined } }));
  const messages = [{ role: 'system', content: systemPrompt('ollama-chat') }, { role: 'user', content: QUESTION }];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const r = await ollama.chat({ model, messages, tools, options: OPTIONS, stream: false });
    checkDone(r, `turn ${turn}`);
    assert.equal(r.model, model);
    assert.equal(r.message.role, 'assistant');
    assert.equal(typeof r.message.content, 'string');
    for (const c of r.message.tool_calls ?? []) {
      assert.equal(typeof c.function.name, 'string');
      assert.equal(typeof c.function.arguments, 'object', 'arguments are an object');
    }
    usages.push(usageOf(r));
    const args = { city: turn % 2 ? 'Paris' : 'Rome', celsius: true };
    messages.push({ role: 'assistant', content: '', tool_calls: [{ function: { name: 'get_weather', arguments: args } }] });
    messages.push({ role: 'tool', tool_name: 'get_weather', content: toolResult('get_weather', args) });
  }
  checkReuse(t, 'ollama chat', usages);
});

test('ollama chat streamed: the lines add up to the whole answer', async () => {
  const messages = [{ role: 'system', content: systemPrompt('ollama-stream') }, { role: 'user', content: QUESTION }];
  const whole = await ollama.chat({ model, messages, options: OPTIONS, stream: false });
  let content = '';
  let thinking = '';
  let last = null;
  let n = 0;
  for await (const part of await ollama.chat({ model, messages, options: OPTIONS, stream: true })) {
    n++;
    if (part.done) { last = part; continue; }
    assert.equal(part.message.role, 'assistant');
    content += part.message.content;
    thinking += part.message.thinking ?? '';
  }
  assert.ok(last, 'a last line with done: true');
  checkDone(last, 'streamed');
  assert.ok(n >= 1, `${n} lines`);
  assert.equal(content, whole.message.content);
  assert.equal(thinking, whole.message.thinking ?? '');
  assert.equal(last.eval_count, whole.eval_count);
});

// A model whose answers reason first (its template opens a reasoning block) cannot be
// held to finish its reasoning within a test's tokens on random weights: the plain model
// runs this.
test('ollama chat with a JSON schema format answers JSON that follows it', async (t) => {
  if ((await ollama.show({ model })).capabilities.includes('thinking')) return t.skip('the model reasons first');
  const schema = {
    type: 'object',
    properties: { city: { type: 'string', enum: ['Paris', 'Rome'] }, umbrella: { type: 'boolean' } },
    required: ['city', 'umbrella'],
    additionalProperties: false,
  };
  const r = await ollama.chat({
    model,
    messages: [{ role: 'user', content: 'Paris or Rome, and do I need an umbrella? Answer in JSON.' }],
    format: schema,
    options: { temperature: 0, num_predict: 64 },
  });
  checkDone({ ...r, eval_count: 0 }, 'format');
  assert.equal(r.done_reason, 'stop', `cut short: ${JSON.stringify(r.message)}`);
  checkValue(schema, JSON.parse(r.message.content));
});

test('ollama generate: whole, streamed, raw, and an empty prompt that only loads', async () => {
  const g = await ollama.generate({ model, prompt: 'Name a city.', system: 'Be terse.', options: OPTIONS });
  checkDone(g, 'generate');
  assert.equal(typeof g.response, 'string');
  let text = '';
  let last = null;
  for await (const part of await ollama.generate({ model, prompt: 'Name a city.', system: 'Be terse.', options: OPTIONS, stream: true })) {
    if (part.done) last = part;
    else text += part.response;
  }
  checkDone(last, 'generate streamed');
  assert.equal(text, g.response);
  const raw = await ollama.generate({ model, prompt: 'The capital of France is', raw: true, options: OPTIONS });
  checkDone(raw, 'raw');
  assert.equal(raw.warmctx.tokens_prefilled + raw.warmctx.tokens_reused <= 16, true, 'a raw prompt has no template around it');
  const load = await ollama.generate({ model, prompt: '' });
  assert.equal(load.done, true);
  assert.equal(load.done_reason, 'load');
});

test('ollama errors name the Ollama field, and the server stays up', async () => {
  await assert.rejects(
    ollama.chat({ model, messages: [{ role: 'user', content: 'hi', images: ['aGk='] }] }),
    (e) => e.status_code === 400 && /images/.test(e.error), 'images');
  await assert.rejects(
    ollama.chat({ model, messages: [{ role: 'user', content: 'hi' }], options: { temperature: 'hot' } }),
    (e) => e.status_code === 400 && /options\.temperature/.test(e.error), 'options.temperature');
  await assert.rejects(
    ollama.generate({ model, prompt: 'hi', context: [1, 2, 3] }),
    (e) => e.status_code === 400 && /context/.test(e.error), 'context');
  const stream = await ollama.chat({ model, messages: [{ role: 'user', content: 'Tell a long story.' }], stream: true, options: { num_predict: 2000 } });
  for await (const part of stream) { if (!part.done) { stream.abort(); break; } }
  const after = await ollama.chat({ model, messages: [{ role: 'user', content: 'hi' }], options: OPTIONS, stream: false });
  checkDone(after, 'after an abort');
});
