// Per-token and time-to-first-token overhead of the API path (runner -> node -> SSE -> client)
// versus the engine alone, measured inside the same requests: the runner stamps each token with
// the CLOCK_MONOTONIC time the engine produced it (`engine_t_ns` in /bench stream chunks) and
// reports the engine's own TTFT (submit -> first token) in `: generation_stats`; this client
// reads the same clock (process.hrtime) when each SSE frame arrives.
//
//   node bench/api/overhead.mjs [--model DIR] [--rounds 20] [--tokens 64] [--rt]
// --rt (root): run the node (all its threads) and this client under SCHED_FIFO, with
// reset-on-fork so the runner and engine stay at normal priority. On a machine shared with other
// work this measures the API path itself rather than how long the OS scheduler makes it wait.
// Prints one line per round and a summary; exit 1 if a request fails.
import fs from 'node:fs';
import path from 'node:path';
import { startNode } from '../../tests/e2e/lib/node.mjs';
import { tinyModel } from '../../tests/e2e/lib/models.mjs';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const rounds = Number(arg('rounds', 20));
const tokens = Number(arg('tokens', 64));
const dir = arg('model', null) || await tinyModel('qwen3-tiny');
const model = path.basename(dir);
const node = await startNode({ args: ['--models-path', path.dirname(dir)] });
if (process.argv.includes('--rt')) {
  const { execFileSync } = await import('node:child_process');
  for (const pid of [node.proc.pid, process.pid])
    execFileSync('chrt', ['-a', '-f', '-R', '-p', '10', String(pid)]);
}
const now = () => Number(process.hrtime.bigint());
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const pct = (a, p) => [...a].sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * p))];

async function once() {
  const t0 = now();
  const r = await fetch(`${node.url}/bench/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, stream: true, max_tokens: tokens,
      messages: [{ role: 'user', content: 'Write a long story about a lighthouse keeper.' }] }) });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '', first = 0, stats = null;
  const lat = [], hop1 = [], hop2 = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const t = now();
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const frame = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (frame.startsWith(': generation_stats ')) stats = JSON.parse(frame.slice(19));
      if (!frame.startsWith('data: {')) continue;
      const c = JSON.parse(frame.slice(6));
      if (c.error) throw new Error(c.error.message);
      if (c.engine_t_ns) {
        if (!first) first = t;
        lat.push((t - c.engine_t_ns) / 1e6);
        hop1.push((c.node_t_ns - c.engine_t_ns) / 1e6);
        hop2.push((t - c.node_t_ns) / 1e6);
      }
    }
  }
  return { ttftClient: (first - t0) / 1e6, ttftEngine: stats.ttft_ms, lat, hop1, hop2, n: lat.length };
}

// CPU seconds (user + system, all threads, 100 Hz ticks) the node process has used so far.
const nodeCpu = () => {
  const f = fs.readFileSync(`/proc/${node.proc.pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
};

try {
  await once(); // load the runner and warm up
  const cpu0 = nodeCpu();
  let total = 0;
  const perToken = [], ttftOver = [], h1 = [], h2 = [];
  for (let i = 0; i < rounds; i++) {
    const r = await once();
    perToken.push(...r.lat);
    total += r.n;
    h1.push(...r.hop1);
    h2.push(...r.hop2);
    ttftOver.push(r.ttftClient - r.ttftEngine);
    console.log(`round ${i + 1}: ${r.n} tokens, token latency median ${median(r.lat).toFixed(3)} ms, ` +
      `TTFT client ${r.ttftClient.toFixed(2)} ms vs engine ${r.ttftEngine.toFixed(2)} ms`);
  }
  console.log(`\nper-token API overhead (engine emit -> client receives SSE frame): ` +
    `median ${median(perToken).toFixed(3)} ms, p90 ${pct(perToken, 0.9).toFixed(3)} ms, ` +
    `p99 ${pct(perToken, 0.99).toFixed(3)} ms over ${perToken.length} tokens`);
  console.log(`  runner (detokenize, stop strings, parser, socket) -> node encoded: median ` +
    `${median(h1).toFixed(3)} ms, p90 ${pct(h1, 0.9).toFixed(3)} ms`);
  console.log(`  node encoded -> client read (SSE write, TCP, client parse): median ` +
    `${median(h2).toFixed(3)} ms, p90 ${pct(h2, 0.9).toFixed(3)} ms`);
  const cpu = nodeCpu() - cpu0;
  console.log(`node process CPU (HTTP + JSON + SSE, runner excluded): ${(cpu * 1e6 / total).toFixed(1)} us ` +
    `per streamed token (${cpu.toFixed(2)} s for ${total} tokens incl. ${rounds} requests)`);
  console.log(`TTFT overhead (client TTFT - engine submit->first token): ` +
    `median ${median(ttftOver).toFixed(2)} ms, p90 ${pct(ttftOver, 0.9).toFixed(2)} ms`);
} finally {
  await node.stop();
}
