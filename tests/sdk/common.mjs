// Tools, schema checks and the reuse check shared by the SDK tests.
import assert from 'node:assert/strict';

export const TURNS = 5;
export const MAX_TOKENS = 200;
export const REUSE_MIN = 0.95;

// Short arguments: enums and booleans only.
export const TOOL_DEFS = {
  get_weather: {
    description: 'Get the current weather in a city.',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', enum: ['Paris', 'Rome'] },
        celsius: { type: 'boolean' },
      },
      required: ['city', 'celsius'],
      additionalProperties: false,
    },
  },
  get_time: {
    description: 'Get the current time in a time zone.',
    parameters: {
      type: 'object',
      properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } },
      required: ['zone'],
      additionalProperties: false,
    },
  },
};

// The system prompt of a small agent. `tag` makes each test's conversation its own, so that
// the reuse a test measures is its own conversation's and not another test's. The server
// does not cache the final user turn of a prompt (it caches what precedes it, and from the
// next turn on the whole history), so on the second turn the first user message is
// prefilled again: it has to stay under 5% of the prompt for the reuse check below.
export function systemPrompt(tag) {
  return [
    `You are a travel assistant (session ${tag}). You help the user plan a short city trip.`,
    'You can look up the current weather in a city and the current time in a time zone.',
    'Rules:',
    '- Always answer by calling exactly one of the tools; never answer in plain text.',
    '- Call get_weather with the city the user asks about; set celsius to true unless the user asks for Fahrenheit.',
    '- Call get_time with the time zone of the city: CET for Paris and Rome, UTC otherwise.',
    '- After a tool result, decide whether another tool call is needed, and call it.',
    '- Keep the arguments exactly as the tool schemas define them: only the listed keys, only the listed values.',
    '- Do not invent cities or time zones. Do not repeat a call whose result you already have unless the user asks again.',
    '- The user reads the answers on a phone: keep them short and plain, without tables or markdown.',
    'Context: the user is travelling this week between Paris and Rome by train and wants to know',
    'whether to pack an umbrella and when the shops close, so weather and local time matter most.',
  ].join('\n');
}
export const QUESTION = 'What is the weather in Paris and what time is it in CET?';

// Chat Completions format.
export function chatTools() {
  return Object.entries(TOOL_DEFS).map(([name, d]) => ({
    type: 'function',
    function: { name, description: d.description, parameters: d.parameters, strict: true },
  }));
}

// Responses API format.
export function responsesTools() {
  return Object.entries(TOOL_DEFS).map(([name, d]) => ({
    type: 'function', name, description: d.description, parameters: d.parameters, strict: true,
  }));
}

// A JSON schema check enough for these schemas: object, required, additionalProperties false,
// string enums, booleans.
export function checkValue(schema, value, where = '$') {
  if (schema.type === 'object') {
    assert.ok(value !== null && typeof value === 'object' && !Array.isArray(value),
      `${where}: expected an object, got ${JSON.stringify(value)}`);
    for (const k of schema.required ?? []) assert.ok(k in value, `${where}: required key '${k}' missing in ${JSON.stringify(value)}`);
    for (const [k, v] of Object.entries(value)) {
      const sub = schema.properties?.[k];
      if (!sub) {
        assert.notEqual(schema.additionalProperties, false, `${where}: unexpected key '${k}'`);
        continue;
      }
      checkValue(sub, v, `${where}.${k}`);
    }
  } else if (schema.type === 'string') {
    assert.equal(typeof value, 'string', `${where}: expected a string, got ${JSON.stringify(value)}`);
    if (schema.enum) assert.ok(schema.enum.includes(value), `${where}: '${value}' not in ${JSON.stringify(schema.enum)}`);
  } else if (schema.type === 'boolean') {
    assert.equal(typeof value, 'boolean', `${where}: expected a boolean, got ${JSON.stringify(value)}`);
  } else {
    throw new Error(`checkValue: schema type ${schema.type} not handled`);
  }
}

// A tool call: its name is a defined tool and its arguments (a JSON string or an object)
// satisfy the tool's schema. Returns the parsed arguments.
export function checkToolCall(name, args) {
  assert.ok(Object.hasOwn(TOOL_DEFS, name), `tool call names an undefined tool '${name}'`);
  let parsed = args;
  if (typeof args === 'string') {
    try { parsed = JSON.parse(args); } catch (e) {
      assert.fail(`arguments of ${name} do not parse as JSON: ${JSON.stringify(args)} (${e.message})`);
    }
  }
  checkValue(TOOL_DEFS[name].parameters, parsed, name);
  return parsed;
}

// What a tool "returns", as the JSON text sent back to the model.
export function toolResult(name, args) {
  if (name === 'get_weather') return JSON.stringify({ city: args.city, temperature: args.celsius ? 21 : 70, sky: 'clear' });
  if (name === 'get_time') return JSON.stringify({ zone: args.zone, time: '12:00' });
  return JSON.stringify({ error: 'unknown tool' });
}

// Every turn after the first reuses at least REUSE_MIN of the previous turn's prompt.
// usages: [{ prompt, cached }] per turn. Prints the per-turn reuse.
export function checkReuse(t, label, usages) {
  for (const [i, u] of usages.entries()) {
    const pct = i === 0 ? '-' : `${((100 * u.cached) / usages[i - 1].prompt).toFixed(1)}%`;
    t.diagnostic(`${label} reuse turn ${i + 1}: prompt ${u.prompt}, cached ${u.cached}, cached/previous prompt ${pct}`);
  }
  for (const [i, u] of usages.entries()) {
    assert.ok(Number.isInteger(u.prompt) && u.prompt > 0, `${label} turn ${i + 1}: prompt tokens ${u.prompt}`);
    assert.ok(Number.isInteger(u.cached) && u.cached >= 0, `${label} turn ${i + 1}: cached tokens ${u.cached}`);
    if (i === 0) continue;
    assert.ok(u.prompt > usages[i - 1].prompt, `${label} turn ${i + 1}: the prompt did not grow`);
    assert.ok(u.cached >= REUSE_MIN * usages[i - 1].prompt,
      `${label} turn ${i + 1}: cached ${u.cached} < ${REUSE_MIN} x previous prompt ${usages[i - 1].prompt}`);
  }
}
