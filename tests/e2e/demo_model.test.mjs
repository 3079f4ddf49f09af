// The embedded demo model (resources/models/exo--demo-dictionary, made by tools/train/): a valid
// MLX 4-bit Llama checkpoint under 25 MB whose chat template renders as trained, and our engine's
// greedy answers equal the ones transformers gave on the same (dequantized) weights (eval.json).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { TokenizerLoader } from '@lenml/tokenizers';
import { deviceArgs, repoRoot, exoBin } from './lib/exo.mjs';

const dir = path.join(repoRoot, 'resources/models/exo--demo-dictionary');
const readJson = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));

function safetensorsHeader(file) {
  const fd = fs.openSync(file, 'r');
  const len = Buffer.alloc(8);
  fs.readSync(fd, len, 0, 8, 0);
  const h = Buffer.alloc(Number(len.readBigUInt64LE()));
  fs.readSync(fd, h, 0, h.length, 8);
  fs.closeSync(fd);
  return JSON.parse(h.toString('utf8'));
}

function tokenizer() {
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: readJson('tokenizer.json'),
    tokenizerConfig: readJson('tokenizer_config.json'),
  });
}

test('demo model: MLX 4-bit Llama checkpoint that matches its config, under 25 MB', () => {
  const cfg = readJson('config.json');
  assert.equal(cfg.model_type, 'llama');
  assert.equal(cfg.quantization.bits, 4);
  const group = cfg.quantization.group_size;
  assert.ok([32, 64, 128].includes(group), `group size ${group}`);
  const file = path.join(dir, 'model.safetensors');
  assert.ok(fs.statSync(file).size < 25e6);
  const h = safetensorsHeader(file);
  const H = cfg.hidden_size, kv = cfg.num_key_value_heads * cfg.head_dim, I = cfg.intermediate_size;
  const shapes = { 'model.embed_tokens': [cfg.vocab_size, H] };
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    const p = `model.layers.${l}`;
    Object.assign(shapes, {
      [`${p}.self_attn.q_proj`]: [cfg.num_attention_heads * cfg.head_dim, H], [`${p}.self_attn.k_proj`]: [kv, H],
      [`${p}.self_attn.v_proj`]: [kv, H], [`${p}.self_attn.o_proj`]: [H, cfg.num_attention_heads * cfg.head_dim],
      [`${p}.mlp.gate_proj`]: [I, H], [`${p}.mlp.up_proj`]: [I, H], [`${p}.mlp.down_proj`]: [H, I],
    });
    for (const n of ['input_layernorm', 'post_attention_layernorm'])
      assert.deepEqual(h[`${p}.${n}.weight`]?.shape, [H], `${p}.${n}`);
  }
  for (const [name, [out, inp]] of Object.entries(shapes)) {
    assert.deepEqual(h[`${name}.weight`]?.shape, [out, inp / 8], `${name}.weight`);
    assert.equal(h[`${name}.weight`].dtype, 'U32');
    assert.deepEqual(h[`${name}.scales`]?.shape, [out, inp / group], `${name}.scales`);
    assert.deepEqual(h[`${name}.biases`]?.shape, [out, inp / group], `${name}.biases`);
  }
  assert.equal(h['lm_head.weight'], undefined, 'tied embeddings: no lm_head');
  assert.equal(Object.keys(h).length - 1, Object.keys(shapes).length * 3 + cfg.num_hidden_layers * 2 + 1);
});

test('demo model: chat template renders the format it was trained on', () => {
  const text = tokenizer().apply_chat_template(
    [{ role: 'user', content: 'What does harbour mean?' }, { role: 'assistant', content: 'A port.' },
     { role: 'user', content: 'Thanks!' }], { tokenize: false, add_generation_prompt: true });
  assert.equal(text, '<s>[INST] What does harbour mean? [/INST] A port.</s><s>[INST] Thanks! [/INST]');
});

test("demo model: exo's greedy answers equal transformers' on the same weights", () => {
  const tok = tokenizer();
  const evalResults = readJson('eval.json');
  // Trained words and held-out ones (the model's less certain answers, where rounding could flip a token).
  const answers = [...evalResults['4bit'].seen_words.answers.slice(0, 3),
    ...evalResults['4bit'].held_out_words.answers.slice(0, 4)];
  for (const { word, answer } of answers) {
    const prompt = tok.apply_chat_template([{ role: 'user', content: `What does ${word} mean?` }],
      { tokenize: false, add_generation_prompt: true });
    const ids = tok.encode(prompt, { add_special_tokens: false });
    const out = execFileSync(exoBin(), ['run', dir, '--tokens', ids.join(','), '--temperature', '0',
      '--max-tokens', '80', '--threads', '2', ...deviceArgs()], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    const gen = out.trim().split(/\s+/).map(Number).filter((t) => t !== tok.eos_token_id);
    assert.equal(tok.decode(gen).trim(), answer, word);
  }
});
