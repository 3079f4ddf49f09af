// exo's 2-node integration tests on real `exo` processes in network namespaces: a pipeline
// instance placed with /place_instance (min_nodes 2) and polled through /state, chat and
// multi-turn through either node (the one without rank 0 forwards), placement errors reported to
// the client, and the resilience sequence: a node killed mid-stream ends the stream with an error
// chunk within 5 s, the remaining node serves, the killed node rejoins and the model is placed on
// both again.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { mkModel } from './lib/models.mjs';
import { DIST_MODELS, body, chat, http, place, remove, startCluster, streamChat } from './lib/multinode.mjs';

const MODEL = 'qwen3-dist';
let c;
before(async () => {
  const dir = await mkModel(MODEL, DIST_MODELS[MODEL]);
  c = await startCluster(2, path.dirname(dir), { EXO_CLUSTER_PEER_TIMEOUT_MS: '1500' });
});
after(async () => { await c?.stop(); });

const ranks = (inst) => Object.values(body(inst).shardAssignments.runnerToShard).map((s) => Object.values(s)[0]);
const rank0Node = (inst) => {
  const b = body(inst);
  for (const [node, runner] of Object.entries(b.shardAssignments.nodeToRunner))
    if (Object.values(b.shardAssignments.runnerToShard[runner])[0].deviceRank === 0) return node;
  return null;
};

test('placement errors are 400s that say why', () => {
  const [a] = c.nodes;
  let r = http(c, a, 'POST', '/place_instance', { model_id: MODEL, instance_meta: 'Carrier' });
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /MlxRing.*MlxJaccl/);
  r = http(c, a, 'POST', '/place_instance', { model_id: MODEL, sharding: 'Pipeline', min_nodes: 3 });
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /needs 3 nodes, the cluster has 2/);
  r = http(c, a, 'POST', '/place_instance', { model_id: MODEL, sharding: 'Diagonal' });
  assert.equal(r.status, 400);
  const prev = http(c, a, 'GET', `/instance/previews?model_id=${MODEL}`).body.previews;
  for (const sharding of ['Pipeline', 'Tensor'])
    for (const meta of ['MlxRing', 'MlxJaccl'])
      for (const n of [1, 2]) {
        const p = prev.find((x) => x.sharding === sharding && x.instance_meta === meta && x.min_nodes === n);
        assert.ok(p && p.instance && !p.error, `${sharding} ${meta} x${n} is possible`);
        assert.equal(Object.keys(p.memory_delta_by_node).length, n);
      }
});

test('2-node pipeline: placed, Ready on both, chat and multi-turn through either node', async () => {
  const [a, b] = c.nodes;
  const { id, instance } = await place(c, a, { model_id: MODEL, sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 2 });
  assert.ok('MlxRingInstance' in instance);
  const shards = ranks(instance);
  assert.deepEqual(shards.map((s) => s.worldSize), [2, 2]);
  assert.deepEqual(shards.map((s) => s.endLayer - s.startLayer).reduce((x, y) => x + y), 4);
  const viaA = chat(c, a, MODEL, [{ role: 'user', content: 'Hello there' }]);
  const viaB = chat(c, b, MODEL, [{ role: 'user', content: 'Hello there' }]);
  assert.ok(viaA.tokens.length > 0);
  assert.deepEqual(viaB.tokens, viaA.tokens, 'the same greedy tokens through either node');
  const turn2 = chat(c, b, MODEL, [{ role: 'user', content: 'Hello there' },
    { role: 'assistant', content: viaB.content }, { role: 'user', content: 'And then?' }]);
  assert.ok(turn2.tokens.length > 0, 'a second turn answers');
  await remove(c, b, id);
  // State no longer lists it; the node's own runner table follows within its sync period.
  await c.until(() => http(c, a, 'GET', `/instance/${id}`).status === 404, 5000,
    `GET /instance/${id} to answer 404 after the delete`);
});

