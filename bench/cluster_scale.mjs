// Cluster scale benchmark: N control-plane nodes (default 32), each in its own network
// namespace on one bridge, started together with no --peer. Measures the time from starting
// them until every node sees every other, one master is agreed, and /state is identical on all
// nodes with every node in it; then the steady-state control traffic per node from the kernel's
// interface counters (everything on the wire: beacons, heartbeats, events, TCP/IP headers and
// ACKs) over a quiet window.
//   sudo node bench/cluster_scale.mjs [nodes=32] [window_s=30]
// Needs root (ip netns) and a built build/tools/cluster-node (make).
import { spawnSync } from 'node:child_process';
import { Cluster, sleep } from '../tests/e2e/lib/cluster.mjs';

const n = Number(process.argv[2] || 32);
const windowS = Number(process.argv[3] || 30);

function ifaceBytes(node) {
  const r = spawnSync('ip', ['-n', node.ns, '-s', '-j', 'link', 'show', 'eth0'], { encoding: 'utf8' });
  const s = JSON.parse(r.stdout)[0].stats64;
  return { rx: s.rx.bytes, tx: s.tx.bytes };
}

async function all(c, path) {
  return Promise.all(c.nodes.map((x) => c.getAsync(x, path)));
}

async function until(fn, ms, what) {
  const t = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t > ms) throw new Error(`timed out waiting for ${what}`);
    await sleep(250); // polling 32 nodes costs CPU the nodes need
  }
}

const c = new Cluster({ mode: 'netns' });
try {
  for (let i = 0; i < n; i++) c.addNode([], { start: false });
  const t0 = Date.now();
  for (const x of c.nodes) c.start(x);
  await until(async () => {
    const st = await all(c, '/cluster/status');
    return st.every((s) => s && s.peers.filter((p) => p.alive).length === n - 1);
  }, 60000, 'all nodes meshed');
  const meshMs = Date.now() - t0;
  await until(async () => {
    const st = await all(c, '/cluster/status');
    if (st.some((s) => !s)) return false;
    const masters = st.filter((s) => s.isMaster);
    return masters.length === 1 && st.every((s) => s.masterNodeId === masters[0].nodeId);
  }, 60000, 'one master');
  const masterMs = Date.now() - t0;
  await until(async () => {
    const st = await all(c, '/state');
    if (st.some((s) => !s || Object.keys(s.nodeSystem).length !== n)) return false;
    const s0 = JSON.stringify(st[0]);
    return st.every((s) => JSON.stringify(s) === s0);
  }, 60000, 'identical state with every node');
  const convergedMs = Date.now() - t0;
  console.log(`nodes=${n} meshed_ms=${meshMs} one_master_ms=${masterMs} converged_ms=${convergedMs}`);

  // Steady state: join-time publishing (info, link probes) is over once the log stops growing.
  let last = -1, quietSince = Date.now();
  const quietStart = Date.now();
  while (Date.now() - quietSince < 5000 && Date.now() - quietStart < 60000) {
    const idx = (await all(c, '/cluster/status')).map((s) => (s ? s.lastIdx : -1)).join(',');
    if (idx !== last) { last = idx; quietSince = Date.now(); }
    await sleep(500);
  }
  console.log(`log quiet ${Math.round((Date.now() - t0) / 1000)} s after start`);
  const a = c.nodes.map(ifaceBytes);
  const s0 = await all(c, '/cluster/status');
  await sleep(windowS * 1000);
  const b = c.nodes.map(ifaceBytes);
  const s1 = await all(c, '/cluster/status');
  const rates = c.nodes.map((x, i) => ({
    master: s1[i].isMaster,
    rx: (b[i].rx - a[i].rx) / windowS / 1024, tx: (b[i].tx - a[i].tx) / windowS / 1024,
    events: s1[i].lastIdx - s0[i].lastIdx,
    app: (s1[i].counters.bytesIn + s1[i].counters.bytesOut - s0[i].counters.bytesIn - s0[i].counters.bytesOut) / windowS / 1024,
  }));
  const during = await c.getAsync(c.nodes[0], `/events?since=${s0[0].lastIdx}`);
  const kinds = {};
  for (const e of during || []) {
    const name = Object.keys(e.event)[0];
    const k = name === 'NodeGatheredInfo' ? Object.keys(e.event[name].info)[0] : name;
    kinds[k] = (kinds[k] || 0) + 1;
  }
  console.log(`events ordered during the window: ${JSON.stringify(kinds)}`);
  const total = rates.map((r) => r.rx + r.tx);
  const maxI = total.indexOf(Math.max(...total));
  const mean = total.reduce((x, y) => x + y, 0) / n;
  const m = rates.find((r) => r.master);
  console.log(`steady window ${windowS} s: wire rx+tx per node KB/s mean=${mean.toFixed(1)} max=${total[maxI].toFixed(1)}` +
    ` (node ${maxI}${rates[maxI].master ? ', master' : ''}); master rx=${m.rx.toFixed(1)} tx=${m.tx.toFixed(1)};` +
    ` JSON payload per node KB/s mean=${(rates.reduce((x, r) => x + r.app, 0) / n).toFixed(1)}; log entries in window=${m.events}`);
  const ok = convergedMs <= 10000 && Math.max(...total) < 50;
  console.log(ok ? 'PASS: converged within 10 s, every node under 50 KB/s' : 'FAIL');
  process.exitCode = ok ? 0 : 1;
} finally {
  if (process.env.KEEP_LOGS) {
    const fs = await import('node:fs');
    fs.mkdirSync('/tmp/scale-logs', { recursive: true });
    for (const x of c.nodes) fs.copyFileSync(x.log, `/tmp/scale-logs/node${x.i}.log`);
  }
  await c.stop();
}
