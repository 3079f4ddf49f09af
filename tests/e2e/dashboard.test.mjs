// The dashboard in a real browser (Debian's chromium driven by playwright-core, headless):
// the node card, the model picker, a streamed chat reply that auto-launches an instance, the
// stop button, deleting the instance, page weight. Screenshots go to tests/artifacts/dashboard/.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { startNode } from './lib/node.mjs';
import { tinyModel } from './lib/models.mjs';
import { repoRoot } from './lib/exo.mjs';

const MODEL_ID = 'test/qwen3-tiny';
const shots = path.join(repoRoot, 'tests/artifacts/dashboard');
let node, browser, page;

before(async () => {
  const dir = await tinyModel('qwen3-tiny');
  const modelsDir = fs.mkdtempSync('/tmp/exo-dash-models-');
  fs.symlinkSync(dir, path.join(modelsDir, 'test--qwen3-tiny'));
  node = await startNode({ modelsDir });
  fs.mkdirSync(shots, { recursive: true });
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
});
after(async () => {
  await browser?.close();
  await node?.stop();
});

const instances = async () => Object.keys((await (await fetch(`${node.url}/state`)).json()).instances || {});

test('first load is small and interactive quickly', async () => {
  let bytes = 0;
  page.on('response', async (r) => { try { bytes += (await r.body()).length; } catch { /* redirects */ } });
  const t0 = Date.now();
  await page.goto(node.url + '/');
  await page.waitForFunction(() => window.exoDashboard?.ready === true);
  const ms = Date.now() - t0;
  console.log(`# dashboard first load: ${bytes} bytes, interactive after ${ms} ms`);
  assert.ok(bytes < 300 * 1024, `first load transferred ${bytes} bytes`);
  await page.screenshot({ path: path.join(shots, '1-chat-empty.png') });
});

test('the cluster view shows this node as a card', async () => {
  await page.click('#tab-cluster');
  const card = page.locator('#node-cards .card');
  await card.first().waitFor();
  assert.equal(await card.count(), 1);
  assert.match(await card.first().innerText(), /Memory/);
  await page.screenshot({ path: path.join(shots, '2-cluster.png') });
});

test('the models view lists and searches the local tiny model', async () => {
  await page.click('#tab-models');
  await page.fill('#model-search', 'qwen3-tiny');
  const row = page.locator('#model-rows tr', { hasText: MODEL_ID });
  await row.waitFor();
  await page.screenshot({ path: path.join(shots, '3-models.png') });
  const deleteButton = (r) => r.locator('button', { hasText: 'Delete files' });
  assert.ok(await deleteButton(row).isVisible(), 'a model in the models dir can be deleted');
  // A built-in model's files are read-only: no "Delete files" (it would only answer 404).
  await page.fill('#model-search', 'demo-dictionary');
  const demo = page.locator('#model-rows tr', { hasText: 'exo/demo-dictionary' });
  await demo.waitFor();
  assert.equal(await deleteButton(demo).isVisible(), false, 'a built-in model offers no Delete files');
});

test('sending "Say hello" streams a reply and launches an instance', async () => {
  await page.click('#tab-chat');
  await page.selectOption('#model-picker', MODEL_ID);
  await page.click('.settings summary');
  await page.fill('#set-temperature', '0');
  await page.fill('#set-max-tokens', '16');
  await page.fill('#prompt', 'Say hello');
  await page.press('#prompt', 'Enter');
  await page.locator('#chat-stats', { hasText: /tok\/s · \d+ tokens/ }).waitFor({ timeout: 60000 });
  const reply = await page.locator('.msg.assistant').last().innerText();
  assert.ok(reply.trim().length > 0 || (await page.locator('.msg.assistant details.thinking').count()) > 0, 'a reply was rendered');
  assert.equal((await instances()).length, 1);
  await page.screenshot({ path: path.join(shots, '4-chat-reply.png') });
});

test('the stop button ends a long generation', async () => {
  await page.fill('#set-max-tokens', '4000');
  await page.fill('#prompt', 'Tell me a very long story');
  await page.press('#prompt', 'Enter');
  await page.locator('#stop').waitFor({ state: 'visible' });
  await page.locator('#chat-stats', { hasText: 'tok/s' }).waitFor({ timeout: 60000 });
  await page.click('#stop');
  await page.locator('#chat-stats', { hasText: 'stopped' }).waitFor({ timeout: 10000 });
  assert.equal(await page.locator('#send').isVisible(), true);
  await page.screenshot({ path: path.join(shots, '5-chat-stopped.png') });
});

test('an instance can be deleted from the cluster view', async () => {
  await page.click('#tab-cluster');
  const del = page.locator('#instances button', { hasText: 'Delete' });
  await del.first().waitFor();
  await page.screenshot({ path: path.join(shots, '6-instances.png') });
  await del.first().click();
  const deadline = Date.now() + 10000;
  while ((await instances()).length && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  assert.equal((await instances()).length, 0);
  await page.locator('#instances p.muted').waitFor();
});

test('the layout works on a phone-sized screen', async () => {
  await page.setViewportSize({ width: 390, height: 800 });
  await page.click('#tab-chat');
  assert.equal(await page.locator('#prompt').isVisible(), true);
  await page.screenshot({ path: path.join(shots, '7-phone.png') });
});
