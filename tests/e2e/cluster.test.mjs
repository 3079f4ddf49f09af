// The cluster control plane across processes: discovery with no --peer, one master, identical
// /state everywhere, master failover with no lost or duplicated events, rejoin and catch-up,
// partition and heal, and refusal of nodes with another key or namespace.
// Each node runs in its own network namespace (see lib/cluster.mjs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Cluster, sleep } from './lib/cluster.mjs';
import { exoBin } from './lib/exo.mjs';

function ids(events) {
  return events.map((e) => `${e.sess}/${e.seq}`);
}

// No two entries carry the same (session, seq): nothing was ordered twice.
function assertNoDuplicates(events) {
  const seen = new Set();
  for (const k of ids(events)) {
    assert.ok(!seen.has(k), `event ${k} appears twice in the log`);
    seen.add(k);
  }
  events.forEach((e, i) => assert.equal(e.idx, i + 1, 'log indexes are consecutive from 1'));
}

async function startCluster(n, opts = {}) {
  const c = new Cluster(opts);
  for (let i = 0; i < n; i++) c.addNode();
  const meshed = await c.until(() => c.meshed(), 3000, `${n} nodes to discover each other`);
  for (const [i, s] of meshed.value.entries()) c.nodes[i].id = s.nodeId;
  return { c, discoveryMs: meshed.ms };
}

for (const n of [2, 5]) {
  test(`${n} nodes discover each other within 3 s, elect one master and agree on /state`, async () => {
    const { c, discoveryMs } = await startCluster(n);
    try {
      console.log(`# ${n} nodes (${c.mode}): discovered in ${discoveryMs} ms`);
      const master = await c.until(() => c.oneMaster(), 5000, 'one master');
      const conv = await c.until(() => {
        const v = c.converged();
        return v && Object.keys(v.state.nodeSystem).length === n ? v : false;
      }, 8000, 'identical /state and /events holding every node');
      const st = conv.value.state;
      assert.equal(st.masterNodeId, master.value);
      assert.equal(st.topology.nodes.length, n);
      for (const node of c.nodes) {
        assert.ok(st.nodeIdentities[node.id], 'every node published its identity');
        assert.ok(st.nodeMemory[node.id].ramTotal.inBytes > 0, 'memory is reported');
        assert.ok(st.nodeSystem[node.id].cpuCores >= 1, 'CPU is reported');
        assert.ok(Array.isArray(st.nodeNetwork[node.id].interfaces));
      }
      assert.equal(st.lastEventAppliedIdx, conv.value.events.length);
      assertNoDuplicates(conv.value.events);
      // GET /state/{path} serves a sub-tree, and a missing path is a 404.
      const mem = c.get(c.nodes[0], `/state/nodeMemory/${c.nodes[1].id}`);
      assert.deepEqual(mem, st.nodeMemory[c.nodes[1].id]);
      const missing = c.get(c.nodes[0], '/state/nodeMemory/no-such-node');
      assert.equal(missing.status, 404);
      assert.equal(c.get(c.nodes[1], '/node_id'), c.nodes[1].id);
      // Link latency was measured and published for the topology.
      await c.until(() => {
        const s = c.get(c.nodes[0], '/state');
        return s && s.topology.connections.length === n * (n - 1);
      }, 8000, 'a measured link between every pair');
    } finally {
      await c.stop();
    }
  });
}

