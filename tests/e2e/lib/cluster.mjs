// Multi-node cluster harness: N control-plane nodes (build/tools/cluster-node, or `exo` when
// EXO_CLUSTER_NODE_BIN says so), each in its own network namespace joined through a bridge that
// lives in a hub namespace of its own — nothing is added to the host's namespace. Where network
// namespaces are unavailable (not root, no `ip netns`), nodes run on loopback with distinct ports
// and the harness says so. Everything it creates is removed by stop(), also on failure/exit.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { buildDir, deviceArgs, exoBin } from './exo.mjs';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function sh(cmd, args, { check = true } = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (check && r.status !== 0) {
    throw new Error(`${cmd} ${args.join(' ')} failed: ${r.stderr || r.stdout}`);
  }
  return r;
}

function pidAlive(pid) {
  try { process.kill(pid, 0); return true; } catch { return false; }
}

// Namespaces left behind by a harness that was itself killed: names carry the owner's pid.
function removeStaleNamespaces() {
  const r = sh('ip', ['netns', 'list'], { check: false });
  for (const line of (r.stdout || '').split('\n')) {
    const m = line.match(/^(exoc(\d+)[a-z0-9]*)/);
    if (m && !pidAlive(Number(m[2]))) sh('ip', ['netns', 'del', m[1]], { check: false });
  }
}

export function namespacesAvailable() {
  if (process.getuid && process.getuid() !== 0) return false;
  const probe = `exoc${process.pid}probe`;
  const r = sh('ip', ['netns', 'add', probe], { check: false });
  if (r.status !== 0) return false;
  sh('ip', ['netns', 'del', probe], { check: false });
  return true;
}

const live = new Set();
function cleanupAll() { for (const c of live) c.stopSync(); }
process.on('exit', cleanupAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => { cleanupAll(); process.exit(130); });
}

let clusterSeq = 0;

export class Cluster {
  // opts: { size, mode: 'netns' | 'loopback', env, apiKey (sent with every request here) }
  constructor(opts = {}) {
    this.mode = opts.mode || process.env.EXO_CLUSTER_TEST_MODE ||
      (namespacesAvailable() ? 'netns' : 'loopback');
    this.tag = `exoc${process.pid}${String.fromCharCode(97 + (clusterSeq++ % 26))}`;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-cluster-'));
    this.bin = opts.bin || process.env.EXO_CLUSTER_NODE_BIN || path.join(buildDir(), 'tools/cluster-node');
    // exo nodes run models, on EXO_TEST_DEVICE's device; cluster-node runs none
    this.device = this.bin === exoBin() ? deviceArgs() : [];
    this.env = { ...process.env, ...(opts.env || {}) };
    this.auth = opts.apiKey ? ['-H', `Authorization: Bearer ${opts.apiKey}`] : [];
    this.nodes = [];
    // Loopback mode: every cluster gets its own port block so leftover nodes cannot join. The
    // blocks lie below the kernel's ephemeral range (32768+): a block up there could hold the
    // source port of some outgoing connection, and a node then cannot listen (seen in CI).
    this.portBase = 20000 + ((process.pid * 7 + clusterSeq * 97) % 127) * 100;
    this.discoveryPort = this.mode === 'netns' ? 52413 : this.portBase + 99;
    if (this.mode === 'netns') {
      removeStaleNamespaces();
      this.hub = `${this.tag}hub`;
      sh('ip', ['netns', 'add', this.hub]);
      sh('ip', ['-n', this.hub, 'link', 'add', 'br0', 'type', 'bridge']);
      sh('ip', ['-n', this.hub, 'link', 'set', 'br0', 'up']);
    } else {
      console.log('# network namespaces unavailable here: nodes share loopback on distinct ports');
    }
    live.add(this);
  }

