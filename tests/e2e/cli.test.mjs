// The exo binary as a user meets it first: help, version, bad flags.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { exoBin } from './lib/exo.mjs';
import { mkModel } from './lib/models.mjs';

test('exo --help lists the node flags and subcommands', () => {
  const r = spawnSync(exoBin(), ['--help'], { encoding: 'utf8' });
  assert.equal(r.status, 0);
  for (const flag of ['--api-port', '--models-dir', '--models-path', '--data-dir', '--offline',
    '--namespace', '--no-worker', '--no-api', '--peer', '--listen-port', '--discovery-port']) {
    assert.ok(r.stdout.includes(flag), `help mentions ${flag}`);
  }
  assert.match(r.stdout, /exo run MODEL \[PROMPT\]/);
});

test('exo --version prints a version', () => {
  const r = spawnSync(exoBin(), ['--version'], { encoding: 'utf8' });
  assert.equal(r.status, 0);
  assert.match(r.stdout, /^exo \d+\.\d+\.\d+/);
});

test('a bad flag exits 2 with a message naming it', () => {
  const r = spawnSync(exoBin(), ['--no-such-flag'], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /--no-such-flag/);
});

test('exo run --help prints its usage on stdout and exits 0; no model is bad usage (2)', () => {
  const r = spawnSync(exoBin(), ['run', '--help'], { encoding: 'utf8' });
  assert.equal(r.status, 0);
  assert.match(r.stdout, /usage: exo run MODEL/);
  const bad = spawnSync(exoBin(), ['run'], { encoding: 'utf8' });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /usage: exo run MODEL/);
});

test('the new limits are in exo --help', () => {
  const r = spawnSync(exoBin(), ['--help'], { encoding: 'utf8' });
  for (const flag of ['--max-runners', '--max-connections-per-ip']) assert.ok(r.stdout.includes(flag), flag);
});

// exo bench --model on the CPU prints, after each decode line against the separately probed
// roofline, a "paired" one: one more decode with a read probe swept between its steps, divided by
// that probe's bandwidth (a shared host's bandwidth swings within seconds; bench/RESULTS.md,
// issue 25). An 8-bit model of 128-multiple widths: its matrices take the inline-scale layout.
test('exo bench --model prints the decode line and the paired one, a probe between the steps', async () => {
  const dir = await mkModel('bench-8bit-e2e', ['--tokenizer', 'qwen3', '--hidden', '128', '--intermediate', '256',
    '--heads', '2', '--kv-heads', '1', '--head-dim', '64', '--quant-bits', '8', '--group-size', '64', '--seed', '3']);
  const r = spawnSync(exoBin(), ['bench', '--threads', '2', '--model', dir, '--device', 'cpu', '--pp', '4', '--tg', '8',
    '--batch', '1', '--reps', '1'], { encoding: 'utf8', timeout: 300000 });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^decode\s+tg8\s+b1\s*:\s+[\d.]+ tok\/s\s+roofline\s+[\d.]+ tok\/s \(memory/m);
  const paired = r.stdout.match(/^decode\s+tg8\s+b1\s*:\s+([\d.]+) tok\/s\s+paired roofline\s+([\d.]+) tok\/s \(probe between the steps: ([\d.]+) GB\/s\) =\s+([\d.]+)%/m);
  assert.ok(paired, r.stdout);
  const [rate, roof, gbs, pct] = paired.slice(1).map(Number);
  assert.ok(rate > 0 && roof > 0 && gbs > 0, paired[0]);
  assert.ok(Math.abs(pct - 100 * rate / roof) < 0.2, `${pct}% is the rate over the paired roofline: ${paired[0]}`);
});
