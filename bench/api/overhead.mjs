// Per-token and time-to-first-token overhead of the API path (runner -> node -> SSE -> client)
// versus the engine alone, same model, same prompt, same number of tokens, A/B interleaved.
//
// 1. Per-token time (the definition): per round, the client's time per streamed token
//    through the API, (last frame - first frame) / (tokens generated between them), minus the
//    engine's own time per token for the same request run alone: /bench with "engine_only":
//    true makes the runner only step the engine and time the tokens (no detokenizing, no
//    messages, no node work, no client), so both sides run in the same process, same model, same
//    chat-templated prompt, same EOS ban and thread count, right after each other (the order
//    alternates). Overhead = median over rounds of (API - engine alone).
//    (A separate engine process is not a fair baseline on a shared machine: one started per
//    benchmark ran 2-3x slower per token than the long-lived runner under the same load.)
// 2. Per-token latency: the runner stamps each token with the CLOCK_MONOTONIC time the engine
//    produced it (`engine_t_ns` in /bench stream chunks), the node stamps when it encoded the
//    frame, and this client reads the same clock (process.hrtime) when the frame arrives.
//    This is how long each token takes to reach the client; it does not slow generation down
//    (the runner does not wait for the node), so it is reported next to, not as, the overhead.
// 3. TTFT overhead: client TTFT minus the engine's own submit -> first token in the same request
//    (`: generation_stats`).
//
//   node bench/api/overhead.mjs [--model DIR] [--rounds 20] [--tokens 64] [--rt]
// --rt (root): run the node (all its threads) and this client under SCHED_FIFO, with
// reset-on-fork so the runner and engine stay at normal priority. On a machine shared with other
// work this measures the API path itself rather than how long the OS scheduler makes it wait.
// Prints one line per round and a summary; exit 1 if a request fails.
import fs from 'node:fs';
import http from 'node:http';
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
const PROMPT = 'Write a long story about a lighthouse keeper.';

const node = await startNode({ args: ['--models-path', path.dirname(dir)] });
if (process.argv.includes('--rt')) {
  const { execFileSync } = await import('node:child_process');
  for (const pid of [node.proc.pid, process.pid])
    execFileSync('chrt', ['-a', '-f', '-R', '-p', '10', String(pid)]);
}
const now = () => Number(process.hrtime.bigint());
const agent = new http.Agent({ keepAlive: true });
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const pct = (a, p) => [...a].sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * p))];

