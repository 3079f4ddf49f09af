// Prefix cache through the HTTP API: time to first token of a chat request whose prompt is a
// ~2,000-token shared prefix, first cold, then (1) the identical request again and (2) the same
// prefix with a different last user turn (a multi-turn chat: only the new turn is computed).
// TTFT is measured by the client (request sent -> first streamed content chunk); cached_tokens
// is usage.prompt_tokens_details.cached_tokens of each answer. Repeated --reps times with a
// different prefix each round; prints each round and the medians.
//
//   node bench/prefix_cache.mjs [--model-dir /work/main/.cache/bench/llama-3.2-1b-4bit]
//                               [--prefix-words 1980] [--reps 3]
// The target (issue 6): the second identical request's TTFT at least 5x lower than the first.
import path from 'node:path';
import { startNode } from '../tests/e2e/lib/node.mjs';
import { repoRoot } from '../tests/e2e/lib/exo.mjs';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const dir = path.resolve(arg('model-dir', path.join(repoRoot, '.cache/bench/llama-3.2-1b-4bit')));
const model = path.basename(dir);
const prefixWords = Number(arg('prefix-words', 1980));
const reps = Number(arg('reps', 3));

const WORDS = ('time year people way day man thing woman life child world school state family ' +
  'student group country problem hand part place case week company system program question work ' +
  'government number night point home water room mother area money story fact month lot right ' +
  'study book eye job word business issue side kind head house service friend father power hour ' +
  'game line end member law car city community name president team minute idea kid body').split(' ');

async function chat(url, messages) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages, stream: true, max_tokens: 4, temperature: 0,
      stream_options: { include_usage: true } }) });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '', ttft = null, usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (ttft === null && j.choices?.[0]?.delta && 'content' in j.choices[0].delta &&
          j.choices[0].delta.content !== '') ttft = performance.now() - t0;
      if (j.usage) usage = j.usage;
    }
  }
  if (ttft === null) ttft = performance.now() - t0;
  return { ttft, prompt: usage?.prompt_tokens, cached: usage?.prompt_tokens_details?.cached_tokens };
}

const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const node = await startNode({ args: ['--models-path', path.dirname(dir)] });
try {
  // place the instance and warm the weights up (a different prompt: nothing shared)
  await chat(node.url, [{ role: 'user', content: 'hello there' }]);
  const rows = [];
  for (let rep = 0; rep < reps; rep++) {
    let s = rep * 7919 + 1;
    const words = Array.from({ length: prefixWords }, () => {
      s = (s * 1103515245 + 12345) % 2147483648;
      return WORDS[s % WORDS.length];
    }).join(' ');
    const system = { role: 'system', content: `Round ${rep}. ${words}` };
    const q = (text) => [system, { role: 'user', content: text }];
    const cold = await chat(node.url, q('Summarise the text above.'));
    const same = await chat(node.url, q('Summarise the text above.'));
    const turn = await chat(node.url, q('Which word comes up most often?'));
    const row = { rep, prompt_tokens: cold.prompt, cold_ms: cold.ttft, cold_cached: cold.cached,
      same_ms: same.ttft, same_cached: same.cached, other_turn_ms: turn.ttft,
      other_turn_cached: turn.cached, speedup_same: cold.ttft / same.ttft,
      speedup_other_turn: cold.ttft / turn.ttft };
    rows.push(row);
    console.log(`round ${rep}: ${cold.prompt} prompt tokens | cold TTFT ${cold.ttft.toFixed(0)} ms ` +
      `(cached ${cold.cached}) | identical ${same.ttft.toFixed(0)} ms (cached ${same.cached}) = ` +
      `${row.speedup_same.toFixed(1)}x | new last turn ${turn.ttft.toFixed(0)} ms (cached ` +
      `${turn.cached}) = ${row.speedup_other_turn.toFixed(1)}x`);
  }
  const ms = (k) => median(rows.map((r) => r[k]));
  console.log(`median of ${reps}: cold ${ms('cold_ms').toFixed(0)} ms, identical ${ms('same_ms').toFixed(0)} ms ` +
    `(${ms('speedup_same').toFixed(1)}x, target >= 5x), new last turn ${ms('other_turn_ms').toFixed(0)} ms ` +
    `(${ms('speedup_other_turn').toFixed(1)}x)`);
  const ok = rows.every((r) => r.cold_cached === 0 && r.same_cached > 0) && ms('speedup_same') >= 5;
  process.exitCode = ok ? 0 : 1;
} finally {
  await node.stop();
}
