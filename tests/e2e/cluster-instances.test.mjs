// Instances and runners in the replicated cluster State, across real exo processes: an instance
// placed on one node is visible (with its runner Ready) on every node, deleting it through
// another node stops its runner, and the master deletes instances whose node left the cluster.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { Cluster } from './lib/cluster.mjs';
import { exoBin } from './lib/exo.mjs';
import { tinyModel } from './lib/models.mjs';

const MODEL = 'qwen3-tiny';
let modelsPath;

before(async () => { modelsPath = path.dirname(await tinyModel(MODEL)); });

function request(c, node, method, p) {
  const curl = ['-s', '-m', '5', '-X', method, '-o', '/dev/null', '-w', '%{http_code}',
    `http://127.0.0.1:${node.apiPort}${p}`];
  const r = c.mode === 'netns'
    ? spawnSync('ip', ['netns', 'exec', node.ns, 'curl', ...curl], { encoding: 'utf8' })
    : spawnSync('curl', curl, { encoding: 'utf8' });
  return Number(r.stdout);
}

async function twoNodes(env = {}) {
  const c = new Cluster({ bin: exoBin(), env: { EXO_CLUSTER_SYNC_MS: '100', ...env } });
  for (let i = 0; i < 2; i++) c.addNode(['--models-path', modelsPath]);
  const meshed = await c.until(() => c.meshed(), 5000, 'two nodes to discover each other');
  for (const [i, s] of meshed.value.entries()) c.nodes[i].id = s.nodeId;
  await c.until(() => c.oneMaster(), 5000, 'one master');
  return c;
}

const runnerReady = (st) => Object.values(st.runners || {}).some((r) => 'RunnerReady' in r);

test('an instance placed on node A shows Ready on node B; deleting it on B stops it on A', async () => {
  const c = await twoNodes();
  try {
    const [a, b] = c.nodes;
    const placed = c.post(a, '/place_instance', { model_id: MODEL });
    const id = placed.instance_id;
    assert.ok(id, `placed: ${JSON.stringify(placed)}`);
    const seen = await c.until(() => {
      const st = c.get(b, '/state');
      return st && st.instances && st.instances[id] && runnerReady(st) ? st : false;
    }, 60000, 'node B to see the instance with its runner Ready');
    const inst = seen.value.instances[id];
    const body = Object.values(inst)[0];
    assert.equal(body.shardAssignments.modelId, MODEL);
    const runnerId = body.shardAssignments.nodeToRunner[a.id];
    assert.ok(runnerId, 'the instance maps node A to its runner');
    assert.ok('RunnerReady' in seen.value.runners[runnerId]);
    assert.equal(request(c, b, 'GET', `/instance/${id}`), 200, 'B serves A\'s instance');

    assert.equal(request(c, b, 'DELETE', `/instance/${id}`), 200);
    await c.until(() => {
      const st = c.get(a, '/state');
      return st && !st.instances[id] && !st.runners[runnerId];
    }, 10000, 'the instance and its runner to leave State on node A');
    await c.until(() => request(c, a, 'GET', `/instance/${id}`) === 404, 5000,
      'node A to stop its runner');
    assert.equal(request(c, b, 'DELETE', `/instance/${id}`), 404, 'a second delete is a 404');
  } finally {
    await c.stop();
  }
});

test('the master deletes the instances of a node that left the cluster', async () => {
  const c = await twoNodes({ EXO_CLUSTER_PEER_TIMEOUT_MS: '1000', EXO_CLUSTER_NODE_TIMEOUT_MS: '2000' });
  try {
    const [a, b] = c.nodes;
    const id = c.post(a, '/place_instance', { model_id: MODEL }).instance_id;
    await c.until(() => {
      const st = c.get(b, '/state');
      return st && st.instances && st.instances[id];
    }, 30000, 'node B to see the instance');
    c.kill(a);
    await c.waitExit(a);
    await c.until(() => {
      const st = c.get(b, '/state');
      return st && !st.topology.nodes.includes(a.id) && !st.instances[id] &&
        Object.keys(st.runners).length === 0;
    }, 20000, 'node B (now master) to time node A out and delete its instance');
  } finally {
    await c.stop();
  }
});
