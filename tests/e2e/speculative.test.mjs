// Speculative decoding as a user turns it on: a node started with --speculative ngram or
// --speculative draft:DIR answers greedy chats (OpenAI, streamed and not) with exactly the text
// and token counts of a node without it; `exo run --speculative` prints the same text plus its
// acceptance line; a bad method is refused at start with a message.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { deviceArgs, exoBin } from './lib/exo.mjs';
import { tinyModel } from './lib/models.mjs';

const MODEL = 'qwen3-tiny-tied'; // greedy repeats itself: n-gram drafts land
const DRAFT = 'qwen3-tiny';      // same tokenizer and vocabulary
const QUESTIONS = [
  'red green blue red green blue red green blue red green',
  'What is the capital of France?',
];
let dir, draftDir;

before(async () => {
  dir = await tinyModel(MODEL);
  draftDir = await tinyModel(DRAFT);
});

async function answers(args) {
  const node = await startNode({ args: ['--models-path', path.dirname(dir), ...args] });
  try {
    const out = [];
    for (const q of QUESTIONS) {
      const body = { model: MODEL, messages: [{ role: 'user', content: q }], max_tokens: 40, temperature: 0 };
      const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST',
        headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      assert.equal(r.status, 200);
      const j = await r.json();
      const s = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST',
        headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }) });
      assert.equal(s.status, 200);
      let streamed = '';
      for (const line of (await s.text()).split('\n')) {
        if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
        streamed += JSON.parse(line.slice(6)).choices?.[0]?.delta?.content ?? '';
      }
      out.push({ text: j.choices[0].message.content, tokens: j.usage.completion_tokens, streamed });
    }
    let metrics = '';
    for (let i = 0; i < 50 && !/exo_spec_drafted_tokens_total\{[^}]*\} [1-9]/.test(metrics) && args.length; i++) {
      metrics = await (await fetch(`${node.url}/metrics`)).text(); // the runner reports within 100 ms
      await new Promise((r) => setTimeout(r, 100));
    }
    return { out, log: node.log(), metrics };
  } finally {
    await node.stop();
  }
}

test('greedy answers with --speculative ngram and draft:DIR equal those without', async () => {
  const plain = await answers([]);
  for (const method of ['ngram', `draft:${draftDir}`]) {
    const spec = await answers(['--speculative', method, '--spec-k', '3']);
    for (let i = 0; i < QUESTIONS.length; i++) {
      assert.equal(spec.out[i].text, plain.out[i].text, `${method}: ${QUESTIONS[i]}`);
      assert.equal(spec.out[i].streamed, plain.out[i].text, `${method} streamed: ${QUESTIONS[i]}`);
      assert.equal(spec.out[i].tokens, plain.out[i].tokens);
    }
    const name = method.startsWith('draft:') ? 'draft' : 'ngram';
    assert.match(spec.log, new RegExp(`speculative decoding with the ${name} drafter, up to 3 tokens`));
    assert.match(spec.log, /drafted tokens accepted/);
    const count = (name) => Number(spec.metrics.match(new RegExp(`${name}\\{model="${MODEL}"\\} (\\d+)`))?.[1]);
    assert.ok(count('exo_spec_drafted_tokens_total') > 0, spec.metrics);
    assert.ok(count('exo_spec_accepted_tokens_total') <= count('exo_spec_drafted_tokens_total'));
    assert.ok(count('exo_spec_verify_steps_total') > 0);
  }
});

test('spec_tokens in a request: 0 turns speculation off for it, out of range is a 400', async () => {
  const node = await startNode({ args: ['--models-path', path.dirname(dir), '--speculative', 'ngram'] });
  try {
    const post = (extra) => fetch(`${node.url}/v1/chat/completions`, { method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: QUESTIONS[0] }],
        max_tokens: 40, temperature: 0, ...extra }) });
    const off = await post({ spec_tokens: 0 });
    assert.equal(off.status, 200);
    const bad = await post({ spec_tokens: 17 });
    assert.equal(bad.status, 400);
    assert.match((await bad.json()).error.message, /spec_tokens/);
    let metrics = '';
    for (let i = 0; i < 30 && !/exo_spec_drafted_tokens_total\{/.test(metrics); i++) {
      await new Promise((r) => setTimeout(r, 100));
      metrics = await (await fetch(`${node.url}/metrics`)).text();
    }
    assert.match(metrics, /exo_spec_drafted_tokens_total\{[^}]*\} 0\n/);
    const two = await post({ spec_tokens: 2 });
    assert.equal((await two.json()).choices[0].message.content, (await off.json()).choices[0].message.content);
  } finally {
    await node.stop();
  }
});

test('exo run --speculative prints the same text and the acceptance', () => {
  const run = (extra) => spawnSync(exoBin(), ['run', dir, QUESTIONS[0], '--raw', '--temperature', '0',
    '--max-tokens', '32', ...deviceArgs(), ...extra], { encoding: 'utf8', timeout: 120000 });
  const plain = run([]);
  const spec = run(['--speculative', 'ngram']);
  assert.equal(plain.status, 0, plain.stderr);
  assert.equal(spec.status, 0, spec.stderr);
  assert.equal(spec.stdout, plain.stdout);
  assert.match(spec.stderr, /\[speculative ngram: \d+ of \d+ drafted tokens accepted \(\d+%\), [\d.]+ tokens per verifying step\]/);
  const bad = run(['--speculative', 'telepathy']);
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /speculative method 'telepathy' is not one of off, ngram, draft:DIR/);
});

test('a node refuses an unknown --speculative method at start', () => {
  const r = spawnSync(exoBin(), ['--speculative', 'telepathy'], { encoding: 'utf8', timeout: 20000 });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--speculative: 'telepathy' is not one of off, ngram, draft:DIR/);
});
