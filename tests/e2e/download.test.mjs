// Model downloads against a local fake Hugging Face Hub: what a user relies on when a model is
// fetched — complete, verified files; resume; clear failures; shards; peers; offline mode.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import net from 'node:net';
import { buildDir } from './lib/exo.mjs';
import { FakeHF, makeTinyModel } from './lib/fake-hf.mjs';

const tool = path.join(buildDir(), 'tools/download');
const ID = 'test-org/tiny-llama';

// A fake Hub that is stopped when the test ends, pass or fail.
async function startHF(t) {
  const hf = await new FakeHF().start();
  t.after(() => hf.stop());
  return hf;
}

const made = [];
after(() => { for (const d of made) fs.rmSync(d, { recursive: true, force: true }); });
function tmpdir(tag) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), `exo-dl-${tag}-`));
  made.push(d);
  return d;
}

// Runs `download get` asynchronously (the fake server lives in this process).
function get(hf, dir, extra = [], { env = {}, onEvent, model = ID } = {}) {
  return new Promise((resolve) => {
    const args = ['get', model, '--models-dir', dir, '--json', '--interval-ms', '100',
      '--backoff-ms', '50', ...extra];
    const p = spawn(tool, args, { env: { ...process.env, HF_TOKEN: '', HF_ENDPOINT: hf?.url ?? 'http://127.0.0.1:9', ...env } });
    const events = [];
    let buf = '', stderr = '';
    p.stdout.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (!line.trim()) continue;
        const ev = JSON.parse(line);
        events.push(ev);
        onEvent?.(ev, p);
      }
    });
    p.stderr.on('data', (d) => { stderr += d; });
    p.on('exit', (code) => {
      const result = events.find((e) => e.event === 'result');
      resolve({ code, events, result, stderr, progress: events.filter((e) => e.event === 'progress') });
    });
  });
}

function modelDir(dir, id = ID) {
  return path.join(dir, id.replace('/', '--'));
}

function assertSameFiles(dir, files, only = null) {
  for (const [p, buf] of Object.entries(files)) {
    if (p === '.gitattributes') continue;
    if (only && !only.includes(p)) continue;
    const got = fs.readFileSync(path.join(dir, p));
    assert.ok(got.equals(buf), `${p} has the served bytes`);
  }
}

test('full download: every file lands verified, a manifest is written, a rerun fetches nothing', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const dir = tmpdir('full');
  const r = await get(hf, dir);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.result.error, 'ok');
  assertSameFiles(modelDir(dir), files);
  assert.ok(!fs.existsSync(path.join(modelDir(dir), '.gitattributes')));
  const manifest = JSON.parse(fs.readFileSync(path.join(modelDir(dir), '.exo-manifest.json')));
  assert.equal(manifest.files.length, Object.keys(files).length - 1);
  const total = Object.entries(files).filter(([p]) => p !== '.gitattributes').reduce((a, [, b]) => a + b.length, 0);
  assert.equal(r.result.bytes_fetched, total);
  const last = r.progress.at(-1);
  assert.equal(last.status, 'completed');
  assert.equal(last.downloaded_bytes, total);
  assert.equal(last.files_done, last.files_total);
  assert.equal(fs.readdirSync(modelDir(dir)).filter((f) => f.endsWith('.partial')).length, 0);

  const before = hf.log.length;
  const again = await get(hf, dir);
  assert.equal(again.code, 0);
  assert.equal(again.result.bytes_fetched, 0);
  assert.equal(hf.log.length, before, 'a complete model needs no network');
  await hf.stop();
});

test('resume: a connection dropped mid-file continues with Range, and so does a restarted process', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const big = 'model-00001-of-00004.safetensors';
  hf.faults.dropAfter = { [big]: { bytes: 50_000, times: 1 } };
  const dir = tmpdir('resume');
  const r = await get(hf, dir);
  assert.equal(r.code, 0, r.stderr);
  assertSameFiles(modelDir(dir), files);
  const gets = hf.requests({ method: 'GET', path: `/${ID}/resolve/main/${big}` });
  assert.equal(gets.length, 2);
  assert.equal(gets[1].range, 'bytes=50000-');
  assert.equal(hf.bytesSent(ID, big), files[big].length, 'no byte was sent twice');

  // a restarted download finds the .partial and asks only for the rest
  const dir2 = tmpdir('resume2');
  fs.mkdirSync(modelDir(dir2), { recursive: true });
  fs.writeFileSync(path.join(modelDir(dir2), `${big}.partial`), files[big].subarray(0, 70_000));
  const sentBefore = hf.bytesSent(ID, big);
  const r2 = await get(hf, dir2);
  assert.equal(r2.code, 0, r2.stderr);
  assertSameFiles(modelDir(dir2), files);
  assert.equal(hf.bytesSent(ID, big) - sentBefore, files[big].length - 70_000);
  assert.equal(hf.requests({ path: `/${ID}/resolve/main/${big}` }).at(-1).range, 'bytes=70000-');
  await hf.stop();
});