test('3 nodes: kill -9 the master, fail over, rejoin and catch up; partition and heal', async () => {
  const { c } = await startCluster(3);
  try {
    const m1 = (await c.until(() => c.oneMaster(), 5000, 'one master')).value;
    const follower = c.nodes.find((x) => x.id !== m1);
    c.post(follower, '/cluster/submit', { InstanceCreated: { instance: { MlxRingInstance: { instanceId: 'inst-a', shardAssignments: { modelId: 'm' } } } } });
    const before = (await c.until(() => {
      const v = c.converged();
      return v && v.state.instances['inst-a'] ? v : false;
    }, 8000, 'the instance to replicate')).value;

    // Kill the master without warning.
    const old = c.nodeByid(m1);
    c.kill(old);
    await c.waitExit(old);
    const killedAt = Date.now();
    const rest = c.running();
    const m2 = (await c.until(() => c.oneMaster(rest), 5000, 'a new master after SIGKILL')).value;
    console.log(`# new master ${m2.slice(0, 8)} ${Date.now() - killedAt} ms after SIGKILL of ${m1.slice(0, 8)}`);
    assert.notEqual(m2, m1);
    c.post(c.nodeByid(m2), '/cluster/submit', { RunnerStatusUpdated: { runnerId: 'r1', runnerStatus: { RunnerReady: {} } } });
    const after = (await c.until(() => {
      const v = c.converged(rest);
      return v && v.state.runners.r1 ? v : false;
    }, 8000, 'the survivors to converge')).value;
    // State preserved: what was ordered before the kill is still there, in the same order.
    assert.deepEqual(after.events.slice(0, before.events.length), before.events);
    assert.deepEqual(after.state.instances, before.state.instances);
    assertNoDuplicates(after.events);

    // Restart the old master on the same data dir: it rejoins as a follower and catches up.
    c.start(old);
    await c.until(() => c.meshed(c.nodes), 6000, 'the restarted node to rejoin');
    const rejoined = (await c.until(() => {
      const v = c.converged(c.nodes);
      return v && v.state.runners.r1 && v.state.nodeIdentities[m1] ? v : false;
    }, 10000, 'the restarted node to catch up')).value;
    assert.equal(c.oneMaster(c.nodes), m2, 'the restarted node does not take mastership back');
    assert.deepEqual(rejoined.events.slice(0, after.events.length), after.events);
    assertNoDuplicates(rejoined.events);

    if (c.mode !== 'netns') {
      console.log('# partition step needs network namespaces: not run in loopback mode');
      return;
    }
    // Partition: cut the master off. Each side orders an event; after healing, one master
    // remains, the logs converge, and both events are in the log exactly once.
    const cut = c.nodeByid(m2);
    const others = c.nodes.filter((x) => x !== cut);
    c.partition(cut);
    const m3 = (await c.until(() => c.oneMaster(others), 9000, 'a master on the majority side')).value;
    assert.notEqual(m3, m2);
    c.post(cut, '/cluster/submit', { TaskCreated: { taskId: 'minority', task: { T: {} } } });
    c.post(others[0], '/cluster/submit', { TaskCreated: { taskId: 'majority', task: { T: {} } } });
    await sleep(1000);
    c.heal(cut);
    const healed = (await c.until(() => {
      if (!c.oneMaster(c.nodes)) return false;
      const v = c.converged(c.nodes);
      return v && v.state.tasks.minority && v.state.tasks.majority ? v : false;
    }, 15000, 'one master and converged logs after healing')).value;
    assertNoDuplicates(healed.events);
    const count = (id) => healed.events.filter((e) => e.event.TaskCreated && e.event.TaskCreated.taskId === id).length;
    assert.equal(count('minority'), 1);
    assert.equal(count('majority'), 1);
  } finally {
    await c.stop();
  }
});

test('a node with the wrong cluster key or another namespace is never admitted', async () => {
  const c = new Cluster();
  try {
    const fs = await import('node:fs');
    const keyFile = `${c.dir}/wrong.key`;
    fs.writeFileSync(keyFile, 'a secret the others do not have\n');
    const good = [c.addNode(), c.addNode()];
    const wrongKey = c.addNode(['--cluster-key', keyFile]);
    const otherNs = c.addNode(['--namespace', 'elsewhere']);
    await c.until(() => c.meshed(good), 3000, 'the two good nodes to mesh');
    await c.until(() => c.oneMaster(good), 5000, 'one master among the good nodes');
    await sleep(2500);
    const st = good.map((n) => c.status(n));
    const badIds = [c.status(wrongKey).nodeId, c.status(otherNs).nodeId];
    for (const s of st) {
      for (const p of s.peers) assert.ok(!(badIds.includes(p.nodeId) && p.alive), 'an outsider is a live peer');
    }
    const state = c.get(good[0], '/state');
    for (const id of badIds) assert.equal(state.nodeIdentities[id], undefined);
    assert.equal(state.topology.nodes.length, 2);
    // The wrong-key node tried (same namespace: it hears the beacons) and was refused.
    assert.ok(st.some((s) => s.counters.handshakesRejected > 0), 'the wrong key was rejected at the handshake');
    // The outsiders only know themselves.
    assert.equal(c.get(wrongKey, '/state').topology.nodes.length, 1);
    assert.equal(c.get(otherNs, '/state').topology.nodes.length, 1);
  } finally {
    await c.stop();
  }
});

test('the exo binary: 3 nodes cluster, and every node serves the same /state, /events and its /node_id', async () => {
  const { c } = await startCluster(3, { bin: exoBin() });
  try {
    const master = (await c.until(() => c.oneMaster(), 5000, 'one master')).value;
    const conv = (await c.until(() => {
      const v = c.converged();
      return v && Object.keys(v.state.nodeIdentities).length === 3 ? v : false;
    }, 8000, 'identical /state on the three exo nodes')).value;
    assert.equal(conv.state.masterNodeId, master);
    for (const node of c.nodes) assert.equal(c.get(node, '/node_id'), node.id);
    assert.equal(c.get(c.nodes[2], '/state/no/such/path').status, 404);
    assert.deepEqual(c.get(c.nodes[2], `/state/nodeIdentities/${c.nodes[0].id}`), conv.state.nodeIdentities[c.nodes[0].id]);
    const tail = c.get(c.nodes[1], `/events?since=${conv.events.length - 2}`);
    // the log only grows: events after the converged ones (link measurements every few seconds,
    // a node's models on disk) may follow the two asked for
    assert.deepEqual(tail.slice(0, 2), conv.events.slice(-2));
  } finally {
    await c.stop();
  }
});

