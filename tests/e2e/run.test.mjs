// `exo run` as a user runs it: chat template + tokenizer + engine + streaming detokenizer give
// the same text transformers produced (tests/fixtures/reference), raw prompts too, and the
// interactive mode keeps the conversation (the second turn reuses the first from the cache; for
// the Qwen3.5 hybrid, its linear layers' state too).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { deviceArgs, exoBin, repoRoot } from './lib/exo.mjs';
import { tinyModel } from './lib/models.mjs';

function fixture(name) {
  return JSON.parse(fs.readFileSync(path.join(repoRoot, 'tests/fixtures/reference', `${name}.json`), 'utf8'));
}

function exoRun(args, input) {
  const r = spawnSync(exoBin(), ['run', ...args, ...deviceArgs()], { encoding: 'utf8', input, timeout: 120000 });
  assert.equal(r.status, 0, r.stderr);
  return r;
}

for (const [model, promptName, extra] of [['qwen3-tiny', 'chat-single', []],
  ['llama3-tiny', 'raw-capital', ['--raw']], ['qwen3.5-tiny', 'chat-single', []],
  ['qwen3-next-tiny', 'raw-story', ['--raw']], ['qwen3.5-moe-tiny-4bit-mlx', 'chat-single', []]]) {
  test(`exo run ${model} (${promptName}) prints what transformers generates`, async () => {
    const dir = await tinyModel(model);
    const p = fixture(model).prompts.find((x) => x.name === promptName);
    const text = p.kind === 'chat' ? p.messages[0].content : p.text;
    const r = exoRun([dir, text, '--temperature', '0', '--max-tokens', '32', ...extra]);
    const got = r.stdout.replace(/\n$/, '');
    assert.ok(got.length > 10, `generated text: ${JSON.stringify(got)}`);
    // transformers continued past EOS; we stop there, so ours is a prefix of its text
    assert.ok(p.greedy.text.startsWith(got), `${JSON.stringify(got)} vs ${JSON.stringify(p.greedy.text)}`);
    assert.match(r.stderr, /prompt \d+ tokens .*generated \d+ tokens, [\d.]+ tok\/s/);
  });
}

for (const model of ['qwen3-tiny', 'qwen3.5-tiny']) test(`exo run ${model} without a prompt chats, reusing the first turn from the prefix cache`, async () => {
  const dir = await tinyModel(model);
  const r = exoRun([dir, '--temperature', '0', '--max-tokens', '24'],
    'What is the capital of France?\nAnd of Italy?\n');
  const turns = [...r.stderr.matchAll(/prompt (\d+) tokens \((\d+) cached\)/g)];
  assert.equal(turns.length, 2, r.stderr);
  assert.equal(Number(turns[0][2]), 0);
  assert.ok(Number(turns[1][2]) >= 16, `second turn cached ${turns[1][2]} tokens`);
  assert.ok(Number(turns[1][1]) > Number(turns[0][1]));
});

test('exo run names a missing model and a bad flag', () => {
  let r = spawnSync(exoBin(), ['run', 'no-org/no-model', 'hi', '--offline', '--models-dir', '/nonexistent'], { encoding: 'utf8' });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /no model 'no-org\/no-model': not found .*\/nonexistent/);
  r = spawnSync(exoBin(), ['run', '/tmp', '--max-tokens', 'many'], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--max-tokens/);
});
