// The node's model endpoints as a user (or the dashboard) calls them: the catalog, downloads
// started / cancelled / deleted over HTTP, custom cards, Hub search, and peer transfer between
// two nodes with the Hub gone.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { FakeHF, makeTinyModel } from './lib/fake-hf.mjs';

const ID = 'test-org/tiny-llama';
const made = [];
after(() => { for (const d of made) fs.rmSync(d, { recursive: true, force: true }); });
function tmpdir(tag) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), `exo-mapi-${tag}-`));
  made.push(d);
  return d;
}

async function node(t, hf, extra = {}) {
  const dataDir = extra.dataDir || tmpdir('data');
  const n = await startNode({
    args: ['--data-dir', dataDir, ...(extra.args || [])],
    env: { HF_ENDPOINT: hf ? hf.url : 'http://127.0.0.1:9', HF_TOKEN: '' },
    modelsDir: extra.modelsDir || tmpdir('models'),
  });
  t.after(() => n.stop());
  n.dataDir = dataDir;
  return n;
}

async function json(url, init) {
  const r = await fetch(url, init);
  return { status: r.status, body: await r.json() };
}
const post = (url, body) => json(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

async function waitDownload(n, id, want = 'DownloadCompleted') {
  const deadline = Date.now() + 20000;
  for (;;) {
    const { body } = await json(`${n.url}/download/status`);
    const e = body.downloads.find((d) => Object.values(d)[0].modelId === id);
    if (e && Object.keys(e)[0] === want) return Object.values(e)[0];
    if (e && Object.keys(e)[0] === 'DownloadFailed' && want !== 'DownloadFailed')
      throw new Error(`download failed: ${e.DownloadFailed.errorMessage}`);
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${want}: ${JSON.stringify(body)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('GET /v1/models lists the built-in catalog with exo fields; ?status=downloaded filters', async (t) => {
  const n = await node(t, null);
  const { status, body } = await json(`${n.url}/v1/models`);
  assert.equal(status, 200);
  assert.equal(body.object, 'list');
  const llama = body.data.find((m) => m.id === 'mlx-community/Llama-3.2-1B-Instruct-4bit');
  assert.ok(llama, 'catalog has Llama 3.2 1B');
  for (const k of ['id', 'object', 'created', 'owned_by', 'hugging_face_id', 'name', 'description',
    'context_length', 'tags', 'storage_size_megabytes', 'supports_tensor', 'tasks', 'is_custom',
    'family', 'quantization', 'base_model', 'capabilities']) assert.ok(k in llama, `field ${k}`);
  assert.equal(llama.storage_size_megabytes, Math.floor(729808896 / 2 ** 20));
  assert.equal(llama.context_length, 131072);
  assert.equal(llama.is_custom, false);
  assert.ok(body.data.length >= 20);
  const dl = await json(`${n.url}/models?status=downloaded`);
  assert.equal(dl.status, 200);
  // Nothing downloaded yet: only the demo model that ships with exo (resources/models) is on disk.
  assert.deepEqual(dl.body.data.map((m) => m.id), ['exo/demo-dictionary']);
  const bad = await json(`${n.url}/models?status=bogus`);
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /status/);
});

test('download over HTTP: start, progress in state shape, listed as downloaded, then deleted', async (t) => {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const n = await node(t, hf);
  const start = await post(`${n.url}/download/start`, { model_id: ID });
  assert.equal(start.status, 200, JSON.stringify(start.body));
  const done = await waitDownload(n, ID);
  assert.ok(done.total.inBytes > 0);
  assert.ok(fs.existsSync(path.join(n.modelsDir, 'test-org--tiny-llama', 'model-00001-of-00004.safetensors')));
  const dl = await json(`${n.url}/models?status=downloaded`);
  const m = dl.body.data.find((x) => x.id === ID);
  assert.ok(m, 'downloaded model is listed');
  assert.equal(m.downloaded, true);
  assert.equal(m.family, 'llama');

  const nodeId = await (await fetch(`${n.url}/node_id`)).json();
  const other = await json(`${n.url}/download/not-this-node/${ID}`, { method: 'DELETE' });
  assert.equal(other.status, 404);
  const del = await json(`${n.url}/download/${nodeId}/${ID}`, { method: 'DELETE' });
  assert.equal(del.status, 200, JSON.stringify(del.body));
  assert.ok(!fs.existsSync(path.join(n.modelsDir, 'test-org--tiny-llama')));
  const again = await json(`${n.url}/download/${nodeId}/${ID}`, { method: 'DELETE' });
  assert.equal(again.status, 404);
  const trav = await json(`${n.url}/download/${nodeId}/..%2F..`, { method: 'DELETE' });
  assert.equal(trav.status, 400);
  const bad = await post(`${n.url}/download/start`, { model_id: '../../etc' });
  assert.equal(bad.status, 400);
  assert.equal(bad.body.error.code, 400);
});

test('cancel over HTTP stops a running download; cancelling nothing is a 404', async (t) => {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModel(ID, makeTinyModel({ nShards: 1, nLayers: 2, layerBytes: 128 * 1024 }));
  hf.faults.bytesPerSec = 50_000;
  const n = await node(t, hf);
  assert.equal((await post(`${n.url}/download/start`, { model_id: ID })).status, 200);
  const again = await post(`${n.url}/download/start`, { model_id: ID });
  assert.equal(again.body.already_running, true);
  await waitDownload(n, ID, 'DownloadOngoing');
  const c = await post(`${n.url}/download/cancel`, { model_id: ID });
  assert.equal(c.status, 200);
  const failed = await waitDownload(n, ID, 'DownloadFailed');
  assert.match(failed.errorMessage, /cancelled/);
  const none = await post(`${n.url}/download/cancel`, { model_id: 'x/y' });
  assert.equal(none.status, 404);
});

test('custom cards: add from config.json, listed as custom, survive a restart, removed', async (t) => {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModel(ID, makeTinyModel());
  const n = await node(t, hf);
  const add = await post(`${n.url}/models/add`, { model_id: ID });
  assert.equal(add.status, 200, JSON.stringify(add.body));
  assert.equal(add.body.model_card.n_layers, 4);
  const list = await json(`${n.url}/models`);
  const m = list.body.data.find((x) => x.id === ID);
  assert.equal(m.is_custom, true);
  assert.ok(m.storage_size_megabytes >= 0);
  assert.equal((await post(`${n.url}/models/add`, { model_id: 'mlx-community/Qwen3-0.6B-4bit' })).status, 409);
  const missing = await post(`${n.url}/models/add`, { model_id: 'nobody/none' });
  assert.equal(missing.status, 404);
  assert.equal((await post(`${n.url}/models/add`, {})).status, 400);
  await n.stop();
  const n2 = await node(t, hf, { dataDir: n.dataDir });
  assert.ok((await json(`${n2.url}/models`)).body.data.find((x) => x.id === ID && x.is_custom));
  const del = await json(`${n2.url}/models/custom/${ID}`, { method: 'DELETE' });
  assert.equal(del.status, 200);
  assert.ok(!(await json(`${n2.url}/models`)).body.data.find((x) => x.id === ID));
  assert.equal((await json(`${n2.url}/models/custom/${ID}`, { method: 'DELETE' })).status, 404);
});

test('GET /models/search goes to the Hub through HF_ENDPOINT', async (t) => {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.extraSearchIds = ['mlx-community/Llama-3.2-1B-Instruct-4bit', 'meta-llama/Llama-3.2-1B'];
  const n = await node(t, hf);
  const r = await json(`${n.url}/models/search?query=llama&limit=5`);
  assert.equal(r.status, 200);
  assert.equal(r.body[0].id, 'mlx-community/Llama-3.2-1B-Instruct-4bit');
  assert.equal(r.body.length, 2);
  assert.equal((await json(`${n.url}/models/search?query=x&limit=0`)).status, 400);
});

test('peer transfer between nodes: B downloads from A over the API port with the Hub stopped', async (t) => {
  const hf = await new FakeHF().start();
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const a = await node(t, hf);
  assert.equal((await post(`${a.url}/download/start`, { model_id: ID })).status, 200);
  await waitDownload(a, ID);
  await hf.stop();
  // A serves only files of complete models, only by safe paths
  const man = await json(`${a.url}/models/${ID}/manifest`);
  assert.equal(man.status, 200);
  assert.equal((await fetch(`${a.url}/models/${ID}/files/..%2F..%2Fetc%2Fpasswd`)).status, 400);
  assert.equal((await fetch(`${a.url}/models/other/model/manifest`)).status, 404);
  const w = 'model-00003-of-00004.safetensors';
  const part = await fetch(`${a.url}/models/${ID}/files/${w}`, { headers: { range: 'bytes=100-199' } });
  assert.equal(part.status, 206);
  assert.ok(Buffer.from(await part.arrayBuffer()).equals(files[w].subarray(100, 200)));

  const b = await node(t, null);
  assert.equal((await post(`${b.url}/download/start`, { model_id: ID, peers: [a.url] })).status, 200);
  await waitDownload(b, ID);
  for (const [p, buf] of Object.entries(files)) {
    if (p === '.gitattributes') continue;
    assert.ok(fs.readFileSync(path.join(b.modelsDir, 'test-org--tiny-llama', p)).equals(buf), p);
  }
});
