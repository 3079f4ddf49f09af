// The OpenAI APIs through the official `openai` npm SDK against a node serving a tiny model:
// chat (stream and not), legacy completions, Responses, logprobs, stop strings across tokens,
// tools in the prompt, usage, /bench, and errors that need a model (prompt too long).
// Greedy output must equal the engine's own output for the same prompt (lib/reference.mjs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';
import { reference, jsTokenizer } from './lib/reference.mjs';

const MODEL = 'qwen3-tiny';
const N = 8;
let node, client, dir, ref;
const hi = [{ role: 'user', content: 'hi' }];

before(async () => {
  dir = await tinyModel(MODEL);
  node = await startNode({ args: ['--models-path', path.dirname(dir)] });
  client = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  ref = await reference(dir, { messages: hi }, N);
});
after(async () => { await node?.stop(); });

test('chat, non-streamed: greedy text equals the engine, with usage', async () => {
  const r = await client.chat.completions.create(
    { model: MODEL, messages: hi, max_tokens: N, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, ref.text);
  assert.equal(r.choices[0].finish_reason, ref.ids.length < N ? 'stop' : 'length');
  assert.equal(r.usage.prompt_tokens, ref.promptIds.length);
  assert.equal(r.usage.completion_tokens, ref.ids.length);
  assert.equal(r.usage.total_tokens, ref.promptIds.length + ref.ids.length);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 0);
});

test('chat, streamed: chunks concatenate to the engine text; include_usage; [DONE]', async () => {
  const stream = await client.chat.completions.create({ model: MODEL, messages: hi, max_tokens: N,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, n = 0;
  for await (const c of stream) {
    assert.equal(c.object, 'chat.completion.chunk');
    n++;
    if (c.choices.length) {
      text += c.choices[0].delta.content ?? '';
      finish = c.choices[0].finish_reason ?? finish;
    }
    if (c.usage) usage = c.usage;
  }
  assert.equal(text, ref.text);
  assert.ok(n >= 3);
  assert.equal(finish, ref.ids.length < N ? 'stop' : 'length');
  assert.equal(usage.completion_tokens, ref.ids.length);
});

test('logprobs with top_logprobs and bytes, matching the text', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: hi, max_tokens: 4,
    temperature: 0, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  let joined = '';
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes) && e.bytes.length > 0);
    assert.equal(Buffer.from(e.bytes).toString('utf8'), e.token);
    assert.equal(e.top_logprobs.length, 3);
    // greedy: the chosen token is the most likely one
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4);
    joined += e.token;
  }
  assert.equal(joined, r.choices[0].message.content);
});

test('stop string spanning two tokens cuts the text before it', async () => {
  const tok = await jsTokenizer(dir);
  const a = tok.decode([ref.ids[0]]), b = tok.decode([ref.ids[1]]);
  const stop = a.slice(-1) + b.slice(0, 2);
  const cut = ref.text.slice(0, ref.text.indexOf(stop));
  const r = await client.chat.completions.create(
    { model: MODEL, messages: hi, max_tokens: N, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].message.content, cut);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await client.chat.completions.create(
    { model: MODEL, messages: hi, max_tokens: N, temperature: 0, stop, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.delta?.content ?? '';
  assert.equal(text, cut);
});

test('tools and a tool-call round trip reach the chat template', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const plain = await client.chat.completions.create(
    { model: MODEL, messages: hi, max_tokens: 1, temperature: 0 });
  const withTools = await client.chat.completions.create(
    { model: MODEL, messages: hi, tools, max_tokens: 1, temperature: 0 });
  assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 20,
    'the tool definitions are in the prompt');
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const r = await client.chat.completions.create(
    { model: MODEL, messages, tools, max_tokens: 2, temperature: 0 });
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.usage.prompt_tokens > withTools.usage.prompt_tokens);
});

