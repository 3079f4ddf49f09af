// Shared helpers for end-to-end tests: where the binary is, free ports, starting nodes, and the
// device every exo process of the run computes on.
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const repoRoot = process.env.EXO_ROOT ||
  path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

export function exoBin() {
  return process.env.EXO_BIN || path.join(repoRoot, 'build/exo');
}

export function buildDir() {
  return process.env.EXO_BUILD || path.join(repoRoot, 'build');
}

// EXO_TEST_DEVICE=cpu|cuda|auto runs the suite on that device: every exo node and `exo run` the
// tests start gets `--device X` (tests/run-e2e-device.sh sets it). Unset, exo's own default
// applies (auto: the GPU when the build has CUDA and one is present). A flag rather than
// EXO_DEVICE in the environment so that the device shows in every command line a log prints.
export function deviceArgs() {
  const device = process.env.EXO_TEST_DEVICE;
  return device ? ['--device', device] : [];
}
