// Slow HTTP clients ("slowloris"): connections that send a request line and then drip one
// header line at a time, never finishing their headers. Used by tests/e2e/slow-clients.test.mjs
// and bench/api/slow_clients.mjs.
//
//   const slow = holdSlowConnections({ port, count: 2000 });
//   ... slow.stats() -> { open, opened, closedByServer, refused }
//   slow.stop();
//
// Each connection comes from its own loopback source address in turns (127.0.0.2, 127.0.0.3,
// ...; all of 127.0.0.0/8 is loopback on Linux), perAddress at most per address, so the node's
// per-address connection limit does not simply refuse them: the test is of what thousands of
// held connections do to the node. One that the node closes (its header deadline) is opened
// again at once, so `count` stay open all the time.
import net from 'node:net';
import http from 'node:http';

export function loopbackAddress(i) {
  // 127.0.0.2 .. 127.0.255.254: skip .0 and .255 in the last byte
  const n = i + 2;
  return `127.0.${Math.floor(n / 254)}.${(n % 254) + 1}`;
}

export function holdSlowConnections({ port, count, perAddress = 50, dripMs = 2000 }) {
  const stats = { open: 0, opened: 0, closedByServer: 0, refused: 0 };
  const sockets = new Set();
  let stopping = false;
  const open = (slot) => {
    if (stopping) return;
    const s = net.connect({ port, host: '127.0.0.1', localAddress: loopbackAddress(Math.floor(slot / perAddress)) });
    let connected = false;
    sockets.add(s);
    s.on('connect', () => {
      connected = true;
      stats.open++;
      stats.opened++;
      s.write(`GET /health HTTP/1.1\r\nHost: x\r\n`);
    });
    s.on('error', () => {});
    s.on('data', () => {});
    s.on('close', () => {
      sockets.delete(s);
      if (connected) stats.open--;
      else stats.refused++;
      if (stopping) return;
      if (connected) stats.closedByServer++;
      setTimeout(() => open(slot), connected ? 0 : 100);
    });
  };
  for (let i = 0; i < count; i++) open(i);
  let k = 0;
  const drip = setInterval(() => {
    k++;
    for (const s of sockets) if (s.writable) s.write(`X-Slow-${k}: a\r\n`);
  }, dripMs);
  return {
    stats: () => ({ ...stats }),
    stop() {
      stopping = true;
      clearInterval(drip);
      for (const s of sockets) s.destroy();
    },
  };
}

// One request on a fresh connection (no keep-alive pool: each probe pays the accept, as a new
// client would). Resolves to { status, ms, body }.
export function timedRequest(url, { method = 'GET', body, timeoutMs = 60000 } = {}) {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const req = http.request(url, { method, agent: false, timeout: timeoutMs,
      headers: body ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } : {} },
    (res) => {
      let data = '';
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, ms: performance.now() - t0, body: data }));
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

export function percentile(values, p) {
  const v = [...values].sort((a, b) => a - b);
  return v.length ? v[Math.min(v.length - 1, Math.floor((p / 100) * v.length))] : NaN;
}
