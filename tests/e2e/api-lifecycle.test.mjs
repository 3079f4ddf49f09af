// Runners and generations over time: auto-place, /state runner statuses, place/get/delete
// instance, client disconnect cancels the generation, POST /v1/cancel/{id}, a runner killed
// mid-stream fails the request within 5 s, stays RunnerFailed in /state, and the next request
// starts a new runner; a hung (SIGSTOP) runner is killed by the watchdog and restarted.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';

const MODEL = 'qwen3-tiny';
let node;

before(async () => {
  const dir = await tinyModel(MODEL);
  node = await startNode({ args: ['--models-path', path.dirname(dir)],
    env: { EXO_SSE_KEEPALIVE_MS: '50' } });
});
after(async () => { await node?.stop(); });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const json = async (p, opts) => (await fetch(node.url + p, opts)).json();
const chatBody = (extra = {}) => JSON.stringify({ model: MODEL, temperature: 0,
  messages: [{ role: 'user', content: 'hi' }], ...extra });

function runnerPids() {
  try {
    return execFileSync('pgrep', ['-P', String(node.proc.pid)], { encoding: 'utf8' })
      .trim().split('\n').filter(Boolean).map(Number);
  } catch { return []; }
}

async function waitFor(cond, ms, what) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await cond()) return;
    await sleep(50);
  }
  assert.fail(`timed out waiting for ${what}`);
}

// Opens a streamed chat and returns {reader, first} once the first content chunk arrived.
async function openStream(ctl, extra = {}) {
  const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', signal: ctl?.signal,
    headers: { 'content-type': 'application/json' },
    body: chatBody({ stream: true, max_tokens: 3000, ...extra }) });
  assert.equal(r.status, 200);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error('stream ended early');
    buf += dec.decode(value);
    const frames = buf.split('\n\n').filter((f) => f.startsWith('data: {'));
    const content = frames.map((f) => JSON.parse(f.slice(6)))
      .find((c) => c.choices?.[0]?.delta?.content);
    if (content) return { reader, first: content, dec };
  }
}

async function readRest(s) {
  let text = '';
  for (;;) {
    const { value, done } = await s.reader.read();
    if (done) return text;
    text += s.dec.decode(value);
  }
}

const inFlight = async () => (await json('/health')).generations_in_flight;

test('place_instance starts a runner; /state shows it Ready with exo names; GET/DELETE instance', async () => {
  const placed = await json('/place_instance', { method: 'POST',
    body: JSON.stringify({ model_id: MODEL, sharding: 'Pipeline' }) });
  const id = placed.instance_id;
  assert.ok(id);
  await waitFor(async () => {
    const s = await json('/state');
    return Object.values(s.runners).some((r) => 'RunnerReady' in r);
  }, 60000, 'RunnerReady');
  const s = await json('/state');
  const inst = s.instances[id];
  const tag = Object.keys(inst)[0];
  assert.equal(inst[tag].shardAssignments.modelId, MODEL);
  assert.equal(inst[tag].instanceId, id);
  assert.equal((await fetch(`${node.url}/instance/${id}`)).status, 200);
  assert.equal((await fetch(`${node.url}/instance/${id}`, { method: 'DELETE' })).status, 200);
  await waitFor(async () => (await fetch(`${node.url}/instance/${id}`)).status === 404, 5000,
    'instance gone');
  await waitFor(() => runnerPids().length === 0, 5000, 'runner process exit');
  const bad = await fetch(`${node.url}/place_instance`, { method: 'POST',
    body: JSON.stringify({ model_id: 'org/absent' }) });
  assert.equal(bad.status, 404);
});

test('a chat with no instance auto-places one', async () => {
  const r = await json('/v1/chat/completions', { method: 'POST', body: chatBody({ max_tokens: 2 }) });
  assert.equal(r.usage.completion_tokens, 2);
  const s = await json('/state');
  assert.equal(Object.keys(s.instances).length, 1);
  assert.ok(Object.values(s.runners).every((r) => 'RunnerReady' in r || 'RunnerRunning' in r));
});

