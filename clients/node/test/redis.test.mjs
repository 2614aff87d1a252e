// Redis mode against a real redis-server and `seatgate run`: a seat's life,
// the wait queue, policy fields, a lost seat, and the errors people read.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client, SeatgateError } from '../dist/index.js';
import { events, freePort, licensePut, seatgateOk, sleep, startService, status, waitForEvent } from './helpers.mjs';

let svc;
let client;
before(async () => {
  svc = await startService();
  client = await Client.connect({ url: svc.url, application: 'nodetest' });
});
after(async () => {
  await client?.close();
  await svc?.stop();
});

test('acquire, heartbeat at a third of the timeout, release', async () => {
  await licensePut(svc, 'life', ['--seats', '2', '--heartbeat-timeout', '1500ms']);
  const seat = await client.acquireSeat('life', { session: 'ws-1', user: 'ada', meta: { host: 'pc-1' } });
  assert.equal(seat.grant.status, 'ACQUIRED');
  assert.equal(seat.heartbeatTimeoutMs, 1500);
  assert.match(seat.lease, /^[0-9a-f]{32}$/);
  assert.ok(client.replyStream.startsWith('seat:reply:nodetest:'), client.replyStream);
  const beats = [];
  seat.on('heartbeat', (r) => beats.push(r.status));
  await sleep(1700);
  // every 500 ms: 3 in 1.7 s (the first 500 ms after the grant)
  assert.ok(seat.heartbeats >= 2 && seat.heartbeats <= 4, `${seat.heartbeats} heartbeats`);
  assert.ok(beats.every((s) => s === 'HEARTBEAT_UPDATED'));
  const held = (await status(svc, 'life')).licenses[0];
  assert.equal(held.seats_used, 1);
  assert.equal(held.holders[0].session, 'ws-1');
  assert.equal(held.holders[0].user, 'ada');
  assert.ok(held.holders[0].heartbeats >= 2);
  assert.equal(held.holders[0].leased, true);
  const gone = await seat.release();
  assert.equal(gone.outcome, 'released');
  assert.equal(gone.reply.status, 'RELEASED');
  assert.equal(seat.state, 'released');
  assert.equal((await status(svc, 'life')).licenses[0].seats_used, 0);
  // A second release is the same answer, not a second request.
  assert.equal((await seat.release()).outcome, 'released');
  const evs = (await events(svc)).filter((e) => e.license === 'life').map((e) => e.type);
  assert.deepEqual(evs, ['acquired', 'released']);
});

test('QUEUED, then GRANTED when the holder releases; the grant is claimed at once', async () => {
  await licensePut(svc, 'one', ['--seats', '1']);
  const holder = await client.acquireSeat('one', { session: 'holder' });
  const positions = [];
  const waiting = client.acquireSeat('one', { session: 'waiter', waitMs: 20000, onQueued: (p) => positions.push(p) });
  await waitForEvent(svc, (e) => e.type === 'queued' && e.session === 'waiter');
  assert.deepEqual(positions.slice(0, 1), [1]);
  const t0 = Date.now();
  assert.equal((await holder.release()).outcome, 'released');
  const seat = await waiting;
  assert.equal(seat.grant.status, 'GRANTED');
  assert.ok(Date.now() - t0 < 2000, `granted ${Date.now() - t0} ms after the release`);
  // Claimed: its first heartbeat went out at once and was answered.
  assert.ok(seat.heartbeats >= 1, `${seat.heartbeats} heartbeats`);
  const evs = (await events(svc)).filter((e) => e.license === 'one').map((e) => `${e.type}:${e.session}`);
  assert.deepEqual(evs, ['acquired:holder', 'queued:waiter', 'released:holder', 'granted:waiter']);
  assert.equal((await seat.release()).outcome, 'released');
});

test('a refusal is a SeatgateError whose code is the status; a wait that runs out is QUEUE_TIMEOUT', async () => {
  await licensePut(svc, 'full', ['--seats', '1']);
  const holder = await client.acquireSeat('full', { session: 'h' });
  await assert.rejects(client.acquireSeat('full', { session: 'x' }), (e) => {
    assert.ok(e instanceof SeatgateError);
    assert.equal(e.code, 'NO_SEATS_AVAILABLE');
    assert.equal(e.reply.status, 'NO_SEATS_AVAILABLE');
    assert.match(e.message, /^acquire of full\/x refused: NO_SEATS_AVAILABLE: no free seat/);
    assert.ok(!e.message.includes('\n'));
    return true;
  });
  await assert.rejects(client.acquireSeat('full', { session: 'y', waitMs: 1000 }), (e) => e.code === 'QUEUE_TIMEOUT');
  await assert.rejects(client.acquireSeat('nosuch', { session: 'z' }), (e) => e.code === 'LICENSE_NOT_FOUND');
  await assert.rejects(client.acquireSeat('full', { session: 'bad id' }), (e) => e.code === 'INVALID_ARGUMENT');
  await holder.release();
});

