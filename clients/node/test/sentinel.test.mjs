// Redis Sentinel: the client finds the master through real Sentinels
// (redis-server --sentinel, ioredis's own Sentinel support), and a seat
// handle keeps its seat when the master is killed -9 and a replica
// promoted. `seatgate run` is in Sentinel mode too (SEATGATE__REDIS__SENTINEL__*):
// its --redis URL names no server.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client, SeatgateError } from '../dist/index.js';
import { seatgate, seatgateOk, sleep, startSentinel, startWorker, waitFor } from './helpers.mjs';

/** In Sentinel mode the URL is unused: it names no server at all. */
const NOWHERE = 'redis://127.0.0.1:1';

let dep;
let worker;
before(async () => {
  dep = await startSentinel(1, 3);
  await seatgateOk(NOWHERE, ['license', 'put', 'cad', '--seats', '3', '--heartbeat-timeout', '9s'], dep.env);
  worker = await startWorker(NOWHERE, dep.env);
});
after(async () => {
  worker?.stop();
  await dep?.stop();
});

/** The sessions holding seats of `license`, as `seatgate status` reads them through the Sentinels. */
async function holders(license) {
  const out = JSON.parse(await seatgateOk(NOWHERE, ['status', '--json', '--license', license], dep.env));
  return (out.licenses[0].holders ?? []).map((h) => h.session).sort();
}

test('connect needs a url, or sentinels with a name', async () => {
  for (const [o, says] of [
    [{}, 'url'],
    [{ sentinels: [{ host: '127.0.0.1', port: 26379 }] }, 'name'],
    [{ sentinels: [{ host: '127.0.0.1', port: 26379 }], name: 'm', url: 'redis://x' }, 'not both'],
    [{ sentinels: [{ host: '127.0.0.1' }], name: 'm' }, '{ host, port }'],
    [{ sentinels: [], name: 'm' }, 'no Sentinel'],
    [{ url: 'redis://127.0.0.1:1', name: 'm' }, 'goes with sentinels'],
  ]) {
    await assert.rejects(Client.connect(o), (e) => {
      assert.ok(e instanceof SeatgateError);
      assert.equal(e.code, 'INVALID_ARGUMENT');
      assert.ok(e.message.includes(says), `${JSON.stringify(o)}: ${e.message}`);
      return true;
    });
  }
});

test('no Sentinel answering is REDIS_UNAVAILABLE naming the Sentinels', async () => {
  const t0 = Date.now();
  await assert.rejects(
    Client.connect({ sentinels: [{ host: '127.0.0.1', port: 1 }], name: 'seatgate', connectTimeoutMs: 1000 }),
    (e) => {
      assert.equal(e.code, 'REDIS_UNAVAILABLE');
      assert.ok(e.message.includes('the Sentinels at 127.0.0.1:1'), e.message);
      return true;
    },
  );
  assert.ok(Date.now() - t0 < 5000, `${Date.now() - t0} ms`);
});

test('a seat handle keeps its seat when the master is killed and a replica promoted', async () => {
  const logs = [];
  const client = await Client.connect({
    sentinels: dep.sentinels,
    name: 'seatgate',
    requestTimeoutMs: 1000,
    giveUpAfterMs: 60_000,
    logger: (l, m) => logs.push(`${l} ${m}`),
  });
  try {
    assert.ok(client.where.includes('"seatgate" of the Sentinels at 127.0.0.1:'), client.where);
    const seat = await client.acquireSeat('cad', { session: 'before' });
    assert.equal(seat.grant.status, 'ACQUIRED');
    assert.equal(seat.heartbeatTimeoutMs, 9000);
    await waitFor('a heartbeat answered', () => seat.heartbeats >= 1, 5000);

    const victim = await dep.masterPort();
    assert.ok(victim, 'the Sentinels name a master');
    const node = dep.node(victim);
    // The seat is on the replica before the kill (replication is
    // asynchronous: this test is about following the master, not about
    // writes the replica never got).
    assert.ok(Number(await node.con.call('WAIT', 1, 5000)) >= 1, 'the replica has the seat');
    assert.deepEqual(await holders('cad'), ['before']);

    node.kill9();
    const killed = Date.now();
    // An acquire sent while there is no master: sent again until the
    // promoted one's workers answer.
    const during = client.acquireSeat('cad', { session: 'during' });
    during.catch(() => undefined);
    const promoted = await dep.promoted(victim, 30000);
    const took = Date.now() - killed;
    const beatsAtPromotion = seat.heartbeats;

    // The handle's own heartbeats (every 3 s), answered on the new master.
    const until = Date.now() + 20000;
    while (seat.heartbeats < beatsAtPromotion + 2) {
      assert.ok(Date.now() < until, `heartbeats stalled at ${seat.heartbeats}: ${logs.join('\n')}`);
      await sleep(100);
    }
    assert.equal(seat.state, 'held', JSON.stringify(seat.loss));

    const inFailover = await during;
    assert.equal(inFailover.grant.status, 'ACQUIRED');

    // A new acquire and a release, through the same client.
    const other = await client.acquireSeat('cad', { session: 'after' });
    assert.equal(other.grant.status, 'ACQUIRED');
    assert.deepEqual(await holders('cad'), ['after', 'before', 'during']);
    // The license's three seats are taken: a fourth session is refused.
    await assert.rejects(client.acquireSeat('cad', { session: 'fourth' }), (e) => e.code === 'NO_SEATS_AVAILABLE');
    for (const s of [other, inFailover]) assert.equal((await s.release()).outcome, 'released');
    assert.deepEqual(await holders('cad'), ['before']);

    // The promoted node holds it, as a master.
    assert.equal(await dep.role(dep.node(promoted)), 'master');
    assert.equal((await seat.release()).outcome, 'released');
    assert.deepEqual(await holders('cad'), []);
    console.log(
      `master :${victim} killed, :${promoted} promoted after ${(took / 1000).toFixed(1)} s; ` +
        `${seat.heartbeats} heartbeats answered (${seat.heartbeats - beatsAtPromotion} after the promotion)`,
    );
  } finally {
    await client.close();
  }
  await waitFor('the worker ready on the new master', () => worker.ready(), 10000);
  // The CLI finds the new master too.
  const out = await seatgate(NOWHERE, ['check-config'], dep.env);
  assert.equal(out.code, 0, out.stderr);
});
