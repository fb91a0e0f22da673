// The openai SDK against /v1/chat/completions: a tool loop (plain and streamed) and
// response_format json_schema.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';
import {
  TURNS, MAX_TOKENS, systemPrompt, QUESTION, chatTools, checkToolCall, checkValue, toolResult, checkReuse,
} from './common.mjs';

let server;
let client;

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'x', maxRetries: 0, timeout: 300_000 });
});

after(async () => { await server?.stop(); });

function request(messages, key, extra = {}) {
  return {
    model: 'tiny',
    messages,
    tools: chatTools(),
    tool_choice: 'required',
    parallel_tool_calls: false,
    temperature: 0,
    max_tokens: MAX_TOKENS,
    prompt_cache_key: key,
    ...extra,
  };
}

// Appends the assistant turn and one tool result per call.
function appendTurn(messages, toolCalls) {
  messages.push({ role: 'assistant', content: null, tool_calls: toolCalls });
  for (const tc of toolCalls) {
    const args = checkToolCall(tc.function.name, tc.function.arguments);
    messages.push({ role: 'tool', tool_call_id: tc.id, content: toolResult(tc.function.name, args) });
  }
}

test('openai chat.completions: 5-turn tool loop, tool_choice required', async (t) => {
  const messages = [{ role: 'system', content: systemPrompt('openai-chat') }, { role: 'user', content: QUESTION }];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const r = await client.chat.completions.create(request(messages, 'sdk-openai-chat'));
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', `turn ${turn}: finish_reason`);
    const calls = choice.message.tool_calls;
    assert.ok(Array.isArray(calls) && calls.length >= 1, `turn ${turn}: no tool_calls in ${JSON.stringify(choice.message)}`);
    for (const tc of calls) {
      assert.equal(tc.type, 'function');
      assert.ok(typeof tc.id === 'string' && tc.id.length > 0, `turn ${turn}: tool call id`);
    }
    assert.ok(r.usage?.prompt_tokens_details, `turn ${turn}: usage.prompt_tokens_details missing`);
    usages.push({ prompt: r.usage.prompt_tokens, cached: r.usage.prompt_tokens_details.cached_tokens });
    t.diagnostic(`turn ${turn}: ${calls.map((c) => `${c.function.name}(${JSON.stringify(JSON.parse(c.function.arguments))})`).join(', ')}`);
    appendTurn(messages, calls);
  }
  checkReuse(t, 'openai chat.completions', usages);
});

test('openai chat.completions: 5-turn tool loop, streamed', async (t) => {
  const messages = [{ role: 'system', content: systemPrompt('openai-chat-stream') }, { role: 'user', content: QUESTION }];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const stream = await client.chat.completions.create(request(messages, 'sdk-openai-chat-stream', {
      stream: true, stream_options: { include_usage: true },
    }));
    const calls = [];
    let finish = null;
    let usage = null;
    let content = '';
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      if (choice.finish_reason) finish = choice.finish_reason;
      if (choice.delta?.content) content += choice.delta.content;
      for (const d of choice.delta?.tool_calls ?? []) {
        assert.ok(Number.isInteger(d.index), `turn ${turn}: tool call delta without an index: ${JSON.stringify(d)}`);
        if (!calls[d.index]) {
          assert.ok(d.id, `turn ${turn}: the first delta of tool call ${d.index} has no id: ${JSON.stringify(d)}`);
          assert.ok(d.function?.name, `turn ${turn}: the first delta of tool call ${d.index} has no name`);
          calls[d.index] = { id: d.id, type: 'function', function: { name: d.function.name, arguments: '' } };
        }
        calls[d.index].function.arguments += d.function?.arguments ?? '';
      }
    }
    assert.equal(finish, 'tool_calls', `turn ${turn}: finish_reason`);
    assert.equal(content, '', `turn ${turn}: content next to the tool calls`);
    assert.ok(calls.length >= 1 && calls.every(Boolean), `turn ${turn}: no tool calls streamed`);
    assert.ok(usage?.prompt_tokens_details, `turn ${turn}: no usage chunk with prompt_tokens_details`);
    usages.push({ prompt: usage.prompt_tokens, cached: usage.prompt_tokens_details.cached_tokens });
    t.diagnostic(`turn ${turn}: ${calls.map((c) => `${c.function.name}(${JSON.stringify(JSON.parse(c.function.arguments))})`).join(', ')}`);
    appendTurn(messages, calls);
  }
  checkReuse(t, 'openai chat.completions stream', usages);
});

test('openai chat.completions: response_format json_schema', async (t) => {
  const schema = {
    type: 'object',
    properties: {
      city: { type: 'string', enum: ['Paris', 'Rome'] },
      sunny: { type: 'boolean' },
    },
    required: ['city', 'sunny'],
    additionalProperties: false,
  };
  const r = await client.chat.completions.create({
    model: 'tiny',
    messages: [{ role: 'user', content: 'Which city is sunny? Answer in JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema } },
    temperature: 0,
    max_tokens: MAX_TOKENS,
    prompt_cache_key: 'sdk-openai-chat-json',
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'stop');
  let value;
  try { value = JSON.parse(choice.message.content); } catch (e) {
    assert.fail(`content does not parse: ${JSON.stringify(choice.message.content)} (${e.message})`);
  }
  checkValue(schema, value);
  t.diagnostic(`json_schema content: ${JSON.stringify(value)}`);
});
