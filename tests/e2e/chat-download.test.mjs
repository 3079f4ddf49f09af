// The first chat request for a catalog model that is not on disk downloads it: a streamed
// (SSE) request waits, with ": download_progress {...}" comments, then streams the answer; a
// request that cannot show progress waits up to EXO_DOWNLOAD_WAIT_S and then gets a 503 with
// Retry-After and the progress, while the download goes on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';
import { FakeHF } from './lib/fake-hf.mjs';

const ID = 'test-org/qwen3-tiny';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function hubWithTinyModel(t, bytesPerSec) {
  const dir = await tinyModel('qwen3-tiny');
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  hf.addModelDir(ID, dir);
  hf.faults.bytesPerSec = bytesPerSec;
  return hf;
}

const post = (n, p, body) => fetch(n.url + p, { method: 'POST', body: JSON.stringify(body) });

test('a streamed chat request downloads the model first, with progress comments', async (t) => {
  const hf = await hubWithTinyModel(t, 16 << 20); // ~3 s for the 50 MB model
  const n = await startNode({ env: { HF_ENDPOINT: hf.url, HF_TOKEN: '' } });
  t.after(() => n.stop());
  const nodeId = await (await fetch(`${n.url}/node_id`)).json();
  assert.equal((await post(n, '/models/add', { model_id: ID })).status, 200, 'card added');

  const r = await post(n, '/v1/chat/completions', { model: ID, max_tokens: 3, stream: true,
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const text = await r.text();
  const progress = [...text.matchAll(/^: download_progress (.*)$/gm)].map((m) => JSON.parse(m[1]));
  assert.ok(progress.length >= 2, `several progress comments:\n${text.slice(0, 2000)}`);
  const ongoing = progress.filter((p) => p.DownloadOngoing);
  assert.ok(ongoing.length >= 1, 'progress while downloading');
  const dp = ongoing[ongoing.length - 1].DownloadOngoing;
  assert.equal(dp.modelId, ID);
  assert.equal(dp.nodeId, nodeId);
  assert.ok(dp.downloadProgress.total.inBytes > 40e6, 'total is the model size');
  assert.ok(progress[progress.length - 1].DownloadCompleted, 'the last comment says completed');
  // comments come before any data event; then the completion streams as usual
  assert.ok(text.indexOf(': download_progress') < text.indexOf('data: '));
  const chunks = text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
  assert.ok(chunks.some((c) => c.choices?.[0]?.finish_reason), 'a finish_reason chunk');
  assert.match(text, /data: \[DONE\]/);
  assert.ok(hf.totalSent(ID) >= 40e6, 'the model came from the Hub');
  assert.ok(fs.existsSync(path.join(n.modelsDir, 'test-org--qwen3-tiny', 'model.safetensors')));

  const st = await (await fetch(`${n.url}/state`)).json();
  const dl = (st.downloads[nodeId] || []).find((d) => Object.values(d)[0].modelId === ID);
  assert.ok(dl?.DownloadCompleted, `State shows the download: ${JSON.stringify(st.downloads)}`);

  // the OpenAI SDK ignores the comments (a second request: the model is on disk now)
  const client = new OpenAI({ baseURL: `${n.url}/v1`, apiKey: 'x' });
  const s = await client.chat.completions.create({ model: ID, max_tokens: 2, stream: true,
    messages: [{ role: 'user', content: 'hi' }] });
  let finish = null;
  for await (const c of s) finish = c.choices[0]?.finish_reason || finish;
  assert.ok(finish);
});

test('a non-streamed chat request gets 503 + Retry-After while the model downloads, then works', async (t) => {
  const hf = await hubWithTinyModel(t, 8 << 20); // ~6 s
  const n = await startNode({ env: { HF_ENDPOINT: hf.url, HF_TOKEN: '', EXO_DOWNLOAD_WAIT_S: '1' } });
  t.after(() => n.stop());
  assert.equal((await post(n, '/models/add', { model_id: ID })).status, 200, 'card added');
  const body = { model: ID, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] };
  const r = await post(n, '/v1/chat/completions', body);
  assert.equal(r.status, 503);
  assert.ok(Number(r.headers.get('retry-after')) > 0, 'Retry-After');
  const e = (await r.json()).error.message;
  assert.match(e, /being downloaded/);
  assert.match(e, /\d+%, [\d.]+ of [\d.]+ MB/);
  // a second request does not start a second download; it waits on the same one
  const end = Date.now() + 60000;
  let ok;
  for (;;) {
    const again = await post(n, '/v1/chat/completions', body);
    if (again.status === 200) { ok = await again.json(); break; }
    assert.equal(again.status, 503, await again.text());
    assert.ok(Date.now() < end, 'download finished in time');
    await sleep(500);
  }
  assert.equal(ok.usage.completion_tokens, 2);
  const fetched = hf.requests({ path: `/${ID}/resolve/main/model.safetensors` });
  assert.ok(fetched.length >= 1);
  assert.ok(hf.bytesSent(ID, 'model.safetensors') < 2 * 38978168, 'the weights were fetched once');
});

test('a chat request for a model in neither the catalog nor on disk is a 404 naming it', async (t) => {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  const n = await startNode({ env: { HF_ENDPOINT: hf.url, HF_TOKEN: '' } });
  t.after(() => n.stop());
  const r = await post(n, '/v1/chat/completions', { model: 'test-org/nowhere', stream: true,
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.status, 404);
  assert.match((await r.json()).error.message, /test-org\/nowhere/);
  assert.equal(hf.log.length, 0, 'the Hub was not asked');
});
