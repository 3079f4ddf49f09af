// A pipeline instance on nodes that lack the model's files: each node downloads only its stage's
// safetensors files (from a peer holding the model, else the Hub: the fake one here), then its
// rank starts and opens just those files; the answer equals one node's. The nodes run with
// --api-key: forwarded generations and peer downloads carry it, a client without it gets 401.
// An instance deleted while its stages download stops those downloads (the Hub then sends
// nothing more; the .partial files stay), and placing it again resumes them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { FakeHF } from './lib/fake-hf.mjs';
import { mkModel } from './lib/models.mjs';
import { body, chat, http, place, remove, startCluster } from './lib/multinode.mjs';
import { startNode } from './lib/node.mjs';

const KEY = 'cluster-secret-key';
const HF_TOKEN = 'hf-secret-token';
// 4 layers of about 1 MB each in files of at most 1 MB, the embedding and the lm_head (19 MB
// each) in files of their own: each pipeline stage needs some files and not others.
const ARGS = ['--arch', 'qwen3', '--seed', '11', '--tokenizer', 'qwen3', '--layers', '4', '--heads', '8',
  '--kv-heads', '4', '--head-dim', '32', '--intermediate', '2048', '--shard-mb', '1'];
const FROM_HUB = 'test-org/qwen3-sharded';
const FROM_PEER = 'test-org/qwen3-sharded-peer';
const HELLO = [{ role: 'user', content: 'Hello' }];

