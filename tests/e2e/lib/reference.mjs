// The engine's own greedy output for a prompt, computed without the API: the prompt is rendered
// and tokenized by an independent implementation (@lenml/tokenizers, a port of transformers.js),
// the token ids go to `exo run --tokens ... --temperature 0`, and the generated ids are decoded
// by the same JS tokenizer. The API path (our chat template, tokenizer, runner, adapters) must
// give the same text.
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { deviceArgs, exoBin, repoRoot } from './exo.mjs';

const run = promisify(execFile);
const lenml = path.join(repoRoot, 'tests/e2e/node_modules/@lenml');

export async function jsTokenizer(modelDir) {
  const { TokenizerLoader } = await import(
    pathToFileURL(path.join(lenml, 'tokenizers/dist/main.mjs')).href);
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8')),
    tokenizerConfig: JSON.parse(
      fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8')),
  });
}

// ids -> generated ids, greedy, through `exo run` (the engine alone).
export async function engineGreedy(modelDir, ids, maxTokens) {
  const { stdout } = await run(exoBin(), ['run', modelDir, '--tokens', ids.join(','),
    '--temperature', '0', '--max-tokens', String(maxTokens), '--threads', '1', ...deviceArgs()],
  { maxBuffer: 1 << 24 });
  return stdout.trim().split(/\s+/).filter(Boolean).map(Number);
}

// The ChatML prompt Qwen models' chat templates produce for plain text messages (written out
// here, independently of any template engine).
export function chatml(messages) {
  return messages.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join('') +
    '<|im_start|>assistant\n';
}

// {messages} (ChatML, Qwen) or {prompt} (raw) -> {text, ids, promptIds}.
export async function reference(modelDir, { messages, prompt }, maxTokens) {
  const tok = await jsTokenizer(modelDir);
  const promptIds = Array.from(tok.encode(messages ? chatml(messages) : prompt,
    { add_special_tokens: !messages }));
  const ids = await engineGreedy(modelDir, promptIds, maxTokens);
  const text = tok.decode(ids, { skip_special_tokens: true });
  return { text, ids, promptIds };
}