test('legacy completions: raw prompt, greedy text equals the engine', async () => {
  const raw = await reference(dir, { prompt: 'Hello world' }, 6);
  const r = await client.completions.create(
    { model: MODEL, prompt: 'Hello world', max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, raw.text);
  assert.equal(r.usage.prompt_tokens, raw.promptIds.length);
  const s = await client.completions.create(
    { model: MODEL, prompt: 'Hello world', max_tokens: 6, temperature: 0, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal(text, raw.text);
});

test('responses API: input string and items, instructions, streaming events in order', async () => {
  const r = await client.responses.create(
    { model: MODEL, input: 'hi', max_output_tokens: N, temperature: 0 });
  assert.equal(r.object, 'response');
  assert.equal(r.output_text, ref.text);
  assert.equal(r.usage.output_tokens, ref.ids.length);
  const sys = await reference(dir, { messages: [{ role: 'system', content: 'Be brief.' }, ...hi] }, N);
  const r2 = await client.responses.create({ model: MODEL, instructions: 'Be brief.',
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }],
    max_output_tokens: N, temperature: 0 });
  assert.equal(r2.output_text, sys.text);
  const stream = await client.responses.create(
    { model: MODEL, input: 'hi', max_output_tokens: N, temperature: 0, stream: true });
  const types = [];
  let text = '', seq = -1, final = null;
  for await (const e of stream) {
    types.push(e.type);
    assert.equal(e.sequence_number, seq + 1);
    seq = e.sequence_number;
    if (e.type === 'response.output_text.delta') text += e.delta;
    if (e.type === 'response.completed' || e.type === 'response.incomplete') final = e.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(types.includes('response.output_item.added'));
  assert.ok(types.includes('response.output_text.done'));
  assert.equal(text, ref.text);
  assert.equal(final.output[0].content[0].text, ref.text);
});

test('function tools through the Responses API reach the prompt', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } }];
  const plain = await client.responses.create({ model: MODEL, input: 'hi', max_output_tokens: 1 });
  const r = await client.responses.create({ model: MODEL, max_output_tokens: 1, tools, input: [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temp": 21}' },
  ] });
  assert.ok(r.usage.input_tokens > plain.usage.input_tokens + 20);
});

test('/bench/chat/completions generates exactly max_tokens and reports stats', async () => {
  const r = await fetch(`${node.url}/bench/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, messages: hi, max_tokens: 12 }) });
  assert.equal(r.status, 200);
  const j = await r.json();
  assert.equal(j.usage.completion_tokens, 12);
  assert.equal(j.generation_stats.generation_tokens, 12);
  assert.ok(j.generation_stats.generation_tps > 0);
  assert.ok(j.generation_stats.peak_memory_usage > 0);
  // engine_only: the runner only steps and times the engine (the overhead benchmark's baseline)
  const e = await (await fetch(`${node.url}/bench/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, messages: hi, max_tokens: 12, engine_only: true }) })).json();
  assert.equal(e.usage.completion_tokens, 12);
  assert.equal(e.choices[0].message.content, '');
  assert.ok(e.generation_stats.generation_tps > 0);
  const bad = await fetch(`${node.url}/bench/chat/completions`, { method: 'POST',
    body: JSON.stringify({ model: MODEL, messages: hi, engine_only: 'yes' }) });
  assert.equal(bad.status, 400);
});

// Tokens are written to the client socket by the node's runner-reader thread; what a socket does
// not take at once (a client that stops reading) is queued and sent when it reads again. A paused
// client must get every frame, in order, as valid chunked SSE. (tests/unit/test_api_stream.c
// forces the socket-full case with 8 MiB against a 4 KiB receive buffer.)
test('a client that stops reading mid-stream gets every frame in order when it reads again', async () => {
  const http = await import('node:http');
  const body = JSON.stringify({ model: MODEL, messages: hi, max_tokens: 1500, temperature: 0,
    stream: true });
  const contentOf = (sse) => {
    assert.match(sse, /data: \[DONE\]\n\n$/);
    return sse.split('\n\n').filter((f) => f.startsWith('data: {'))
      .map((f) => JSON.parse(f.slice(6)).choices[0]?.delta?.content ?? '').join('');
  };
  const normal = await (await fetch(`${node.url}/bench/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body })).text();
  const paused = await new Promise((resolve, reject) => {
    const req = http.request(`${node.url}/bench/chat/completions`, { method: 'POST',
      headers: { 'content-type': 'application/json' } }, (res) => {
      res.setEncoding('utf8');
      let text = '', stopped = false;
      res.on('data', (d) => {
        text += d;
        if (!stopped) { // stop reading after the first bytes: the socket buffers fill up
          stopped = true;
          res.pause();
          setTimeout(() => res.resume(), 1500);
        }
      });
      res.on('end', () => resolve(text));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
  const want = contentOf(normal);
  assert.ok(want.length > 1000, `a long text (${want.length} chars)`);
  assert.equal(contentOf(paused), want);
});

test('a prompt longer than the context is a 400; max_tokens <= 0 a 400', async () => {
  await assert.rejects(client.chat.completions.create({ model: MODEL,
    messages: [{ role: 'user', content: 'hello '.repeat(5000) }], max_tokens: 4 }),
  (e) => e.status === 400 && /context/.test(e.message));
  await assert.rejects(client.chat.completions.create(
    { model: MODEL, messages: hi, max_tokens: -1 }), (e) => e.status === 400);
  await assert.rejects(client.chat.completions.create(
    { model: 'org/absent', messages: hi }), (e) => e.status === 404);
});

test('GET /v1/models lists the model', async () => {
  const list = await client.models.list();
  assert.ok(list.data.some((m) => m.id === MODEL));
});
