// Baseline for bench_tokenizer: @lenml/tokenizers (transformers.js) encoding the same text.
// node bench/tokenizer/bench_lenml.mjs TEXT_FILE NAME...   (NAME = qwen3, llama3_1, ...)
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const lenml = path.join(root, 'tests/e2e/node_modules/@lenml');
const { TokenizerLoader } = await import(pathToFileURL(path.join(lenml, 'tokenizers/dist/main.mjs')).href);
const text = fs.readFileSync(process.argv[2], 'utf8');
for (const name of process.argv.slice(3)) {
  const dir = path.join(lenml, `tokenizer-${name}/models`);
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')),
  });
  const times = [];
  // process CPU time (user+system), comparable with the C side's thread CPU time
  const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
  let n = 0;
  for (let r = 0; r < 7; r++) {
    const t0 = cpu();
    n = tok.encode(text, { add_special_tokens: false }).length;
    times.push(cpu() - t0);
  }
  times.sort((a, b) => a - b);
  console.log(`${name} ${times[3].toFixed(2)} ${n}`);
}
