// Serves one big generated file through the fake Hub (tree + resolve, like huggingface.co) for
// the download throughput benchmark. Prints the URL on stdout, then serves until killed.
//   node bench/download/serve.mjs FILE
import crypto from 'node:crypto';
import fs from 'node:fs';
import { FakeHF } from '../../tests/e2e/lib/fake-hf.mjs';

const file = process.argv[2];
const sha = await new Promise((resolve) => {
  const h = crypto.createHash('sha256');
  fs.createReadStream(file, { highWaterMark: 1 << 22 }).on('data', (c) => h.update(c)).on('end', () => resolve(h.digest('hex')));
});
const hf = await new FakeHF().start();
hf.addDiskFile('bench/big', 'model.safetensors', file, sha);
console.log(hf.url);
