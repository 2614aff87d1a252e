// Honest release through a frozen Redis: redis-server is SIGSTOPped while
// the release goes out, the handle keeps sending (same lease, new ids after
// each request timeout) and reports what the service decided once it
// answers: released, and the events stream shows it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client } from '../dist/index.js';
import { events, licensePut, sleep, startService, status } from './helpers.mjs';

let svc;
before(async () => {
  svc = await startService();
});
after(async () => {
  await svc?.stop();
});

test('a release sent while Redis is frozen for 4 s reports released', async () => {
  await licensePut(svc, 'frozen', ['--seats', '1', '--heartbeat-timeout', '30s']);
  const logs = [];
  const client = await Client.connect({ url: svc.url, requestTimeoutMs: 1000, logger: (l, m) => logs.push(`${l} ${m}`) });
  try {
    const seat = await client.acquireSeat('frozen', { session: 'ice' });
    svc.redis.freeze();
    const t0 = Date.now();
    const releasing = seat.release();
    let thawed = false;
    const thaw = sleep(4000).then(() => {
      svc.redis.thaw();
      thawed = true;
    });
    const result = await releasing;
    await thaw;
    const took = Date.now() - t0;
    assert.ok(thawed, 'answered only after Redis came back');
    assert.equal(result.outcome, 'released', JSON.stringify(result));
    assert.equal(result.reply.status, 'RELEASED');
    assert.ok(took >= 3900 && took < 15000, `${took} ms`);
    const evs = (await events(svc)).filter((e) => e.license === 'frozen').map((e) => `${e.type}:${e.session}`);
    assert.deepEqual(evs, ['acquired:ice', 'released:ice']);
    assert.equal((await status(svc, 'frozen')).licenses[0].seats_used, 0);
    console.log(`released after ${took} ms through a 4 s freeze`);
  } finally {
    svc.redis.thaw();
    await client.close();
  }
});

test('a release nobody answers before the heartbeat timeout ends in unknown, not an error', async () => {
  await licensePut(svc, 'gone', ['--seats', '1', '--heartbeat-timeout', '1500ms']);
  const client = await Client.connect({ url: svc.url, requestTimeoutMs: 500, giveUpAfterMs: 1000 });
  try {
    const seat = await client.acquireSeat('gone', { session: 'far' });
    svc.worker.stop(); // nobody decides anything any more
    await sleep(100);
    const t0 = Date.now();
    const result = await seat.release();
    const took = Date.now() - t0;
    assert.equal(result.outcome, 'unknown');
    assert.ok(took >= 900 && took < 4000, `${took} ms`);
  } finally {
    await client.close();
  }
});

test('an acquire while Redis is out of memory says so', async () => {
  // Redis full (maxmemory below used memory, noeviction) refuses every XADD with OOM.
  await licensePut(svc, 'full', ['--seats', '1']);
  const logs = [];
  const client = await Client.connect({
    url: svc.url,
    requestTimeoutMs: 300,
    giveUpAfterMs: 1200,
    logger: (l, m) => logs.push(`${l} ${m}`),
  });
  try {
    await svc.redis.con.setrange('ballast', 8 * 1024 * 1024, 'x');
    await svc.redis.con.config('SET', 'maxmemory', '4mb');
    await assert.rejects(client.acquireSeat('full', { session: 's1' }), (e) => {
      assert.equal(e.code, 'REDIS_UNAVAILABLE', e.message);
      assert.match(e.message, /Redis is out of memory \(OOM\).*maxmemory/);
      return true;
    });
    assert.ok(logs.some((l) => l.includes('Redis is out of memory (OOM)')), logs.join('\n'));
  } finally {
    await svc.redis.con.del('ballast');
    await svc.redis.con.config('SET', 'maxmemory', '0');
    await client.close();
  }
});
