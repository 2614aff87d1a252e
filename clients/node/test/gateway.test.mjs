// HTTP mode against a real `seatgate gateway` (plain HTTP on loopback),
// with tokens from `seatgate token issue`: the same seat handle acquires,
// heartbeats and releases, and a wait is granted over server-sent events.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { Client, SeatgateError } from '../dist/index.js';
import { events, licensePut, seatgateOk, sleep, startGateway, startService, status, waitForEvent } from './helpers.mjs';

const env = { SEATGATE__STREAM__APPLICATIONS: 'cad' };
let svc;
let gw;
let ada;
let bob;
before(async () => {
  svc = await startService(env);
  gw = await startGateway(svc.url, env);
  const issue = async (user) => (await seatgateOk(svc.url, ['token', 'issue', '--app', 'cad', '--user', user, '--actor', 'test'], env)).trim();
  ada = Client.gateway({ baseUrl: gw.baseUrl, token: await issue('ada') });
  bob = Client.gateway({ baseUrl: gw.baseUrl, token: await issue('bob') });
});
after(async () => {
  await ada?.close();
  await bob?.close();
  gw?.stop();
  await svc?.stop();
});

test('acquire, heartbeat and release through the gateway', async () => {
  await licensePut(svc, 'gw-life', ['--seats', '1', '--heartbeat-timeout', '1500ms'], env);
  const seat = await ada.acquireSeat('gw-life', { session: 'ws-1', meta: { host: 'pc' } });
  assert.equal(seat.grant.status, 'ACQUIRED');
  assert.equal(seat.heartbeatTimeoutMs, 1500);
  assert.ok(seat.lease.length >= 16);
  await sleep(1200);
  assert.ok(seat.heartbeats >= 1, `${seat.heartbeats} heartbeats`);
  const st = (await status(svc, 'gw-life')).licenses[0];
  assert.equal(st.holders[0].session, 'cad/ws-1');
  assert.equal(st.holders[0].user, 'cad/ada');
  const gone = await seat.release();
  assert.equal(gone.outcome, 'released');
  assert.equal(gone.reply.status, 'RELEASED');
  const evs = (await events(svc)).filter((e) => e.license === 'gw-life').map((e) => e.type);
  assert.deepEqual(evs, ['acquired', 'released']);
});

test('a wait through the gateway is granted over SSE and claimed', async () => {
  await licensePut(svc, 'gw-wait', ['--seats', '1'], env);
  const held = await ada.acquireSeat('gw-wait', { session: 'a-1' });
  const positions = [];
  const waiting = bob.acquireSeat('gw-wait', { session: 'b-1', waitMs: 30000, onQueued: (p) => positions.push(p) });
  await waitForEvent(svc, (e) => e.type === 'queued' && e.session === 'cad/b-1');
  await sleep(300); // the SSE stream is open
  assert.deepEqual(positions.slice(0, 1), [1]);
  const t0 = Date.now();
  assert.equal((await held.release()).outcome, 'released');
  const seat = await waiting;
  assert.equal(seat.grant.status, 'GRANTED');
  assert.ok(Date.now() - t0 < 3000, `granted ${Date.now() - t0} ms after the release`);
  assert.ok(seat.heartbeats >= 1, 'claimed with a heartbeat');
  assert.equal(seat.heartbeatTimeoutMs, 90000, 'the claim heartbeat told the timeout');
  const st = (await status(svc, 'gw-wait')).licenses[0];
  assert.equal(st.holders[0].session, 'cad/b-1');
  assert.equal((await seat.release()).outcome, 'released');
});

test('a refusal through the gateway carries the wire status', async () => {
  await licensePut(svc, 'gw-full', ['--seats', '1'], env);
  const held = await ada.acquireSeat('gw-full', { session: 'a-2' });
  await assert.rejects(bob.acquireSeat('gw-full', { session: 'b-2' }), (e) => {
    assert.ok(e instanceof SeatgateError);
    assert.equal(e.code, 'NO_SEATS_AVAILABLE');
    assert.ok(!e.message.includes('\n'));
    return true;
  });
  await held.release();
  const bad = Client.gateway({ baseUrl: gw.baseUrl, token: 'sgt_nosuchtoken' });
  await assert.rejects(bad.acquireSeat('gw-full', { session: 'c-1' }), (e) => {
    assert.equal(e.code, 'GATEWAY_UNAVAILABLE');
    assert.match(e.message, /gateway/);
    return true;
  });
  await bad.close();
});

/** A throwaway CA and a certificate it signed for 127.0.0.1, made with openssl. */
function testCa() {
  const dir = mkdtempSync(join(tmpdir(), 'seatgate-node-ca-'));
  const f = (name) => join(dir, name);
  const ssl = (...args) => execFileSync('openssl', args, { stdio: 'ignore' });
  ssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '1', '-subj', '/CN=seatgate node test CA');
  ssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', f('key.pem'), '-out', f('leaf.csr'), '-subj', '/CN=127.0.0.1');
  writeFileSync(f('ext.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  ssl('x509', '-req', '-in', f('leaf.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial', '-out', f('cert.pem'), '-days', '1', '-extfile', f('ext.cnf'));
  return { dir, ca: readFileSync(f('ca.pem')), cert: f('cert.pem'), key: f('key.pem') };
}

test('over HTTPS with a private CA given as `ca`', async () => {
  const ca = testCa();
  const tls = await startGateway(svc.url, { ...env, SEATGATE__GATEWAY__TLS_CERT_FILE: ca.cert, SEATGATE__GATEWAY__TLS_KEY_FILE: ca.key }, 'https');
  const token = (await seatgateOk(svc.url, ['token', 'issue', '--app', 'cad', '--user', 'eve', '--actor', 'test'], env)).trim();
  const client = Client.gateway({ baseUrl: tls.baseUrl, token, ca: ca.ca });
  const untrusting = Client.gateway({ baseUrl: tls.baseUrl, token, giveUpAfterMs: 1000 });
  try {
    await licensePut(svc, 'gw-tls', ['--seats', '1'], env);
    assert.ok(tls.baseUrl.startsWith('https://'));
    const seat = await client.acquireSeat('gw-tls', { session: 'e-1' });
    assert.equal(seat.grant.status, 'ACQUIRED');
    assert.equal((await seat.release()).outcome, 'released');
    // Without the CA the certificate is not trusted: no seat, an error naming the gateway.
    await assert.rejects(untrusting.acquireSeat('gw-tls', { session: 'e-2' }), (e) => e.code === 'TIMEOUT' && /gateway.*certificate/i.test(e.message) && !e.message.includes('\n'));
  } finally {
    await client.close();
    await untrusting.close();
    tls.stop();
    rmSync(ca.dir, { recursive: true, force: true });
  }
});
