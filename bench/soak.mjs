// Soak: random arrivals and random cancellations against one node serving a small model through
// the HTTP API, for a fixed duration; then every generation must have ended cleanly, the runner's
// KV cache must hold no blocks for anyone (exo_kv_blocks_used 0, nothing running or waiting, from
// /metrics), and the resident memory of the node and its runner must be flat (sampled all along:
// the peak of the second half may not exceed the peak of the first half by more than 5% + 4 MiB).
//
//   node bench/soak.mjs [--duration 600] [--concurrency 12] [--kv-cache-mem 384K] [--seed 1]
//                       [--model qwen3-tiny] [--sample-every 2]
//
// Requests: chat completions, streamed (most) or not, prompts sharing one of four long system
// prompts (so the prefix cache is hit, shared and evicted), random lengths, max_tokens and
// temperature. A quarter are cut off by the client at a random moment (disconnect), a tenth are
// stopped through POST /v1/cancel/{id} after their first chunk. The small default KV budget makes
// the scheduler preempt and evict. tests/e2e/soak.test.mjs runs a short version in CI; the
// 10-minute run is recorded in bench/RESULTS.md.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startNode } from '../tests/e2e/lib/node.mjs';
import { tinyModel } from '../tests/e2e/lib/models.mjs';

const WORDS = ('the of and a to in is you that it he was for on are as with his they at be this ' +
  'have from or one had by word but not what all were we when your can said there use an each ' +
  'which she do how their if will up other about out many then them these so some her would make ' +
  'like him into time has look two more write go see number no way could people my than first ' +
  'water been call who oil its now find long down day did get come made may part').split(' ');

function rng(seed) {
  let s = BigInt(seed) * 6364136223846793005n + 1442695040888963407n;
  return () => {
    s = (s * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn;
    return Number(s >> 11n) / 2 ** 53;
  };
}

function rssKiB(pid) {
  try {
    const m = /VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
  } catch { return 0; }
}

function childrenOf(pid) {
  const out = [];
  try {
    for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
      const c = fs.readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').trim();
      if (c) out.push(...c.split(/\s+/).map(Number));
    }
  } catch { /* gone */ }
  return out;
}

