// A short soak (bench/soak.mjs): 20 s of random arrivals, client disconnects and /v1/cancel
// against a node with a small KV cache (so sequences are preempted and cached prefixes evicted);
// every request ends cleanly, /metrics shows no KV block held and nothing queued afterwards, the
// runner never restarts and resident memory stays flat. The 10-minute run is in bench/RESULTS.md.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { soak } from '../../bench/soak.mjs';

test('soak: random arrivals and cancels leak no KV blocks and no memory', { timeout: 120000 }, async () => {
  const s = await soak({ duration: 20, concurrency: 10, sampleEvery: 1, log: () => {} });
  assert.deepEqual(s.failures, []);
  assert.ok(s.completed > 20, `only ${s.completed} requests completed`);
  assert.ok(s.disconnected + s.cancelled > 5, 'too few cancellations to mean anything');
  assert.equal(s.kvBlocksUsedEnd, 0);
  assert.ok(s.kvBlocksUsedPeak > 0, 'the KV gauge never moved');
});
