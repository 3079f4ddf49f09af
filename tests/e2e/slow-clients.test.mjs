// Slow and greedy HTTP clients (issue 26): a request must arrive whole within its deadlines
// however its bytes are dripped, one address cannot take more than its share of connections,
// and thousands of held connections do not stop the node from answering /health and chats.
// Streams are not bound by the request deadlines. The bounds asserted here are generous (a
// loaded 2-core machine); bench/api/slow_clients.mjs measures the real latencies.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startNode } from './lib/node.mjs';
import { holdSlowConnections, timedRequest } from './lib/slow-clients.mjs';

const MODEL = 'exo/demo-dictionary'; // built in: no files to make
let quick; // request deadlines shortened to 1 s (headers) and 2 s (body)
let limited; // default deadlines, at most 8 connections per address
before(async () => {
  quick = await startNode({ env: { EXO_HTTP_HEADER_TIMEOUT_S: '1', EXO_HTTP_BODY_TIMEOUT_S: '2' } });
  limited = await startNode({ args: ['--max-connections-per-ip', '8'] });
});
after(async () => {
  await quick?.stop();
  await limited?.stop();
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Opens a raw connection and resolves when the node closes it: { ms, data }.
function untilClosed(port, { localAddress, first = '', drip = '', dripMs = 200 } = {}) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    let data = '';
    let timer;
    const s = net.connect({ port, host: '127.0.0.1', localAddress }, () => {
      if (first) s.write(first);
      if (drip) timer = setInterval(() => { if (s.writable) s.write(drip); }, dripMs);
    });
    s.on('data', (d) => { data += d; });
    s.on('error', () => {});
    s.on('close', () => { clearInterval(timer); resolve({ ms: Date.now() - t0, data }); });
    setTimeout(() => { s.destroy(); reject(new Error('the node kept the connection open for 30 s')); }, 30000).unref();
  });
}

test('partial headers: closed at the header deadline with 408', async () => {
  const r = await untilClosed(quick.port, { first: 'GET /health HTTP/1.1\r\nHost: x\r\n' });
  assert.match(r.data, /^HTTP\/1\.1 408 /);
  assert.ok(r.ms >= 900, `closed after ${r.ms} ms, before the deadline`);
  assert.ok(r.ms < 10000, `closed after ${r.ms} ms`);
});

test('drip-fed headers: a byte every 200 ms does not extend the deadline', async () => {
  const r = await untilClosed(quick.port, { first: 'GET /health HTTP/1.1\r\n', drip: 'X: y\r\n' });
  assert.match(r.data, /^HTTP\/1\.1 408 /);
  assert.ok(r.ms < 10000, `closed after ${r.ms} ms`);
});

test('a connection that sends nothing is closed at the header deadline, silently', async () => {
  const r = await untilClosed(quick.port);
  assert.equal(r.data, '');
  assert.ok(r.ms < 10000, `closed after ${r.ms} ms`);
});

test('a body dripped slower than its deadline is cut off', async () => {
  const r = await untilClosed(quick.port, {
    first: 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
      'Content-Length: 1000\r\n\r\n{',
    drip: ' ', dripMs: 100 });
  assert.equal(r.data, '', 'no answer to a request that never arrived');
  assert.ok(r.ms >= 1900 && r.ms < 12000, `closed after ${r.ms} ms`);
  const m = await (await fetch(`${quick.url}/metrics`)).text();
  assert.match(m, /^exo_http_request_timeouts_total [1-9]/m);
});

test('a stream that outlasts the request deadlines streams to the end', async () => {
  const body = JSON.stringify({ model: MODEL, stream: true, stream_options: { include_usage: true },
    max_tokens: 1000, temperature: 0,
    messages: [{ role: 'user', content: 'Tell me a long story.' }] });
  const r = await timedRequest(`${quick.url}/bench/chat/completions`, { method: 'POST', body });
  assert.equal(r.status, 200);
  const events = r.body.split('\n').filter((l) => l.startsWith('data: '));
  assert.equal(events.at(-1), 'data: [DONE]');
  const usage = events.map((l) => l.slice(6)).filter((l) => l !== '[DONE]').map((l) => JSON.parse(l))
    .find((e) => e.usage)?.usage;
  assert.equal(usage?.completion_tokens, 1000);
  console.log(`stream of 1000 tokens took ${r.ms.toFixed(0)} ms (header deadline 1 s, body 2 s)`);
});

test('one address gets at most --max-connections-per-ip connections; others are still served', async () => {
  const sockets = [];
  const closedEarly = [];
  for (let i = 0; i < 12; i++) {
    const s = net.connect({ port: limited.port, host: '127.0.0.1', localAddress: '127.0.0.3' });
    s.on('error', () => {});
    s.on('close', () => closedEarly.push(i));
    sockets.push(s);
  }
  await sleep(1500); // well inside the 10 s header deadline: only refusals close
  assert.equal(closedEarly.length, 4, `closed: ${closedEarly}`);
  const h = await timedRequest(`${limited.url}/health`);
  assert.equal(h.status, 200);
  for (const s of sockets) s.destroy();
});

test('2,000 slow-header connections held open: /health and chats still answer', async () => {
  const slow = holdSlowConnections({ port: limited.port, count: 2000, perAddress: 8 });
  try {
    const t0 = Date.now();
    while (slow.stats().open < 2000 && Date.now() - t0 < 30000) await sleep(100);
    assert.ok(slow.stats().open >= 1900, `only ${slow.stats().open} slow connections open`);
    const chatBody = JSON.stringify({ model: MODEL, max_tokens: 8, temperature: 0,
      messages: [{ role: 'user', content: 'What does harbour mean?' }] });
    const times = { health: [], chat: [] };
    for (let i = 0; i < 6; i++) {
      const h = await timedRequest(`${limited.url}/health`, { timeoutMs: 30000 });
      assert.equal(h.status, 200);
      times.health.push(Math.round(h.ms));
      const c = await timedRequest(`${limited.url}/v1/chat/completions`, { method: 'POST', body: chatBody, timeoutMs: 60000 });
      assert.equal(c.status, 200, c.body);
      times.chat.push(Math.round(c.ms));
      assert.ok(slow.stats().open >= 1900, `only ${slow.stats().open} slow connections held`);
    }
    console.log(`with ${slow.stats().open} slow connections: /health ms ${times.health}, chat ms ${times.chat}`);
    // Generous: the first chat places the demo model (a runner start).
    assert.ok(Math.max(...times.health) < 5000, `/health took ${times.health} ms`);
    assert.ok(Math.max(...times.chat.slice(1)) < 10000, `chats took ${times.chat} ms`);
  } finally {
    slow.stop();
  }
});
