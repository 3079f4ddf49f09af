// The exo binary as a user meets it first: help, version, bad flags.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { exoBin } from './lib/exo.mjs';

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