  // Adds node i (0-based) and starts it. extra: more flags (e.g. ['--namespace', 'x']); env:
  // this node's own environment on top of the cluster's.
  addNode(extra = [], { start = true, env = {} } = {}) {
    const i = this.nodes.length;
    const node = { i, extra, env, dataDir: path.join(this.dir, `node${i}`), log: path.join(this.dir, `node${i}.log`) };
    if (this.mode === 'netns') {
      node.ns = `${this.tag}n${i}`;
      node.addr = `10.213.0.${i + 1}`;
      node.apiPort = 52415;
      node.listenPort = 52414;
      sh('ip', ['netns', 'add', node.ns]);
      sh('ip', ['-n', node.ns, 'link', 'set', 'lo', 'up']);
      sh('ip', ['link', 'add', `${this.tag}v${i}`, 'netns', node.ns, 'type', 'veth', 'peer', 'name', `p${i}`, 'netns', this.hub]);
      sh('ip', ['-n', node.ns, 'link', 'set', `${this.tag}v${i}`, 'name', 'eth0']);
      sh('ip', ['-n', node.ns, 'addr', 'add', `${node.addr}/24`, 'brd', '+', 'dev', 'eth0']);
      sh('ip', ['-n', node.ns, 'link', 'set', 'eth0', 'up']);
      sh('ip', ['-n', this.hub, 'link', 'set', `p${i}`, 'master', 'br0']);
      sh('ip', ['-n', this.hub, 'link', 'set', `p${i}`, 'up']);
    } else {
      node.addr = '127.0.0.1';
      node.apiPort = this.portBase + i * 2;
      node.listenPort = this.portBase + i * 2 + 1;
    }
    this.nodes.push(node);
    if (start) this.start(node);
    return node;
  }

  args(node) {
    return ['--data-dir', node.dataDir, '--api-port', String(node.apiPort), '--listen-port',
      String(node.listenPort), '--discovery-port', String(this.discoveryPort), '--no-worker', ...this.device, ...node.extra];
  }

  start(node) {
    const out = fs.openSync(node.log, 'a');
    const cmd = this.mode === 'netns' ? 'ip' : this.bin;
    const args = this.mode === 'netns' ? ['netns', 'exec', node.ns, this.bin, ...this.args(node)] : this.args(node);
    node.proc = spawn(cmd, args, { stdio: ['ignore', out, out], env: { ...this.env, ...node.env } });
    fs.closeSync(out);
    node.startedAt = Date.now();
    node.exited = false;
    node.proc.on('exit', () => { node.exited = true; });
  }

  kill(node, signal = 'SIGKILL') {
    if (node.proc && !node.exited) node.proc.kill(signal);
  }

  async waitExit(node) {
    while (!node.exited) await sleep(20);
  }

  // Cuts a node off the network (both directions) / reconnects it.
  partition(node) {
    if (this.mode === 'netns') sh('ip', ['-n', this.hub, 'link', 'set', `p${node.i}`, 'down']);
    else throw new Error('partition needs network namespaces');
  }

  heal(node) {
    sh('ip', ['-n', this.hub, 'link', 'set', `p${node.i}`, 'up']);
  }

  // GET path on a node; returns parsed JSON, or null when it cannot be reached.
  get(node, p) {
    const url = `http://127.0.0.1:${node.apiPort}${p}`;
    const curl = ['-s', '-m', '3', ...this.auth, '-w', '\n%{http_code}', url];
    const r = this.mode === 'netns'
      ? spawnSync('ip', ['netns', 'exec', node.ns, 'curl', ...curl], { encoding: 'utf8', maxBuffer: 64 << 20 })
      : spawnSync('curl', curl, { encoding: 'utf8', maxBuffer: 64 << 20 });
    if (r.status !== 0) return null;
    const cut = r.stdout.lastIndexOf('\n');
    const status = Number(r.stdout.slice(cut + 1));
    const body = r.stdout.slice(0, cut);
    if (status !== 200) return { status, body };
    try { return JSON.parse(body); } catch { return null; }
  }

