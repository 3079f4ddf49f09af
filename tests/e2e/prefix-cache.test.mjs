// Prefix cache through the HTTP API (tiny model): a repeated long prompt reports the reused
// tokens in usage (OpenAI prompt_tokens_details.cached_tokens, Claude cache_read_input_tokens),
// whole blocks only and never the whole prompt, with the same greedy answer as the cold request;
// a request that only shares the system prompt reuses less; a fresh prompt reuses nothing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';

const MODEL = 'qwen3-tiny';
const HYBRID = 'qwen3.5-tiny'; // GatedDeltaNet layers: a cached prefix restores their state too
let node;
const long = Array.from({ length: 150 }, (_, i) => `word${i % 37}`).join(' ');

before(async () => {
  await tinyModel(HYBRID);
  const dir = await tinyModel(MODEL);
  node = await startNode({ args: ['--models-path', path.dirname(dir)] });
});
after(async () => { await node?.stop(); });

function post(messages, model) {
  return fetch(`${node.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages, max_tokens: 6, temperature: 0 }) });
}

async function openai(messages, model = MODEL) {
  const r = await post(messages, model);
  const body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  return body;
}

test('a repeated prompt is served from the prefix cache and says so in usage', async () => {
  const q = [{ role: 'system', content: long }, { role: 'user', content: 'first question' }];
  const cold = await openai(q);
  assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(cold.usage.prompt_tokens > 100, `prompt of ${cold.usage.prompt_tokens} tokens`);
  const warm = await openai(q);
  const cached = warm.usage.prompt_tokens_details.cached_tokens;
  assert.equal(warm.usage.prompt_tokens, cold.usage.prompt_tokens);
  assert.ok(cached > 0 && cached < warm.usage.prompt_tokens, `cached ${cached}`);
  assert.equal(cached % 16, 0, 'whole KV blocks');
  assert.ok(warm.usage.prompt_tokens - cached <= 16, 'everything but the last partial block reused');
  assert.equal(warm.choices[0].message.content, cold.choices[0].message.content);

  const other = await openai([q[0], { role: 'user', content: 'a different second turn entirely' }]);
  const shared = other.usage.prompt_tokens_details.cached_tokens;
  assert.ok(shared > 0 && shared <= cached, `shared system prompt: cached ${shared}`);

  const fresh = await openai([{ role: 'user', content: `${long} unrelated` .split(' ').reverse().join(' ') }]);
  assert.equal(fresh.usage.prompt_tokens_details.cached_tokens, 0);
});

// A hybrid reuses a prefix only up to a block boundary where it kept the recurrent state: the
// prompt's last one (and the boundaries its prefill chunks or its decode ended on), not
// arbitrary earlier ones.
test('a hybrid model serves a repeated prompt from the prefix cache with the same answer', async () => {
  const q = [{ role: 'system', content: long }, { role: 'user', content: 'hybrid question' }];
  const cold = await openai(q, HYBRID);
  assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
  const warm = await openai(q, HYBRID);
  const cached = warm.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0 && warm.usage.prompt_tokens - cached <= 16, `cached ${cached}`);
  assert.equal(cached % 16, 0, 'whole KV blocks');
  assert.equal(warm.choices[0].message.content, cold.choices[0].message.content);
});

test('Claude Messages reports cache_read_input_tokens', async () => {
  const body = { model: MODEL, max_tokens: 4, temperature: 0, system: `claude ${long}`,
    messages: [{ role: 'user', content: 'hello' }] };
  const post = async () => {
    const r = await fetch(`${node.url}/v1/messages`, { method: 'POST',
      headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify(body) });
    assert.equal(r.status, 200);
    return r.json();
  };
  const cold = await post();
  assert.equal(cold.usage.cache_read_input_tokens, 0);
  const warm = await post();
  assert.ok(warm.usage.cache_read_input_tokens > 100, JSON.stringify(warm.usage));
});