test('client disconnect cancels the generation in the runner', async () => {
  const ctl = new AbortController();
  await openStream(ctl);
  assert.equal(await inFlight(), 1);
  ctl.abort();
  await waitFor(async () => (await inFlight()) === 0, 3000, 'cancel after disconnect');
  // the runner still serves
  const r = await json('/v1/chat/completions', { method: 'POST', body: chatBody({ max_tokens: 1 }) });
  assert.equal(r.usage.completion_tokens, 1);
});

test('POST /v1/cancel/{id} stops a running generation', async () => {
  const s = await openStream(null);
  const c = await fetch(`${node.url}/v1/cancel/${s.first.id}`, { method: 'POST' });
  assert.equal(c.status, 200);
  const rest = await readRest(s);
  assert.match(rest, /"finish_reason":"stop"/);
  assert.match(rest, /data: \[DONE\]/);
  assert.equal(await inFlight(), 0);
});

test('a runner killed mid-stream fails the request within 5 s; the next request works', async () => {
  const s = await openStream(null);
  const pids = runnerPids();
  assert.equal(pids.length, 1);
  const t0 = Date.now();
  process.kill(pids[0], 'SIGKILL');
  const rest = await readRest(s);
  assert.ok(Date.now() - t0 < 5000, 'the stream ended within 5 s');
  assert.match(rest, /"error":\{"message":"the runner stopped/);
  assert.match(rest, /data: \[DONE\]/);
  // the failure stays visible in /state (exo's RunnerFailed, with the reason) until replaced
  const failed = await json('/state');
  const statuses = Object.values(failed.runners);
  assert.equal(statuses.length, 1);
  assert.ok('RunnerFailed' in statuses[0], JSON.stringify(statuses));
  assert.match(statuses[0].RunnerFailed.errorMessage, /killed by signal 9/);
  assert.equal(Object.keys(failed.instances).length, 1);
  // the next request places a new runner, which replaces the failed one
  const r = await json('/v1/chat/completions', { method: 'POST', body: chatBody({ max_tokens: 2 }) });
  assert.equal(r.usage.completion_tokens, 2);
  const now = runnerPids();
  assert.equal(now.length, 1);
  assert.notEqual(now[0], pids[0]);
  // State is applied from the node's event log: the replacement's events (the failed runner
  // deleted, the new one Ready) land within a moment of the answer, not necessarily before it
  let after;
  await waitFor(async () => {
    after = await json('/state');
    return Object.values(after.runners).every((x) => 'RunnerReady' in x || 'RunnerRunning' in x);
  }, 5000, "the failed runner replaced by a Ready one in /state");
  assert.equal(Object.keys(after.instances).length, 1);
});

test('a hung runner (SIGSTOP) fails in-flight requests in each API format and is restarted', async () => {
  const dir = await tinyModel(MODEL);
  const n = await startNode({ args: ['--models-path', path.dirname(dir)],
    env: { EXO_RUNNER_WATCHDOG_S: '2' } });
  const pidsOf = () => {
    try {
      return execFileSync('pgrep', ['-P', String(n.proc.pid)], { encoding: 'utf8' })
        .trim().split('\n').filter(Boolean).map(Number);
    } catch { return []; }
  };
  let stopped = 0;
  try {
    const post = (p, body) => fetch(n.url + p, { method: 'POST',
      headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const msgs = [{ role: 'user', content: 'hi' }];
    // an OpenAI stream that is producing tokens when the runner stops
    const r = await post('/v1/chat/completions', { model: MODEL, temperature: 0, stream: true,
      max_tokens: 3000, messages: msgs });
    assert.equal(r.status, 200);
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let text = '';
    while (!/"content":"[^"]/.test(text)) {
      const { value, done } = await reader.read();
      assert.ok(!done, 'stream ended early');
      text += dec.decode(value);
    }
    const pids = pidsOf();
    assert.equal(pids.length, 1);
    stopped = pids[0];
    process.kill(stopped, 'SIGSTOP');
    const t0 = Date.now();
    // requests sent to the stopped runner: Claude non-streamed, Ollama non-streamed
    const claude = post('/v1/messages', { model: MODEL, max_tokens: 50, messages: msgs });
    const ollama = post('/ollama/api/chat', { model: MODEL, stream: false, messages: msgs,
      options: { num_predict: 50 } });
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += dec.decode(value);
    }
    const elapsed = Date.now() - t0;
    assert.ok(elapsed >= 1500 && elapsed < 10000, `the stream ended after ${elapsed} ms`);
    assert.match(text, /"error":\{"message":"the runner stopped for model qwen3-tiny: it did not answer for 2 s/);
    assert.match(text, /data: \[DONE\]/);
    const c = await claude;
    assert.equal(c.status, 504);
    const cj = await c.json();
    assert.equal(cj.type, 'error');
    assert.match(cj.error.message, /did not answer for 2 s/);
    const o = await ollama;
    assert.equal(o.status, 504);
    assert.match((await o.json()).error, /did not answer for 2 s/);
    // the stopped runner was killed and a new one started for the model
    let gone = false;
    try { process.kill(stopped, 0); } catch { gone = true; }
    assert.ok(gone, 'the hung runner was killed');
    const again = await (await post('/v1/chat/completions', { model: MODEL, temperature: 0,
      max_tokens: 2, messages: msgs })).json();
    assert.equal(again.usage.completion_tokens, 2);
    const now = pidsOf();
    assert.equal(now.length, 1);
    assert.notEqual(now[0], stopped);
    stopped = 0;
  } finally {
    if (stopped) try { process.kill(stopped, 'SIGKILL'); } catch { /* gone */ }
    await n.stop();
  }
});

test('prefill progress and keep-alive comments reach SSE clients', async () => {
  // A node of its own with a 1 ms keep-alive interval: any pause in the stream (template,
  // tokenization, a prefill chunk) is longer than that, however fast the machine is. (With the
  // file's 50 ms interval this test failed on a quiet machine whose prefill finished sooner.)
  const dir = await tinyModel(MODEL);
  const fast = await startNode({ args: ['--models-path', path.dirname(dir)], env: { EXO_SSE_KEEPALIVE_MS: '1' } });
  try {
    // prefill progress needs a long prompt: > 256 tokens
    const r = await fetch(`${fast.url}/v1/chat/completions`, { method: 'POST', body: chatBody({
      stream: true, max_tokens: 1,
      messages: [{ role: 'user', content: 'hello '.repeat(1500) }] }) });
    const text = await r.text();
    assert.match(text, /^: prefill_progress \{"processed_tokens":\d+,"total_tokens":\d+\}$/m);
    assert.match(text, /^: keep-alive$/m);
    assert.match(text, /data: \[DONE\]/);
  } finally {
    await fast.stop();
  }
});

test('--model places the model at start; SIGTERM stops the node and its runner', async () => {
  const dir = await tinyModel(MODEL);
  const n = await startNode({ args: ['--models-path', path.dirname(dir), '--model', MODEL] });
  try {
    await waitFor(async () => {
      const s = await (await fetch(`${n.url}/state`)).json();
      return Object.values(s.runners).some((r) => 'RunnerReady' in r);
    }, 60000, 'the --model runner to be Ready');
    const pids = execFileSync('pgrep', ['-P', String(n.proc.pid)], { encoding: 'utf8' })
      .trim().split('\n').map(Number);
    assert.equal(pids.length, 1);
    assert.equal(await n.stop(), 0);
    let alive = true;
    try { process.kill(pids[0], 0); } catch { alive = false; }
    assert.equal(alive, false, 'the runner exited with the node');
  } finally {
    await n.stop();
  }
});

test('SIGTERM with a runner that does not answer (SIGSTOP): the node kills it after the grace period', async () => {
  const dir = await tinyModel(MODEL);
  const n = await startNode({ args: ['--models-path', path.dirname(dir), '--model', MODEL],
    env: { EXO_RUNNER_WATCHDOG_S: '0' } }); // the watchdog must not be the one that kills it
  try {
    await waitFor(async () => {
      const s = await (await fetch(`${n.url}/state`)).json();
      return Object.values(s.runners).some((r) => 'RunnerReady' in r);
    }, 60000, 'the --model runner to be Ready');
    const [pid] = execFileSync('pgrep', ['-P', String(n.proc.pid)], { encoding: 'utf8' })
      .trim().split('\n').map(Number);
    process.kill(pid, 'SIGSTOP'); // as a runner deep in a long engine step: it reads nothing
    assert.equal(await n.stop(), 0, 'the node exits by itself (before the harness SIGKILLs it at 8 s)');
    let alive = true;
    try { process.kill(pid, 0); } catch { alive = false; }
    if (alive) process.kill(pid, 'SIGKILL');
    assert.equal(alive, false, 'the stopped runner was killed, not left behind');
  } finally {
    await n.stop();
  }
});

test('DELETE /instance of a runner that does not answer (SIGSTOP): the node kills it after the grace period', async () => {
  const dir = await tinyModel(MODEL);
  const n = await startNode({ args: ['--models-path', path.dirname(dir)],
    env: { EXO_RUNNER_WATCHDOG_S: '0' } }); // the hang watchdog must not be the one that kills it
  let pid;
  try {
    const { instance_id: id } = await (await fetch(`${n.url}/place_instance`, { method: 'POST',
      body: JSON.stringify({ model_id: MODEL }) })).json();
    await waitFor(async () => {
      const s = await (await fetch(`${n.url}/state`)).json();
      return Object.values(s.runners).some((r) => 'RunnerReady' in r);
    }, 60000, 'the runner to be Ready');
    [pid] = execFileSync('pgrep', ['-P', String(n.proc.pid)], { encoding: 'utf8' })
      .trim().split('\n').map(Number);
    process.kill(pid, 'SIGSTOP'); // as a runner deep in a long engine step: it reads nothing
    assert.equal((await fetch(`${n.url}/instance/${id}`, { method: 'DELETE' })).status, 200);
    const gone = () => { try { process.kill(pid, 0); return false; } catch { return true; } };
    await sleep(2000);
    assert.equal(gone(), false, 'still inside its grace period');
    await waitFor(gone, 8000, 'the stopped runner to be killed (5 s grace)');
    assert.equal((await fetch(`${n.url}/instance/${id}`)).status, 404);
    assert.equal((await fetch(`${n.url}/health`)).status, 200, 'the node is unaffected');
  } finally {
    if (pid) try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
    await n.stop();
  }
});

test('a model that fails to load is a 503 naming the reason, in each API shape', async () => {
  const fs = await import('node:fs');
  const broken = path.join(node.modelsDir, 'org--broken');
  fs.mkdirSync(broken, { recursive: true });
  fs.writeFileSync(path.join(broken, 'config.json'), '{"model_type": "llama"}');
  fs.writeFileSync(path.join(broken, 'model.safetensors'), 'not a safetensors file');
  const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST',
    body: JSON.stringify({ model: 'org/broken', messages: [{ role: 'user', content: 'hi' }] }) });
  assert.equal(r.status, 503);
  const j = await r.json();
  assert.match(j.error.message, /runner for org\/broken failed: \S+/);
  const c = await fetch(`${node.url}/v1/messages`, { method: 'POST', body: JSON.stringify({
    model: 'org/broken', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }) });
  assert.equal(c.status, 503);
  assert.equal((await c.json()).error.type, 'overloaded_error');
  // the failed runner stays in /state as RunnerFailed with its error, one instance for the
  // model (the second request replaced the first failed one), until the instance is deleted
  const brokenIds = async () => Object.entries((await json('/state')).instances)
    .filter(([, i]) => Object.values(i)[0].shardAssignments.modelId === 'org/broken')
    .map(([id, i]) => [id, Object.values(i)[0].shardAssignments.runnerToShard]);
  await waitFor(async () => {
    const ids = await brokenIds();
    if (ids.length !== 1) return false;
    const runner = (await json('/state')).runners[Object.keys(ids[0][1])[0]];
    return runner && 'RunnerFailed' in runner && /\S/.test(runner.RunnerFailed.errorMessage);
  }, 5000, 'RunnerFailed in /state');
  const [[id]] = await brokenIds();
  assert.equal((await fetch(`${node.url}/instance/${id}`, { method: 'DELETE' })).status, 200);
  await waitFor(async () => (await brokenIds()).length === 0, 5000, 'deleted failed instance');
});
