// A local stand-in for the Hugging Face Hub: the tree / resolve / search endpoints exo uses,
// over generated tiny models, with switchable faults (dropped connections, corrupt bytes,
// 429 + Retry-After, auth, throttling) and a log of what was requested and sent.
import http from 'node:http';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

const sha256 = (buf) => crypto.createHash('sha256').update(buf).digest('hex');
const gitSha1 = (buf) =>
  crypto.createHash('sha1').update(`blob ${buf.length}\0`).update(buf).digest('hex');

// A safetensors file: 8-byte little-endian header length, JSON header, raw tensor bytes.
// tensors: [{name, bytes}] -> F32 tensors of bytes/4 elements filled from a seeded pattern.
export function makeSafetensors(tensors, seed = 1) {
  const header = {};
  let off = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: 'F32', shape: [t.bytes / 4], data_offsets: [off, off + t.bytes] };
    off += t.bytes;
  }
  let json = JSON.stringify(header);
  while ((8 + json.length) % 8) json += ' ';
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(json.length));
  const data = Buffer.alloc(off);
  let x = seed * 2654435761 >>> 0;
  for (let i = 0; i < off; i += 4) {
    x = (x * 1664525 + 1013904223) >>> 0;
    data.writeUInt32LE(x, i);
  }
  return Buffer.concat([head, Buffer.from(json), data]);
}

// A tiny llama-like model: nLayers layers spread over nShards safetensors files, embeddings in
// the first shard, final norm + lm_head in the last, plus config/tokenizer files.
export function makeTinyModel({ nLayers = 4, nShards = 4, layerBytes = 64 * 1024, seed = 1 } = {}) {
  const files = {};
  const weightMap = {};
  const perShard = Math.ceil(nLayers / nShards);
  for (let s = 0; s < nShards; s++) {
    const name = `model-${String(s + 1).padStart(5, '0')}-of-${String(nShards).padStart(5, '0')}.safetensors`;
    const tensors = [];
    if (s === 0) tensors.push({ name: 'model.embed_tokens.weight', bytes: layerBytes });
    for (let l = s * perShard; l < Math.min(nLayers, (s + 1) * perShard); l++) {
      tensors.push({ name: `model.layers.${l}.self_attn.q_proj.weight`, bytes: layerBytes / 2 });
      tensors.push({ name: `model.layers.${l}.mlp.down_proj.weight`, bytes: layerBytes / 2 });
    }
    if (s === nShards - 1) {
      tensors.push({ name: 'model.norm.weight', bytes: 256 });
      tensors.push({ name: 'lm_head.weight', bytes: layerBytes });
    }
    for (const t of tensors) weightMap[t.name] = name;
    files[name] = makeSafetensors(tensors, seed * 100 + s);
  }
  files['config.json'] = Buffer.from(JSON.stringify({
    architectures: ['LlamaForCausalLM'], model_type: 'llama', num_hidden_layers: nLayers,
    hidden_size: 64, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 128,
    max_position_embeddings: 2048, vocab_size: 256, torch_dtype: 'float32',
    tie_word_embeddings: false,
  }, null, 2));
  files['model.safetensors.index.json'] = Buffer.from(JSON.stringify({
    metadata: { total_size: Object.values(files).reduce((a, b) => a + b.length, 0) },
    weight_map: weightMap,
  }, null, 2));
  files['tokenizer_config.json'] = Buffer.from('{"bos_token":"<s>","eos_token":"</s>"}');
  files['tokenizer.json'] = Buffer.from(JSON.stringify({ version: '1.0', model: { type: 'BPE', vocab: {} } }));
  files['README.md'] = Buffer.from('# tiny test model\n');
  files['.gitattributes'] = Buffer.from('*.safetensors filter=lfs diff=lfs merge=lfs -text\n');
  return files;
}