test('MlxJaccl on nodes without RDMA devices runs over TCP and says so', async () => {
  const [a] = c.nodes;
  const st = c.get(a, '/state');
  for (const node of c.nodes) assert.ok(Array.isArray(st.nodeNetwork[node.id].rdmaDevices), 'each node lists its RDMA devices');
  if (c.nodes.some((n) => st.nodeNetwork[n.id].rdmaDevices.length)) return; // an RDMA host: ibverbs is the right answer there
  const { id, instance } = await place(c, a, { model_id: MODEL, sharding: 'Tensor', instance_meta: 'MlxJaccl', min_nodes: 2 });
  const b = body(instance);
  assert.ok('MlxJacclInstance' in instance);
  assert.equal(b.transport, 'tcp');
  assert.match(b.transportNote, /MlxJaccl asked for RDMA; node \S+ has no RDMA device: TCP/);
  assert.ok(chat(c, a, MODEL, [{ role: 'user', content: 'Hello there' }]).tokens.length > 0);
  await remove(c, a, id);
});

test('resilience: a node killed mid-stream, the other serves, the node rejoins, both again', async () => {
  const [a, b] = c.nodes;
  // 1. The follower's node dies while rank 0 streams: the client gets an error chunk in < 5 s.
  let placed = await place(c, a, { model_id: MODEL, sharding: 'Pipeline', min_nodes: 2 });
  const follower = rank0Node(placed.instance) === a.id ? b : a;
  const api = follower === b ? a : b;
  let killedAt = 0;
  const s1 = await streamChat(c, api, MODEL, 3500, () => { killedAt = Date.now(); c.kill(follower); });
  assert.ok(killedAt, 'the stream started');
  assert.ok(s1.errorAt !== null, `an error chunk (got ${s1.lines.slice(-2).join(' | ')} ${s1.other.join(' | ')})`);
  assert.ok(s1.endAt - s1.firstAt < 5000, `the stream ended ${s1.endAt - s1.firstAt} ms after the kill`);
  await c.waitExit(follower);
  // 2. The remaining node: placed alone, chat works.
  await c.until(() => {
    const st = c.get(api, '/state');
    return st && !st.instances[placed.id];
  }, 20000, 'the failed instance to be deleted');
  const alone = await place(c, api, { model_id: MODEL, sharding: 'Pipeline', min_nodes: 1 });
  assert.ok(chat(c, api, MODEL, [{ role: 'user', content: 'Still there?' }]).tokens.length > 0);
  await remove(c, api, alone.id);
  // 3. The node rejoins; the model is placed on both again and answers through both.
  c.start(follower);
  await c.until(() => c.meshed(), 20000, 'the node to rejoin');
  await c.until(() => {
    const st = c.get(api, '/state');
    return st && st.nodeMemory[follower.id];
  }, 20000, 'the node back in State');
  placed = await place(c, api, { model_id: MODEL, sharding: 'Pipeline', min_nodes: 2 });
  assert.equal(Object.keys(body(placed.instance).shardAssignments.nodeToRunner).length, 2);
  const r1 = chat(c, a, MODEL, [{ role: 'user', content: 'Back?' }]);
  const r2 = chat(c, b, MODEL, [{ role: 'user', content: 'Back?' }]);
  assert.deepEqual(r1.tokens, r2.tokens);
  // 4. Rank 0's node dies while another node forwards the stream: that node sends the error.
  const rank0 = c.nodes.find((n) => n.id === rank0Node(placed.instance));
  const other = rank0 === a ? b : a;
  const s2 = await streamChat(c, other, MODEL, 3500, () => c.kill(rank0));
  assert.ok(s2.errorAt !== null, `an error chunk (got ${s2.lines.slice(-2).join(' | ')} ${s2.other.join(' | ')})`);
  assert.ok(s2.endAt - s2.firstAt < 5000, `the stream ended ${s2.endAt - s2.firstAt} ms after the kill`);
});
