// Helpers for multi-node instance tests on the namespace harness (lib/cluster.mjs): HTTP with a
// body and a longer timeout than the harness's, placing through /place_instance and waiting in
// /state until every runner of the instance is RunnerReady (as exo's integration tests do), a
// streamed chat read line by line, and a cluster of real `exo` nodes sharing one models folder.
import { spawn, spawnSync } from 'node:child_process';
import { Cluster } from './cluster.mjs';
import { exoBin } from './exo.mjs';

function curlArgs(c, node, method, p, body, timeoutS) {
  const args = ['-s', '-m', String(timeoutS), ...c.auth, '-X', method, '-w', '\n%{http_code}',
    '-H', 'Content-Type: application/json'];
  if (body !== undefined) args.push('-d', JSON.stringify(body));
  args.push(`http://127.0.0.1:${node.apiPort}${p}`);
  return c.mode === 'netns' ? ['ip', ['netns', 'exec', node.ns, 'curl', ...args]] : ['curl', args];
}

// {status, body} (body parsed when JSON).
export function http(c, node, method, p, body, timeoutS = 60) {
  const [cmd, args] = curlArgs(c, node, method, p, body, timeoutS);
  return curlReply(spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20 }).stdout);
}

// curl's output with -w '\n%{http_code}' -> {status, body}.
function curlReply(out) {
  const cut = out.lastIndexOf('\n');
  const status = Number(out.slice(cut + 1));
  const text = out.slice(0, cut);
  try { return { status, body: JSON.parse(text) }; } catch { return { status, body: text }; }
}

// The same, without blocking: for requests that must be in flight together.
export function httpAsync(c, node, method, p, body, timeoutS = 60) {
  const [cmd, args] = curlArgs(c, node, method, p, body, timeoutS);
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d.toString('utf8'); });
    child.on('close', () => resolve(curlReply(out)));
  });
}

// opts: mode ('loopback' where the nodes must reach a server on this host's loopback, e.g. the
// fake Hub), apiKey (every node runs with --api-key, the harness sends it), args(i) (node i's
// flags instead of --models-path modelsPath), nodeArgs (more flags for every node), nodeEnv(i)
// (node i's own environment variables).
export async function startCluster(n, modelsPath, env = {}, opts = {}) {
  const c = new Cluster({ bin: exoBin(), mode: opts.mode, apiKey: opts.apiKey,
    env: { EXO_CLUSTER_SYNC_MS: '100', EXO_RUNNER_THREADS: '1', ...env } });
  const key = opts.apiKey ? ['--api-key', opts.apiKey] : [];
  for (let i = 0; i < n; i++) {
    c.addNode([...(opts.args ? opts.args(i) : ['--models-path', modelsPath]), ...(opts.nodeArgs || []), ...key],
      { env: opts.nodeEnv ? opts.nodeEnv(i) : {} });
  }
  await c.until(() => c.meshed(), 15000, `${n} nodes to discover each other`);
  for (const [i, s] of c.meshed().entries()) c.nodes[i].id = s.nodeId;
  await c.until(() => c.oneMaster(), 10000, 'one master');
  // every node's memory is in State (placement reads it)
  await c.until(() => {
    const st = c.get(c.nodes[0], '/state');
    return st && c.nodes.every((x) => st.nodeMemory && st.nodeMemory[x.id]);
  }, 10000, 'every node in State');
  return c;
}

export const body = (instance) => Object.values(instance)[0];

// Every runner of the instance reports RunnerReady in node's /state.
export function allReady(st, id) {
  const inst = st && st.instances && st.instances[id];
  if (!inst) return false;
  const runners = Object.values(body(inst).shardAssignments.nodeToRunner);
  return runners.every((r) => st.runners[r] && 'RunnerReady' in st.runners[r]);
}

// POST /place_instance through node, then polls /state until all its runners are Ready, in the
// State of every running node (a node whose State lags would place a chat's model itself).
export async function place(c, node, req, timeoutMs = 60000) {
  const r = http(c, node, 'POST', '/place_instance', req);
  if (r.status !== 200) throw new Error(`place_instance ${JSON.stringify(req)}: ${r.status} ${JSON.stringify(r.body)}`);
  const id = r.body.instance_id;
  const seen = await c.until(() => {
    const st = c.get(node, '/state');
    return allReady(st, id) && c.running().every((n) => allReady(c.get(n, '/state'), id)) ? st : false;
  }, timeoutMs, `instance ${id} of ${req.model_id} to be Ready on every node`);
  return { id, instance: seen.value.instances[id], state: seen.value };
}

