// /instance/previews and /instance/placement on a single node: where a model would run, how much
// memory it needs there (weights + KV cache + headroom), and a clear reason when it cannot.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';

let node;
before(async () => {
  const dir = await tinyModel('qwen3-tiny');
  const modelsDir = fs.mkdtempSync('/tmp/exo-place-models-');
  fs.symlinkSync(dir, path.join(modelsDir, 'test--qwen3-tiny'));
  node = await startNode({ modelsDir, args: ['--data-dir', fs.mkdtempSync('/tmp/exo-place-data-')] });
});
after(async () => { await node?.stop(); });

const get = async (p) => { const r = await fetch(node.url + p); return { status: r.status, body: await r.json() }; };

test('previews of a local model list a one-node pipeline placement with its memory', async () => {
  const { status, body } = await get('/instance/previews?model_id=test/qwen3-tiny');
  assert.equal(status, 200);
  const pipe = body.previews.find((p) => p.sharding === 'Pipeline' && p.min_nodes === 1);
  assert.ok(pipe, 'a pipeline preview');
  assert.equal(pipe.error, null);
  assert.equal(pipe.instance_meta, 'MlxRing');
  const shard = Object.values(pipe.instance.MlxRingInstance.shardAssignments.runnerToShard)[0].PipelineShardMetadata;
  assert.equal(shard.startLayer, 0);
  assert.equal(shard.endLayer, shard.nLayers);
  const mem = Object.values(pipe.memory_delta_by_node)[0];
  const weights = fs.statSync(path.join(await tinyModel('qwen3-tiny'), 'model.safetensors')).size;
  assert.ok(mem > weights, `memory ${mem} counts more than the weights ${weights}`);
});

test('a model too large for the cluster gets a placement error naming the shortfall', async () => {
  const { status, body } = await get('/instance/placement?model_id=mlx-community/Qwen3.5-397B-A17B-4bit');
  assert.equal(status, 400);
  assert.match(body.error.message, /does not fit: .* needs [\d.]+ GB .* has [\d.]+ GB free/);
  const prev = await get('/instance/previews?model_id=mlx-community/Qwen3.5-397B-A17B-4bit');
  assert.ok(prev.body.previews.every((p) => p.error && p.instance === null));
});

test('bad requests are 400/404 in the error format', async () => {
  assert.equal((await get('/instance/previews')).status, 400);
  assert.equal((await get('/instance/previews?model_id=nobody/nothing')).status, 404);
  assert.equal((await get('/instance/placement?model_id=test/qwen3-tiny&sharding=Diagonal')).status, 400);
});
