// GGUF repositories on Hugging Face, as llama.cpp's `-hf org/repo:QUANT` and Ollama's
// `hf.co/org/repo:QUANT` use them: `exo run org/repo:TAG` downloads only the .gguf whose name
// carries the tag (through the download module: verified, resumable, into
// <models>/org--repo:TAG/) and runs it; an id without a tag takes the Q4_K_M file; an unknown
// tag names the files on offer and fetches nothing; the second run fetches nothing again; a node
// whose model card names org/repo:TAG downloads that file only on the first chat and answers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { exoAsync as exo } from './lib/exo.mjs';
import { mkModel, tinyModelSpecs } from './lib/models.mjs';
import { FakeHF } from './lib/fake-hf.mjs';
import { startNode } from './lib/node.mjs';

const REPO = 'test-org/Tiny-Qwen3-GGUF';

// qwen3-tiny widened so every matrix's rows hold whole K-quant blocks of 256 (Q4_K_M)
async function gguf(type) {
  const dir = await mkModel(`qwen3-tiny256-gguf-${type.toLowerCase()}`, [...tinyModelSpecs()['qwen3-tiny'],
    '--hidden', '256', '--intermediate', '512', '--head-dim', '64', '--gguf', type]);
  return fs.readFileSync(path.join(dir, 'model.gguf'));
}

test('exo run org/repo:TAG downloads that quantization only and runs it', async (t) => {
  const files = {
    'README.md': Buffer.from('# Tiny Qwen3 GGUF\n'),
    'Tiny-Qwen3-Q4_0.gguf': await gguf('Q4_0'),
    'Tiny-Qwen3-Q8_0.gguf': await gguf('Q8_0'),
    'Tiny-Qwen3-Q4_K_M.gguf': await gguf('Q4_K_M'),
    'mmproj-Tiny-Qwen3-F16.gguf': Buffer.alloc(8192, 7), // a vision projector: never a model
  };
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModel(REPO, files);
  const models = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-gguf-dl-'));
  t.after(() => fs.rmSync(models, { recursive: true, force: true }));
  const env = { HF_ENDPOINT: hf.url };
  const run = (id, n = 3) => exo(['run', id, 'hi', '--max-tokens', String(n), '--models-dir', models], env);

  const r = await run(`${REPO}:Q8_0`);
  assert.equal(r.status, 0, r.stderr);
  assert.ok(r.stdout.length > 0, 'it generated text');
  const dir = path.join(models, 'test-org--Tiny-Qwen3-GGUF:Q8_0');
  assert.deepEqual(fs.readdirSync(dir).filter((f) => !f.startsWith('.')), ['Tiny-Qwen3-Q8_0.gguf']);
  assert.ok(fs.readFileSync(path.join(dir, 'Tiny-Qwen3-Q8_0.gguf')).equals(files['Tiny-Qwen3-Q8_0.gguf']));
  for (const f of Object.keys(files))
    assert.equal(hf.bytesSent(REPO, f), f === 'Tiny-Qwen3-Q8_0.gguf' ? files[f].length : 0, f);

  // On disk now: nothing is fetched again.
  const before = hf.totalSent(REPO);
  const again = await run(`${REPO}:Q8_0`, 1);
  assert.equal(again.status, 0, again.stderr);
  assert.equal(hf.totalSent(REPO), before);

  // The tag is matched case-insensitively as a word: "q4_0" is Q4_0's file, not Q4_K_M's.
  const lower = await run(`${REPO}:q4_0`);
  assert.equal(lower.status, 0, lower.stderr);
  assert.equal(hf.bytesSent(REPO, 'Tiny-Qwen3-Q4_0.gguf'), files['Tiny-Qwen3-Q4_0.gguf'].length);
  assert.equal(hf.bytesSent(REPO, 'Tiny-Qwen3-Q4_K_M.gguf'), 0);

  // Ollama's spelling, hf.co/org/repo:TAG, is the same id: on disk already, nothing fetched.
  const sentBefore = hf.totalSent(REPO);
  const ollamaStyle = await run(`hf.co/${REPO}:Q8_0`, 1);
  assert.equal(ollamaStyle.status, 0, ollamaStyle.stderr);
  assert.equal(hf.totalSent(REPO), sentBefore);

  // No tag: llama.cpp's default quantization, Q4_K_M, into <models>/org--repo/.
  const plain = await run(REPO);
  assert.equal(plain.status, 0, plain.stderr);
  assert.deepEqual(fs.readdirSync(path.join(models, 'test-org--Tiny-Qwen3-GGUF')).filter((f) => !f.startsWith('.')),
    ['Tiny-Qwen3-Q4_K_M.gguf']);
  assert.equal(hf.bytesSent(REPO, 'mmproj-Tiny-Qwen3-F16.gguf'), 0);
  assert.equal(hf.bytesSent(REPO, 'README.md'), 0);
});