export class FakeHF {
  constructor() {
    this.models = new Map(); // id -> Map(path -> {buf?, diskPath?, size, sha256, sha1, lfs})
    this.faults = {};
    this.log = []; // {t, method, path, range, status, auth}
    this.sent = new Map(); // "id/path" -> bytes of body sent
    this.sockets = new Set();
    this.cdn = null; // (id, path) -> URL: LFS files answer 302 to it (the Hub's CDN redirect)
  }

  addModel(id, files) {
    const m = new Map();
    for (const [p, buf] of Object.entries(files)) {
      const lfs = p.endsWith('.safetensors') || buf.length > 4096;
      m.set(p, { buf, size: buf.length, sha256: sha256(buf), sha1: gitSha1(buf), lfs });
    }
    this.models.set(id, m);
    return m;
  }

  // Every file of a model directory on disk (dotfiles, e.g. our own markers, left out).
  addModelDir(id, dir) {
    const files = {};
    for (const f of fs.readdirSync(dir)) if (!f.startsWith('.')) files[f] = fs.readFileSync(path.join(dir, f));
    return this.addModel(id, files);
  }

  // A big file served from disk (benchmarks): sha256 given by the caller.
  addDiskFile(id, p, diskPath, sha) {
    if (!this.models.has(id)) this.models.set(id, new Map());
    const size = fs.statSync(diskPath).size;
    this.models.get(id).set(p, { diskPath, size, sha256: sha, sha1: '0'.repeat(40), lfs: true });
  }

  bytesSent(id, p) { return this.sent.get(`${id}/${p}`) || 0; }
  totalSent(id) {
    let n = 0;
    for (const [k, v] of this.sent) if (k.startsWith(id + '/')) n += v;
    return n;
  }
  requests(filter = {}) {
    return this.log.filter((r) => Object.entries(filter).every(([k, v]) => r[k] === v));
  }

  async start(port = 0) {
    this.server = http.createServer((req, res) => this.handle(req, res));
    this.server.on('connection', (s) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
    await new Promise((r) => this.server.listen(port, '127.0.0.1', r));
    this.port = this.server.address().port;
    this.url = `http://127.0.0.1:${this.port}`;
    return this;
  }

  async stop() {
    if (!this.server) return;
    for (const s of this.sockets) s.destroy();
    await new Promise((r) => this.server.close(r));
    this.server = null;
  }

  record(req, pathName, status) {
    this.log.push({ t: Date.now(), method: req.method, path: pathName, range: req.headers.range || null,
      status, auth: req.headers.authorization || null });
  }

  fail(res, status, msg, headers = {}) {
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(JSON.stringify({ error: msg }));
  }

  handle(req, res) {
    const u = new URL(req.url, 'http://x');
    const f = this.faults;
    if (f.requireToken && req.headers.authorization !== `Bearer ${f.requireToken}`) {
      this.record(req, u.pathname, 401);
      return this.fail(res, 401, 'Invalid credentials in Authorization header');
    }
    let m;
    if ((m = u.pathname.match(/^\/api\/models\/([^/]+\/[^/]+)\/tree\/([^/]+)$/))) {
      const model = this.models.get(m[1]);
      this.record(req, u.pathname, model ? 200 : 404);
      if (!model) return this.fail(res, 404, 'Repository not found');
      const list = [];
      for (const [p, e] of model) {
        const item = { type: 'file', oid: e.sha1, size: e.size, path: p };
        if (e.lfs) item.lfs = { oid: e.sha256, size: e.size, pointerSize: 134 };
        if (this.faults.treeWithoutHashes) { delete item.oid; delete item.lfs; }
        list.push(item);
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify(list));
    }
    if (u.pathname === '/api/models') {
      this.record(req, u.pathname, 200);
      const q = (u.searchParams.get('search') || '').toLowerCase();
      const limit = Number(u.searchParams.get('limit') || 20);
      const ids = [...this.models.keys(), ...(this.extraSearchIds || [])];
      const out = ids.filter((id) => id.toLowerCase().includes(q)).slice(0, limit)
        .map((id, i) => ({ id, modelId: id, downloads: 1000 - i, likes: 10, tags: ['mlx'] }));
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify(out));
    }
    if ((m = u.pathname.match(/^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/))) {
      return this.resolve(req, res, m[1], decodeURIComponent(m[3]), u.pathname);
    }
    this.record(req, u.pathname, 404);
    this.fail(res, 404, 'no route');
  }

