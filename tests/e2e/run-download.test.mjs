// `exo run ORG/NAME` with a model that is not on disk downloads it (progress bar on stderr) from
// HF_ENDPOINT and then generates; with --offline it only names the missing model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { deviceArgs, exoBin } from './lib/exo.mjs';
import { tinyModel } from './lib/models.mjs';
import { FakeHF } from './lib/fake-hf.mjs';

const ID = 'test-org/qwen3-tiny';

// Async (the fake Hub runs in this process, so spawnSync would block it).
function exo(args, env = {}) {
  return new Promise((resolve) => {
    const p = spawn(exoBin(), args, { env: { ...process.env, HF_TOKEN: '', ...env } });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    p.on('exit', (status) => resolve({ status, stdout, stderr }));
  });
}

test('exo run downloads a missing model with a progress bar, then runs it; --offline does not', async (t) => {
  const dir = await tinyModel('qwen3-tiny');
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModelDir(ID, dir);
  const models = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-run-dl-'));
  t.after(() => fs.rmSync(models, { recursive: true, force: true }));

  const off = await exo(['run', ID, 'hi', '--offline', '--models-dir', models], { HF_ENDPOINT: hf.url });
  assert.equal(off.status, 1);
  assert.match(off.stderr, /no model 'test-org\/qwen3-tiny': not found/);
  assert.equal(hf.totalSent(ID), 0, '--offline fetched nothing');

  const r = await exo(['run', ID, 'hi', '--max-tokens', '3', '--models-dir', models, ...deviceArgs()],
    { HF_ENDPOINT: hf.url });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /downloading/);
  assert.match(r.stderr, /\d+\.\d% .*files \d+\/\d+/, 'a progress bar was drawn');
  assert.ok(r.stdout.length > 0, 'it generated text');
  assert.ok(fs.existsSync(path.join(models, 'test-org--qwen3-tiny', 'model.safetensors')));
  const sent = hf.totalSent(ID);
  assert.ok(sent > 0);

  // Second run: the model is on disk now; nothing is fetched again.
  const again = await exo(['run', ID, 'hi', '--max-tokens', '1', '--models-dir', models, ...deviceArgs()],
    { HF_ENDPOINT: hf.url });
  assert.equal(again.status, 0, again.stderr);
  assert.equal(hf.totalSent(ID), sent);
});