// One streamed /bench request through node:http (a lean client: the time a frame arrives is
// when its bytes reach this process, not how long a WHATWG stream takes to hand them over).
function once() {
  return new Promise((resolve, reject) => {
    const t0 = now();
    const body = JSON.stringify({ model, stream: true, max_tokens: tokens, temperature: 0,
      messages: [{ role: 'user', content: PROMPT }] });
    const req = http.request(`${node.url}/bench/chat/completions`, { method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
    (res) => {
      if (res.statusCode !== 200) {
        let t = '';
        res.on('data', (d) => { t += d; });
        res.on('end', () => reject(new Error(`HTTP ${res.statusCode}: ${t}`)));
        return;
      }
      res.setEncoding('utf8');
      let buf = '', first = 0, last = 0, tokFirst = 0, tokLast = 0, stats = null;
      const lat = [], hop1 = [], hop2 = [];
      res.on('data', (chunk) => {
        const t = now();
        buf += chunk;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (frame.startsWith(': generation_stats ')) stats = JSON.parse(frame.slice(19));
          if (!frame.startsWith('data: {')) continue;
          const c = JSON.parse(frame.slice(6));
          if (c.error) return reject(new Error(c.error.message));
          if (c.engine_t_ns) {
            if (!first) { first = t; tokFirst = c.engine_tokens; }
            last = t;
            tokLast = c.engine_tokens;
            lat.push((t - c.engine_t_ns) / 1e6);
            hop1.push((c.node_t_ns - c.engine_t_ns) / 1e6);
            hop2.push((t - c.node_t_ns) / 1e6);
          }
        }
      });
      res.on('end', () => resolve({ ttftClient: (first - t0) / 1e6, ttftEngine: stats.ttft_ms, lat,
        hop1, hop2, n: stats.generation_tokens, runnerPerToken: 1000 / stats.generation_tps, perToken: (last - first) / 1e6 / (tokLast - tokFirst) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

// CPU seconds (user + system, all threads, 100 Hz ticks) the node process has used so far.
const nodeCpu = () => {
  const f = fs.readFileSync(`/proc/${node.proc.pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
};

async function engineAlone() {
  const r = await fetch(`${node.url}/bench/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, max_tokens: tokens, temperature: 0, engine_only: true,
      messages: [{ role: 'user', content: PROMPT }] }) });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const g = (await r.json()).generation_stats;
  return { tokens: g.generation_tokens, per_token_ms: 1000 / g.generation_tps };
}

// Context switches of all the node's threads so far (each one a thread that slept and woke).
const nodeSwitches = () => {
  let n = 0;
  for (const t of fs.readdirSync(`/proc/${node.proc.pid}/task`)) {
    try {
      const st = fs.readFileSync(`/proc/${node.proc.pid}/task/${t}/status`, 'utf8');
      for (const m of st.matchAll(/^(?:non)?voluntary_ctxt_switches:\s+(\d+)$/mg)) n += Number(m[1]);
    } catch { /* thread ended */ }
  }
  return n;
};

try {
  await once(); // load the runner and warm up
  await engineAlone();
  const cpu0 = nodeCpu();
  const sw0 = nodeSwitches();
  let total = 0;
  const perToken = [], ttftOver = [], h1 = [], h2 = [], api = [], alone = [], diff = [];
  for (let i = 0; i < rounds; i++) {
    let r, e;
    if (i % 2) { e = await engineAlone(); r = await once(); } else { r = await once(); e = await engineAlone(); }
    if (e.tokens !== r.n) throw new Error(`engine alone made ${e.tokens} tokens, the API ${r.n}`);
    perToken.push(...r.lat);
    total += r.lat.length;
    h1.push(...r.hop1);
    h2.push(...r.hop2);
    api.push(r.perToken);
    alone.push(e.per_token_ms);
    diff.push(r.perToken - e.per_token_ms);
    ttftOver.push(r.ttftClient - r.ttftEngine);
    console.log(`round ${i + 1}: ${r.n} tokens, per token: API ${r.perToken.toFixed(3)} ms (runner's own ` +
      `${r.runnerPerToken.toFixed(3)}), engine alone ` +
      `${e.per_token_ms.toFixed(3)} ms; token latency median ${median(r.lat).toFixed(3)} ms; ` +
      `TTFT client ${r.ttftClient.toFixed(2)} ms vs engine ${r.ttftEngine.toFixed(2)} ms`);
  }
  console.log(`\nper-token time: through the API median ${median(api).toFixed(3)} ms, engine alone median ` +
    `${median(alone).toFixed(3)} ms (${rounds} rounds of ${tokens} tokens, A/B interleaved)`);
  console.log(`per-token API overhead (API - engine alone, per round): median ${median(diff).toFixed(3)} ms, ` +
    `p90 ${pct(diff, 0.9).toFixed(3)} ms`);
  console.log(`per-token latency (engine emit -> client receives SSE frame): ` +
    `median ${median(perToken).toFixed(3)} ms, p90 ${pct(perToken, 0.9).toFixed(3)} ms, ` +
    `p99 ${pct(perToken, 0.99).toFixed(3)} ms over ${perToken.length} tokens`);
  console.log(`  runner (detokenize, stop strings, parser, socket) -> node encoded: median ` +
    `${median(h1).toFixed(3)} ms, p90 ${pct(h1, 0.9).toFixed(3)} ms`);
  console.log(`  node encoded -> client read (SSE write, TCP, client parse): median ` +
    `${median(h2).toFixed(3)} ms, p90 ${pct(h2, 0.9).toFixed(3)} ms`);
  const cpu = nodeCpu() - cpu0;
  const sw = nodeSwitches() - sw0;
  console.log(`node context switches: ${(sw / total).toFixed(2)} per streamed token (${sw} for ${total} ` +
    `tokens incl. ${rounds} requests; threads that ended during the run are not counted)`);
  console.log(`node process CPU (HTTP + JSON + SSE, runner excluded): ${(cpu * 1e6 / total).toFixed(1)} us ` +
    `per streamed token (${cpu.toFixed(2)} s for ${total} tokens incl. ${rounds} requests)`);
  console.log(`TTFT overhead (client TTFT - engine submit->first token): ` +
    `median ${median(ttftOver).toFixed(2)} ms, p90 ${pct(ttftOver, 0.9).toFixed(2)} ms`);
} finally {
  await node.stop();
}
