// Robustness: a node serving a tiny model survives garbage on every POST route (random bytes,
// truncated JSON, huge numbers, 100k-deep nesting, invalid UTF-8, wrong content types; 200 at
// once per route), clients that vanish mid-body and mid-stream, and slowloris-style headers;
// afterwards it answers the same greedy chat exactly as before and its RSS has not grown with
// the traffic. A runner given a corrupt safetensors file fails with a clear message and the
// API answers with an error instead of hanging.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';

const MODEL = 'qwen3-tiny';
let node;
let modelsPath;

// Deterministic PRNG (mulberry32) so every run sends the same bytes.
function prng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

before(async () => {
  const dir = await tinyModel(MODEL);
  modelsPath = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-robust-'));
  fs.symlinkSync(dir, path.join(modelsPath, MODEL));
  // Corrupt copies: a truncated weights file, and one whose header length lies.
  const st = fs.readFileSync(path.join(dir, 'model.safetensors'));
  for (const [name, bytes] of [
    ['corrupt-truncated', st.subarray(0, Math.floor(st.length / 2))],
    ['corrupt-header', Buffer.concat([Buffer.from([0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0]), st.subarray(8)])],
  ]) {
    const d = path.join(modelsPath, name);
    fs.mkdirSync(d);
    for (const f of fs.readdirSync(dir)) if (f !== 'model.safetensors') fs.copyFileSync(path.join(dir, f), path.join(d, f));
    fs.writeFileSync(path.join(d, 'model.safetensors'), bytes);
  }
  // Under ASan, freed memory sits in a quarantine (256 MiB by default) that would read as RSS
  // growth; keep it small so the RSS bound below means the same in both builds.
  const env = process.env.ASAN_OPTIONS !== undefined
    ? { ASAN_OPTIONS: `${process.env.ASAN_OPTIONS}:quarantine_size_mb=8` } : {};
  node = await startNode({ args: ['--models-path', modelsPath], env });
});
after(async () => {
  const code = await node?.stop();
  if (modelsPath) fs.rmSync(modelsPath, { recursive: true, force: true });
  assert.equal(code, 0, `node exit status after the robustness tests:\n${node?.log().slice(-3000)}`);
});

const POST_ROUTES = ['/v1/chat/completions', '/bench/chat/completions', '/v1/completions',
  '/v1/responses', '/v1/messages', '/ollama/api/chat', '/ollama/api/generate', '/ollama/api/show',
  '/place_instance', '/instance', '/v1/cancel/123'];

async function chat(model = MODEL) {
  const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, signal: AbortSignal.timeout(60000),
    body: JSON.stringify({ model, temperature: 0, max_tokens: 8,
      messages: [{ role: 'user', content: 'hello there' }] }) });
  return { status: r.status, body: await r.json() };
}

function rssKiB() {
  const s = fs.readFileSync(`/proc/${node.proc.pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(s)[1]);
}

function garbageBodies(rand) {
  const bytes = (n) => Buffer.from(Array.from({ length: n }, () => Math.floor(rand() * 256)));
  const valid = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] });
  return [
    ['application/json', bytes(1 + Math.floor(rand() * 4096))],
    ['application/json', Buffer.from(valid.slice(0, Math.floor(rand() * valid.length)))],
    ['application/json', Buffer.from(`{"model":"${MODEL}","max_tokens":1${'9'.repeat(400)},` +
      `"temperature":1e999,"top_p":-1e308,"messages":12345678901234567890123}`)],
    ['application/json', Buffer.from('['.repeat(100000) + ']'.repeat(100000))],
    ['application/json', Buffer.from('{"a":'.repeat(100000))],
    ['application/json', Buffer.concat([Buffer.from(`{"model":"${MODEL}","messages":[{"role":"user","content":"`),
      Buffer.from([0xc3, 0x28, 0xff, 0xfe, 0xed, 0xa0, 0x80, 0xf4, 0x90, 0x80, 0x80]), Buffer.from('"}]}')])],
    ['text/plain', Buffer.from(valid.replace('hi', 'x'.repeat(10)).replace(MODEL, 'no-such-model'))],
    ['multipart/form-data; boundary=zz', Buffer.from('--zz\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--zz--')],
    ['application/x-www-form-urlencoded', Buffer.from('model=x&messages=%ff%fe')],
  ];
}

