// Waiter liveness and the claim window (docs/protocol.md, "Waiter liveness
// and the claim window"): a waiting handle heartbeats every third of the
// heartbeat timeout and hears QUEUED; a GRANTED is claimed at once with a
// heartbeat, so the claim window (2 s here) never takes it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client } from '../dist/index.js';
import { events, licensePut, seatgate, sleep, startService, status, waitForEvent } from './helpers.mjs';

let svc;
let client;
before(async () => {
  svc = await startService({ SEATGATE__QUEUE__CLAIM_MS: '2000' });
  client = await Client.connect({ url: svc.url });
});
after(async () => {
  await client?.close();
  await svc?.stop();
});

async function license(name) {
  await licensePut(svc, name, ['--seats', '1', '--heartbeat-timeout', '3s']);
}

/** What a heartbeat of the waiting session answers (seatgate heartbeat with its lease). */
async function waiterHeartbeat(lic, session, lease) {
  const out = await seatgate(svc.url, ['heartbeat', '--license', lic, '--session', session, '--lease', lease, '--json']);
  return JSON.parse(out.stdout);
}

test('a waiting handle keeps its place with heartbeats answered QUEUED', async () => {
  await license('live');
  const holder = await client.acquireSeat('live', { session: 'holder' });
  const lease = 'waiterlease0123456789abcdef';
  const positions = [];
  const waiting = client.acquireSeat('live', { session: 'waiter', lease, waitMs: 30000, onQueued: (p) => positions.push(p) });
  // A failed assertion must not leave the wait running unobserved.
  waiting.catch(() => {});
  await waitForEvent(svc, (e) => e.type === 'queued' && e.session === 'waiter');
  const probe = await waiterHeartbeat('live', 'waiter', lease);
  assert.equal(probe.status, 'QUEUED', JSON.stringify(probe));
  assert.equal(probe.position, '1');
  assert.equal(probe.heartbeat_timeout_ms, '3000');
  // Past the heartbeat timeout, still waiting: the handle's heartbeats kept the place.
  await sleep(4500);
  assert.ok(positions.length >= 3, `told the place ${positions.length} times: ${positions}`);
  assert.ok(positions.every((p) => p === 1));
  const st = (await status(svc, 'live')).licenses[0];
  assert.deepEqual(st.queue.map((w) => w.session), ['waiter']);
  assert.ok(!(await events(svc)).some((e) => e.type === 'queue_timeout' && e.session === 'waiter'));
  await holder.release();
  const seat = await waiting;
  assert.equal(seat.grant.status, 'GRANTED');
  await seat.release();
});

test('a GRANTED is claimed at once: no unclaimed eviction after the claim window', async () => {
  await license('claim');
  const holder = await client.acquireSeat('claim', { session: 'holder' });
  const waiting = client.acquireSeat('claim', { session: 'grantee', waitMs: 30000 });
  await waitForEvent(svc, (e) => e.type === 'queued' && e.session === 'grantee');
  await sleep(2500); // a few waiter heartbeats
  await holder.release();
  const seat = await waiting;
  assert.equal(seat.grant.status, 'GRANTED');
  assert.ok(seat.heartbeats >= 1, 'claimed before acquireSeat resolved');
  await sleep(3000); // past claim_ms (2 s)
  assert.equal(seat.state, 'held');
  const evs = (await events(svc)).filter((e) => e.license === 'claim');
  assert.ok(!evs.some((e) => e.type === 'evicted'), JSON.stringify(evs));
  const st = (await status(svc, 'claim')).licenses[0];
  assert.deepEqual(st.holders.map((h) => h.session), ['grantee']);
  assert.equal((await seat.release()).outcome, 'released');
});