test('a node restarted after a crash mid-write cuts the torn record, replays from its snapshot and catches up', async () => {
  const { c } = await startCluster(2, { env: { EXO_CLUSTER_SNAPSHOT_EVERY: '4' } });
  try {
    const fs = await import('node:fs');
    const master = (await c.until(() => c.oneMaster(), 5000, 'one master')).value;
    const follower = c.nodes.find((x) => x.id !== master);
    await c.until(() => {
      const v = c.converged();
      return v && Object.keys(v.state.nodeSystem).length === 2 ? v : false;
    }, 8000, 'both nodes in the state');
    c.kill(follower);
    await c.waitExit(follower);
    const logFile = `${follower.dataDir}/cluster/events.log`;
    const before = fs.statSync(logFile).size;
    assert.ok(fs.existsSync(`${follower.dataDir}/cluster/snapshot.json`), 'a snapshot was written');
    // A record header promising 200 bytes, followed by only a few: a write cut short by a crash.
    fs.appendFileSync(logFile, Buffer.from('EXL1\xc8\x00\x00\x00\x63\x00\x00\x00\x00\x00\x00\x00garbage', 'latin1'));
    c.post(c.nodeByid(master), '/cluster/submit', { TaskCreated: { taskId: 'while-down', task: { T: {} } } });
    c.start(follower);
    const back = (await c.until(() => {
      const v = c.converged();
      return v && v.state.tasks['while-down'] ? v : false;
    }, 10000, 'the restarted node to catch up')).value;
    assertNoDuplicates(back.events);
    const log = fs.readFileSync(follower.log, 'utf8');
    assert.match(log, /damaged record \(\d+ bytes/);
    assert.match(log, /replayed from a snapshot/);
    assert.ok(fs.statSync(logFile).size > before, 'the log grew past the cut');
  } finally {
    await c.stop();
  }
});

test('--peer joins nodes that cannot hear each other\'s beacons; the rest is learned by gossip', async () => {
  const c = new Cluster();
  try {
    // Each node listens for beacons on its own port, so discovery cannot find anyone.
    const a = c.addNode(['--discovery-port', '41001']);
    const peerOf = (n) => `${n.addr}:${n.listenPort}`;
    const b = c.addNode(['--discovery-port', '41002', '--peer', peerOf(a)]);
    const d = c.addNode(['--discovery-port', '41003', '--peer', peerOf(a)]);
    await c.until(() => c.meshed([a, b, d]), 10000, 'three nodes meshed through one bootstrap peer');
    // b and d were only told about a: they found each other through a's gossip.
    await c.until(() => c.oneMaster([a, b, d]), 5000, 'one master');
  } finally {
    await c.stop();
  }
});

// Found by trying it as a new user: three nodes started with --peer to the first, the first
// killed about a second after the others joined it, before any gossip could introduce them. The
// survivors must still find each other (gossip at join, and every member dials the members the
// replicated State lists), elect one master between them and agree on State.
test('--peer bootstrap killed right after the others joined: the survivors still meet', async () => {
  const c = new Cluster();
  try {
    const a = c.addNode(['--discovery-port', '41011']);
    const peerOf = (n) => `${n.addr}:${n.listenPort}`;
    const b = c.addNode(['--discovery-port', '41012', '--peer', peerOf(a)]);
    const d = c.addNode(['--discovery-port', '41013', '--peer', peerOf(a)]);
    // As soon as a lists both as alive, kill it (no quiet period for gossip to happen in).
    await c.until(() => {
      const s = c.status(a);
      return s && s.peers && s.peers.filter((p) => p.alive).length >= 2;
    }, 10000, 'the bootstrap node to see both joiners');
    await sleep(1000);
    c.kill(a);
    await c.waitExit(a);
    await c.until(() => c.meshed([b, d]), 10000, 'the two survivors meshed');
    await c.until(() => c.oneMaster([b, d]), 10000, 'one master among the survivors');
    const st = c.get(b, '/state');
    assert.ok(st.topology.nodes.includes(c.status(d).nodeId), 'b lists d in State');
  } finally {
    await c.stop();
  }
});

test('members dial every member the replicated State lists (gossip off): the survivors of a dead bootstrap node meet', async () => {
  const c = new Cluster({ env: { EXO_CLUSTER_NO_GOSSIP: '1' } });
  try {
    const a = c.addNode(['--discovery-port', '41021']);
    const peerOf = (n) => `${n.addr}:${n.listenPort}`;
    const b = c.addNode(['--discovery-port', '41022', '--peer', peerOf(a)]);
    const d = c.addNode(['--discovery-port', '41023', '--peer', peerOf(a)]);
    // b and d know only a; without gossip, only State can introduce them.
    await c.until(() => {
      const st = c.get(b, '/state');
      return st && !st.status && Object.keys(st.nodeIdentities || {}).length === 3 &&
        Object.values(st.nodeIdentities).every((i) => i.listenPort > 0);
    }, 15000, 'State listing all three members with their listen ports');
    c.kill(a);
    await c.waitExit(a);
    await c.until(() => c.meshed([b, d]), 10000, 'the two survivors meshed through State');
    await c.until(() => c.oneMaster([b, d]), 10000, 'one master among the survivors');
  } finally {
    await c.stop();
  }
});
