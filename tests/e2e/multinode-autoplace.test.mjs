// Auto-placement across nodes: a chat for a model with no instance that does not fit one node
// (each node reports less memory than the model needs: EXO_NODE_MEMORY_BYTES, its GPU's too on
// --device cuda) places it on two nodes by itself, answers, and /state shows one 2-rank pipeline
// instance. First, every node's device and memory bandwidth are in State (placement reads them).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { mkModel } from './lib/models.mjs';
import { DIST_MODELS, body, chat, startCluster } from './lib/multinode.mjs';

const MODEL = 'qwen3-dist';
let c;
after(async () => { await c?.stop(); });

test('a chat for a model too big for one node places it on two and answers', async () => {
  const dir = await mkModel(MODEL, DIST_MODELS[MODEL]);
  const weights = fs.statSync(path.join(dir, 'model.safetensors')).size;
  // placement needs weights + KV cache (4096 tokens: 8 MiB here) + 256 MiB headroom per node:
  // give each node room for about three quarters of that
  const headroom = 256 * 1024 * 1024, kv = 2 * 4 * 4 * 32 * 2 * 4096;
  const memory = headroom + Math.floor(0.75 * (weights + kv));
  c = await startCluster(2, path.dirname(dir), { EXO_NODE_MEMORY_BYTES: String(memory) });
  const [a, b] = c.nodes;
  // every node says what its runners compute on and that device's bandwidth (a CPU's measured
  // at start), which placement weighs beside a GPU node; a GPU node's memory is capped as well
  const { value: sys } = await c.until(() => {
    const s = c.get(a, '/state');
    return s && c.nodes.every((x) => s.nodeSystem[x.id]?.memoryBandwidthGBs > 0) ? s : false;
  }, 15000, 'every node\'s device and memory bandwidth in State');
  const asked = process.env.EXO_TEST_DEVICE; // auto (or unset): either, as the machine has
  for (const x of c.nodes) {
    const device = sys.nodeSystem[x.id].device;
    assert.ok(['cpu', 'cuda'].includes(asked) ? device === asked : ['cpu', 'cuda'].includes(device), device);
    if (device === 'cuda') assert.ok(sys.nodeMemory[x.id].gpuAvailable.inBytes <= memory, 'GPU memory capped');
  }
  const first = chat(c, b, MODEL, [{ role: 'user', content: 'Hello' }]);
  assert.ok(first.tokens.length > 0);
  const st = c.get(a, '/state');
  const insts = Object.values(st.instances);
  assert.equal(insts.length, 1, 'one instance');
  assert.equal(Object.keys(body(insts[0]).shardAssignments.nodeToRunner).length, 2, 'on both nodes');
  assert.deepEqual(chat(c, a, MODEL, [{ role: 'user', content: 'Hello' }]).tokens, first.tokens);
});
