// Serves one big generated file through the fake Hub (tree + resolve, like huggingface.co) for
// the download throughput benchmark. Prints the URL on stdout, then serves until killed.
//   node bench/download/serve.mjs FILE [CDN_URL]
// With CDN_URL the Hub answers the file's resolve with a 302 to CDN_URL, as huggingface.co
// redirects LFS files to its CDN; the bytes then come from that server.
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
const cdn = process.argv[3];
if (cdn) hf.cdn = () => cdn;
console.log(hf.url);