// Sums every series of a metric in Prometheus text (null if absent).
function metric(text, name) {
  let sum = null;
  for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'gm')))
    sum = (sum ?? 0) + Number(m[1]);
  return sum;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function soak({ duration = 600, concurrency = 12, kvCacheMem = '384K', seed = 1,
  model = 'qwen3-tiny', sampleEvery = 2, log = console.log } = {}) {
  const dir = await tinyModel(model);
  const node = await startNode({ args: ['--models-path', path.dirname(dir), '--kv-cache-mem', kvCacheMem] });
  const rand = rng(seed);
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const words = (n) => Array.from({ length: n }, () => pick(WORDS)).join(' ');
  const systems = [40, 120, 200, 300].map((n) => words(n));
  const c = { started: 0, completed: 0, disconnected: 0, cancelled: 0, errors: 0, tokens: 0 };
  const errors = [];
  const samples = [];
  let inFlight = 0, runnerPid = null, runnerPids = new Set();

  async function one(i) {
    const stream = rand() < 0.8;
    const body = {
      model, stream, max_tokens: 1 + Math.floor(rand() * 48),
      temperature: rand() < 0.5 ? 0 : 0.7, seed: i,
      messages: [{ role: 'system', content: pick(systems) },
        { role: 'user', content: `${i} ${words(1 + Math.floor(rand() * 80))}` }],
    };
    const r = rand();
    const mode = r < 0.25 ? 'disconnect' : r < 0.35 && stream ? 'cancel' : 'finish';
    const ac = new AbortController();
    let timer = null;
    if (mode === 'disconnect') timer = setTimeout(() => ac.abort(), Math.floor(rand() * 1500));
    try {
      const res = await fetch(`${node.url}/v1/chat/completions`, {
        method: 'POST', body: JSON.stringify(body), signal: ac.signal,
        headers: { 'content-type': 'application/json' } });
      if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
      if (!stream) {
        const j = await res.json();
        c.tokens += j.usage?.completion_tokens ?? 0;
        if (!j.choices?.[0]?.finish_reason) throw new Error(`no finish_reason: ${JSON.stringify(j).slice(0, 200)}`);
        c.completed++;
        return;
      }
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = '', done = false, id = null, asked = false;
      for (;;) {
        const { value, done: end } = await reader.read();
        if (end) break;
        buf += dec.decode(value, { stream: true });
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          if (!ev.startsWith('data: ')) continue;
          const data = ev.slice(6);
          if (data === '[DONE]') { done = true; continue; }
          const j = JSON.parse(data);
          if (j.error) throw new Error(`stream error: ${JSON.stringify(j.error).slice(0, 200)}`);
          id = id || j.id;
          if (j.choices?.[0]?.delta?.content) c.tokens++;
          if (mode === 'cancel' && id && !asked) {
            asked = true;
            const cr = await fetch(`${node.url}/v1/cancel/${id}`, { method: 'POST' });
            // 404: it ended on its own before the cancel arrived
            if (cr.status !== 200 && cr.status !== 404) throw new Error(`cancel: HTTP ${cr.status}`);
          }
        }
      }
      if (!done) throw new Error('stream ended without [DONE]');
      if (mode === 'cancel') c.cancelled++;
      else c.completed++;
    } catch (e) {
      if (ac.signal.aborted) { c.disconnected++; return; }
      c.errors++;
      if (errors.length < 5) errors.push(String(e.message || e));
    } finally {
      clearTimeout(timer);
    }
  }

  async function sample(t) {
    const m = await (await fetch(`${node.url}/metrics`)).text();
    const kids = childrenOf(node.proc.pid);
    for (const k of kids) runnerPids.add(k);
    if (kids.length && runnerPid === null) runnerPid = kids[0];
    samples.push({
      t, nodeKiB: rssKiB(node.proc.pid), runnerKiB: kids.reduce((a, p) => a + rssKiB(p), 0),
      used: metric(m, 'exo_kv_blocks_used'), total: metric(m, 'exo_kv_blocks_total'),
      cached: metric(m, 'exo_kv_blocks_cached'), running: metric(m, 'exo_scheduler_running'),
      waiting: metric(m, 'exo_scheduler_waiting'), queue: metric(m, 'exo_queue_depth'),
      preemptions: metric(m, 'exo_scheduler_preemptions_total'),
    });
  }

  // The KV gauge between the 1-2 s samples: a tiny model's runner is busy only in short bursts
  // (most samples find it idle), so the peak comes from polling /metrics every 25 ms.
  let usedPeak = 0, polling = true;
  const poller = (async () => {
    while (polling) {
      try {
        usedPeak = Math.max(usedPeak, metric(await (await fetch(`${node.url}/metrics`)).text(), 'exo_kv_blocks_used') ?? 0);
      } catch { /* the node is checked by the requests */ }
      await sleep(25);
    }
  })();
  const tasks = new Set();
  const t0 = Date.now();
  let nextSample = 0, failures = [];
  try {
    // the first request places the instance and loads the runner
    await one(0);
    c.started = 1;
    while (Date.now() - t0 < duration * 1000) {
      const t = (Date.now() - t0) / 1000;
      if (t >= nextSample) {
        await sample(t);
        nextSample += sampleEvery;
      }
      await sleep(-Math.log(1 - rand()) * 40); // Poisson arrivals, 25/s offered
      if (inFlight >= concurrency) continue;
      inFlight++;
      const p = one(++c.started).finally(() => { inFlight--; tasks.delete(p); });
      tasks.add(p);
    }
    await Promise.all(tasks);
    polling = false;
    await poller;
    // idle: the runner's last kv_stats says what it holds
    let last;
    for (let k = 0; k < 50; k++) {
      await sample((Date.now() - t0) / 1000);
      last = samples.at(-1);
      if (last.used === 0 && last.running === 0 && last.waiting === 0 && last.queue === 0) break;
      await sleep(200);
    }
    const half = samples.filter((s) => s.t <= duration / 2), rest = samples.filter((s) => s.t > duration / 2);
    const peak = (a, f) => Math.max(...a.map(f));
    const rss = {};
    for (const [name, f] of [['node', (s) => s.nodeKiB], ['runner', (s) => s.runnerKiB]]) {
      rss[name] = { firstHalfPeakMiB: peak(half, f) / 1024, secondHalfPeakMiB: peak(rest, f) / 1024,
        endMiB: f(last) / 1024 };
      if (peak(rest, f) > peak(half, f) * 1.05 + 4096)
        failures.push(`${name} RSS grew: ${(peak(half, f) / 1024).toFixed(1)} MiB peak in the first half, ` +
          `${(peak(rest, f) / 1024).toFixed(1)} MiB in the second`);
    }
    if (last.total === null) failures.push('/metrics has no exo_kv_blocks_total');
    if (last.used !== 0) failures.push(`${last.used} KV blocks still used at the end (leak)`);
    if (last.running !== 0 || last.waiting !== 0) failures.push(`scheduler not idle: ${last.running} running, ${last.waiting} waiting`);
    if (last.queue !== 0) failures.push(`exo_queue_depth ${last.queue} at the end`);
    if (c.errors) failures.push(`${c.errors} requests failed: ${errors.join(' | ')}`);
    if (runnerPids.size !== 1) failures.push(`runner processes seen: ${runnerPids.size} (a runner died and was replaced?)`);
    const summary = {
      duration_s: (Date.now() - t0) / 1000, ...c, kvBlocksTotal: last.total, kvBlocksUsedEnd: last.used,
      kvBlocksCachedEnd: last.cached, kvBlocksUsedPeak: Math.max(usedPeak, peak(samples, (s) => s.used ?? 0)),
      preemptions: last.preemptions, samples: samples.length, rss,
      // RSS (MiB, node / runner) and KV blocks used, about ten points over the run
      timeline: samples.filter((s, i) => i % Math.max(1, Math.floor(samples.length / 10)) === 0 ||
        i === samples.length - 1).map((s) => `${s.t.toFixed(0)}s ${(s.nodeKiB / 1024).toFixed(1)}/` +
        `${(s.runnerKiB / 1024).toFixed(1)} MiB kv ${s.used}`),
      failures,
    };
    log(JSON.stringify(summary));
    return summary;
  } finally {
    polling = false;
    await Promise.allSettled([...tasks, poller]);
    await node.stop();
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) {
  const arg = (name, def) => {
    const i = process.argv.indexOf(`--${name}`);
    return i > 0 ? process.argv[i + 1] : def;
  };
  const s = await soak({
    duration: Number(arg('duration', 600)), concurrency: Number(arg('concurrency', 12)),
    kvCacheMem: arg('kv-cache-mem', '384K'), seed: Number(arg('seed', 1)),
    model: arg('model', 'qwen3-tiny'), sampleEvery: Number(arg('sample-every', 2)),
  });
  console.log(s.failures.length ? `FAIL: ${s.failures.join('; ')}` : 'PASS');
  process.exitCode = s.failures.length ? 1 : 0;
}
