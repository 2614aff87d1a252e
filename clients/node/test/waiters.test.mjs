// Waiter liveness and the claim window (the server change of issue 37,
// problem 4): a waiting handle heartbeats every third of the heartbeat
// timeout and hears QUEUED; a GRANTED is claimed at once with a heartbeat.
// Needs a server with the change (the file WAITERS_READY beside the
// seatgate binary, or $SEATGATE_WAITERS_READY). Against a server that
// answers the old way (a waiter's heartbeat gets SESSION_NOT_ACTIVE) the
// liveness test is skipped, saying so; the claim test runs on both.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client } from '../dist/index.js';
import { events, licensePut, seatgate, sleep, startService, status, waitersReady, WAITERS_READY_FILE, waitForEvent } from './helpers.mjs';

let svc;
let client;
before(async () => {
  svc = await startService();
  // A QUEUED from a server without waiter liveness carries no
  // heartbeat_timeout_ms: assume the licenses' 3 s, so the handle's waiter
  // heartbeats go out every second either way.
  client = await Client.connect({ url: svc.url, defaultHeartbeatTimeoutMs: 3000 });
});
after(async () => {
  await client?.close();
  await svc?.stop();
});

async function license(name) {
  await licensePut(svc, name, ['--seats', '1', '--heartbeat-timeout', '3s']);
  // The claim window, as a license field (a server without it ignores it).
  await svc.redis.con.hset(`seat:{${name}}:license`, 'claim_ms', '2000');
}

/** What a heartbeat of the waiting session answers (seatgate heartbeat with its lease). */
async function waiterHeartbeat(lic, session, lease) {
  const out = await seatgate(svc.url, ['heartbeat', '--license', lic, '--session', session, '--lease', lease, '--json']);
  return JSON.parse(out.stdout);
}

test('a waiting handle keeps its place with heartbeats answered QUEUED', async (t) => {
  await license('live');
  const holder = await client.acquireSeat('live', { session: 'holder' });
  const lease = 'waiterlease0123456789abcdef';
  const positions = [];
  const waiting = client.acquireSeat('live', { session: 'waiter', lease, waitMs: 30000, onQueued: (p) => positions.push(p) });
  await waitForEvent(svc, (e) => e.type === 'queued' && e.session === 'waiter');
  const probe = await waiterHeartbeat('live', 'waiter', lease);
  if (probe.status === 'SESSION_NOT_ACTIVE' && !waitersReady()) {
    t.skip(`the server answers the old way (a waiter's heartbeat gets SESSION_NOT_ACTIVE; no ${WAITERS_READY_FILE}): waiter liveness not testable`);
    await holder.release();
    await (await waiting).release();
    return;
  }
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
  await sleep(2500); // a few waiter heartbeats, whatever the server answers them
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
