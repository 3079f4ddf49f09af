// GGUF models as llama.cpp and Ollama users have them: `exo run X.gguf` and a node serving a
// .gguf give the text transformers produced for the same weights (tests/fixtures/reference: a
// BF16 GGUF holds exactly the values of the bf16 safetensors model the fixture was made from),
// through the GGUF's own tokenizer metadata and chat template, for Qwen3 and Llama 3 (q/k rows
// permuted by llama.cpp's layout, Llama 3 RoPE scaling as a frequency table).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { deviceArgs, exoBin, repoRoot } from './lib/exo.mjs';
import { mkModel, tinyModelSpecs } from './lib/models.mjs';
import { startNode } from './lib/node.mjs';

function fixture(name) {
  return JSON.parse(fs.readFileSync(path.join(repoRoot, 'tests/fixtures/reference', `${name}.json`), 'utf8'));
}

// The named tiny model as a GGUF file of `type` (.cache/models/<name>-gguf-<type>/model.gguf).
async function ggufModel(name, type) {
  return mkModel(`${name}-gguf-${type.toLowerCase()}`, [...tinyModelSpecs()[name], '--gguf', type]);
}

function exoRun(args) {
  const r = spawnSync(exoBin(), ['run', ...args, ...deviceArgs()], { encoding: 'utf8', timeout: 120000 });
  assert.equal(r.status, 0, r.stderr);
  return r;
}

for (const [model, promptName, extra, asFile] of [['qwen3-tiny', 'chat-single', [], false],
  ['llama3-tiny', 'raw-capital', ['--raw'], true]]) {
  test(`exo run ${model} as BF16 GGUF (${promptName}) prints what transformers generates`, async () => {
    const dir = await ggufModel(model, 'BF16');
    const p = fixture(model).prompts.find((x) => x.name === promptName);
    const text = p.kind === 'chat' ? p.messages[0].content : p.text;
    const target = asFile ? path.join(dir, 'model.gguf') : dir;
    const r = exoRun([target, text, '--temperature', '0', '--max-tokens', '32', ...extra]);
    const got = r.stdout.replace(/\n$/, '');
    assert.ok(got.length > 10, `generated text: ${JSON.stringify(got)}`);
    assert.ok(p.greedy.text.startsWith(got), `${JSON.stringify(got)} vs ${JSON.stringify(p.greedy.text)}`);
  });
}

test('exo run names what it cannot run in a GGUF file', async () => {
  const dir = fs.mkdtempSync('/tmp/exo-gguf-bad-');
  const file = path.join(dir, 'broken.gguf');
  fs.writeFileSync(file, Buffer.concat([Buffer.from('GGUF\x01\x00\x00\x00', 'latin1'), Buffer.alloc(24)]));
  const r = spawnSync(exoBin(), ['run', file, 'hi'], { encoding: 'utf8' });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /broken\.gguf: GGUF version 1; exo reads versions 2 and 3/);
  fs.rmSync(dir, { recursive: true, force: true });
});

let node;
after(async () => { await node?.stop(); });

test('a node serves a GGUF model: chat equals the transformers reference, Ollama lists and shows it', async () => {
  const dir = await ggufModel('qwen3-tiny', 'BF16');
  const id = path.basename(dir);
  node = await startNode({ args: ['--models-path', path.dirname(dir)] });
  const p = fixture('qwen3-tiny').prompts.find((x) => x.name === 'chat-single');
  const res = await fetch(`${node.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: id, messages: p.messages, max_tokens: 16, temperature: 0 }),
  });
  const body = await res.json();
  assert.equal(res.status, 200, JSON.stringify(body));
  const got = body.choices[0].message.content;
  assert.ok(got.length > 0 && p.greedy.text.startsWith(got), `${JSON.stringify(got)} vs ${JSON.stringify(p.greedy.text)}`);
  const tags = await (await fetch(`${node.url}/ollama/api/tags`)).json();
  const listed = tags.models.find((m) => m.name.startsWith(id) || m.model.startsWith(id));
  assert.ok(listed, JSON.stringify(tags));
  // what Ollama clients show: the file's format, family, llama.cpp's name of its type, its size
  assert.equal(listed.details.format, 'gguf', JSON.stringify(listed));
  assert.equal(listed.details.family, 'qwen3');
  assert.equal(listed.details.quantization_level, 'BF16');
  assert.equal(listed.size, fs.statSync(path.join(dir, 'model.gguf')).size);
  const show = await (await fetch(`${node.url}/ollama/api/show`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: id }),
  })).json();
  assert.equal(show.model_info.architectures[0], 'Qwen3ForCausalLM', JSON.stringify(show));
  assert.equal(show.details.quantization_level, 'BF16');
  assert.equal(show.model_info.num_hidden_layers, 2);
});
