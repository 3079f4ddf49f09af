// Models Ollama has already pulled ($OLLAMA_MODELS: manifests + sha256 blobs) run by their Ollama
// names with no copy: `exo run name:tag` generates what the same GGUF file gives, a model pulled
// from Hugging Face through Ollama (hf.co/org/repo:TAG) answers to exo's own id org/repo:TAG with
// no download, a node lists them in /ollama/api/tags and /models and chats with them, a manifest
// whose blob is missing is not a model, and nothing under Ollama's directory is written.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { exoBin } from './lib/exo.mjs';
import { mkModel, tinyModelSpecs } from './lib/models.mjs';
import { startNode } from './lib/node.mjs';

// A fake Ollama store: each entry [manifest path under manifests/, GGUF bytes or null (blob missing)].
function ollamaStore(entries) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-ollama-'));
  fs.mkdirSync(path.join(root, 'blobs'));
  for (const [name, gguf] of entries) {
    const bytes = gguf || Buffer.from('GGUF-missing');
    const hex = crypto.createHash('sha256').update(bytes).digest('hex');
    if (gguf) fs.writeFileSync(path.join(root, 'blobs', `sha256-${hex}`), gguf);
    const tmpl = Buffer.from('{{ .Prompt }}');
    const tmplHex = crypto.createHash('sha256').update(tmpl).digest('hex');
    fs.writeFileSync(path.join(root, 'blobs', `sha256-${tmplHex}`), tmpl);
    const manifest = {
      schemaVersion: 2, mediaType: 'application/vnd.docker.distribution.manifest.v2+json',
      config: { mediaType: 'application/vnd.docker.container.image.v1+json', digest: `sha256:${'0'.repeat(64)}`, size: 2 },
      layers: [
        { mediaType: 'application/vnd.ollama.image.model', digest: `sha256:${hex}`, size: bytes.length },
        { mediaType: 'application/vnd.ollama.image.template', digest: `sha256:${tmplHex}`, size: tmpl.length },
      ],
    };
    const file = path.join(root, 'manifests', name);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, JSON.stringify(manifest));
  }
  return root;
}

// Every file under dir with its size and mtime: what "nothing was written" is checked against.
function snapshot(dir) {
  const out = [];
  for (const e of fs.readdirSync(dir, { recursive: true })) {
    const st = fs.statSync(path.join(dir, e));
    out.push(`${e} ${st.size} ${st.mtimeMs}`);
  }
  return out.sort();
}

const exoRun = (args, env) => spawnSync(exoBin(), ['run', ...args], {
  encoding: 'utf8', timeout: 120000, env: { ...process.env, HF_ENDPOINT: 'http://127.0.0.1:9', ...env },
});

let node, root, models;
after(async () => {
  await node?.stop();
  for (const d of [root, models]) if (d) fs.rmSync(d, { recursive: true, force: true });
});

test('Ollama-pulled models run by name, in place, and a node lists and serves them', async () => {
  const dir = await mkModel('qwen3-tiny-gguf-q8_0', [...tinyModelSpecs()['qwen3-tiny'], '--gguf', 'Q8_0']);
  const gguf = fs.readFileSync(path.join(dir, 'model.gguf'));
  root = ollamaStore([
    ['registry.ollama.ai/library/tinyqwen/1b', gguf],
    ['hf.co/test-org/Tiny-Qwen3-GGUF/Q8_0', gguf],
    ['registry.ollama.ai/library/gone/latest', null],
  ]);
  models = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-ollama-models-'));
  const before = snapshot(root);
  const env = { OLLAMA_MODELS: root };
  const common = ['hi', '--temperature', '0', '--max-tokens', '8', '--models-dir', models];

  const want = exoRun([path.join(dir, 'model.gguf'), ...common], env);
  assert.equal(want.status, 0, want.stderr);
  const byName = exoRun(['tinyqwen:1b', ...common], env);
  assert.equal(byName.status, 0, byName.stderr);
  assert.equal(byName.stdout, want.stdout);
  // pulled from Hugging Face through Ollama: exo's id for the same quantization, no download
  const hfId = exoRun(['test-org/Tiny-Qwen3-GGUF:Q8_0', ...common], env);
  assert.equal(hfId.status, 0, hfId.stderr);
  assert.equal(hfId.stdout, want.stdout);
  assert.doesNotMatch(hfId.stderr, /downloading/);
  // a manifest without its blob names no model; without OLLAMA_MODELS nothing is found
  const gone = exoRun(['gone', 'hi', '--offline', '--models-dir', models], env);
  assert.equal(gone.status, 1);
  assert.match(gone.stderr, /no model 'gone'/);
  const off = exoRun(['tinyqwen:1b', 'hi', '--offline', '--models-dir', models], { OLLAMA_MODELS: path.join(root, 'nowhere') });
  assert.equal(off.status, 1);
  assert.deepEqual(fs.readdirSync(models), [], 'nothing was copied into the models dir');

  node = await startNode({ env, modelsDir: models });
  const tags = await (await fetch(`${node.url}/ollama/api/tags`)).json();
  const names = tags.models.map((m) => m.name);
  for (const n of ['tinyqwen:1b', 'test-org/Tiny-Qwen3-GGUF:Q8_0'])
    assert.ok(names.some((x) => x === n || x.startsWith(`${n}:`)), `${n} in ${JSON.stringify(names)}`);
  assert.ok(!names.some((x) => x.startsWith('gone')), JSON.stringify(names));
  const res = await fetch(`${node.url}/ollama/api/chat`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tinyqwen:1b', messages: [{ role: 'user', content: 'hi' }], stream: false,
      options: { temperature: 0, num_predict: 4 } }),
  });
  const body = await res.json();
  assert.equal(res.status, 200, JSON.stringify(body));
  assert.equal(typeof body.message.content, 'string');
  assert.deepEqual(snapshot(root), before, "nothing under Ollama's directory changed");
});
