// Structured outputs: what the grammar mask costs in decode throughput.
//
// For each batch size B, alternating rounds of:
//   schema  B concurrent streams of /bench/chat/completions with response_format json_schema;
//   free    the same B streams without a schema, each asked for exactly the token count its
//           schema twin produced (the bench endpoint bans eos), so both rounds decode the same
//           number of tokens from the same prompts.
// tok/s = completion tokens of the round / its wall time; overhead = 1 - schema / free.
// "same" gives every request one schema (the grammar and its mask cache are shared, as for an
// agent calling one tool); "varied" gives each request its own schema (every mask is new).
//
//   node bench/structured/overhead.mjs --model M [--models-path DIR] [--batch 1,32]
//        [--rounds 2] [--requests 8] [--mode same,varied] [--exo build/release/exo]
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const argv = process.argv.slice(2);
const opt = (name, def) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : def;
};
const model = opt('model', 'exo/demo-dictionary');
const modelsPath = opt('models-path', '');
const batches = opt('batch', '1,32').split(',').map(Number);
const rounds = Number(opt('rounds', '2'));
const minRequests = Number(opt('requests', '8'));
const modes = opt('mode', 'same,varied').split(',');
const exo = opt('exo', 'build/release/exo');
const port = 52600 + Math.floor(Math.random() * 300);
const url = `http://127.0.0.1:${port}`;

// A record of a dozen fields: strings, numbers, an enum, a nested object and a bounded array.
function schema(seed) {
  const keys = ['word', 'meaning', 'examples', 'kind', 'score', 'detail', 'tags', 'count'];
  const k = (i) => `${keys[(seed + i) % keys.length]}${seed}`;
  return {
    type: 'object',
    properties: {
      [k(0)]: { type: 'string', maxLength: 24 },
      [k(1)]: { type: 'string', maxLength: 48 },
      [k(2)]: { type: 'array', items: { type: 'string', maxLength: 16 }, minItems: 1, maxItems: 3 },
      [k(3)]: { enum: ['noun', 'verb', 'adjective', 'adverb'] },
      [k(4)]: { type: 'number', minimum: 0, maximum: 10 },
      [k(5)]: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'boolean' } },
        required: ['a', 'b'] },
    },
    required: [k(0), k(1), k(2), k(3), k(4), k(5)],
    additionalProperties: false,
  };
}

const messages = [{ role: 'user', content: 'What does harbour mean? Answer as JSON.' }];

async function post(body) {
  const r = await fetch(`${url}/bench/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const j = await r.json();
  if (!r.ok) throw new Error(`${r.status} ${JSON.stringify(j)}`);
  return j;
}

async function round(b, n, bodyOf) {
  const tokens = new Array(n).fill(0);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: b }, async () => {
    while (next < n) {
      const i = next++;
      const r = await post(bodyOf(i));
      tokens[i] = r.usage.completion_tokens;
    }
  }));
  const s = (performance.now() - t0) / 1000;
  const total = tokens.reduce((a, x) => a + x, 0);
  return { tokens, total, s, tps: total / s };
}

async function main() {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-bench-'));
  const args = ['--api-port', String(port), '--data-dir', dataDir, '--listen-port', '0',
    '--namespace', `bench-structured-${process.pid}`];
  if (modelsPath) args.push('--models-path', modelsPath);
  const node = spawn(exo, args, { stdio: ['ignore', 'ignore', 'inherit'] });
  try {
    for (let t = 0; ; t++) {
      try { if ((await fetch(`${url}/node_id`)).ok) break; } catch { /* starting */ }
      if (t > 200) throw new Error('node did not start');
      await new Promise((r) => setTimeout(r, 50));
    }
    const base = { model, messages, temperature: 0.7, seed: 1, max_tokens: 400 };
    // load the model, build the vocabulary trie, warm the shared schema's mask cache
    await post({ ...base, max_tokens: 4 });
    await post({ ...base, response_format: { type: 'json_schema', json_schema: { name: 'r', schema: schema(0) } } });
    console.log(`model ${model}, ${os.cpus().length} cpus, load ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}`);
    for (const mode of modes) {
      for (const b of batches) {
        const n = Math.max(b, minRequests);
        for (let r = 0; r < rounds; r++) {
          const seedOf = (i) => (mode === 'same' ? 0 : 1000 * (r + 1) + i + b);
          const constrained = await round(b, n, (i) => ({ ...base, seed: i + 1,
            response_format: { type: 'json_schema', json_schema: { name: 'r', schema: schema(seedOf(i)) } } }));
          const free = await round(b, n, (i) => ({ ...base, seed: i + 1,
            max_tokens: Math.max(1, constrained.tokens[i]) }));
          console.log(`${mode.padEnd(6)} batch ${String(b).padStart(2)} round ${r + 1}: ` +
            `${constrained.total} tokens, schema ${constrained.tps.toFixed(1)} tok/s, ` +
            `free ${free.tps.toFixed(1)} tok/s, overhead ${(100 * (1 - constrained.tps / free.tps)).toFixed(1)}%`);
        }
      }
    }
  } finally {
    node.kill('SIGTERM');
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