// One batch: 200 garbage requests at once to one route; each must get an HTTP answer below 500.
async function barrage(route, rand) {
  const bodies = garbageBodies(rand);
  const reqs = Array.from({ length: 200 }, (_, i) => {
    const [ct, body] = bodies[i % bodies.length];
    return fetch(node.url + route, { method: 'POST', headers: { 'content-type': ct }, body,
      signal: AbortSignal.timeout(60000) })
      .then(async (r) => { await r.arrayBuffer(); return r.status; });
  });
  const statuses = await Promise.all(reqs);
  for (const s of statuses) assert.ok(s >= 400 && s < 500, `${route}: status ${s} for garbage`);
}

function rawSocket() {
  return new Promise((resolve, reject) => {
    const s = net.connect(node.port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

let answer;
let rss0;
let rss1;

test('baseline: greedy chat answer and RSS after warm-up', async () => {
  const r = await chat();
  assert.equal(r.status, 200);
  answer = r.body.choices[0].message.content;
  assert.ok(answer.length > 0);
  await barrage('/v1/chat/completions', prng(1)); // warm-up: allocator pools, thread stacks
  rss0 = rssKiB();
});

test('200 concurrent garbage requests per POST route get 4xx answers', async () => {
  const rand = prng(42);
  for (const route of POST_ROUTES) await barrage(route, rand);
  rss1 = rssKiB();
});

test('clients that disconnect mid-body and mid-stream do not hurt the node', async () => {
  for (let i = 0; i < 50; i++) {
    const s = await rawSocket();
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Content-Length: 100000\r\n\r\n{"model":"${MODEL}","messages":[`);
    s.destroy();
  }
  for (let i = 0; i < 3; i++) {
    const ctl = new AbortController();
    const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', signal: ctl.signal,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, stream: true, max_tokens: 2000,
        messages: [{ role: 'user', content: 'go' }] }) });
    assert.equal(r.status, 200);
    await r.body.getReader().read();
    ctl.abort();
  }
  assert.equal((await chat()).body.choices[0].message.content, answer);
});

test('slowloris headers do not block other clients', async () => {
  const slow = [];
  for (let i = 0; i < 40; i++) {
    const s = await rawSocket();
    s.on('error', () => {});
    s.write('GET /state HTTP/1.1\r\nHost: x\r\n');
    slow.push(s);
  }
  for (let k = 0; k < 10; k++) {
    for (const s of slow) if (!s.destroyed) s.write(`X-Slow-${k}: a\r\n`);
    const t0 = Date.now();
    const r = await fetch(`${node.url}/node_id`, { signal: AbortSignal.timeout(10000) });
    assert.equal(r.status, 200, `answered after ${Date.now() - t0} ms`);
    await new Promise((res) => setTimeout(res, 100));
  }
  for (const s of slow) s.destroy();
});

test('afterwards: same greedy answer, and RSS did not grow with the traffic', async () => {
  assert.equal((await chat()).body.choices[0].message.content, answer);
  // Two more full rounds (4400 requests) measured from the end of the first one, so glibc's
  // per-thread arenas that 200 concurrent connection threads touch once (~90 MiB, measured: warm
  // 106 MiB, after round 1 193 MiB, round 2 197, round 3 198) are not counted. 24 MiB over 4400
  // requests catches any leak above ~5.6 KiB per request; leaking the 200 kB nested bodies
  // alone would add ~190 MiB.
  const rand = prng(7);
  for (const route of POST_ROUTES) await barrage(route, rand);
  const rss2 = rssKiB();
  for (const route of POST_ROUTES) await barrage(route, rand);
  const rss3 = rssKiB();
  console.log(`RSS KiB: warm ${rss0} round1 ${rss1} round2 ${rss2} round3 ${rss3}`);
  const grown = rss3 - rss1;
  // Under ASan (build/san) RSS measures the sanitizer's allocator caches, not the program; there
  // LeakSanitizer at the node's exit is the leak check (after() asserts exit status 0 and
  // tests/run-e2e.sh fails on any report).
  if (!/\/san\/?$/.test(process.env.EXO_BUILD || '')) assert.ok(grown < 24 * 1024, `node RSS grew by ${grown} KiB`);
  assert.equal((await chat()).body.choices[0].message.content, answer);
});

test('a corrupt safetensors file fails the runner with a clear message, no hang', async () => {
  for (const model of ['corrupt-truncated', 'corrupt-header']) {
    const t0 = Date.now();
    const r = await chat(model);
    assert.ok(r.status >= 400, `${model}: status ${r.status}`);
    const msg = JSON.stringify(r.body);
    assert.match(msg, /safetensors|truncated|header|weights|tensor/i, `${model}: ${msg}`);
    assert.ok(Date.now() - t0 < 60000);
    console.log(`${model}: ${r.status} ${msg}`);
  }
  assert.equal((await chat()).body.choices[0].message.content, answer);
});
