// Structured outputs through the four APIs' official clients against a node serving a
// random-weight tiny model: any token is possible, so only the grammar mask can make the output
// valid. 200 requests with generated schemas (objects, optional members, enums, consts, integer
// and number ranges, formats, patterns, arrays with bounds, nested objects, anyOf, $ref) must
// each return JSON that ajv validates against its schema; forced tool calls must call the named
// tool with valid arguments; bad constraints are 400s in each API's own error shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';

const MODEL = 'qwen3-tiny';
const MAX_TOKENS = 1500; // room for any output of the generated schemas
const PER_API = 50;
const CONCURRENCY = 8;
let node, openai, claude, ollama;
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
const ask = [{ role: 'user', content: 'Fill in the record.' }];

before(async () => {
  const dir = await tinyModel(MODEL);
  node = await startNode({ args: ['--models-path', path.dirname(dir)] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  claude = new Anthropic({ baseURL: node.url, apiKey: 'unused', maxRetries: 0 });
  ollama = new Ollama({ host: `${node.url}/ollama` });
});
after(async () => { await node?.stop(); });

// ---------------------------------------------------------------- schemas

function prng(seed) {
  let s = (seed * 2654435761) >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}

const KEYS = ['name', 'age', 'city', 'tags', 'score', 'id', 'when', 'x-y', 'ключ', 'a b', 'ok', 'kind'];
const PATTERNS = ['^[A-Z]{2}-\\d{3}$', '^(yes|no|maybe)$', '^[a-f0-9]{4,8}$', '^\\w{1,5}@\\d{2}$'];
const FORMATS = ['date', 'date-time', 'time', 'uuid', 'email', 'ipv4'];

// A random schema; leaves only below depth 2. Strings are bounded (a random model would write
// an unbounded one forever).
function genSchema(r, depth, defs) {
  const pick = (a) => a[Math.floor(r() * a.length)];
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const leaves = ['string', 'enum', 'const', 'integer', 'number', 'boolean', 'null', 'format',
    'pattern', 'nullable'];
  const kind = pick(depth >= 2 ? leaves : [...leaves, 'array', 'object', 'anyOf', 'ref']);
  switch (kind) {
    case 'string': return { type: 'string', minLength: int(0, 2), maxLength: int(2, 8) };
    case 'enum': return { enum: pick([['red', 'green', 'blue'], [1, 2.5, -3], ['a', 7, null, true],
      ['é', 'naïve "quoted"', 'back\\slash']]) };
    case 'const': return { const: pick(['fixed', 42, false, { k: [1, 2] }]) };
    case 'integer': {
      const lo = int(-2000, 500);
      return pick([{ type: 'integer', minimum: lo, maximum: lo + int(0, 3000) },
        { type: 'integer', exclusiveMinimum: lo }, { type: 'integer', maximum: lo },
        { type: 'integer' }]);
    }
    case 'number': return pick([{ type: 'number', minimum: -10.5, maximum: 99 },
      { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1000 }, { type: 'number' }]);
    case 'boolean': return { type: 'boolean' };
    case 'null': return { type: 'null' };
    case 'format': return { type: 'string', format: pick(FORMATS) };
    case 'pattern': return { type: 'string', pattern: pick(PATTERNS) };
    case 'nullable': return { type: ['string', 'null'], maxLength: int(1, 5) };
    case 'array': return { type: 'array', items: genSchema(r, depth + 1, defs),
      minItems: int(0, 1), maxItems: int(1, 3) };
    case 'anyOf': return { anyOf: [genSchema(r, depth + 1, defs), genSchema(r, depth + 1, defs)] };
    case 'ref': {
      const name = `Def${Object.keys(defs).length}`;
      defs[name] = true; // taken: a nested ref gets the next name
      defs[name] = genSchema(r, depth + 1, defs);
      return { $ref: `#/$defs/${name}` };
    }
    default: return genObject(r, depth + 1, defs);
  }
}

function genObject(r, depth, defs) {
  const n = 1 + Math.floor(r() * 4);
  const keys = [...KEYS].sort(() => r() - 0.5).slice(0, n);
  const properties = {};
  for (const k of keys) properties[k] = genSchema(r, depth, defs);
  const required = keys.filter(() => r() < 0.6);
  const o = { type: 'object', properties, required };
  if (r() < 0.5) o.additionalProperties = false;
  return o;
}

function schemaFor(seed) {
  const r = prng(seed);
  const defs = {};
  const schema = genObject(r, 0, defs);
  if (Object.keys(defs).length) schema.$defs = defs;
  return schema;
}

function assertValid(schema, value, what) {
  const validate = ajv.compile(schema);
  assert.ok(validate(value), `${what}: ${JSON.stringify(value)} does not validate against ` +
    `${JSON.stringify(schema)}: ${ajv.errorsText(validate.errors)}`);
}

async function pool(n, fn) {
  const errors = [];
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const i = next++;
      try { await fn(i); } catch (e) { errors.push(e); }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  if (errors.length) throw errors[0];
}

const seedOf = (api, i) => api * 1000 + i + 1;

// ---------------------------------------------------------------- 4 x 50 schemas

test('OpenAI chat response_format json_schema: 50 schemas, every reply validates', async () => {
  await pool(PER_API, async (i) => {
    const schema = schemaFor(seedOf(1, i));
    const r = await openai.chat.completions.create({
      model: MODEL, messages: ask, max_tokens: MAX_TOKENS, seed: i,
      response_format: { type: 'json_schema', json_schema: { name: 'record', schema, strict: true } },
    });
    assert.equal(r.choices[0].finish_reason, 'stop', `finished by ${r.choices[0].finish_reason}`);
    assertValid(schema, JSON.parse(r.choices[0].message.content), `chat #${i}`);
  });
});

test('OpenAI Responses text.format json_schema: 50 schemas, every reply validates', async () => {
  await pool(PER_API, async (i) => {
    const schema = schemaFor(seedOf(2, i));
    const r = await openai.responses.create({
      model: MODEL, input: ask, max_output_tokens: MAX_TOKENS, temperature: 1,
      text: { format: { type: 'json_schema', name: 'record', schema, strict: true } },
    });
    assert.equal(r.status, 'completed');
    assertValid(schema, JSON.parse(r.output_text), `responses #${i}`);
  });
});

test('Claude tool_choice {type:"tool"}: 50 input schemas, every tool_use input validates', async () => {
  await pool(PER_API, async (i) => {
    const schema = schemaFor(seedOf(3, i));
    const tools = [{ name: 'record', description: 'Store a record', input_schema: schema },
      { name: 'other', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }];
    const m = await claude.messages.create({
      model: MODEL, max_tokens: MAX_TOKENS, messages: ask, tools,
      tool_choice: { type: 'tool', name: 'record' },
    });
    assert.equal(m.stop_reason, 'tool_use');
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    assert.equal(uses[0].name, 'record');
    assertValid(schema, uses[0].input, `claude #${i}`);
  });
});

test('Ollama format (a schema): 50 schemas, every reply validates', async () => {
  await pool(PER_API, async (i) => {
    const schema = schemaFor(seedOf(4, i));
    const r = await ollama.chat({ model: MODEL, messages: ask, format: schema,
      options: { num_predict: MAX_TOKENS, seed: i, temperature: 0.9 } });
    assert.equal(r.done_reason, 'stop');
    assertValid(schema, JSON.parse(r.message.content), `ollama #${i}`);
  });
});

// ---------------------------------------------------------------- JSON modes, grammars, streams

test('json_object modes (OpenAI chat, Responses, Ollama "json") return a JSON object', async () => {
  const chat = await openai.chat.completions.create({ model: MODEL, messages: ask, seed: 3,
    max_tokens: 64, temperature: 0, response_format: { type: 'json_object' } });
  // a random model may open objects without end: a complete reply parses, a cut one is "length"
  if (chat.choices[0].finish_reason === 'stop') {
    assert.equal(typeof JSON.parse(chat.choices[0].message.content), 'object');
  } else assert.match(chat.choices[0].message.content, /^\{/);
  const resp = await openai.responses.create({ model: MODEL, input: ask, max_output_tokens: 64,
    temperature: 0, text: { format: { type: 'json_object' } } });
  assert.match(resp.output_text, /^\{/);
  const ol = await ollama.generate({ model: MODEL, prompt: 'x', format: 'json',
    options: { num_predict: 64, temperature: 0 } });
  assert.match(ol.response, /^\{/);
});

test('a GBNF grammar on /v1/completions and chat decides the output', async () => {
  const grammar = 'root ::= ("yes" | "no") " " [0-9]{2} "!"';
  const r = await openai.completions.create({ model: MODEL, prompt: 'Answer:', max_tokens: 20,
    grammar });
  assert.match(r.choices[0].text, /^(yes|no) [0-9]{2}!$/);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const c = await openai.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 20,
    grammar: 'root ::= [a-c]{3}' });
  assert.match(c.choices[0].message.content, /^[a-c]{3}$/);
});

test('streamed constrained output joins into valid JSON', async () => {
  const schema = schemaFor(77);
  const stream = await openai.chat.completions.create({ model: MODEL, messages: ask, stream: true,
    max_tokens: MAX_TOKENS, response_format: { type: 'json_schema', json_schema: { name: 'r', schema } } });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assertValid(schema, JSON.parse(text), 'stream');
});

// ---------------------------------------------------------------- forced tool calls

const weather = { type: 'object', properties: { city: { type: 'string', maxLength: 12 },
  unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false };
const openaiTools = [
  { type: 'function', function: { name: 'get_weather', parameters: weather } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object',
    properties: { zone: { type: 'string', format: 'uuid' } }, required: ['zone'] } } }];

test('OpenAI chat tool_choice: a named function and "required" force a valid call', async () => {
  for (let i = 0; i < 5; i++) {
    const r = await openai.chat.completions.create({ model: MODEL, messages: ask, seed: i,
      max_tokens: MAX_TOKENS, tools: openaiTools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const calls = r.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'get_weather');
    assertValid(weather, JSON.parse(calls[0].function.arguments), 'named call');
  }
  const names = new Set();
  for (let i = 0; i < 6; i++) {
    const r = await openai.chat.completions.create({ model: MODEL, messages: ask, seed: i,
      temperature: 1, max_tokens: MAX_TOKENS, tools: openaiTools, tool_choice: 'required' });
    const call = r.choices[0].message.tool_calls[0];
    const tool = openaiTools.find((t) => t.function.name === call.function.name);
    assert.ok(tool, `called ${call.function.name}`);
    assertValid(tool.function.parameters, JSON.parse(call.function.arguments), 'required call');
    names.add(call.function.name);
  }
  // streamed: the call arrives as tool_calls deltas
  const stream = await openai.chat.completions.create({ model: MODEL, messages: ask, stream: true,
    max_tokens: MAX_TOKENS, tools: openaiTools, tool_choice: { type: 'function', function: { name: 'get_time' } } });
  let name = '', args = '';
  for await (const chunk of stream) {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      name += tc.function?.name ?? '';
      args += tc.function?.arguments ?? '';
    }
  }
  assert.equal(name, 'get_time');
  assertValid(openaiTools[1].function.parameters, JSON.parse(args), 'streamed call');
});

test('Responses tool_choice {type:"function",name} forces a function_call item', async () => {
  const tools = openaiTools.map((t) => ({ type: 'function', name: t.function.name,
    parameters: t.function.parameters }));
  const r = await openai.responses.create({ model: MODEL, input: ask, max_output_tokens: MAX_TOKENS,
    tools, tool_choice: { type: 'function', name: 'get_weather' } });
  const call = r.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  assertValid(weather, JSON.parse(call.arguments), 'responses call');
});

test('Claude tool_choice {type:"any"} forces a call of one of the tools', async () => {
  const tools = openaiTools.map((t) => ({ name: t.function.name, input_schema: t.function.parameters }));
  const m = await claude.messages.create({ model: MODEL, max_tokens: MAX_TOKENS, messages: ask,
    tools, tool_choice: { type: 'any' } });
  const use = m.content.find((b) => b.type === 'tool_use');
  const tool = tools.find((t) => t.name === use.name);
  assert.ok(tool);
  assertValid(tool.input_schema, use.input, 'claude any');
});

// ---------------------------------------------------------------- errors, in each API's shape

async function status(promise) {
  try { await promise; } catch (e) { return e; }
  assert.fail('expected an error');
}

test('bad tool_choice values and unknown tools are 400s in each API\'s error shape', async () => {
  let e = await status(openai.chat.completions.create({ model: MODEL, messages: ask,
    tools: openaiTools, tool_choice: { type: 'function', function: { name: 'nope' } } }));
  assert.equal(e.status, 400);
  assert.match(e.error.message, /'nope', which is not in 'tools'/);
  e = await status(openai.chat.completions.create({ model: MODEL, messages: ask,
    tools: openaiTools, tool_choice: 'bogus' }));
  assert.equal(e.status, 400);
  e = await status(openai.chat.completions.create({ model: MODEL, messages: ask,
    tool_choice: 'required' }));
  assert.equal(e.status, 400);
  assert.match(e.error.message, /no 'tools'/);
  e = await status(openai.responses.create({ model: MODEL, input: ask,
    tools: [{ type: 'function', name: 'a', parameters: {} }], tool_choice: { type: 'function', name: 'b' } }));
  assert.equal(e.status, 400);
  e = await status(claude.messages.create({ model: MODEL, max_tokens: 8, messages: ask,
    tools: [{ name: 'a', input_schema: { type: 'object' } }], tool_choice: { type: 'tool', name: 'b' } }));
  assert.equal(e.status, 400);
  assert.equal(e.error.type, 'error');
  assert.equal(e.error.error.type, 'invalid_request_error');
  e = await status(claude.messages.create({ model: MODEL, max_tokens: 8, messages: ask,
    tool_choice: { type: 'bogus' } }));
  assert.equal(e.status, 400);
});

test('unsupported schema keywords and bad grammars are 400s naming the problem', async () => {
  let e = await status(openai.chat.completions.create({ model: MODEL, messages: ask,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
      type: 'object', properties: { tags: { type: 'array', uniqueItems: true } } } } } }));
  assert.equal(e.status, 400);
  assert.match(e.error.message, /uniqueItems.*#\/properties\/tags/);
  e = await status(openai.responses.create({ model: MODEL, input: ask,
    text: { format: { type: 'json_schema', name: 'x', schema: { type: 'number', multipleOf: 3 } } } }));
  assert.equal(e.status, 400);
  assert.match(e.error.message, /multipleOf/);
  e = await status(openai.completions.create({ model: MODEL, prompt: 'x', grammar: 'root ::= root "a"' }));
  assert.equal(e.status, 400);
  assert.match(e.error.message, /left-recursive/);
  e = await status(ollama.chat({ model: MODEL, messages: ask, format: { type: 'string', format: 'hostname' } }));
  assert.match(String(e.message), /format 'hostname' is not supported/);
  e = await status(claude.messages.create({ model: MODEL, max_tokens: 8, messages: ask,
    tools: [{ name: 'a', input_schema: { type: 'object', properties: { x: { not: {} } } } }],
    tool_choice: { type: 'any' } }));
  assert.equal(e.status, 400);
  assert.match(e.error.error.message, /'not'/);
});