  // Like get(), without blocking: many nodes can be asked at once.
  getAsync(node, p) {
    const url = `http://127.0.0.1:${node.apiPort}${p}`;
    const curl = ['-s', '-m', '3', ...this.auth, url];
    const [cmd, args] = this.mode === 'netns' ? ['ip', ['netns', 'exec', node.ns, 'curl', ...curl]] : ['curl', curl];
    return new Promise((resolve) => {
      const chunks = [];
      const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'ignore'] });
      child.stdout.on('data', (d) => chunks.push(d));
      child.on('close', () => {
        try { resolve(JSON.parse(Buffer.concat(chunks).toString('utf8'))); } catch { resolve(null); }
      });
    });
  }

  post(node, p, json) {
    const url = `http://127.0.0.1:${node.apiPort}${p}`;
    const curl = ['-s', '-m', '3', ...this.auth, '-X', 'POST', '-d', JSON.stringify(json), url];
    const r = this.mode === 'netns'
      ? spawnSync('ip', ['netns', 'exec', node.ns, 'curl', ...curl], { encoding: 'utf8' })
      : spawnSync('curl', curl, { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`POST ${p} to node ${node.i} failed`);
    return JSON.parse(r.stdout);
  }

  status(node) { return this.get(node, '/cluster/status'); }

  running() { return this.nodes.filter((n) => !n.exited); }

  // Polls fn() every 100 ms until it returns a truthy value or timeoutMs passes.
  async until(fn, timeoutMs, what) {
    const start = Date.now();
    for (;;) {
      const v = await fn();
      if (v) return { value: v, ms: Date.now() - start };
      if (Date.now() - start > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}\n${this.logs()}`);
      await sleep(100);
    }
  }

  // Every listed node sees every other as alive.
  meshed(nodes = this.running()) {
    const ids = nodes.map((n) => this.status(n));
    if (ids.some((s) => !s || !s.nodeId)) return false;
    for (const s of ids) {
      const alive = new Set(s.peers.filter((p) => p.alive).map((p) => p.nodeId));
      for (const o of ids) if (o.nodeId !== s.nodeId && !alive.has(o.nodeId)) return false;
    }
    return ids;
  }

  // The nodes agree on one master, which is one of them and says so itself. Returns its id.
  oneMaster(nodes = this.running()) {
    const st = nodes.map((n) => this.status(n));
    if (st.some((s) => !s)) return false;
    const masters = st.filter((s) => s.isMaster);
    if (masters.length !== 1) return false;
    const id = masters[0].nodeId;
    return st.every((s) => s.masterNodeId === id) ? id : false;
  }

  // /state and /events identical on all listed nodes (fetched back to back; retried by until()).
  converged(nodes = this.running()) {
    const states = nodes.map((n) => this.get(n, '/state'));
    const events = nodes.map((n) => this.get(n, '/events'));
    if (states.some((s) => !s || s.status) || events.some((e) => !Array.isArray(e))) return false;
    const s0 = JSON.stringify(states[0]), e0 = JSON.stringify(events[0]);
    if (!states.every((s) => JSON.stringify(s) === s0)) return false;
    if (!events.every((e) => JSON.stringify(e) === e0)) return false;
    return { state: states[0], events: events[0] };
  }

  nodeByid(id) { return this.nodes.find((n) => n.id === id); }

  logs() {
    return this.nodes.map((n) => {
      let text = '';
      try { text = fs.readFileSync(n.log, 'utf8').split('\n').slice(-15).join('\n'); } catch { /* none */ }
      return `--- node ${n.i} (${n.ns || n.apiPort}) ---\n${text}`;
    }).join('\n');
  }

  stopSync() {
    if (process.env.EXO_CLUSTER_KEEP_LOGS) { // a folder to copy the node logs into
      fs.mkdirSync(process.env.EXO_CLUSTER_KEEP_LOGS, { recursive: true });
      for (const n of this.nodes) {
        try { fs.copyFileSync(n.log, path.join(process.env.EXO_CLUSTER_KEEP_LOGS, `${this.tag}-node${n.i}.log`)); } catch { /* none */ }
      }
    }
    for (const n of this.nodes) {
      if (n.proc && !n.exited) { try { n.proc.kill('SIGKILL'); } catch { /* gone */ } }
    }
    if (this.mode === 'netns') {
      // Killing `ip netns exec` kills the node too (same process: exec replaces it).
      for (const n of this.nodes) sh('ip', ['netns', 'del', n.ns], { check: false });
      sh('ip', ['netns', 'del', this.hub], { check: false });
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
    live.delete(this);
  }

  async stop() {
    this.stopSync();
  }
}
