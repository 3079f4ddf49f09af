// Shared helpers for end-to-end tests: where the binary is, free ports, starting nodes.
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
