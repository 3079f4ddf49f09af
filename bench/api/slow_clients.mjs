// Slow clients against a node: how fast /health and a chat answer while thousands of
// connections hold the node with headers they never finish (drip-fed "slowloris" clients that
// reconnect at once when the node closes them), against the same probes with no slow clients.
// Issue 26's bound: /health and a chat within 1 s while 2,000 slow-header connections are held
// open on loopback.
//
//   node bench/api/slow_clients.mjs [--connections 2000] [--seconds 30] [--per-address 50]
//
// The slow connections come from 127.0.0.2 and up (--per-address each, under the node's
// per-address limit), the probes from 127.0.0.1 on fresh connections. The chat asks the
// built-in demo model for 8 tokens. Prints one line per phase and PASS/FAIL for the 1 s bound.
import { startNode } from '../../tests/e2e/lib/node.mjs';
import { holdSlowConnections, timedRequest, percentile } from '../../tests/e2e/lib/slow-clients.mjs';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const connections = arg('connections', 2000);
const seconds = arg('seconds', 30);
const perAddress = arg('per-address', 50);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const chatBody = JSON.stringify({ model: 'exo/demo-dictionary', max_tokens: 8, temperature: 0,
  messages: [{ role: 'user', content: 'What does harbour mean?' }] });

async function probe(node, ms, chatEvery) {
  const health = [], chat = [], held = [];
  const end = Date.now() + ms;
  for (let i = 0; Date.now() < end; i++) {
    const h = await timedRequest(`${node.url}/health`);
    if (h.status !== 200) throw new Error(`/health: ${h.status}`);
    health.push(h.ms);
    if (i % chatEvery === 0) {
      const c = await timedRequest(`${node.url}/v1/chat/completions`, { method: 'POST', body: chatBody });
      if (c.status !== 200) throw new Error(`chat: ${c.status} ${c.body}`);
      chat.push(c.ms);
    }
    held.push(node.slow ? node.slow.stats().open : 0);
    await sleep(250);
  }
  return { health, chat, held };
}

function line(name, r) {
  const f = (v) => v.toFixed(1);
  return `${name}: held ${Math.min(...r.held)}-${Math.max(...r.held)} slow connections; ` +
    `/health n=${r.health.length} p50 ${f(percentile(r.health, 50))} ms p99 ${f(percentile(r.health, 99))} ms ` +
    `max ${f(Math.max(...r.health))} ms; chat n=${r.chat.length} p50 ${f(percentile(r.chat, 50))} ms ` +
    `max ${f(Math.max(...r.chat))} ms`;
}

const node = await startNode();
try {
  await timedRequest(`${node.url}/v1/chat/completions`, { method: 'POST', body: chatBody }); // place the runner
  const base = await probe(node, 5000, 4);
  console.log(line('baseline', base));
  node.slow = holdSlowConnections({ port: node.port, count: connections, perAddress });
  const t0 = Date.now();
  while (node.slow.stats().open < connections && Date.now() - t0 < 30000) await sleep(200);
  console.log(`${node.slow.stats().open} slow connections open after ${Date.now() - t0} ms`);
  const loaded = await probe(node, seconds * 1000, 4);
  const st = node.slow.stats();
  console.log(line(`with ${connections} slow clients`, loaded));
  console.log(`slow connections closed by the node (header deadline) ${st.closedByServer}, refused ${st.refused}, ` +
    `opened ${st.opened}`);
  const metrics = await (await fetch(`${node.url}/metrics`)).text();
  console.log(metrics.split('\n').filter((l) => /^exo_(open_connections|http_request_timeouts_total)/.test(l)).join('; '));
  // The node closes each cohort of slow connections at its header deadline and they reconnect
  // at once, so the count held dips for a moment every 10 s; most probes see all of them held.
  const worst = Math.max(...loaded.health, ...loaded.chat);
  const full = loaded.held.filter((h) => h >= connections * 0.95).length;
  console.log(`${worst < 1000 && full >= loaded.held.length * 0.8 ? 'PASS' : 'FAIL'}: slowest answer ` +
    `${worst.toFixed(1)} ms (bound 1000 ms); ${full} of ${loaded.held.length} probes ran with at least 95% ` +
    `of ${connections} slow connections held`);
  node.slow.stop();
} finally {
  await node.stop();
}