test('CDN redirect, big files: LFS bytes come from another host via 302 without the token; three 8-24 MB files at once; a drop resumes', async (t) => {
  const hub = await startHF(t);
  const cdn = await startHF(t);
  // 48 MB in 3 files fetched in parallel: their chunks interleave in the download's 16 MiB
  // receive ring, which wraps around several times while it is hashed and written
  const files = makeTinyModel({ nLayers: 4, nShards: 3, layerBytes: 8 << 20 });
  hub.addModel(ID, files);
  cdn.addModel(ID, files);
  hub.cdn = (id, p) => `${cdn.url}/${id}/resolve/main/${encodeURIComponent(p)}`;
  hub.faults.requireToken = 'hf_secret';
  const shards = Object.keys(files).filter((p) => p.endsWith('.safetensors'));
  assert.equal(shards.length, 3);
  const dropped = shards[1];
  cdn.faults.dropAfter = { [dropped]: { bytes: 5_000_000, times: 1 } };
  const dir = tmpdir('cdn');
  const r = await get(hub, dir, [], { env: { HF_TOKEN: 'hf_secret' } });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.result.error, 'ok');
  assertSameFiles(modelDir(dir), files);
  for (const p of shards) {
    assert.equal(hub.bytesSent(ID, p), 0, `${p}: no byte from the Hub itself`);
    assert.equal(cdn.bytesSent(ID, p), files[p].length, `${p}: every byte once from the CDN`);
    assert.ok(hub.requests({ method: 'GET', path: `/${ID}/resolve/main/${p}` }).every((q) => q.status === 302));
  }
  assert.ok(cdn.log.length >= 4);
  assert.ok(cdn.log.every((q) => q.auth === null), 'HF_TOKEN is never sent to the CDN host');
  assert.ok(hub.log.every((q) => q.auth === 'Bearer hf_secret'), 'the Hub gets the token');
  const cdnGets = cdn.requests({ method: 'GET', path: `/${ID}/resolve/main/${dropped}` });
  assert.equal(cdnGets.length, 2);
  assert.equal(cdnGets[1].range, 'bytes=5000000-', 'resumed through the redirect from the byte reached');
  const manifest = JSON.parse(fs.readFileSync(path.join(modelDir(dir), '.exo-manifest.json'), 'utf8'));
  assert.equal(manifest.files.length, Object.keys(files).length - 1); // .gitattributes skipped
  await hub.stop();
  await cdn.stop();
});

test('corrupt bytes: retried, then a clean failure with no corrupt file left in place', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const bad = 'model-00002-of-00004.safetensors';
  // corrupted once: the retry succeeds
  hf.faults.corrupt = { [bad]: 1 };
  const dir = tmpdir('corrupt1');
  const ok = await get(hf, dir);
  assert.equal(ok.code, 0, ok.stderr);
  assertSameFiles(modelDir(dir), files);

  // corrupted always: the download fails with a checksum message after the retries
  hf.faults.corrupt = { [bad]: 1000 };
  const dir2 = tmpdir('corrupt2');
  const before = hf.requests({ path: `/${ID}/resolve/main/${bad}` }).length;
  const r = await get(hf, dir2, ['--retries', '2']);
  assert.equal(r.code, 4);
  assert.equal(r.result.error, 'verify');
  assert.match(r.result.message, /checksum/);
  assert.match(r.result.message, new RegExp(bad));
  assert.equal(hf.requests({ path: `/${ID}/resolve/main/${bad}` }).length - before, 3);
  assert.ok(!fs.existsSync(path.join(modelDir(dir2), bad)), 'no corrupt file under the final name');
  assert.ok(!fs.existsSync(path.join(modelDir(dir2), `${bad}.partial`)), 'no corrupt partial kept');
  assert.equal(r.progress.at(-1).status, 'failed');
  await hf.stop();
});