let hf, c, dir, single, expected;
before(async () => {
  dir = await mkModel('qwen3-sharded', ARGS);
  hf = await new FakeHF().start();
  hf.addModelDir(FROM_HUB, dir);
  hf.addModelDir(FROM_PEER, dir);
  // one node holding the whole model gives the answer to match
  single = await startNode({ args: ['--models-path', path.dirname(dir)] });
  const r = await fetch(`${single.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({
    model: 'qwen3-sharded', messages: HELLO, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 2 }) });
  assert.equal(r.status, 200);
  const choice = (await r.json()).choices[0];
  expected = choice.logprobs.content.map((t) => t.token);
  await single.stop();
  single = null;
  // The fake Hub listens on this host's loopback: the nodes share it (loopback mode).
  // Each token goes to its own kind of server: the Hub answers only with the HF token, the
  // peers only with the API key (a token sent to the wrong one fails the download there).
  hf.faults.requireToken = HF_TOKEN;
  c = await startCluster(2, null, { HF_ENDPOINT: hf.url, HF_TOKEN }, {
    mode: 'loopback', apiKey: KEY, args: (i) => ['--models-dir', path.join(os_tmp(), `models${i}`)],
  });
});
after(async () => {
  await single?.stop();
  await c?.stop();
  await hf?.stop();
});

let tmpRoot; // the nodes' models dirs
function os_tmp() {
  if (!tmpRoot) tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-multinode-download-'));
  return tmpRoot;
}
after(() => { if (tmpRoot) fs.rmSync(tmpRoot, { recursive: true, force: true }); });

// A POST that leaves the event loop free: the fake Hub answers from this process (the
// harness's http() blocks it while curl runs).
async function post(node, p, json) {
  const r = await fetch(`http://127.0.0.1:${node.apiPort}${p}`, { method: 'POST', body: JSON.stringify(json),
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` } });
  const text = await r.text();
  try { return { status: r.status, body: JSON.parse(text) }; } catch { return { status: r.status, body: text }; }
}

// The stage rule of src/model/safetensors.c (safetensors_stage_needs), for the expectations.
function stageNeeds(name, nLayers, start, end) {
  const m = name.match(/(?:^|\.)(?:layers|h|blocks)\.(\d+)\./);
  if (m) return Number(m[1]) >= start && Number(m[1]) < end;
  if (name.includes('embed')) return start === 0;
  if (name.includes('lm_head') || name.includes('norm')) return end >= nLayers;
  return start === 0 || end >= nLayers;
}

// {file: present} for every weight file of the model on node i, and the files its stage needs.
function weightFiles(i, model, start, end) {
  const index = JSON.parse(fs.readFileSync(path.join(dir, 'model.safetensors.index.json'), 'utf8'));
  const files = [...new Set(Object.values(index.weight_map))].sort();
  const need = new Set(Object.entries(index.weight_map)
    .filter(([name]) => stageNeeds(name, 4, start, end)).map(([, f]) => f));
  const where = path.join(os_tmp(), `models${i}`, model.replace('/', '--'));
  return {
    present: files.filter((f) => fs.existsSync(path.join(where, f))),
    needed: files.filter((f) => need.has(f)),
    all: files,
  };
}

// Places a 2-node pipeline of model through node, waits until Ready; returns {id, stages}.
async function placeTwo(node, model) {
  const placed = await place(c, node, { model_id: model, sharding: 'Pipeline', instance_meta: 'MlxRing',
    min_nodes: 2 }, 120000);
  const b = body(placed.instance);
  const stages = Object.entries(b.shardAssignments.nodeToRunner).map(([nodeId, runner]) => {
    const meta = Object.values(b.shardAssignments.runnerToShard[runner])[0];
    return { node: c.nodeByid(nodeId), rank: meta.deviceRank, start: meta.startLayer, end: meta.endLayer };
  }).sort((x, y) => x.rank - y.rank);
  return { id: placed.id, stages };
}

function assertOnlyStageFiles(stages, model) {
  for (const s of stages) {
    const f = weightFiles(s.node.i, model, s.start, s.end);
    assert.deepEqual(f.present, f.needed, `node ${s.node.i} (layers ${s.start}:${s.end}) holds just its stage's files`);
    assert.ok(f.needed.length < f.all.length, `stage ${s.start}:${s.end} needs fewer files than the model has`);
  }
}

test('neither node holds the model: each downloads only its stage\'s files from the Hub', async () => {
  const [a] = c.nodes;
  const added = await post(a, '/models/add', { model_id: FROM_HUB });
  assert.equal(added.status, 200, `card added: ${JSON.stringify(added.body)}`);
  const { id, stages } = await placeTwo(a, FROM_HUB);
  assertOnlyStageFiles(stages, FROM_HUB);
  const st = c.get(a, '/state');
  for (const s of stages) {
    const d = st.downloads[s.node.id].find((e) => Object.values(e)[0].modelId === FROM_HUB);
    assert.ok(d && d.DownloadCompleted, `node ${s.node.i}'s download completed in State`);
    assert.equal(d.DownloadCompleted.startLayer, s.start);
    assert.equal(d.DownloadCompleted.endLayer, s.end);
  }
  for (const s of stages) assert.deepEqual(chat(c, s.node, FROM_HUB, HELLO).tokens, expected);
  await remove(c, a, id);
});

test('a node holding the model serves the other stage\'s files; requests need the API key', async () => {
  const [a, b] = c.nodes;
  for (const [n, p] of [[a, '/models/add'], [b, '/models/add'], [a, '/download/start']]) {
    const r = await post(n, p, { model_id: FROM_PEER });
    assert.equal(r.status, 200, `${p} on node ${n.i}: ${JSON.stringify(r.body)}`);
  }
  await c.until(() => {
    const list = (c.get(b, '/state')?.downloads || {})[a.id] || [];
    return list.some((e) => e.DownloadCompleted && e.DownloadCompleted.modelId === FROM_PEER);
  }, 30000, 'node A to hold the whole model');
  const fromHub = hf.totalSent(FROM_PEER);
  const { id, stages } = await placeTwo(b, FROM_PEER);
  assert.equal(stages[0].node, a, 'the node holding the files is preferred (rank 0)');
  assert.equal(stages[1].node, b);
  assertOnlyStageFiles([stages[1]], FROM_PEER);
  assert.equal(hf.totalSent(FROM_PEER), fromHub, 'node B fetched its files from node A, not the Hub');
  assert.ok(hf.log.every((r) => r.auth === `Bearer ${HF_TOKEN}`), 'the Hub saw only the HF token');

  // through the node without rank 0: forwarded to node A with the key
  assert.deepEqual(chat(c, b, FROM_PEER, HELLO).tokens, expected);
  const noKey = spawnSync('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', '-m', '10',
    '-H', 'Content-Type: application/json', '-d', JSON.stringify({ model: FROM_PEER, messages: HELLO, max_tokens: 2 }),
    `http://127.0.0.1:${b.apiPort}/v1/chat/completions`], { encoding: 'utf8' });
  assert.equal(noKey.stdout, '401', 'a client without the key is refused');
  const wrong = http({ ...c, auth: ['-H', 'Authorization: Bearer wrong'] }, a,
    'GET', `/models/${FROM_PEER}/manifest`);
  assert.equal(wrong.status, 401, 'peer file transfer needs the key too');
  await remove(c, a, id);
});

