// Downloads in the replicated cluster State: a download on one node shows up, with exo's
// DownloadOngoing/DownloadCompleted shapes, under downloads[nodeId] on every node.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { Cluster } from './lib/cluster.mjs';
import { exoBin } from './lib/exo.mjs';
import { FakeHF, makeTinyModel } from './lib/fake-hf.mjs';

const ID = 'test-org/tiny-llama';

function entry(st, nodeId, model) {
  const list = st?.downloads?.[nodeId] || [];
  return list.find((d) => Object.values(d)[0].modelId === model);
}

test('a download on node A is visible in /state on node B, through completion', async (t) => {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModel(ID, makeTinyModel());
  // The fake Hub listens on this machine's loopback: the nodes must share it.
  const c = new Cluster({ mode: 'loopback', bin: exoBin(),
    env: { HF_ENDPOINT: hf.url, HF_TOKEN: '' } });
  t.after(() => c.stop());
  for (let i = 0; i < 2; i++) c.addNode(['--models-dir', path.join(c.dir, `models${i}`)]);
  const meshed = await c.until(() => c.meshed(), 5000, 'two nodes to discover each other');
  for (const [i, s] of meshed.value.entries()) c.nodes[i].id = s.nodeId;
  await c.until(() => c.oneMaster(), 5000, 'one master');
  const [a, b] = c.nodes;

  const started = c.post(a, '/download/start', { model_id: ID });
  assert.ok(!started.error, JSON.stringify(started));
  const { value: done } = await c.until(() => {
    const e = entry(c.get(b, '/state'), a.id, ID);
    return e && e.DownloadCompleted ? e.DownloadCompleted : false;
  }, 20000, 'node B to see node A\'s download completed');
  assert.equal(done.nodeId, a.id);
  assert.ok(done.total.inBytes > 0, 'the completed entry carries the size');
  // The same entry on A itself, and nothing for B (it downloaded nothing).
  assert.ok(entry(c.get(a, '/state'), a.id, ID).DownloadCompleted);
  assert.equal(entry(c.get(b, '/state'), b.id, ID), undefined);

  // Deleting the files on A removes the entry from State everywhere.
  const del = spawnSync('curl', ['-s', '-m', '5', '-X', 'DELETE', '-o', '/dev/null', '-w', '%{http_code}',
    `http://127.0.0.1:${a.apiPort}/download/${a.id}/${ID}`], { encoding: 'utf8' });
  assert.equal(del.stdout, '200');
  await c.until(() => {
    const st = c.get(b, '/state');
    return st && st.downloads && !entry(st, a.id, ID);
  }, 10000, 'node B to see node A\'s download deleted');
});
