// Edges a newcomer or an attacker meets (issue 26): logprob tokens that join into the content,
// 413 answers counted in /metrics, clear messages (an unknown Ollama role, a directory without
// config.json, `n`), a warning for a models dir the node cannot write, and a node that will not
// run under a random id when its cluster port is taken.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { startNode } from './lib/node.mjs';
import { exoBin } from './lib/exo.mjs';

const MODEL = 'exo/demo-dictionary'; // built in
let node, client;
before(async () => {
  node = await startNode({ args: ['--max-body-size', '2K'] });
  client = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await node?.stop(); });

test('logprob tokens keep their leading space and join into the content', async () => {
  const r = await client.chat.completions.create({ model: MODEL, max_tokens: 12, temperature: 0,
    logprobs: true, top_logprobs: 2, messages: [{ role: 'user', content: 'What does harbour mean?' }] });
  const content = r.choices[0].message.content;
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.map((e) => e.token).join(''), content);
  let spaced = 0;
  lp.forEach((e, i) => {
    const text = Buffer.from(e.bytes).toString('utf8');
    // the first token may lose its leading space, as the content's first word does
    if (i > 0) assert.equal(e.token, text, `token ${i}`);
    if (i > 0 && text.startsWith(' ')) spaced++;
    for (const alt of e.top_logprobs) if (i > 0) assert.equal(alt.token, Buffer.from(alt.bytes).toString('utf8'));
  });
  assert.ok(spaced > 0, `some tokens start with a space: ${JSON.stringify(lp.map((e) => e.token))}`);
});

test('413 answers are counted in /metrics under their API', async () => {
  const metric = async () => {
    const m = await (await fetch(`${node.url}/metrics`)).text();
    return Number(/^exo_requests_total\{api="openai",status="413"\} (\d+)/m.exec(m)[1]);
  };
  const before = await metric();
  const big = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(4000) }] });
  const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: big });
  assert.equal(r.status, 413);
  // no Content-Length (chunked): found while reading the body
  const chunked = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', duplex: 'half',
    headers: { 'content-type': 'application/json' },
    body: new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode(big)); c.close(); } }) });
  assert.equal(chunked.status, 413);
  assert.equal(await metric(), before + 2);
});

test('an unknown Ollama role is named as such, not as an empty prompt', async () => {
  const ollama = new Ollama({ host: `${node.url}/ollama` });
  await assert.rejects(ollama.chat({ model: MODEL, stream: false,
    messages: [{ role: 'narrator', content: 'hi' }] }), (e) => {
    assert.match(e.message, /unknown role 'narrator'/);
    return true;
  });
});

test('`n` other than 1 says what it must be', async () => {
  await assert.rejects(client.chat.completions.create({ model: MODEL, n: 2,
    messages: [{ role: 'user', content: 'hi' }] }), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /'n' must be 1 \(got 2\)/);
    return true;
  });
});

test('a model directory without config.json is named as such, not "not on disk"', async () => {
  fs.mkdirSync(path.join(node.modelsDir, 'org--empty'));
  fs.writeFileSync(path.join(node.modelsDir, 'org--empty', 'README.md'), 'not a model');
  await assert.rejects(client.chat.completions.create({ model: 'org/empty',
    messages: [{ role: 'user', content: 'hi' }] }), (e) => {
    assert.equal(e.status, 404);
    assert.match(e.message, /org--empty has no config\.json/);
    return true;
  });
});

test('a models dir the node cannot write is a warning at start-up', async () => {
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'exo-ro-')), 'a-file');
  fs.writeFileSync(file, '');
  const n = await startNode({ modelsDir: path.join(file, 'models') });
  try {
    assert.match(n.log(), /models directory .*a-file\/models is not writable/);
  } finally {
    await n.stop();
  }
});

test('with its cluster port taken the node exits with the reason, under no other id', async () => {
  const blocker = net.createServer();
  await new Promise((r) => blocker.listen(0, '0.0.0.0', r));
  const port = blocker.address().port;
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-data-'));
  try {
    const proc = spawn(exoBin(), ['--api-port', '0', '--listen-port', String(port), '--data-dir', dataDir,
      '--namespace', `e2e-busy-${process.pid}`], { stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    proc.stdout.on('data', (d) => { log += d; });
    proc.stderr.on('data', (d) => { log += d; });
    const code = await new Promise((resolve) => {
      const t = setTimeout(() => proc.kill('SIGKILL'), 20000);
      proc.on('exit', (c) => { clearTimeout(t); resolve(c); });
    });
    assert.equal(code, 1, log);
    assert.match(log, new RegExp(`cannot listen on port ${port}`));
    assert.match(log, /not starting/);
    assert.doesNotMatch(log, /API and dashboard/);
  } finally {
    blocker.close();
    fs.rmSync(dataDir, { recursive: true, force: true });
  }
});
