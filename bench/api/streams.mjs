// Many concurrent open streams: N (256) clients start a streamed chat at once; every one must
// end with [DONE] and no error, and the node must have held them all open together (peak of
// exo_open_connections from /metrics, sampled while they run).
//   node bench/api/streams.mjs [--streams 256] [--tokens 8]
import path from 'node:path';
import { startNode } from '../../tests/e2e/lib/node.mjs';
import { tinyModel } from '../../tests/e2e/lib/models.mjs';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const n = Number(arg('streams', 256));
const tokens = Number(arg('tokens', 8));
const dir = await tinyModel('qwen3-tiny');
const node = await startNode({ args: ['--models-path', path.dirname(dir)] });
let peak = 0, sampling = true;
const sampler = (async () => {
  while (sampling) {
    const m = await (await fetch(`${node.url}/metrics`)).text();
    peak = Math.max(peak, Number(/^exo_open_connections (\d+)/m.exec(m)[1]) - 1);
    await new Promise((r) => setTimeout(r, 100));
  }
})();
try {
  await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({
    model: 'qwen3-tiny', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }) });
  const t0 = Date.now();
  const results = await Promise.all(Array.from({ length: n }, async (_, i) => {
    const r = await fetch(`${node.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({
      model: 'qwen3-tiny', stream: true, max_tokens: tokens,
      messages: [{ role: 'user', content: `story number ${i}` }] }) });
    const text = await r.text();
    return r.status === 200 && text.includes('data: [DONE]') && !text.includes('"error"');
  }));
  sampling = false;
  await sampler;
  const ok = results.filter(Boolean).length;
  console.log(`${ok}/${n} streams complete in ${((Date.now() - t0) / 1000).toFixed(1)} s; ` +
    `peak open streams seen by the node: ${peak}`);
  process.exitCode = ok === n ? 0 : 1;
} finally {
  sampling = false;
  await node.stop();
}
