// The openai SDK against /v1/responses: a tool loop with function_call and
// function_call_output items, plain and streamed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';
import {
  TURNS, MAX_TOKENS, systemPrompt, QUESTION, responsesTools, checkToolCall, toolResult, checkReuse,
} from './common.mjs';

let server;
let client;

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'x', maxRetries: 0, timeout: 300_000 });
});

after(async () => { await server?.stop(); });

function request(input, tag, extra = {}) {
  return {
    model: 'tiny',
    instructions: systemPrompt(tag),
    input,
    tools: responsesTools(),
    tool_choice: 'required',
    parallel_tool_calls: false,
    store: false,
    temperature: 0,
    max_output_tokens: MAX_TOKENS,
    prompt_cache_key: `sdk-${tag}`,
    ...extra,
  };
}

// Checks a completed response and appends its function calls and their outputs to input.
function takeTurn(t, turn, response, input, usages) {
  assert.equal(response.object, 'response');
  assert.equal(response.status, 'completed', `turn ${turn}: status ${response.status} (${JSON.stringify(response.incomplete_details)})`);
  const calls = response.output.filter((item) => item.type === 'function_call');
  assert.ok(calls.length >= 1, `turn ${turn}: no function_call in ${JSON.stringify(response.output)}`);
  // A reasoning model's reasoning is a reasoning item first (Qwen3.5's answers always
  // have one), sent back with the calls as Codex does (the server skips it).
  const reasoning = response.output.filter((item) => item.type === 'reasoning');
  if (reasoning.length > 0) {
    assert.equal(response.output[0].type, 'reasoning', `turn ${turn}: the reasoning item first`);
    assert.equal(typeof reasoning[0].content?.[0]?.text, 'string', `turn ${turn}: ${JSON.stringify(reasoning[0])}`);
    input.push(reasoning[0]);
  }
  if ((process.env.WARMCTX_TINY_MODEL ?? '').includes('hybrid'))
    assert.equal(reasoning.length, 1, `turn ${turn}: one reasoning item in ${JSON.stringify(response.output)}`);
  assert.ok(response.usage?.input_tokens_details, `turn ${turn}: usage.input_tokens_details missing`);
  usages.push({ prompt: response.usage.input_tokens, cached: response.usage.input_tokens_details.cached_tokens });
  const shown = [];
  for (const call of calls) {
    assert.ok(typeof call.call_id === 'string' && call.call_id.length > 0, `turn ${turn}: call_id`);
    const args = checkToolCall(call.name, call.arguments);
    shown.push(`${call.name}(${JSON.stringify(args)})`);
    input.push(call); // the output item as it came, as SDK users do
    input.push({ type: 'function_call_output', call_id: call.call_id, output: toolResult(call.name, args) });
  }
  t.diagnostic(`turn ${turn}: ${shown.join(', ')}`);
}

test('openai responses: 5-turn tool loop, tool_choice required', async (t) => {
  const input = [{ role: 'user', content: QUESTION }];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const r = await client.responses.create(request(input, 'openai-responses'));
    takeTurn(t, turn, r, input, usages);
  }
  checkReuse(t, 'openai responses', usages);
});

test('openai responses: 5-turn tool loop, streamed', async (t) => {
  const input = [{ role: 'user', content: QUESTION }];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const stream = await client.responses.create(request(input, 'openai-responses-stream', { stream: true }));
    const types = [];
    let completed = null;
    let argsDelta = '';
    let argsDone = null;
    let lastSeq = -1;
    for await (const event of stream) {
      types.push(event.type);
      if (typeof event.sequence_number === 'number') {
        assert.ok(event.sequence_number > lastSeq, `turn ${turn}: sequence_number ${event.sequence_number} after ${lastSeq}`);
        lastSeq = event.sequence_number;
      }
      if (event.type === 'response.function_call_arguments.delta') argsDelta += event.delta;
      if (event.type === 'response.function_call_arguments.done') argsDone = event.arguments;
      if (event.type === 'response.completed') completed = event.response;
      assert.notEqual(event.type, 'error', `turn ${turn}: error event ${JSON.stringify(event)}`);
      assert.notEqual(event.type, 'response.failed', `turn ${turn}: ${JSON.stringify(event)}`);
    }
    assert.equal(types[0], 'response.created', `turn ${turn}: events ${types.join(' ')}`);
    assert.ok(completed, `turn ${turn}: no response.completed event in ${types.join(' ')}`);
    assert.ok(types.includes('response.output_item.added') && types.includes('response.output_item.done'),
      `turn ${turn}: events ${[...new Set(types)].join(' ')}`);
    const call = completed.output.find((item) => item.type === 'function_call');
    assert.ok(call, `turn ${turn}: no function_call in the completed response`);
    assert.equal(argsDone, call.arguments, `turn ${turn}: function_call_arguments.done differs from the output item`);
    assert.equal(argsDelta, call.arguments, `turn ${turn}: the argument deltas do not add up to the arguments`);
    takeTurn(t, turn, completed, input, usages);
  }
  checkReuse(t, 'openai responses stream', usages);
});