// {nodeId: startLayer} of an instance body.
function stageStarts(b) {
  const out = {};
  for (const [nodeId, runner] of Object.entries(b.shardAssignments.nodeToRunner).sort())
    out[nodeId] = Object.values(b.shardAssignments.runnerToShard[runner])[0].startLayer;
  return out;
}
let firstStages;

// node's entry for model in State's downloads (as node `from` sees it), unwrapped with its tag.
function downloadEntry(from, node, model) {
  const e = ((c.get(from, '/state')?.downloads || {})[node.id] || []).find((x) => Object.values(x)[0].modelId === model);
  return e && { kind: Object.keys(e)[0], ...Object.values(e)[0] };
}

test('an instance deleted while its stages download stops the downloads; placed again, they resume', async () => {
  const [a, b] = c.nodes;
  const MODEL = 'test-org/qwen3-sharded-deleted';
  hf.addModelDir(MODEL, dir);
  assert.equal((await post(a, '/models/add', { model_id: MODEL })).status, 200);
  hf.faults.bytesPerSec = 100_000; // per response: minutes for the whole model
  try {
    const placed = await post(a, '/place_instance', { model_id: MODEL, sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 2 });
    assert.equal(placed.status, 200, JSON.stringify(placed.body));
    await c.until(() => [a, b].every((n) => downloadEntry(a, n, MODEL)?.kind === 'DownloadOngoing') &&
      hf.totalSent(MODEL) > 200_000, 30000, 'both stages to be downloading');
    firstStages = stageStarts(body(c.get(a, '/state').instances[placed.body.instance_id]));
    const del = await fetch(`http://127.0.0.1:${a.apiPort}/instance/${placed.body.instance_id}`,
      { method: 'DELETE', headers: { authorization: `Bearer ${KEY}` } });
    assert.equal(del.status, 200);
    const { value: ended } = await c.until(() => {
      const e = [a, b].map((n) => downloadEntry(a, n, MODEL));
      return e.every((x) => x?.kind === 'DownloadFailed') ? e : false;
    }, 10000, 'both stage downloads to stop');
    for (const e of ended) assert.match(e.errorMessage, /cancelled/);
    const sent = hf.totalSent(MODEL);
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(hf.totalSent(MODEL), sent, 'the Hub sends nothing more');
    assert.ok(sent < 4 * 1024 * 1024, `only part of the model was fetched (${sent} bytes)`);
    for (const i of [0, 1]) { // the download module's rule for a cancel: partial files stay
      const where = path.join(os_tmp(), `models${i}`, MODEL.replace('/', '--'));
      const partial = fs.readdirSync(where).filter((f) => f.endsWith('.partial'));
      assert.ok(partial.length > 0, `node ${i} keeps its .partial files to resume`);
    }
  } finally {
    hf.faults.bytesPerSec = 0;
  }
  const before = hf.totalSent(MODEL);
  const { id, stages } = await placeTwo(a, MODEL);
  assertOnlyStageFiles(stages, MODEL);
  assert.deepEqual(chat(c, b, MODEL, HELLO).tokens, expected);
  // the first test fetched the same files from scratch; a node given the same stage again
  // fetches only what its .partial files lack
  const fresh = hf.totalSent(FROM_HUB), again = hf.totalSent(MODEL) - before;
  if (JSON.stringify(stageStarts(body(c.get(a, '/state').instances[id]))) === JSON.stringify(firstStages))
    assert.ok(again <= fresh - before / 2, `placed again, the stages resumed (${again} bytes, ${fresh} from scratch, ${before} before)`);
  await remove(c, a, id);
});

test('an --offline node assigned a rank whose files it lacks reports RunnerFailed saying so', async () => {
  const [a] = c.nodes;
  const off = c.addNode(['--models-dir', path.join(os_tmp(), 'models-offline'), '--offline', '--api-key', KEY]);
  const meshed = await c.until(() => c.meshed(), 15000, 'the offline node to join');
  off.id = meshed.value[off.i].nodeId;
  await c.until(() => c.get(a, '/state')?.nodeMemory?.[off.id], 10000, 'the offline node in State');
  const r = http(c, a, 'POST', '/place_instance', { model_id: FROM_HUB, sharding: 'Pipeline', min_nodes: 3 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const { value: failed } = await c.until(() => {
    const events = c.get(a, '/events') || [];
    return events.map((e) => JSON.stringify(e)).find((e) => e.includes('RunnerFailed') && e.includes('offline'));
  }, 30000, 'the offline node\'s rank to fail');
  assert.match(failed, /cannot download the files of rank \d/);
});
