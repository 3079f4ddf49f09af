// A node that holds a model only through --models-path (never downloaded through the cluster) is
// known to every node: State lists it as a completed download of that node (exo's
// DownloadCompleted shape), so placement on another node prefers it to a node with more free
// memory that would have to fetch the files first. A copy removed by hand is withdrawn from State.
//
// Three nodes: 0 and 2 hold the model in their --models-path; 1 holds nothing but reports the
// most free memory (EXO_NODE_MEMORY_BYTES), so memory alone would always pick it.
//
// Node 2 syncs its instances with State only every 1.5 s, so right after an instance is deleted
// through node 0 its rank on node 2 still runs for a while: a placement through node 2 in that
// time must place a new instance, never hand back the deleted one (a race CI once hit).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { mkModel } from './lib/models.mjs';
import { DIST_MODELS, body, chat, http, place, remove, startCluster } from './lib/multinode.mjs';

const MODEL = 'qwen3-dist';
const GiB = 1024 ** 3;
let c, tmp;
after(async () => {
  await c?.stop();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

// node holds the whole model in st's downloads
function holds(st, nodeId) {
  return ((st?.downloads || {})[nodeId] || []).some((e) => e.DownloadCompleted &&
    e.DownloadCompleted.modelId === MODEL && e.DownloadCompleted.endLayer === undefined);
}

const nodesOf = (placed) => Object.keys(body(placed.instance).shardAssignments.nodeToRunner).sort();

test('models held through --models-path are in State and placement prefers their nodes', async () => {
  const dir = await mkModel(MODEL, DIST_MODELS[MODEL]);
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-holdings-'));
  const paths = [path.dirname(dir), path.join(tmp, 'empty'), path.join(tmp, 'copy')];
  fs.mkdirSync(paths[1]);
  fs.cpSync(dir, path.join(paths[2], MODEL), { recursive: true });
  c = await startCluster(3, null, {}, {
    args: (i) => ['--models-path', paths[i]],
    nodeEnv: (i) => ({ EXO_NODE_MEMORY_BYTES: String(i === 1 ? 1.5 * GiB : 1 * GiB),
      ...(i === 2 ? { EXO_CLUSTER_SYNC_MS: '1500' } : {}) }),
  });
  const [a, b, d] = c.nodes;
  const { value: st } = await c.until(() => {
    const s = c.get(b, '/state');
    return holds(s, a.id) && holds(s, d.id) ? s : false;
  }, 20000, 'node 1 to see nodes 0 and 2 holding the model');
  assert.ok(!holds(st, b.id), 'node 1 holds nothing');
  const entry = st.downloads[d.id].find((e) => e.DownloadCompleted?.modelId === MODEL).DownloadCompleted;
  assert.equal(entry.nodeId, d.id);
  assert.ok(entry.total.inBytes > 1e6, 'the entry carries the model\'s size');
  assert.equal(entry.readOnly, true, '--models-path is read-only: no "Delete files" for it');

  let deleted = null;
  for (const sharding of ['Pipeline', 'Tensor']) {
    const placed = await place(c, a, { model_id: MODEL, sharding, instance_meta: 'MlxRing', min_nodes: 2 });
    assert.deepEqual(nodesOf(placed), [a.id, d.id].sort(), `${sharding} x2 on the two nodes holding the files`);
    assert.ok(chat(c, b, MODEL, [{ role: 'user', content: 'Hello' }]).tokens.length > 0);
    await remove(c, a, placed.id);
    deleted = placed.id;
  }
  // straight after the delete: node 2's rank of it has not been stopped yet
  const r = http(c, d, 'POST', '/place_instance', { model_id: MODEL, sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 1 });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.notEqual(r.body.instance_id, deleted, 'a placement handed back the instance just deleted');
  const one = await place(c, d, { model_id: MODEL, sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 1 });
  assert.equal(one.id, r.body.instance_id, 'placing again on the node returns its instance');
  assert.notDeepEqual(nodesOf(one), [b.id], 'one node: a holder, not the one with the most memory');
  await remove(c, d, one.id);

  // the copy on node 2 removed by hand: withdrawn from State within the rescan period (5 s)
  fs.rmSync(path.join(paths[2], MODEL), { recursive: true });
  await c.until(() => {
    const s = c.get(a, '/state');
    return s && !holds(s, d.id) && holds(s, a.id);
  }, 20000, 'node 2\'s removed copy to leave State');
});
