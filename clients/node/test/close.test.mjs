// close() ends within 2 s while the reply reader is blocked in XREAD,
// 100 times in a row, and leaves no connection behind.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client } from '../dist/index.js';
import { licensePut, sleep, startService, status } from './helpers.mjs';

let svc;
before(async () => {
  svc = await startService();
});
after(async () => {
  await svc?.stop();
});

async function clients() {
  const info = await svc.redis.con.info('clients');
  return Number(/connected_clients:(\d+)/.exec(info)[1]);
}

async function blockedReads() {
  const list = await svc.redis.con.client('LIST');
  return list.split('\n').filter((l) => /cmd=xread\b/.test(l)).length;
}

test('close() 100 times in a row, each within 2 s while XREAD blocks', async () => {
  await licensePut(svc, 'close', ['--seats', '5']);
  const baseline = await clients();
  let slowest = 0;
  let total = 0;
  for (let i = 0; i < 100; i++) {
    const client = await Client.connect({ url: svc.url });
    // Every tenth holds a seat, which close() releases.
    const seat = i % 10 === 0 ? await client.acquireSeat('close', { session: `c-${i}` }) : undefined;
    // Until the reader's XREAD is blocked on the server.
    for (let tries = 0; (await blockedReads()) < 1; tries++) {
      assert.ok(tries < 200, 'the reader never blocked');
      await sleep(5);
    }
    const t0 = performance.now();
    await client.close();
    const took = performance.now() - t0;
    slowest = Math.max(slowest, took);
    total += took;
    assert.ok(took < 2000, `close ${i} took ${took} ms`);
    if (seat) assert.equal(seat.state, 'released');
  }
  assert.equal((await status(svc, 'close')).licenses[0].seats_used, 0);
  for (let tries = 0; (await clients()) > baseline; tries++) {
    assert.ok(tries < 100, `${(await clients()) - baseline} connections left open`);
    await sleep(20);
  }
  console.log(`100 closes: slowest ${slowest.toFixed(1)} ms, mean ${(total / 100).toFixed(1)} ms`);
});

test('releaseOnExit: SIGTERM releases the seat, then the process dies of the signal', async () => {
  await licensePut(svc, 'exit', ['--seats', '1']);
  const { spawn } = await import('node:child_process');
  const script = `
    import { Client } from ${JSON.stringify(new URL('../dist/index.js', import.meta.url).href)};
    const client = await Client.connect({ url: ${JSON.stringify(svc.url)}, releaseOnExit: true });
    await client.acquireSeat('exit', { session: 'leaving' });
    console.log('held');
    setInterval(() => {}, 1000);
  `;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((res) => child.stdout.once('data', res));
  assert.equal((await status(svc, 'exit')).licenses[0].seats_used, 1);
  const exited = new Promise((res) => child.on('exit', (code, signal) => res({ code, signal })));
  const t0 = Date.now();
  process.kill(child.pid, 'SIGTERM');
  const how = await exited;
  assert.deepEqual(how, { code: null, signal: 'SIGTERM' });
  assert.ok(Date.now() - t0 < 2000, `${Date.now() - t0} ms`);
  assert.equal((await status(svc, 'exit')).licenses[0].seats_used, 0);
});
