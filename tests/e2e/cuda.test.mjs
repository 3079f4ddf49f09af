// The CUDA backend where CI runs (no GPU): it compiles, and a build without it refuses
// --device cuda with a message a user can act on. GPU tests live in tests/unit/test_cuda_ops.c
// and test_engine_reference.c; they skip themselves where no GPU is present.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { exoBin } from './lib/exo.mjs';

const root = process.env.EXO_ROOT || path.resolve(import.meta.dirname, '../..');
const cudaHome = process.env.CUDA_HOME || '/usr/local/cuda';

function haveNvcc() {
  if (existsSync(path.join(cudaHome, 'bin/nvcc'))) return true;
  return spawnSync('nvcc', ['--version']).status === 0;
}

test('make CUDA=1 compiles the CUDA backend (src/compute/cuda/*.cu and the C door to it)', (t) => {
  if (!haveNvcc()) {
    t.skip(`no nvcc here (CUDA_HOME=${cudaHome}): the CUDA backend cannot be compiled`);
    return;
  }
  const cu = readdirSync(path.join(root, 'src/compute/cuda')).filter((f) => f.endsWith('.cu'));
  assert.ok(cu.length >= 3, 'the backend has its .cu files');
  const targets = cu.map((f) => `build/cuda/obj/src/compute/cuda/${f.replace(/\.cu$/, '.o')}`);
  targets.push('build/cuda/obj/src/compute/device.o');
  const env = { ...process.env, PATH: `${path.join(cudaHome, 'bin')}:${process.env.PATH}` };
  const r = spawnSync('make', ['--no-print-directory', 'CUDA=1', '-j2', ...targets],
    { cwd: root, env, encoding: 'utf8', timeout: 900_000 });
  assert.equal(r.status, 0, `make CUDA=1 failed:\n${r.stdout}\n${r.stderr}`);
});

test('--device cuda: a build without CUDA or a machine without a GPU says so and exits 2', () => {
  for (const args of [['run', 'no-such-model', '--device', 'cuda'],
    ['bench', '--model', 'no-such-dir', '--device', 'cuda']]) {
    const r = spawnSync(exoBin(), args, { encoding: 'utf8' });
    if (r.status === 0 || !/--device cuda/.test(r.stderr)) {
      // a CUDA build on a GPU machine accepts the flag and fails later, on the model
      assert.doesNotMatch(r.stderr, /--device cuda/);
      continue;
    }
    assert.equal(r.status, 2);
    assert.match(r.stderr, /built without the CUDA backend|no CUDA GPU is available/);
  }
  const bad = spawnSync(exoBin(), ['run', 'm', '--device', 'tpu'], { encoding: 'utf8' });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /device 'tpu' is not one of cpu, cuda, auto/);
});
