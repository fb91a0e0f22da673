// LangChain's ChatOpenAI (Chat Completions): bindTools with tool_choice required, a 5-turn
// loop with ToolMessage results, and .stream() once.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, SystemMessage, ToolMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';
import { startServer } from './server.mjs';
import { TURNS, MAX_TOKENS, systemPrompt, QUESTION, checkToolCall, toolResult, checkReuse } from './common.mjs';

let server;

before(async () => { server = await startServer(); });
after(async () => { await server?.stop(); });

const tools = [
  tool(async (input) => toolResult('get_weather', input), {
    name: 'get_weather',
    description: 'Get the current weather in a city.',
    schema: z.object({ city: z.enum(['Paris', 'Rome']), celsius: z.boolean() }),
  }),
  tool(async (input) => toolResult('get_time', input), {
    name: 'get_time',
    description: 'Get the current time in a time zone.',
    schema: z.object({ zone: z.enum(['UTC', 'CET']) }),
  }),
];

function chat(key) {
  const llm = new ChatOpenAI({
    model: 'tiny',
    apiKey: 'x',
    configuration: { baseURL: server.baseURL },
    temperature: 0,
    maxTokens: MAX_TOKENS,
    maxRetries: 0,
    promptCacheKey: key,
  });
  return llm.bindTools(tools, { tool_choice: 'required', parallel_tool_calls: false, strict: true });
}

test('langchain ChatOpenAI: 5-turn tool loop, tool_choice required', async (t) => {
  const llm = chat('sdk-langchain');
  const messages = [new SystemMessage(systemPrompt('langchain')), new HumanMessage(QUESTION)];
  const usages = [];
  for (let turn = 1; turn <= TURNS; turn++) {
    const ai = await llm.invoke(messages);
    assert.deepEqual(ai.invalid_tool_calls ?? [], [], `turn ${turn}: invalid tool calls`);
    assert.ok(ai.tool_calls?.length >= 1, `turn ${turn}: no tool_calls in ${JSON.stringify(ai)}`);
    const u = ai.usage_metadata;
    assert.ok(u, `turn ${turn}: no usage_metadata`);
    usages.push({ prompt: u.input_tokens, cached: u.input_token_details?.cache_read });
    messages.push(ai);
    for (const call of ai.tool_calls) {
      checkToolCall(call.name, call.args);
      assert.ok(call.id, `turn ${turn}: tool call without an id`);
      const tl = tools.find((x) => x.name === call.name);
      messages.push(new ToolMessage({ content: await tl.invoke(call.args), tool_call_id: call.id }));
    }
    t.diagnostic(`turn ${turn}: ${ai.tool_calls.map((c) => `${c.name}(${JSON.stringify(c.args)})`).join(', ')}`);
  }
  checkReuse(t, 'langchain invoke', usages);
});

test('langchain ChatOpenAI: .stream() with tools', async (t) => {
  const llm = chat('sdk-langchain-stream');
  const stream = await llm.stream([new SystemMessage(systemPrompt('langchain-stream')), new HumanMessage(QUESTION)]);
  let full;
  let chunks = 0;
  for await (const chunk of stream) {
    full = full === undefined ? chunk : full.concat(chunk);
    chunks++;
  }
  assert.ok(full, 'no chunks');
  assert.ok(full.tool_call_chunks?.length >= 1, `no tool_call_chunks after ${chunks} chunks`);
  assert.deepEqual(full.invalid_tool_calls ?? [], [], 'invalid tool calls');
  assert.ok(full.tool_calls?.length >= 1, 'no tool_calls');
  for (const call of full.tool_calls) checkToolCall(call.name, call.args);
  assert.ok(full.usage_metadata?.input_tokens > 0, `usage_metadata ${JSON.stringify(full.usage_metadata)}`);
  t.diagnostic(`stream (${chunks} chunks): ${full.tool_calls.map((c) => `${c.name}(${JSON.stringify(c.args)})`).join(', ')}`);
});
