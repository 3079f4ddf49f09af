// Model ids from the network (issue 26): one model has one identity (every spelling of its path
// is its id and shares one runner), a path outside the node's model directories names nothing
// and every such path gets the same answer (no probing whether /etc exists), and a node starts
// at most --max-runners runners.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { repoRoot } from './lib/exo.mjs';
import { tinyModel } from './lib/models.mjs';

const DEMO = 'exo/demo-dictionary';
const demoDir = path.join(repoRoot, 'resources/models/exo--demo-dictionary');
let node, tinyDir, outside;
before(async () => {
  tinyDir = await tinyModel('qwen3-tiny');
  await tinyModel('llama3-tiny');
  // A real model directory outside every model dir: a path to it must not work either.
  outside = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-outside-'));
  fs.cpSync(tinyDir, path.join(outside, 'qwen3-tiny'), { recursive: true });
  node = await startNode({ args: ['--models-path', path.dirname(tinyDir), '--max-runners', '2'] });
});
after(async () => {
  await node?.stop();
  fs.rmSync(outside, { recursive: true, force: true });
});

const post = (p, body) => fetch(node.url + p, { method: 'POST',
  headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
const chat = (model) => post('/v1/chat/completions',
  { model, max_tokens: 2, temperature: 0, messages: [{ role: 'user', content: 'hi' }] });
const state = async () => (await fetch(`${node.url}/state`)).json();
const modelsOf = (st) => Object.values(st.instances).map((i) => Object.values(i)[0].shardAssignments.modelId);
// The models of the instances in /state once the event log has caught up (instances reach the
// State through it, a moment after they start).
async function instanceModels(atLeast) {
  const deadline = Date.now() + 10000;
  while (modelsOf(await state()).length < atLeast && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  await new Promise((r) => setTimeout(r, 500));
  return modelsOf(await state()).sort();
}

test('every spelling of a model directory\'s path is the model\'s id, served by one runner', async () => {
  const parent = path.dirname(demoDir);
  const spellings = [demoDir, `${demoDir}/`, `${demoDir}/.`, `/${demoDir}`, `${parent}/./exo--demo-dictionary`,
    `${demoDir}/../exo--demo-dictionary`, DEMO];
  for (const model of spellings) {
    const r = await chat(model);
    const body = await r.json();
    assert.equal(r.status, 200, `${model}: ${JSON.stringify(body)}`);
    assert.equal(body.model, DEMO, model);
  }
  const r = await post('/instance', { model_id: `${demoDir}//` });
  assert.equal(r.status, 200);
  assert.equal((await r.json()).model_id, DEMO);
  assert.deepEqual(await instanceModels(1), [DEMO], 'one instance of the model');
});

test('a path outside the model directories names nothing, with one answer for any path', async () => {
  const paths = ['/etc', '/nonexistent', '/', '//', path.join(outside, 'qwen3-tiny'), `${demoDir}/config.json`,
    '/tmp/../etc/passwd'];
  const answers = new Set();
  for (const p of paths) {
    const norm = (text) => text.split(`'${p}'`).join('PATH');
    const c = await chat(p);
    assert.equal(c.status, 404, p);
    const msg = (await c.json()).error.message;
    assert.match(msg, /model directories/);
    answers.add(`chat ${c.status} ${norm(msg)}`);
    for (const route of ['/instance', '/place_instance']) {
      const r = await post(route, { model_id: p });
      answers.add(`${route} ${r.status} ${norm(await r.text())}`);
    }
    const show = await post('/ollama/api/show', { model: p });
    answers.add(`show ${show.status} ${norm(await show.text())}`);
    const prev = await fetch(`${node.url}/instance/previews?model_id=${encodeURIComponent(p)}`);
    answers.add(`previews ${prev.status} ${norm(await prev.text())}`);
  }
  // one answer per route, whatever the path: existing or not, a model or not
  assert.equal(answers.size, 5, [...answers].join('\n'));
  for (const a of answers) assert.doesNotMatch(a, /^\S+ 2\d\d/, a);
  assert.deepEqual(await instanceModels(1), [DEMO], 'no runner started for a path');
});

test('a node starts at most --max-runners runners; the next placement is a clear 503', async () => {
  const second = await chat('qwen3-tiny');
  assert.equal(second.status, 200);
  const third = await chat('llama3-tiny');
  assert.equal(third.status, 503);
  assert.match((await third.json()).error.message, /--max-runners/);
  assert.deepEqual(await instanceModels(2), [DEMO, 'qwen3-tiny']);
  // an instance that exists is still served
  assert.equal((await chat(DEMO)).status, 200);
});