// Places model as each [sharding, nodes] of splits in turn through node `at` (every instance
// removed first) and runs ask({what, n, via, rank0}) on it, where via is the node to ask (`other`,
// which forwards to rank 0 when it does not hold it; for a 1-node instance its own node: other
// nodes place their own rather than forward to it) and rank0 the node holding rank 0; checks
// that the placed instance served (no other one in State), then removes it. Returns ask's
// results in split order.
export async function eachSplit(c, at, other, model, splits, ask) {
  await removeAll(c, at);
  const out = [];
  for (const [sharding, n] of splits) {
    const what = `${sharding} x${n}`;
    const placed = await place(c, at, { model_id: model, sharding, instance_meta: 'MlxRing', min_nodes: n });
    const shards = body(placed.instance).shardAssignments;
    if (Object.keys(shards.nodeToRunner).length !== n) throw new Error(`${what}: not on ${n} nodes`);
    const [rank0Id] = Object.entries(shards.nodeToRunner).find(([, r]) =>
      Object.values(shards.runnerToShard[r])[0].deviceRank === 0);
    const rank0 = c.nodes.find((x) => x.id === rank0Id);
    out.push(await ask({ what, n, via: n === 1 ? rank0 : other, rank0 }));
    const ids = Object.keys(c.get(at, '/state').instances);
    if (ids.length !== 1 || ids[0] !== placed.id) throw new Error(`${what}: other instances served: ${ids}`);
    await remove(c, at, placed.id);
  }
  return out;
}

export async function remove(c, node, id) {
  const before = c.get(node, '/state');
  const inst = before && before.instances[id];
  const runners = inst ? Object.values(body(inst).shardAssignments.nodeToRunner) : [];
  const r = http(c, node, 'DELETE', `/instance/${id}`);
  if (r.status !== 200) throw new Error(`DELETE /instance/${id}: ${r.status}`);
  await c.until(() => c.running().every((n) => {
    const st = c.get(n, '/state');
    return st && !st.instances[id] && runners.every((x) => !st.runners[x]);
  }), 20000, `instance ${id} and its runners to leave State`);
}

// Deletes every instance (a failed test must not leave its instance to the next one).
export async function removeAll(c, node) {
  const st = c.get(node, '/state');
  for (const id of Object.keys((st && st.instances) || {})) await remove(c, node, id);
}

// Greedy chat: {content, logprobs: [numbers], tokens: [strings], finish}.
export function chat(c, node, model, messages, maxTokens = 12) {
  const r = http(c, node, 'POST', '/v1/chat/completions', {
    model, messages, max_tokens: maxTokens, temperature: 0, logprobs: true, top_logprobs: 2,
  }, 120);
  if (r.status !== 200) throw new Error(`chat via node ${node.i}: ${r.status} ${JSON.stringify(r.body)}`);
  const choice = r.body.choices[0];
  const lp = (choice.logprobs && choice.logprobs.content) || [];
  return { content: choice.message.content, finish: choice.finish_reason,
    tokens: lp.map((t) => t.token), logprobs: lp.map((t) => t.logprob) };
}

// A streamed chat through node: resolves {lines, errorAt, firstAt, endAt} (ms since start);
// onFirstContent runs once, at the first content delta.
export function streamChat(c, node, model, maxTokens, onFirstContent) {
  const payload = JSON.stringify({ model, stream: true, max_tokens: maxTokens, temperature: 0,
    messages: [{ role: 'user', content: 'Count to a thousand, slowly.' }] });
  const args = ['-s', '-N', '-m', '120', '-H', 'Content-Type: application/json', '-d', payload,
    `http://127.0.0.1:${node.apiPort}/v1/chat/completions`];
  const [cmd, argv] = c.mode === 'netns' ? ['ip', ['netns', 'exec', node.ns, 'curl', ...args]] : ['curl', args];
  const start = Date.now();
  const out = { lines: [], other: [], firstAt: null, errorAt: null, endAt: null };
  return new Promise((resolve) => {
    const child = spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'ignore'] });
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d.toString('utf8');
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i).trim();
        buf = buf.slice(i + 1);
        if (!line.startsWith('data: ')) { if (line) out.other.push(line); continue; }
        out.lines.push(line);
        if (line.includes('"error"') && out.errorAt === null) out.errorAt = Date.now() - start;
        if (out.firstAt === null && line.includes('"content"')) {
          out.firstAt = Date.now() - start;
          if (onFirstContent) onFirstContent();
        }
      }
    });
    child.on('close', () => {
      if (buf.trim()) out.other.push(buf.trim());
      out.endAt = Date.now() - start;
      resolve(out);
    });
  });
}

// Models split over up to 4 ranks: 4 layers (3 pipeline stages), 8 heads and 4 KV heads (4 tensor
// ranks); 4-bit in MLX's usual groups of 64, which every rank's share of o_proj's (8 x 32 / 4) and
// down_proj's (256 / 4) input columns fills whole.
const SHAPE = ['--tokenizer', 'qwen3', '--layers', '4', '--heads', '8', '--kv-heads', '4', '--head-dim', '32',
  '--intermediate', '256'];
const Q4 = ['--quant-bits', '4', '--group-size', '64'];
const MOE = ['--arch', 'qwen3_moe', '--moe-intermediate', '256', '--seed', '12'];
export const DIST_MODELS = {
  'qwen3-dist': ['--arch', 'qwen3', '--seed', '11', ...SHAPE],
  'qwen3-dist-4bit': ['--arch', 'qwen3', '--seed', '11', ...SHAPE, ...Q4],
  'qwen3-moe-dist': [...MOE, ...SHAPE],
  'qwen3-moe-dist-4bit': [...MOE, ...SHAPE, ...Q4],
};
