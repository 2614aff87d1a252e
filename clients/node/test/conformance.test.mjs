// A self-check of conformance-agent.mjs: the JSON-lines contract the
// lead's harness drives, against a real worker.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { after, before, test } from 'node:test';

import { licensePut, PACKAGE_DIR, seatgateOk, startService, status } from './helpers.mjs';

let svc;
before(async () => {
  svc = await startService();
});
after(async () => {
  await svc?.stop();
});

/** The agent as a child: send(obj), next(pred) → the next line matching, exit promise. */
function agent(args) {
  const child = spawn(process.execPath, ['conformance-agent.mjs', ...args], { cwd: PACKAGE_DIR, stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const seen = [];
  const waiting = [];
  createInterface({ input: child.stdout }).on('line', (line) => {
    const obj = JSON.parse(line); // every line is one JSON object
    seen.push(obj);
    for (const w of [...waiting]) {
      if (w.pred(obj)) {
        waiting.splice(waiting.indexOf(w), 1);
        w.resolve(obj);
      }
    }
  });
  const exited = new Promise((res) => child.on('exit', (code) => res(code)));
  return {
    child,
    seen,
    stderr: () => stderr,
    exited,
    send: (obj) => child.stdin.write(`${typeof obj === 'string' ? obj : JSON.stringify(obj)}\n`),
    next(pred, ms = 15000) {
      const found = seen.find(pred);
      if (found) {
        seen.splice(seen.indexOf(found), 1);
        return Promise.resolve(found);
      }
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no matching line within ${ms} ms; saw ${JSON.stringify(seen)}; stderr ${stderr}`)), ms);
        waiting.push({ pred: (o) => (pred(o) ? (clearTimeout(timer), seen.splice(seen.indexOf(o), 1), true) : false), resolve });
      });
    },
  };
}

test('the agent: ready, held, queued, refused, released, lost, errors, exited within 2 s', async () => {
  await licensePut(svc, 'conf', ['--seats', '1', '--heartbeat-timeout', '1500ms']);
  const a = agent(['--redis', svc.url, '--application', 'conf']);
  await a.next((o) => o.event === 'ready');
  a.send({ cmd: 'acquire', name: 'a', license: 'conf', session: 'S-a', user: 'ada' });
  assert.deepEqual(await a.next((o) => o.name === 'a'), { name: 'a', event: 'held', status: 'ACQUIRED', session: 'S-a' });
  a.send({ cmd: 'acquire', name: 'r', license: 'conf', session: 'S-r' });
  const refused = await a.next((o) => o.name === 'r');
  assert.equal(refused.event, 'refused');
  assert.equal(refused.status, 'NO_SEATS_AVAILABLE');
  assert.ok(refused.error.length > 0);
  a.send({ cmd: 'acquire', name: 'b', license: 'conf', session: 'S-b', wait_ms: 60000 });
  assert.deepEqual(await a.next((o) => o.name === 'b'), { name: 'b', event: 'queued', position: 1 });
  a.send('{not json');
  assert.equal((await a.next((o) => o.event === 'error' && !o.name)).event, 'error');
  a.send({ cmd: 'dance' });
  assert.match((await a.next((o) => o.event === 'error' && !o.name)).error, /unknown command/);
  a.send({ cmd: 'release', name: 'a' });
  assert.deepEqual(await a.next((o) => o.name === 'a'), { name: 'a', event: 'released', outcome: 'released', status: 'RELEASED' });
  const held = await a.next((o) => o.name === 'b' && o.event !== 'queued');
  assert.deepEqual(held, { name: 'b', event: 'held', status: 'GRANTED', session: 'S-b' });
  await seatgateOk(svc.url, ['revoke', '--license', 'conf', '--session', 'S-b', '--reason', 'conformance']);
  const lost = await a.next((o) => o.name === 'b');
  assert.equal(lost.event, 'lost');
  assert.equal(lost.status, 'SESSION_REVOKED');
  assert.match(lost.reason, /conformance/);
  a.send({ cmd: 'acquire', name: 'c', license: 'conf', session: 'S-c' });
  assert.equal((await a.next((o) => o.name === 'c')).event, 'held');
  const t0 = Date.now();
  a.send({ cmd: 'exit' });
  await a.next((o) => o.event === 'exited', 2000);
  assert.equal(await a.exited, 0);
  assert.ok(Date.now() - t0 < 2000, `exit took ${Date.now() - t0} ms`);
  // exit released what it held.
  assert.equal((await status(svc, 'conf')).licenses[0].seats_used, 0);
});

test('the agent: stdin closed behaves as exit, releasing the seat', async () => {
  await licensePut(svc, 'conf2', ['--seats', '1']);
  const a = agent(['--redis', svc.url]);
  await a.next((o) => o.event === 'ready');
  a.send({ cmd: 'acquire', name: 'x', license: 'conf2' });
  const held = await a.next((o) => o.name === 'x');
  assert.equal(held.event, 'held');
  assert.match(held.session, /^node-[0-9a-f]{16}$/);
  const t0 = Date.now();
  a.child.stdin.end();
  await a.next((o) => o.event === 'exited', 2000);
  assert.equal(await a.exited, 0);
  assert.ok(Date.now() - t0 < 2000);
  assert.equal((await status(svc, 'conf2')).licenses[0].seats_used, 0);
});
