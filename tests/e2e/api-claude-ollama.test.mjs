// Claude Messages through the official @anthropic-ai/sdk and Ollama through the official
// `ollama` client, against a node serving a tiny model. Greedy output must equal the engine's
// own output for the same prompt; errors come in each API's own shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';
import { reference } from './lib/reference.mjs';

const MODEL = 'qwen3-tiny';
const N = 8;
let node, claude, ollama, dir, ref;
const hi = [{ role: 'user', content: 'hi' }];

before(async () => {
  dir = await tinyModel(MODEL);
  node = await startNode({ args: ['--models-path', path.dirname(dir)] });
  claude = new Anthropic({ baseURL: node.url, apiKey: 'unused', maxRetries: 0 });
  ollama = new Ollama({ host: `${node.url}/ollama` });
  ref = await reference(dir, { messages: hi }, N);
});
after(async () => { await node?.stop(); });

test('claude messages, non-streamed: text equals the engine; usage; stop_reason', async () => {
  const m = await claude.messages.create(
    { model: MODEL, max_tokens: N, messages: hi, temperature: 0 });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.content[0].text, ref.text);
  assert.equal(m.stop_reason, ref.ids.length < N ? 'end_turn' : 'max_tokens');
  assert.equal(m.usage.input_tokens, ref.promptIds.length);
  assert.equal(m.usage.output_tokens, ref.ids.length);
});

test('claude system prompt reaches the model', async () => {
  const sys = await reference(dir, { messages: [{ role: 'system', content: 'You are terse.' }, ...hi] }, N);
  const m = await claude.messages.create(
    { model: MODEL, max_tokens: N, system: 'You are terse.', messages: hi, temperature: 0 });
  assert.equal(m.content[0].text, sys.text);
  assert.equal(m.usage.input_tokens, sys.promptIds.length);
  const blocks = await claude.messages.create({ model: MODEL, max_tokens: N, temperature: 0,
    system: [{ type: 'text', text: 'You are terse.' }], messages: hi });
  assert.equal(blocks.content[0].text, sys.text);
});

test('claude streaming: event order, text deltas equal the engine text', async () => {
  const stream = claude.messages.stream(
    { model: MODEL, max_tokens: N, messages: hi, temperature: 0 });
  const types = [];
  let text = '';
  for await (const e of stream) {
    types.push(e.type);
    if (e.type === 'content_block_delta' && e.delta.type === 'text_delta') text += e.delta.text;
  }
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.ok(types.includes('content_block_start') && types.includes('content_block_stop'));
  assert.ok(types.includes('message_delta'));
  assert.equal(text, ref.text);
  assert.equal(final.content[0].text, ref.text);
  assert.equal(final.usage.output_tokens, ref.ids.length);
});

test('claude tools and a tool_use / tool_result round trip reach the template', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather',
    input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  const plain = await claude.messages.create({ model: MODEL, max_tokens: 1, messages: hi });
  const m = await claude.messages.create({ model: MODEL, max_tokens: 1, tools, messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather',
      input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '21 C' }] },
  ] });
  assert.equal(m.role, 'assistant');
  assert.ok(m.usage.input_tokens > plain.usage.input_tokens + 20);
});

test('claude errors use the Anthropic error shape', async () => {
  await assert.rejects(claude.messages.create({ model: MODEL, messages: hi, max_tokens: 0 }),
    (e) => e.status === 400 && e.error?.type === 'error' &&
      e.error.error.type === 'invalid_request_error');
  await assert.rejects(claude.messages.create({ model: 'org/absent', messages: hi, max_tokens: 4 }),
    (e) => e.status === 404 && e.error.error.type === 'not_found_error');
  const r = await fetch(`${node.url}/v1/messages`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, messages: hi }) });
  assert.equal(r.status, 400);
  assert.match((await r.json()).error.message, /max_tokens/);
});

test('ollama chat, non-streamed and streamed (the default), equals the engine', async () => {
  const r = await ollama.chat({ model: MODEL, messages: hi, stream: false,
    options: { num_predict: N, temperature: 0 } });
  assert.equal(r.message.role, 'assistant');
  assert.equal(r.message.content, ref.text);
  assert.equal(r.done, true);
  assert.equal(r.eval_count, ref.ids.length);
  assert.equal(r.prompt_eval_count, ref.promptIds.length);
  const s = await ollama.chat({ model: MODEL, messages: hi, stream: true,
    options: { num_predict: N, temperature: 0 } });
  let text = '', last;
  for await (const part of s) {
    text += part.message.content;
    last = part;
  }
  assert.equal(text, ref.text);
  assert.equal(last.done, true);
  assert.equal(last.done_reason, ref.ids.length < N ? 'stop' : 'length');
  // raw HTTP: no "stream" field means NDJSON streaming
  const raw = await fetch(`${node.url}/ollama/api/chat`, { method: 'POST',
    body: JSON.stringify({ model: MODEL, messages: hi, options: { num_predict: 2 } }) });
  assert.match(raw.headers.get('content-type'), /ndjson/);
  const lines = (await raw.text()).trim().split('\n').map((l) => JSON.parse(l));
  assert.ok(lines.length >= 2);
  assert.equal(lines.at(-1).done, true);
});

test('ollama generate applies the chat template; raw does not', async () => {
  const r = await ollama.generate({ model: MODEL, prompt: 'hi', stream: false,
    options: { num_predict: N, temperature: 0 } });
  assert.equal(r.response, ref.text);
  const raw = await reference(dir, { prompt: 'Hello world' }, 6);
  const r2 = await ollama.generate({ model: MODEL, prompt: 'Hello world', raw: true, stream: false,
    options: { num_predict: 6, temperature: 0 } });
  assert.equal(r2.response, raw.text);
});

test('ollama list, ps, show, version', async () => {
  const list = await ollama.list();
  assert.ok(list.models.some((m) => m.name === MODEL));
  const ps = await ollama.ps();
  assert.ok(ps.models.some((m) => m.name === MODEL), 'the model is running after the chats above');
  const show = await ollama.show({ model: MODEL });
  assert.ok(show.model_info.num_hidden_layers > 0);
  assert.equal(typeof (await ollama.version()).version, 'string');
  await assert.rejects(ollama.chat({ model: 'org/absent', messages: hi, stream: false }),
    (e) => e.status_code === 404 && /not found/.test(e.error));
});