test('a listing without hashes: sizes and hashes come from HEAD (x-linked-etag / etag), still verified', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  hf.faults.treeWithoutHashes = true;
  const bad = 'model-00002-of-00004.safetensors';
  hf.faults.corrupt = { [bad]: 1, 'config.json': 1 };
  const dir = tmpdir('head');
  const r = await get(hf, dir);
  assert.equal(r.code, 0, r.stderr);
  assertSameFiles(modelDir(dir), files);
  const heads = hf.requests({ method: 'HEAD' });
  assert.equal(heads.length, Object.keys(files).length - 1, 'one HEAD per file');
  // the corrupted copies were caught by the HEAD-provided hashes and fetched again
  assert.equal(hf.requests({ method: 'GET', path: `/${ID}/resolve/main/${bad}` }).length, 2);
  assert.equal(hf.requests({ method: 'GET', path: `/${ID}/resolve/main/config.json` }).length, 2);
});

test('429: the download waits for Retry-After and then succeeds', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const f = 'model-00003-of-00004.safetensors';
  hf.faults.rateLimit = { [f]: 2 };
  hf.faults.retryAfter = 1;
  const dir = tmpdir('429');
  const r = await get(hf, dir);
  assert.equal(r.code, 0, r.stderr);
  assertSameFiles(modelDir(dir), files);
  const reqs = hf.requests({ path: `/${ID}/resolve/main/${f}` });
  assert.deepEqual(reqs.map((q) => q.status), [429, 429, 200]);
  // Retry-After: 1 is honoured (not the 50 ms backoff)
  assert.ok(reqs[1].t - reqs[0].t >= 900, `waited ${reqs[1].t - reqs[0].t} ms`);
  assert.ok(reqs[2].t - reqs[1].t >= 900);
  await hf.stop();
});

test('404: an unknown model fails with a message naming it', async (t) => {
  const hf = await startHF(t);
  const dir = tmpdir('404');
  const r = await get(hf, dir, [], { model: 'nobody/no-such-model' });
  assert.equal(r.code, 1);
  assert.equal(r.result.error, 'not_found');
  assert.match(r.result.message, /nobody\/no-such-model/);
  assert.match(r.result.message, /not found/);
  assert.ok(!fs.existsSync(modelDir(dir, 'nobody/no-such-model')));
  await hf.stop();
});

test('auth: a gated model asks for HF_TOKEN, and downloads with it', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  hf.faults.requireToken = 'hf_secret';
  const dir = tmpdir('auth');
  const r = await get(hf, dir);
  assert.equal(r.code, 2);
  assert.equal(r.result.error, 'auth');
  assert.match(r.result.message, /HF_TOKEN/);
  const ok = await get(hf, dir, [], { env: { HF_TOKEN: 'hf_secret' } });
  assert.equal(ok.code, 0, ok.stderr);
  assertSameFiles(modelDir(dir), files);
  assert.ok(hf.requests({ method: 'GET' }).filter((q) => q.status === 200).every((q) => q.auth === 'Bearer hf_secret'));
  await hf.stop();
});

test('slow server: completes, reporting speed and ETA about once per interval', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel({ nShards: 2, nLayers: 2, layerBytes: 32 * 1024 });
  hf.addModel(ID, files);
  hf.faults.bytesPerSec = 100_000;
  const dir = tmpdir('slow');
  const start = Date.now();
  const r = await get(hf, dir, ['--parallel', '1']);
  const secs = (Date.now() - start) / 1000;
  assert.equal(r.code, 0, r.stderr);
  assertSameFiles(modelDir(dir), files);
  const ongoing = r.progress.filter((p) => p.status === 'ongoing');
  assert.ok(ongoing.length >= 5, `${ongoing.length} progress reports`);
  // throttled: never more reports than one per 100 ms interval (+ start and end)
  assert.ok(r.progress.length <= secs * 10 + 3, `${r.progress.length} reports in ${secs}s`);
  const mid = ongoing.filter((p) => p.speed > 0);
  assert.ok(mid.length > 0);
  for (const p of mid) {
    assert.ok(p.speed < 400_000, `speed ${p.speed} reflects the throttled server`);
    assert.ok(p.eta_seconds >= 0);
  }
  assert.ok(ongoing.some((p) => p.downloaded_bytes > 0 && p.downloaded_bytes < p.total_bytes));
  await hf.stop();
});

