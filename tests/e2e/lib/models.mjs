// Tiny random-weight models for end-to-end tests, built once by build/tools/mkmodel and cached
// under .cache/models/<name>. The names and their mkmodel arguments live in
// tools/mkmodel/tiny-models.json (shared with tools/reference/make_fixtures.py, whose fixtures
// in tests/fixtures/reference/<name>.json describe what transformers outputs for them).
//
//   import { tinyModel } from './lib/models.mjs';
//   const dir = await tinyModel('qwen3-tiny');   // a Hugging Face model directory
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { repoRoot, buildDir } from './exo.mjs';

const run = promisify(execFile);

export function tinyModelSpecs() {
  const file = path.join(repoRoot, 'tools/mkmodel/tiny-models.json');
  const specs = JSON.parse(fs.readFileSync(file, 'utf8'));
  delete specs._comment;
  return specs;
}

export function tinyModelNames() {
  return Object.keys(tinyModelSpecs());
}

const building = new Map();

// Returns the directory of the named tiny model, building it if missing or made with other
// arguments. Safe to call from concurrent test processes (build in a temp dir, then rename).
export async function tinyModel(name) {
  const args = tinyModelSpecs()[name];
  if (!args) throw new Error(`unknown tiny model '${name}' (see tools/mkmodel/tiny-models.json)`);
  return mkModel(name, args);
}

// A model of a test's own shape (mkmodel arguments), cached like the named ones. For shapes a
// test needs that the reference fixtures do not cover (tiny-models.json lists only those).
export async function mkModel(name, args) {
  const dir = path.join(repoRoot, '.cache/models', name);
  const stamp = JSON.stringify(args);
  const stampFile = path.join(dir, '.mkmodel-args');
  if (fs.existsSync(stampFile) && fs.readFileSync(stampFile, 'utf8') === stamp) return dir;
  if (!building.has(name)) building.set(name, build(name, args, dir, stamp).finally(() => building.delete(name)));
  return building.get(name);
}

async function build(name, args, dir, stamp) {
  const mkmodel = path.join(buildDir(), 'tools/mkmodel');
  if (!fs.existsSync(mkmodel)) throw new Error(`${mkmodel} not found: run make first`);
  const tokIndex = args.indexOf('--tokenizer');
  if (tokIndex >= 0) await run('bash', [path.join(repoRoot, 'scripts/tokenizers.sh'), args[tokIndex + 1]]);
  const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  fs.mkdirSync(path.dirname(dir), { recursive: true });
  try {
    await run(mkmodel, ['--out', tmp, ...args], { cwd: repoRoot });
    fs.writeFileSync(path.join(tmp, '.mkmodel-args'), stamp);
    fs.rmSync(dir, { recursive: true, force: true });
    try {
      fs.renameSync(tmp, dir);
    } catch (e) {
      // Another process finished first with the same arguments: use its copy.
      if (!fs.existsSync(path.join(dir, '.mkmodel-args'))) throw e;
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return dir;
}
