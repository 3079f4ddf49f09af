// Speculative decoding on instances of several nodes: nodes started with --speculative ngram run
// every rank of a pipeline or tensor instance with the n-gram drafter (each rank drafts the same
// tokens from the same history; the sampling rank verifies). Greedy chats on a 2-node pipeline
// and a 2-node tensor instance give exactly one node's text and token counts, and rank 0's node
// counts drafted tokens in /metrics. The model ties its embeddings, so greedy decoding repeats
// itself and n-gram drafts land; the exact kernels and f32 KV cache make every split compute the
// one-node logits (multinode-equivalence).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { mkModel } from './lib/models.mjs';
import { DIST_MODELS, eachSplit, http, startCluster } from './lib/multinode.mjs';

const MODEL = 'qwen3-dist-tied';
const SPLITS = [['Pipeline', 1], ['Pipeline', 2], ['Tensor', 2]];
const QUESTIONS = ['red green blue red green blue red green blue red green', 'What is the capital of France?'];

let c;
before(async () => {
  const dir = await mkModel(MODEL, [...DIST_MODELS['qwen3-dist'], '--tie-embeddings']);
  c = await startCluster(2, path.dirname(dir), { EXO_CPU_SIMD: 'avx2', EXO_Q4_LAYOUT: 'mlx' },
    { nodeArgs: ['--kv-cache-dtype', 'f32', '--speculative', 'ngram', '--spec-k', '3'] });
});
after(async () => { await c?.stop(); });

function ask(node, q) {
  const r = http(c, node, 'POST', '/v1/chat/completions',
    { model: MODEL, messages: [{ role: 'user', content: q }], max_tokens: 40, temperature: 0 }, 120);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return { text: r.body.choices[0].message.content, tokens: r.body.usage.completion_tokens };
}

const drafted = (node) => {
  const m = http(c, node, 'GET', '/metrics').body;
  return Number(String(m).match(new RegExp(`exo_spec_drafted_tokens_total\\{model="${MODEL}"\\} (\\d+)`))?.[1] ?? 0);
};

test('greedy with --speculative ngram: pipeline x2 and tensor x2 answer as one node, drafting', async () => {
  const [a, b] = c.nodes;
  const [reference, ...others] = await eachSplit(c, a, b, MODEL, SPLITS, async ({ what, n, via, rank0 }) => {
    const answers = QUESTIONS.map((q) => ask(via, q));
    if (n > 1) {
      const { value } = await c.until(() => drafted(rank0) || false, 5000, `${what}: rank 0's node to report drafts`);
      assert.ok(value > 0, `${what}: drafted tokens`);
    }
    return { what, answers };
  });
  for (const o of others) assert.deepEqual(o.answers, reference.answers, `${o.what}: one node's answers`);
});
