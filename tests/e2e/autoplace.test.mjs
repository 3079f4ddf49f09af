// Placing a model that is in the catalog but not on disk downloads it first (from the fake Hub
// here), shows the download in /state, then loads it; offline, a missing model is a clear 404.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';
import { FakeHF } from './lib/fake-hf.mjs';

const ID = 'test-org/qwen3-tiny';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(fn, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

const post = async (n, p, body) => {
  const r = await fetch(n.url + p, { method: 'POST', body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
};
const state = async (n) => (await fetch(`${n.url}/state`)).json();

test('place_instance of a catalog model not on disk downloads it, then runs it', async (t) => {
  const dir = await tinyModel('qwen3-tiny');
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModelDir(ID, dir);
  const n = await startNode({ env: { HF_ENDPOINT: hf.url, HF_TOKEN: '' } });
  t.after(() => n.stop());
  const nodeId = await (await fetch(`${n.url}/node_id`)).json();

  const unknown = await post(n, '/place_instance', { model_id: 'test-org/not-anywhere' });
  assert.equal(unknown.status, 404);
  assert.match(unknown.body.error.message, /test-org\/not-anywhere/);

  assert.equal((await post(n, '/models/add', { model_id: ID })).status, 200, 'card added');
  const placed = await post(n, '/place_instance', { model_id: ID });
  assert.equal(placed.status, 200, JSON.stringify(placed.body));
  assert.equal(placed.body.downloading, true);

  const st = await until(async () => {
    const s = await state(n);
    const ready = Object.values(s.runners).some((r) => 'RunnerReady' in r);
    const inst = Object.values(s.instances).find((i) => Object.values(i)[0].shardAssignments.modelId === ID);
    return ready && inst ? s : false;
  }, 60000, 'the downloaded model to be placed and Ready');
  const dl = st.downloads[nodeId].find((d) => Object.values(d)[0].modelId === ID);
  assert.ok(dl && dl.DownloadCompleted, `download completed in State: ${JSON.stringify(st.downloads)}`);
  assert.ok(fs.existsSync(path.join(n.modelsDir, 'test-org--qwen3-tiny', 'model.safetensors')));
  assert.ok(hf.totalSent(ID) > 0, 'the files came from the Hub');

  const r = await post(n, '/v1/chat/completions', { model: ID, max_tokens: 2,
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.usage.completion_tokens, 2);
});

test('offline, placing a catalog model that is not on disk is a 404 naming it', async (t) => {
  const n = await startNode({ args: ['--offline'] });
  t.after(() => n.stop());
  const catalog = (await (await fetch(`${n.url}/models`)).json()).data;
  const missing = catalog.find((m) => !m.downloaded && m.id.includes('/'));
  assert.ok(missing, 'the built-in catalog has a model that is not downloaded');
  const r = await post(n, '/place_instance', { model_id: missing.id });
  assert.equal(r.status, 404);
  assert.ok(r.body.error.message.includes(missing.id), r.body.error.message);
  assert.match(r.body.error.message, /offline/);
});
