// Auto-placement across nodes: a chat for a model with no instance that does not fit one node
// (each node reports less memory than the model needs: EXO_NODE_MEMORY_BYTES) places it on two
// nodes by itself, answers, and /state shows one 2-rank pipeline instance.
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
  const first = chat(c, b, MODEL, [{ role: 'user', content: 'Hello' }]);
  assert.ok(first.tokens.length > 0);
  const st = c.get(a, '/state');
  const insts = Object.values(st.instances);
  assert.equal(insts.length, 1, 'one instance');
  assert.equal(Object.keys(body(insts[0]).shardAssignments.nodeToRunner).length, 2, 'on both nodes');
  assert.deepEqual(chat(c, a, MODEL, [{ role: 'user', content: 'Hello' }]).tokens, first.tokens);
});
