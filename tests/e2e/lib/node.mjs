// Starting and stopping an exo node for a test file: a free port, a temporary models dir,
// waiting until /node_id answers, and killing the node (and its runners) at the end.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { deviceArgs, exoBin } from './exo.mjs';

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// Starts `exo --api-port P --models-dir DIR ...extraArgs` (on EXO_TEST_DEVICE's device); resolves to {url, port, proc, modelsDir,
// log(), stop()}.
export async function startNode({ args = [], env = {}, modelsDir } = {}) {
  const port = await freePort();
  const dir = modelsDir || fs.mkdtempSync(path.join(os.tmpdir(), 'exo-models-'));
  // Each test node is a cluster of its own: private data dir, namespace and cluster port, so
  // test nodes (and other people's, on a shared machine) never join each other.
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-data-'));
  const isolate = ['--data-dir', dataDir, '--namespace', `e2e-${process.pid}-${port}`, '--listen-port', '0'];
  const proc = spawn(exoBin(), ['--api-port', String(port), '--models-dir', dir, ...isolate, ...deviceArgs(), ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  proc.stdout.on('data', (d) => { log += d; });
  proc.stderr.on('data', (d) => { log += d; });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 10000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`exo exited early (${proc.exitCode}):\n${log}`);
    try {
      const r = await fetch(`${url}/node_id`);
      if (r.ok) break;
    } catch { /* not up yet */ }
    if (Date.now() > deadline) throw new Error(`exo did not start:\n${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url, port, proc, modelsDir: dir, dataDir,
    log: () => log,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      proc.kill('SIGTERM');
      const code = await new Promise((resolve) => {
        const t = setTimeout(() => { proc.kill('SIGKILL'); }, 8000);
        proc.on('exit', (c, sig) => { clearTimeout(t); resolve(c ?? sig); });
      });
      fs.rmSync(dataDir, { recursive: true, force: true });
      return code;
    },
  };
}
