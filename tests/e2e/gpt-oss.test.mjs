// gpt-oss end to end: the tiny gpt-oss models (bf16 and MXFP4 experts, tools/mkmodel) served by a
// node answer the fixture's Harmony prompts — the publisher's chat template with tools and
// reasoning_effort, rendered at the fixture's pinned date — with exactly the prompt transformers
// tokenized and the tokens it generated (tests/fixtures/reference/gpt-oss-tiny*.json), through
// the OpenAI, Responses, Claude and Ollama APIs. The random weights write no Harmony markup, so
// the text comes back as content (the Harmony parser's fallback); how channels and calls map to
// each API's fields is tested in tests/unit/test_output_formats.c and test_api_adapters.c.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { deviceArgs, exoBin, repoRoot } from './lib/exo.mjs';
import { tinyModel } from './lib/models.mjs';

const MODELS = ['gpt-oss-tiny', 'gpt-oss-tiny-mxfp4'];
const EPOCH = '1768435200'; // the date make_fixtures.py pinned (2026-01-15)
let node;

function fixture(name) {
  return JSON.parse(fs.readFileSync(path.join(repoRoot, 'tests/fixtures/reference', `${name}.json`), 'utf8'));
}

before(async () => {
  const dirs = await Promise.all(MODELS.map((m) => tinyModel(m)));
  node = await startNode({ args: ['--models-path', path.dirname(dirs[0])], env: { SOURCE_DATE_EPOCH: EPOCH } });
});
after(async () => { await node?.stop(); });

async function post(route, body) {
  const r = await fetch(`${node.url}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  return JSON.parse(text);
}

// transformers decoded with special tokens and ran past the end of the turn; we stop at
// <|return|> / <|call|>, so ours is a prefix of its text
function assertPrefixOfReference(got, p) {
  assert.ok(got.length > 0, 'some text');
  assert.ok(p.greedy.text.startsWith(got), `${JSON.stringify(got)} vs ${JSON.stringify(p.greedy.text)}`);
}

for (const model of MODELS) {
  for (const name of ['chat-tools', 'chat-tool-result', 'chat-multi']) {
    test(`${model} ${name}: the OpenAI API gives transformers' prompt and tokens`, async () => {
      const p = fixture(model).prompts.find((x) => x.name === name);
      const body = { model, messages: p.messages, max_tokens: 32, temperature: 0 };
      if (p.tools) body.tools = p.tools;
      if (p.template_kwargs?.reasoning_effort) body.reasoning_effort = p.template_kwargs.reasoning_effort;
      const r = await post('/v1/chat/completions', body);
      assert.equal(r.usage.prompt_tokens, p.prompt_ids.length, 'prompt tokens as transformers');
      assertPrefixOfReference(r.choices[0].message.content, p);
    });
  }
}

// The fixture's chat-tools prompt was rendered with reasoning_effort "low" (the template's
// default is "medium"): every API's own way of asking for it must give transformers' prompt and
// tokens.
test('reasoning effort and tools reach the template from every API', async () => {
  const model = MODELS[0];
  const p = fixture(model).prompts.find((x) => x.name === 'chat-tools');
  const sys = p.messages.find((m) => m.role === 'system').content;
  const user = p.messages.find((m) => m.role === 'user').content;
  const fn = p.tools[0].function;
  const openai = await post('/v1/chat/completions', { model, messages: p.messages, tools: p.tools,
    reasoning_effort: 'low', max_tokens: 8, temperature: 0 });
  assert.equal(openai.usage.prompt_tokens, p.prompt_ids.length);
  assertPrefixOfReference(openai.choices[0].message.content, p);
  const responses = await post('/v1/responses', { model, instructions: sys, input: user, max_output_tokens: 8,
    temperature: 0, reasoning: { effort: 'low' }, tools: [{ type: 'function', ...fn }] });
  assert.equal(responses.usage.input_tokens, p.prompt_ids.length);
  assertPrefixOfReference(responses.output_text ?? responses.output.find((o) => o.type === 'message').content[0].text, p);
  const claude = await post('/v1/messages', { model, system: sys, messages: [{ role: 'user', content: user }],
    max_tokens: 8, temperature: 0, output_config: { effort: 'low' },
    tools: [{ name: fn.name, description: fn.description, input_schema: fn.parameters }] });
  assert.equal(claude.usage.input_tokens, p.prompt_ids.length);
  assertPrefixOfReference(claude.content.find((c) => c.type === 'text').text, p);
  const ollama = await post('/ollama/api/chat', { model, messages: p.messages, tools: p.tools, think: 'low', stream: false,
    options: { num_predict: 8, temperature: 0 } });
  assert.equal(ollama.prompt_eval_count, p.prompt_ids.length);
  assertPrefixOfReference(ollama.message.content, p);
  const bad = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: p.messages, reasoning_effort: 'extreme' }) });
  assert.equal(bad.status, 400);
  assert.match(await bad.text(), /reasoning_effort/);
});

// `exo run` renders the Harmony prompt (at the pinned date) and parses the reply's channels: the
// random model writes no markup, so all of it is the answer, which must be transformers' text.
test('exo run gpt-oss-tiny prints what transformers generates', async () => {
  const dir = await tinyModel(MODELS[0]);
  const p = fixture(MODELS[0]).prompts.find((x) => x.name === 'chat-single');
  const r = spawnSync(exoBin(), ['run', dir, p.messages[0].content, '--temperature', '0', '--max-tokens', '16',
    ...deviceArgs()],
    { encoding: 'utf8', timeout: 120000, env: { ...process.env, SOURCE_DATE_EPOCH: EPOCH } });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, new RegExp(`prompt ${p.prompt_ids.length} tokens`));
  assertPrefixOfReference(r.stdout.replace(/\n$/, ''), p);
});