test('exo run org/repo:TAG with a tag no file carries lists the files and fetches nothing', async (t) => {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModel(REPO, { 'Tiny-Qwen3-Q4_0.gguf': await gguf('Q4_0'), 'Tiny-Qwen3-Q8_0.gguf': await gguf('Q8_0') });
  const models = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-gguf-dl-'));
  t.after(() => fs.rmSync(models, { recursive: true, force: true }));
  for (const [id, want] of [
    [`${REPO}:Q5_K_S`, /no \.gguf file of test-org\/Tiny-Qwen3-GGUF carries the tag 'Q5_K_S'; it has: Tiny-Qwen3-Q4_0\.gguf, Tiny-Qwen3-Q8_0\.gguf/],
    [`${REPO}:Q4`, /carries the tag 'Q4'/], // a tag is a whole word of the name, not a prefix
    [REPO, /holds 2 \.gguf files and none is Q4_K_M; choose one with "test-org\/Tiny-Qwen3-GGUF:TAG"/],
    [`${REPO}:Q8_0/x`, /tag \(after ':'\) may only use/],
  ]) {
    const r = await exo(['run', id, 'hi', '--models-dir', models], { HF_ENDPOINT: hf.url });
    assert.equal(r.status, 1, r.stderr);
    assert.match(r.stderr, want);
  }
  assert.equal(hf.totalSent(REPO), 0);
});

test('a model card naming org/repo:TAG: the first chat downloads that file only, then answers', async (t) => {
  const files = { 'Tiny-Qwen3-Q4_0.gguf': await gguf('Q4_0'), 'Tiny-Qwen3-Q8_0.gguf': await gguf('Q8_0') };
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModel(REPO, files);
  const cards = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-gguf-cards-'));
  t.after(() => fs.rmSync(cards, { recursive: true, force: true }));
  const id = `${REPO}:Q8_0`;
  fs.writeFileSync(path.join(cards, 'tiny-gguf.toml'), [
    `model_id = "${id}"`, 'n_layers = 2', 'hidden_size = 256', 'num_key_value_heads = 2',
    'supports_tensor = false', 'tasks = ["TextGeneration"]', 'family = "qwen"', 'quantization = "8bit"',
    'base_model = "Tiny Qwen3 GGUF"', 'capabilities = ["text"]', 'context_length = 4096', '',
    '[storage_size]', `in_bytes = ${files['Tiny-Qwen3-Q8_0.gguf'].length}`, ''].join('\n'));
  const n = await startNode({ env: { HF_ENDPOINT: hf.url, HF_TOKEN: '', EXO_CARDS_DIR: cards } });
  t.after(() => n.stop());
  const listed = await (await fetch(`${n.url}/models`)).json();
  assert.ok(JSON.stringify(listed).includes(id), `the card is in the catalog: ${JSON.stringify(listed).slice(0, 500)}`);
  const r = await fetch(`${n.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: id, max_tokens: 3, messages: [{ role: 'user', content: 'hi' }] }),
  });
  const body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  assert.equal(typeof body.choices[0].message.content, 'string');
  assert.equal(hf.bytesSent(REPO, 'Tiny-Qwen3-Q8_0.gguf'), files['Tiny-Qwen3-Q8_0.gguf'].length);
  assert.equal(hf.bytesSent(REPO, 'Tiny-Qwen3-Q4_0.gguf'), 0);
  assert.deepEqual(fs.readdirSync(path.join(n.modelsDir, 'test-org--Tiny-Qwen3-GGUF:Q8_0')).filter((f) => !f.startsWith('.')),
    ['Tiny-Qwen3-Q8_0.gguf']);
});