  resolve(req, res, id, p, pathName) {
    const f = this.faults;
    const e = this.models.get(id)?.get(p);
    if (!e) {
      this.record(req, pathName, 404);
      return this.fail(res, 404, 'Entry not found');
    }
    const key = `${id}/${p}`;
    if (f.rateLimit?.[p] > 0) {
      f.rateLimit[p]--;
      this.record(req, pathName, 429);
      return this.fail(res, 429, 'rate limited', { 'retry-after': String(f.retryAfter ?? 1) });
    }
    const headers = {
      'accept-ranges': 'bytes', 'content-type': 'application/octet-stream',
      etag: `"${e.lfs ? e.sha256 : e.sha1}"`,
    };
    if (e.lfs) {
      headers['x-linked-size'] = String(e.size);
      headers['x-linked-etag'] = `"${e.sha256}"`;
    }
    if (e.lfs && this.cdn) { // like huggingface.co: LFS bytes come from a CDN host via a redirect
      this.record(req, pathName, 302);
      res.writeHead(302, { ...headers, location: this.cdn(id, p), 'content-length': '0' });
      return res.end();
    }
    let start = 0, end = e.size - 1, status = 200;
    const range = f.ignoreRange ? undefined : req.headers.range; // ignoreRange: an old server
    if (range) {
      const r = range.match(/^bytes=(\d+)-(\d*)$/);
      if (!r || Number(r[1]) >= e.size) {
        this.record(req, pathName, 416);
        res.writeHead(416, { 'content-range': `bytes */${e.size}` });
        return res.end();
      }
      start = Number(r[1]);
      if (r[2]) end = Math.min(Number(r[2]), e.size - 1);
      status = 206;
      headers['content-range'] = `bytes ${start}-${end}/${e.size}`;
    }
    headers['content-length'] = String(end - start + 1);
    this.record(req, pathName, status);
    res.writeHead(status, headers);
    if (req.method === 'HEAD') return res.end();

    let body;
    if (e.buf) {
      body = Buffer.from(e.buf.subarray(start, end + 1));
      if (f.corrupt?.[p] > 0) {
        f.corrupt[p]--;
        body[Math.floor(body.length / 2)] ^= 0xff;
      }
    }
    const drop = f.dropAfter?.[p];
    let limit = end - start + 1;
    if (drop && drop.times > 0) {
      drop.times--;
      limit = Math.min(limit, drop.bytes);
    }
    const count = (n) => this.sent.set(key, (this.sent.get(key) || 0) + n);
    const finish = () => {
      if (limit < end - start + 1) req.socket.destroy(); // connection drops mid-file
      else res.end();
    };
    if (!e.buf) { // disk file: stream
      const s = fs.createReadStream(e.diskPath, { start, end: start + limit - 1, highWaterMark: 1 << 20 });
      s.on('data', (c) => count(c.length));
      s.pipe(res, { end: false });
      s.on('end', finish);
      return;
    }
    const rate = f.bytesPerSec;
    if (!rate) {
      count(limit);
      return res.write(body.subarray(0, limit), finish); // finish once the bytes are flushed
    }
    let off = 0;
    const chunk = Math.max(1024, Math.floor(rate / 20));
    const tick = () => {
      if (res.destroyed) return;
      if (off >= limit) return finish();
      const n = Math.min(chunk, limit - off);
      count(n);
      off += n;
      res.write(body.subarray(off - n, off), () => setTimeout(tick, 50));
    };
    tick();
  }
}
