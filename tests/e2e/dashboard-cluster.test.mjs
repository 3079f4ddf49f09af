// The dashboard of a 3-node cluster (three real exo processes, discovering each other over
// loopback so the host's browser can reach them): 3 node cards, one master, links between them
// with measured latency. Screenshot: tests/artifacts/dashboard/cluster-3-nodes.png.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { Cluster } from './lib/cluster.mjs';
import { exoBin, repoRoot } from './lib/exo.mjs';

let cluster, browser;
after(async () => {
  await browser?.close();
  await cluster?.stop();
});

test('a 3-node cluster shows 3 nodes, one master and the links between them', async () => {
  cluster = new Cluster({ mode: 'loopback', bin: exoBin() });
  for (let i = 0; i < 3; i++) cluster.addNode();
  await cluster.until(() => {
    const v = cluster.converged();
    return v && Object.keys(v.state.nodeIdentities || {}).length === 3 &&
      (v.state.topology?.connections || []).length >= 3 ? v : false;
  }, 15000, 'three nodes with links in /state');
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  await page.goto(`http://127.0.0.1:${cluster.nodes[0].apiPort}/`);
  await page.waitForFunction(() => window.exoDashboard?.ready === true);
  await page.click('#tab-cluster');
  await page.waitForFunction(() => document.querySelectorAll('#node-cards .card').length === 3, null, { timeout: 10000 });
  assert.equal(await page.locator('#node-cards .badge', { hasText: 'master' }).count(), 1);
  await page.waitForFunction(() => document.querySelectorAll('#topology line.link').length === 3, null, { timeout: 10000 });
  const labels = await page.locator('#topology text.link-label').allTextContents();
  assert.ok(labels.some((l) => /ms/.test(l)), `link labels show latency: ${labels.join(' | ')}`);
  assert.match(await page.locator('#cluster-summary').innerText(), /3 nodes/);
  const shots = path.join(repoRoot, 'tests/artifacts/dashboard');
  fs.mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: path.join(shots, 'cluster-3-nodes.png') });
});