test('an aborted wait leaves the queue', async () => {
  await licensePut(svc, 'abort', ['--seats', '1']);
  const holder = await client.acquireSeat('abort', { session: 'h' });
  const ac = new AbortController();
  const waiting = client.acquireSeat('abort', { session: 'w', waitMs: 30000, signal: ac.signal });
  await waitForEvent(svc, (e) => e.type === 'queued' && e.session === 'w');
  ac.abort();
  await assert.rejects(waiting, (e) => e.code === 'ABORTED');
  await waitForEvent(svc, (e) => e.type === 'left_queue' && e.session === 'w');
  await holder.release();
  assert.equal((await status(svc, 'abort')).licenses[0].seats_used, 0);
});

test('policy fields reach the server: user, group, priority, borrow_ms', async () => {
  await licensePut(svc, 'pol', ['--seats', '2', '--max-priority', '5', '--max-borrow', '1h', '--group-max', 'eng=2']);
  const borrowed = await client.acquireSeat('pol', { session: 'b-1', user: 'ada', group: 'eng', borrowMs: 600000 });
  assert.equal(borrowed.grant.status, 'ACQUIRED');
  assert.ok(Number(borrowed.grant.borrowed_until_ms) > Date.now() + 590000, borrowed.grant.borrowed_until_ms);
  const other = await client.acquireSeat('pol', { session: 'b-2', user: 'bob', group: 'eng' });
  const positions = [];
  const waiting = client.acquireSeat('pol', { session: 'b-3', user: 'eve', priority: 3, waitMs: 20000, onQueued: (p) => positions.push(p) });
  const queued = await waitForEvent(svc, (e) => e.type === 'queued' && e.session === 'b-3');
  assert.equal(queued.priority, '3');
  assert.equal(queued.user, 'eve'); // the shared stream keeps ids as sent
  const st = (await status(svc, 'pol')).licenses[0];
  const ada = st.holders.find((h) => h.session === 'b-1');
  assert.equal(ada.user, 'ada');
  assert.equal(ada.group, 'eng');
  assert.ok(ada.borrowed_until_ms > Date.now());
  assert.equal(st.seats_borrowed, 1);
  assert.equal(st.queue[0].session, 'b-3');
  assert.equal(st.queue[0].priority, 3);
  const acquired = (await events(svc)).find((e) => e.type === 'acquired' && e.session === 'b-1');
  assert.equal(acquired.group, 'eng');
  assert.equal(acquired.user, 'ada');
  assert.ok(acquired.borrowed_until_ms);
  await other.release();
  const granted = await waiting;
  assert.equal(granted.grant.status, 'GRANTED');
  assert.deepEqual(positions.slice(0, 1), [1]);
  await granted.release();
  await borrowed.release();
});

test('a revoked seat is lost: the event, the promise and the state say SESSION_REVOKED', async () => {
  await licensePut(svc, 'rev', ['--seats', '1', '--heartbeat-timeout', '1200ms']);
  const seat = await client.acquireSeat('rev', { session: 'laptop-42' });
  const heard = new Promise((res) => seat.once('lost', res));
  await seatgateOk(svc.url, ['revoke', '--license', 'rev', '--session', 'laptop-42', '--reason', 'left the company', '--actor', 'ada']);
  const loss = await seat.lost;
  assert.equal(loss.status, 'SESSION_REVOKED');
  assert.match(loss.error, /revoked by ada: left the company/);
  assert.equal((await heard).status, 'SESSION_REVOKED');
  assert.equal(seat.state, 'lost');
  assert.ok(!client.heldSeats.includes(seat));
  const gone = await seat.release();
  assert.equal(gone.outcome, 'already_gone');
  assert.equal(gone.reply.status, 'SESSION_REVOKED');
});

test('Redis unreachable: REDIS_UNAVAILABLE, one line naming Redis', async () => {
  const port = await freePort();
  const t0 = Date.now();
  await assert.rejects(Client.connect({ url: `redis://:secret@127.0.0.1:${port}`, connectTimeoutMs: 1000 }), (e) => {
    assert.ok(e instanceof SeatgateError);
    assert.equal(e.code, 'REDIS_UNAVAILABLE');
    assert.match(e.message, new RegExp(`^cannot connect to Redis at redis://:\\*\\*\\*@127.0.0.1:${port}`));
    assert.ok(!e.message.includes('secret'));
    assert.ok(!e.message.includes('\n'));
    return true;
  });
  assert.ok(Date.now() - t0 < 3000);
});
