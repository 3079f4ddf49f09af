// The tiny models every e2e test can ask for: each builds, is a complete Hugging Face directory
// whose config.json matches its tokenizer, and a second request reuses the cached copy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { tinyModel, tinyModelNames } from './lib/models.mjs';

test('every named tiny model builds into a complete model directory', async () => {
  for (const name of tinyModelNames()) {
    const dir = await tinyModel(name);
    for (const f of ['config.json', 'model.safetensors', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json'])
      assert.ok(fs.existsSync(path.join(dir, f)), `${name}: ${f} missing`);
    const config = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
    const tok = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
    let maxId = -1;
    for (const id of Object.values(tok.model.vocab)) maxId = Math.max(maxId, id);
    for (const t of tok.added_tokens) maxId = Math.max(maxId, t.id);
    assert.equal(config.vocab_size, maxId + 1, `${name}: vocab_size covers every token id`);
    assert.equal(Boolean(config.quantization), name.includes('4bit'), `${name}: quantization`);
    // The safetensors header parses and names the embedding with the right shape.
    const fd = fs.openSync(path.join(dir, 'model.safetensors'), 'r');
    const len = Buffer.alloc(8);
    fs.readSync(fd, len, 0, 8, 0);
    const header = Buffer.alloc(Number(len.readBigUInt64LE()));
    fs.readSync(fd, header, 0, header.length, 8);
    fs.closeSync(fd);
    const h = JSON.parse(header.toString('utf8'));
    const embed = h['model.embed_tokens.weight'];
    assert.equal(embed.shape[0], config.vocab_size);
    assert.equal(embed.dtype, config.quantization ? 'U32' : 'BF16');
  }
});

test('a second request reuses the cached model', async () => {
  const dir = await tinyModel('qwen3-tiny');
  const before = fs.statSync(path.join(dir, 'model.safetensors')).mtimeMs;
  assert.equal(await tinyModel('qwen3-tiny'), dir);
  assert.equal(fs.statSync(path.join(dir, 'model.safetensors')).mtimeMs, before);
});

// The committed transformers fixtures describe exactly these weights: if mkmodel's output ever
// changes, the fixtures must be regenerated (tools/reference/README.md).
test('tiny models match the weights the reference fixtures were made from', async () => {
  const { createHash } = await import('node:crypto');
  const { repoRoot } = await import('./lib/exo.mjs');
  const dir = path.join(repoRoot, 'tests/fixtures/reference');
  const names = tinyModelNames();
  let checked = 0;
  for (const f of fs.readdirSync(dir).filter((f) => f.endsWith('.json'))) {
    const fixture = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
    assert.ok(names.includes(fixture.model), `${f}: model ${fixture.model} is not in tiny-models.json`);
    const model = await tinyModel(fixture.model);
    const sha = createHash('sha256').update(fs.readFileSync(path.join(model, 'model.safetensors'))).digest('hex');
    assert.equal(sha, fixture.safetensors_sha256, `${fixture.model}: weights differ from the fixture's`);
    checked++;
  }
  assert.equal(checked, names.length, 'every tiny model has a fixture');
});
