// The HTTP server itself, as any client meets it: CORS and preflight, the error format for
// malformed JSON / wrong field types / unknown model / unknown route, the body limit (413),
// the optional API key (401), static page at "/", /health, /metrics, clean shutdown.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startNode } from './lib/node.mjs';

let node;
let keyed;
before(async () => {
  node = await startNode({ args: ['--max-body-size', '4K'] });
  keyed = await startNode({ args: ['--api-key', 'sekrit'] });
});
after(async () => {
  await node?.stop();
  await keyed?.stop();
});

const post = (base, p, body, headers = {}) => fetch(base + p, {
  method: 'POST', headers: { 'content-type': 'application/json', ...headers },
  body: typeof body === 'string' ? body : JSON.stringify(body),
});

test('GET /node_id returns the node id as a JSON string, with open CORS', async () => {
  const r = await fetch(`${node.url}/node_id`);
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('access-control-allow-origin'), '*');
  const id = await r.json();
  assert.equal(typeof id, 'string');
  assert.ok(id.length >= 8);
});

test('OPTIONS preflight answers 204 with the requested headers allowed', async () => {
  const r = await fetch(`${node.url}/v1/chat/completions`, {
    method: 'OPTIONS',
    headers: { origin: 'http://example.com', 'access-control-request-method': 'POST',
      'access-control-request-headers': 'content-type,authorization' },
  });
  assert.equal(r.status, 204);
  assert.equal(r.headers.get('access-control-allow-origin'), '*');
  assert.match(r.headers.get('access-control-allow-headers'), /authorization/);
});

test('malformed JSON is a 400 naming the position', async () => {
  const r = await post(node.url, '/v1/chat/completions', '{"model": "m", "messages": [');
  assert.equal(r.status, 400);
  const j = await r.json();
  assert.equal(j.error.code, 400);
  assert.match(j.error.message, /line 1 column \d+/);
});

test('a field of the wrong type is a 400 naming the field', async () => {
  const r = await post(node.url, '/v1/chat/completions',
    { model: 'm', messages: [{ role: 'user', content: 'hi' }], temperature: 'hot' });
  assert.equal(r.status, 400);
  assert.match((await r.json()).error.message, /temperature/);
  const r2 = await post(node.url, '/v1/chat/completions', { model: 'm' });
  assert.equal(r2.status, 400);
  assert.match((await r2.json()).error.message, /messages/);
  const r3 = await post(node.url, '/v1/chat/completions',
    { model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 0 });
  assert.equal(r3.status, 400);
  assert.match((await r3.json()).error.message, /max_tokens/);
});

test('an unknown model is a 404 in the OpenAI error format', async () => {
  const r = await post(node.url, '/v1/chat/completions',
    { model: 'nobody/no-such-model', messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.status, 404);
  const j = await r.json();
  assert.equal(j.error.type, 'Not Found');
  assert.match(j.error.message, /no-such-model/);
});

test('a body over --max-body-size is a 413', async () => {
  const r = await post(node.url, '/v1/chat/completions', 'x'.repeat(8192));
  assert.equal(r.status, 413);
  assert.equal((await r.json()).error.code, 413);
  // the server still answers afterwards
  assert.equal((await fetch(`${node.url}/health`)).status, 200);
});

test('unknown routes are 404, known paths with the wrong method 405', async () => {
  assert.equal((await fetch(`${node.url}/no/such/route`)).status, 404);
  assert.equal((await fetch(`${node.url}/v1/chat/completions`)).status, 405);
});

test('"/" serves a page; /health and /metrics answer', async () => {
  const r = await fetch(`${node.url}/`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/html/);
  assert.match(await r.text(), /exo/);
  const h = await (await fetch(`${node.url}/health`)).json();
  assert.equal(h.status, 'ok');
  const m = await (await fetch(`${node.url}/metrics`)).text();
  assert.match(m, /# TYPE exo_requests_total counter/);
  assert.match(m, /exo_requests_total\{api="openai",status="404"\} [1-9]/);
  assert.match(m, /exo_time_to_first_token_seconds_bucket/);
  assert.match(m, /exo_queue_depth 0/);
});

test('with --api-key, routes need the key (Bearer or x-api-key); /node_id does not', async () => {
  assert.equal((await fetch(`${keyed.url}/node_id`)).status, 200);
  const r = await fetch(`${keyed.url}/v1/models`);
  assert.equal(r.status, 401);
  assert.equal((await r.json()).error.code, 401);
  assert.equal((await fetch(`${keyed.url}/v1/models`,
    { headers: { authorization: 'Bearer wrong' } })).status, 401);
  assert.equal((await fetch(`${keyed.url}/v1/models`,
    { headers: { authorization: 'Bearer sekrit' } })).status, 200);
  assert.equal((await fetch(`${keyed.url}/v1/models`,
    { headers: { 'x-api-key': 'sekrit' } })).status, 200);
  // each API's own error shape
  const c = await fetch(`${keyed.url}/v1/messages`, { method: 'POST', body: '{}' });
  assert.equal(c.status, 401);
  assert.equal((await c.json()).error.type, 'authentication_error');
  const o = await fetch(`${keyed.url}/ollama/api/tags`);
  assert.equal(o.status, 401);
  assert.equal(typeof (await o.json()).error, 'string');
});

test('GET /state lists instances and runners; unknown instances are 404', async () => {
  const s = await (await fetch(`${node.url}/state`)).json();
  // The cluster State in exo's shape (instances and runners plus topology, node info, ...).
  for (const k of ['instances', 'runners', 'tasks', 'downloads', 'topology', 'nodeIdentities',
    'nodeMemory', 'lastEventAppliedIdx']) assert.ok(k in s, `/state has ${k}`);
  assert.equal((await fetch(`${node.url}/state/no/such/path`)).status, 404);
  assert.equal((await fetch(`${node.url}/instance/nope`)).status, 404);
  assert.equal((await fetch(`${node.url}/instance/nope`, { method: 'DELETE' })).status, 404);
  assert.equal((await post(node.url, '/v1/cancel/nope', {})).status, 404);
});

test('SIGTERM stops the node cleanly (exit 0)', async () => {
  const n = await startNode();
  assert.equal(await n.stop(), 0);
});