function canMount() {
  return process.getuid?.() === 0 && spawnSync('mount', ['--version']).status === 0;
}

function mountTmpfs(bytes) {
  const mnt = tmpdir('tmpfs');
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${bytes}`, 'tmpfs', mnt]);
  if (r.status !== 0) return null;
  return mnt;
}

test('disk full: detected before the download (statvfs) and during it (ENOSPC)', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel({ layerBytes: 256 * 1024 }); // ~1.3 MB of weights
  hf.addModel(ID, files);
  const mnt = canMount() ? mountTmpfs(512 * 1024) : null;
  if (!mnt) {
    // No tmpfs (not root): the same check, driven by a free-space reserve larger than the disk.
    const dir = tmpdir('full-fallback');
    const r = await get(hf, dir, ['--min-free', String(2 ** 60)]);
    assert.equal(r.code, 5);
    assert.match(r.result.message, /not enough disk space/);
    await hf.stop();
    return;
  }
  try {
    const r = await get(hf, mnt);
    assert.equal(r.code, 5);
    assert.equal(r.result.error, 'disk_full');
    assert.match(r.result.message, /not enough disk space/);
    assert.equal(hf.requests({ method: 'GET' }).filter((q) => q.path.includes('/resolve/')).length, 0,
      'nothing was downloaded');
  } finally {
    spawnSync('umount', [mnt]);
  }
  // during: enough space at the start, then something else fills the disk
  const mnt2 = mountTmpfs(4 * 1024 * 1024);
  try {
    hf.faults.bytesPerSec = 400_000;
    let filled = false;
    const r = await get(hf, mnt2, ['--parallel', '2'], {
      onEvent: (ev) => {
        if (!filled && ev.event === 'progress' && ev.downloaded_bytes > 0) {
          filled = true;
          const free = Number(spawnSync('df', ['-B1', '--output=avail', mnt2], { encoding: 'utf8' }).stdout.split('\n')[1]);
          fs.writeFileSync(path.join(mnt2, 'filler'), Buffer.alloc(Math.max(0, free - 4096)));
        }
      },
    });
    assert.ok(filled);
    assert.equal(r.code, 5, r.stderr);
    assert.equal(r.result.error, 'disk_full');
    assert.match(r.result.message, /disk full while writing/);
  } finally {
    spawnSync('umount', [mnt2]);
  }
  await hf.stop();
});

test('cancel: SIGINT stops the download, keeps the partial, and a rerun resumes it', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel({ nShards: 1, nLayers: 2, layerBytes: 128 * 1024 });
  hf.addModel(ID, files);
  hf.faults.bytesPerSec = 100_000;
  const dir = tmpdir('cancel');
  let sent = false;
  const r = await get(hf, dir, [], {
    onEvent: (ev, p) => {
      if (!sent && ev.event === 'progress' && ev.downloaded_bytes > 30_000) {
        sent = true;
        p.kill('SIGINT');
      }
    },
  });
  assert.equal(r.code, 6);
  assert.equal(r.result.error, 'cancelled');
  const w = 'model-00001-of-00001.safetensors';
  assert.ok(!fs.existsSync(path.join(modelDir(dir), w)));
  const partial = fs.statSync(path.join(modelDir(dir), `${w}.partial`)).size;
  assert.ok(partial > 0 && partial < files[w].length);
  hf.faults.bytesPerSec = 0;
  const again = await get(hf, dir);
  assert.equal(again.code, 0, again.stderr);
  assertSameFiles(modelDir(dir), files);
  assert.match(hf.requests({ path: `/${ID}/resolve/main/${w}` }).at(-1).range, /^bytes=\d+-$/);
  await hf.stop();
});

test('delete: removes the downloaded model; ids that escape the models dir are refused', async (t) => {
  const hf = await startHF(t);
  hf.addModel(ID, makeTinyModel());
  const dir = tmpdir('delete');
  assert.equal((await get(hf, dir)).code, 0);
  const del = spawnSync(tool, ['delete', ID, '--models-dir', dir], { encoding: 'utf8' });
  assert.equal(del.status, 0, del.stderr);
  assert.ok(!fs.existsSync(modelDir(dir)));
  fs.writeFileSync(path.join(dir, 'keep'), 'x');
  const bad = spawnSync(tool, ['delete', '../..', '--models-dir', dir], { encoding: 'utf8' });
  assert.equal(bad.status, 9);
  assert.match(bad.stderr, /model id/);
  assert.ok(fs.existsSync(path.join(dir, 'keep')));
  await hf.stop();
});

test('offline: a downloaded model needs no server; a missing one fails clearly', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const dir = tmpdir('offline');
  assert.equal((await get(hf, dir)).code, 0);
  await hf.stop();
  const r = await get(null, dir, ['--offline']);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.result.bytes_fetched, 0);
  assert.equal(r.progress.at(-1).status, 'completed');
  const miss = await get(null, dir, ['--offline'], { model: 'test-org/absent' });
  assert.equal(miss.code, 7);
  assert.equal(miss.result.error, 'offline');
  assert.match(miss.result.message, /offline mode: test-org\/absent is not in/);
});

test('pipeline shard: each of 2 stages downloads only the files holding its layers', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel({ nLayers: 8, nShards: 4 });
  hf.addModel(ID, files);
  const index = JSON.parse(files['model.safetensors.index.json']).weight_map;
  const small = Object.keys(files).filter((p) => !p.endsWith('.safetensors') && p !== '.gitattributes');
  const smallBytes = small.reduce((a, p) => a + files[p].length, 0);
  const expect = (start, end) => {
    const need = new Set();
    for (const [name, file] of Object.entries(index)) {
      const m = name.match(/layers\.(\d+)\./);
      if (m ? (m[1] >= start && m[1] < end) : name.includes('embed') ? start === 0 : end === 8) need.add(file);
    }
    return [...need].sort();
  };
  for (const [start, end] of [[0, 4], [4, 8]]) {
    const dir = tmpdir(`shard${start}`);
    const sentBefore = hf.totalSent(ID);
    const r = await get(hf, dir, ['--layers', `${start}:${end}`]);
    assert.equal(r.code, 0, r.stderr);
    const want = expect(start, end);
    assert.equal(want.length, 2);
    const got = fs.readdirSync(modelDir(dir)).filter((f) => f.endsWith('.safetensors')).sort();
    assert.deepEqual(got, want);
    const wantBytes = smallBytes + want.reduce((a, p) => a + files[p].length, 0);
    assert.equal(hf.totalSent(ID) - sentBefore, wantBytes, 'bytes fetched = config/tokenizer + its shards');
    assert.equal(r.result.bytes_fetched, wantBytes);
    assertSameFiles(modelDir(dir), files, [...small, ...want]);
  }
  await hf.stop();
});

// The tensors of one safetensors file as [name, start, end) in file offsets.
function tensorsOf(buf) {
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString());
  return { headerEnd: 8 + n, tensors: Object.entries(header).filter(([k]) => k !== '__metadata__')
    .map(([name, t]) => [name, 8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]]) };
}

test('pipeline shard, one file holding every layer: each stage fetches only its byte ranges', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel({ nLayers: 8, nShards: 1, layerBytes: 256 * 1024 });
  hf.addModel(ID, files);
  const file = Object.keys(files).find((p) => p.endsWith('.safetensors'));
  const src = files[file];
  const { headerEnd, tensors } = tensorsOf(src);
  const dir = tmpdir('ranges');
  for (const [start, end] of [[0, 4], [4, 8]]) {
    const need = tensors.filter(([name]) => {
      const m = name.match(/layers\.(\d+)\./);
      return m ? m[1] >= start && m[1] < end : name.includes('embed') ? start === 0 : end === 8;
    });
    const sd = tmpdir(`ranges${start}`);
    const before = hf.bytesSent(ID, file);
    const r = await get(hf, sd, ['--layers', `${start}:${end}`]);
    assert.equal(r.code, 0, r.stderr);
    const fetched = hf.bytesSent(ID, file) - before;
    const wantBytes = headerEnd + need.reduce((a, [, s0, e0]) => a + e0 - s0, 0);
    assert.equal(fetched, wantBytes, 'bytes fetched = the header + this stage\'s tensors');
    assert.ok(fetched < src.length * 0.6, `${fetched} of ${src.length} bytes`);
    const ranged = hf.requests({ path: `/${ID}/resolve/main/${file}` });
    assert.ok(ranged.length >= 3 && ranged.every((q) => q.range && q.status === 206), 'only range requests');
    // the file is in place at full size: this stage's tensors hold the served bytes, the rest is a hole
    const got = fs.readFileSync(path.join(modelDir(sd), file));
    assert.equal(got.length, src.length);
    assert.ok(got.subarray(0, headerEnd).equals(src.subarray(0, headerEnd)), 'header');
    for (const [name, s0, e0] of tensors) {
      const same = got.subarray(s0, e0).equals(src.subarray(s0, e0));
      if (need.some(([n]) => n === name)) assert.ok(same, `${name} fetched`);
      else assert.ok(got.subarray(s0, e0).every((b) => b === 0), `${name} not fetched`);
    }
    const sparse = JSON.parse(fs.readFileSync(path.join(modelDir(sd), '.exo-ranges.json')));
    assert.deepEqual(sparse.files[file].layers, [start, end]);
    // the same stage again fetches nothing
    const again = await get(hf, sd, ['--layers', `${start}:${end}`]);
    assert.equal(again.code, 0, again.stderr);
    assert.equal(again.result.bytes_fetched, 0);
    hf.log.length = 0;
    if (start === 4) {
      // a whole-model download over the sparse copy fetches the file whole and verifies it
      const whole = await get(hf, sd);
      assert.equal(whole.code, 0, whole.stderr);
      assert.ok(fs.readFileSync(path.join(modelDir(sd), file)).equals(src), 'whole file, verified');
      assert.ok(!fs.existsSync(path.join(modelDir(sd), '.exo-ranges.json')), 'no sparse files left');
    }
  }
  void dir;
  await hf.stop();
});

test('pipeline shard ranges: a connection dropped mid-range resumes from the byte it reached', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel({ nLayers: 8, nShards: 1, layerBytes: 256 * 1024 });
  hf.addModel(ID, files);
  const file = Object.keys(files).find((p) => p.endsWith('.safetensors'));
  const { headerEnd, tensors } = tensorsOf(files[file]);
  hf.faults.dropAfter = { [file]: { times: 4, bytes: 300000 } }; // 2 header requests, then 2 drops
  const sd = tmpdir('rangedrop');
  const r = await get(hf, sd, ['--layers', '4:8']);
  assert.equal(r.code, 0, r.stderr);
  const need = tensors.filter(([name]) => !/embed|layers\.[0-3]\./.test(name));
  const got = fs.readFileSync(path.join(modelDir(sd), file));
  for (const [name, s0, e0] of need) assert.ok(got.subarray(s0, e0).equals(files[file].subarray(s0, e0)), name);
  const wantBytes = headerEnd + need.reduce((a, [, s0, e0]) => a + e0 - s0, 0);
  assert.equal(hf.bytesSent(ID, file), wantBytes, 'no byte fetched twice');
  const ranges = hf.requests({ path: `/${ID}/resolve/main/${file}` }).map((q) => q.range);
  const starts = ranges.map((x) => Number(x.match(/bytes=(\d+)-/)[1]));
  const dataStart = need.reduce((a, [, s0]) => Math.min(a, s0), Infinity);
  assert.ok(starts.includes(dataStart + 300000) && starts.includes(dataStart + 600000),
    `resumed where each drop happened: ${ranges.join(' ')}`);
});

test('pipeline shard ranges: a server that ignores Range gets the file fetched whole', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel({ nLayers: 4, nShards: 1 });
  hf.addModel(ID, files);
  const file = Object.keys(files).find((p) => p.endsWith('.safetensors'));
  hf.faults.ignoreRange = true;
  const sd = tmpdir('norange');
  const r = await get(hf, sd, ['--layers', '0:2']);
  assert.equal(r.code, 0, r.stderr);
  assert.ok(fs.readFileSync(path.join(modelDir(sd), file)).equals(files[file]), 'whole file, verified');
  assert.ok(!fs.existsSync(path.join(modelDir(sd), '.exo-ranges.json')));
});

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

test('peer transfer: node B gets the model from node A with the Hub stopped', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const a = tmpdir('peerA');
  assert.equal((await get(hf, a)).code, 0);
  await hf.stop();

  const port = await freePort();
  const server = spawn(tool, ['serve', '--models-dir', a, '--port', String(port)]);
  await new Promise((r) => server.stdout.once('data', r));
  try {
    const peer = `http://127.0.0.1:${port}`;
    // the peer refuses paths outside a model, and partial files
    const esc = await fetch(`${peer}/models/${ID}/files/..%2F..%2Fetc%2Fpasswd`);
    assert.notEqual(esc.status, 200);
    const b = tmpdir('peerB');
    const r = await get(null, b, ['--peer', peer]);
    assert.equal(r.code, 0, r.stderr);
    assertSameFiles(modelDir(b), files);
    const total = Object.entries(files).filter(([p]) => p !== '.gitattributes').reduce((x, [, v]) => x + v.length, 0);
    assert.equal(r.result.bytes_from_peers, total);
    // a ranged request is answered with 206 and exactly those bytes
    const w = 'model-00002-of-00004.safetensors';
    const part = await fetch(`${peer}/models/${ID}/files/${w}`, { headers: { range: 'bytes=10-19' } });
    assert.equal(part.status, 206);
    assert.ok(Buffer.from(await part.arrayBuffer()).equals(files[w].subarray(10, 20)));
  } finally {
    server.kill('SIGTERM');
  }
});

