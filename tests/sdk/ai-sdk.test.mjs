// The Vercel AI SDK through @ai-sdk/openai-compatible: generateText with a 5-step tool
// loop (toolChoice required), streamText, generateObject.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText, generateObject, tool, stepCountIs } from 'ai';
import { z } from 'zod';
import { startServer } from './server.mjs';
import { TURNS, MAX_TOKENS, systemPrompt, QUESTION, checkToolCall, checkValue, toolResult, checkReuse } from './common.mjs';

let server;
let model;

before(async () => {
  server = await startServer();
  const provider = createOpenAICompatible({
    name: 'warmctx',
    baseURL: server.baseURL,
    apiKey: 'x',
    includeUsage: true,
    supportsStructuredOutputs: true,
  });
  model = provider.chatModel('tiny');
});

after(async () => { await server?.stop(); });

// The same tools as common.mjs's, as zod schemas; execute returns the tool's result.
function tools() {
  return {
    get_weather: tool({
      description: 'Get the current weather in a city.',
      inputSchema: z.object({ city: z.enum(['Paris', 'Rome']), celsius: z.boolean() }).strict(),
      execute: async (input) => JSON.parse(toolResult('get_weather', input)),
    }),
    get_time: tool({
      description: 'Get the current time in a time zone.',
      inputSchema: z.object({ zone: z.enum(['UTC', 'CET']) }).strict(),
      execute: async (input) => JSON.parse(toolResult('get_time', input)),
    }),
  };
}

// Body fields for the provider ('warmctx' provider options go into the request body).
function providerOptions(key) {
  return { warmctx: { prompt_cache_key: key, parallel_tool_calls: false } };
}

function checkStepCalls(turn, calls) {
  assert.ok(calls.length >= 1, `step ${turn}: no tool calls`);
  for (const c of calls) {
    assert.ok(!c.invalid, `step ${turn}: invalid tool call ${JSON.stringify(c)}`);
    checkToolCall(c.toolName, c.input);
  }
}

test('ai-sdk generateText: 5-step tool loop, toolChoice required', async (t) => {
  const result = await generateText({
    model,
    system: systemPrompt('ai-sdk-generate'),
    prompt: QUESTION,
    tools: tools(),
    toolChoice: 'required',
    stopWhen: stepCountIs(TURNS),
    temperature: 0,
    maxOutputTokens: MAX_TOKENS,
    maxRetries: 0,
    providerOptions: providerOptions('sdk-ai-sdk-generate'),
  });
  assert.equal(result.steps.length, TURNS);
  const usages = [];
  for (const [i, step] of result.steps.entries()) {
    assert.equal(step.finishReason, 'tool-calls', `step ${i + 1}: finishReason`);
    checkStepCalls(i + 1, step.toolCalls);
    assert.equal(step.toolResults.length, step.toolCalls.length, `step ${i + 1}: tool results`);
    for (const part of step.content) assert.notEqual(part.type, 'tool-error', `step ${i + 1}: ${JSON.stringify(part)}`);
    t.diagnostic(`step ${i + 1}: ${step.toolCalls.map((c) => `${c.toolName}(${JSON.stringify(c.input)})`).join(', ')}`);
    usages.push({ prompt: step.usage.inputTokens, cached: step.usage.inputTokenDetails?.cacheReadTokens });
  }
  checkReuse(t, 'ai-sdk generateText', usages);
});

test('ai-sdk streamText: toolChoice required', async (t) => {
  const errors = [];
  const result = streamText({
    model,
    system: systemPrompt('ai-sdk-stream'),
    prompt: QUESTION,
    tools: tools(),
    toolChoice: 'required',
    temperature: 0,
    maxOutputTokens: MAX_TOKENS,
    maxRetries: 0,
    providerOptions: providerOptions('sdk-ai-sdk-stream'),
    onError: ({ error }) => { errors.push(error); },
  });
  const parts = [];
  for await (const part of result.fullStream) {
    parts.push(part.type);
    if (part.type === 'error') errors.push(part.error);
  }
  assert.deepEqual(errors.map(String), [], 'stream errors');
  assert.ok(parts.includes('tool-input-delta'), `parts: ${[...new Set(parts)].join(' ')}`);
  const calls = await result.toolCalls;
  checkStepCalls(1, calls);
  assert.equal((await result.toolResults).length, calls.length);
  assert.equal(await result.finishReason, 'tool-calls');
  const usage = await result.usage;
  assert.ok(usage.inputTokens > 0, `usage ${JSON.stringify(usage)}`);
  t.diagnostic(`streamText: ${calls.map((c) => `${c.toolName}(${JSON.stringify(c.input)})`).join(', ')}; usage ${JSON.stringify(usage)}`);
});

test('ai-sdk generateObject: zod schema (enum + boolean) via json_schema', async (t) => {
  const schema = z.object({ city: z.enum(['Paris', 'Rome']), sunny: z.boolean() });
  const result = await generateObject({
    model,
    schema,
    schemaName: 'answer',
    prompt: 'Which city is sunny? Answer in JSON.',
    temperature: 0,
    maxOutputTokens: MAX_TOKENS,
    maxRetries: 0,
    providerOptions: { warmctx: { prompt_cache_key: 'sdk-ai-sdk-object' } },
  });
  const body = typeof result.request.body === 'string' ? JSON.parse(result.request.body) : result.request.body;
  assert.equal(body.response_format?.type, 'json_schema', `response_format sent: ${JSON.stringify(body.response_format)}`);
  checkValue({
    type: 'object',
    properties: { city: { type: 'string', enum: ['Paris', 'Rome'] }, sunny: { type: 'boolean' } },
    required: ['city', 'sunny'],
    additionalProperties: false,
  }, result.object);
  t.diagnostic(`generateObject: ${JSON.stringify(result.object)}`);
});