test('peer without the model: falls back to the Hub', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const empty = tmpdir('peerEmpty');
  const port = await freePort();
  const server = spawn(tool, ['serve', '--models-dir', empty, '--port', String(port)]);
  await new Promise((r) => server.stdout.once('data', r));
  try {
    const b = tmpdir('peerFallback');
    const r = await get(hf, b, ['--peer', `http://127.0.0.1:${port}`]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.result.bytes_from_peers, 0);
    assertSameFiles(modelDir(b), files);
  } finally {
    server.kill('SIGTERM');
    await hf.stop();
  }
});

test('peer with a corrupt file: the bad copy is rejected by its hash and fetched from the Hub', async (t) => {
  const hf = await startHF(t);
  const files = makeTinyModel();
  hf.addModel(ID, files);
  const a = tmpdir('peerCorrupt');
  assert.equal((await get(hf, a)).code, 0);
  const w = 'model-00002-of-00004.safetensors';
  const fd = fs.openSync(path.join(modelDir(a), w), 'r+');
  fs.writeSync(fd, Buffer.from([0x42]), 0, 1, 1000); // same size, different bytes
  fs.closeSync(fd);
  const port = await freePort();
  const server = spawn(tool, ['serve', '--models-dir', a, '--port', String(port)]);
  t.after(() => server.kill('SIGTERM'));
  await new Promise((r) => server.stdout.once('data', r));
  const before = hf.bytesSent(ID, w);
  const b = tmpdir('peerCorruptB');
  const r = await get(hf, b, ['--peer', `http://127.0.0.1:${port}`]);
  assert.equal(r.code, 0, r.stderr);
  assertSameFiles(modelDir(b), files);
  assert.equal(hf.bytesSent(ID, w) - before, files[w].length, 'the corrupt file came again from the Hub');
  const total = Object.entries(files).filter(([p]) => p !== '.gitattributes').reduce((x, [, v]) => x + v.length, 0);
  assert.equal(r.result.bytes_from_peers, total, 'everything else came from the peer');
});

test('search: Hub search through HF_ENDPOINT lists mlx-community first', async (t) => {
  const hf = await startHF(t);
  hf.addModel('someone/Qwen3-tiny', makeTinyModel({ nShards: 1, nLayers: 1, layerBytes: 1024 }));
  hf.extraSearchIds = ['mlx-community/Qwen3-0.6B-4bit', 'other/llama'];
  const r = await new Promise((resolve) => {
    const p = spawn(tool, ['search', 'qwen3', '--limit', '5'], { env: { ...process.env, HF_ENDPOINT: hf.url } });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.on('exit', (code) => resolve({ code, out }));
  });
  assert.equal(r.code, 0);
  const list = JSON.parse(r.out);
  assert.deepEqual(list.map((m) => m.id), ['mlx-community/Qwen3-0.6B-4bit', 'someone/Qwen3-tiny']);
  await hf.stop();
});
