// Test support: a real redis-server per test file on a free loopback port
// with its own temp dir (no persistence), `seatgate run` (and `seatgate
// gateway`) processes against it, and the seatgate CLI. Every process is
// killed by its PID when the file's tests end.

import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';

const here = dirname(fileURLToPath(import.meta.url));
/** clients/node */
export const PACKAGE_DIR = resolve(here, '..');
/** The seatgate binary: $SEATGATE_BIN, else the repo's debug build. */
export const SEATGATE_BIN = process.env.SEATGATE_BIN || resolve(PACKAGE_DIR, '../../target/debug/seatgate');

/** The binary, or a clear failure when it is not there. */
function bin() {
  if (!existsSync(SEATGATE_BIN)) {
    throw new Error(`no seatgate binary at ${SEATGATE_BIN}: build it (cargo build) or set SEATGATE_BIN`);
  }
  return SEATGATE_BIN;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A loopback port nobody listens on (at the time of asking). */
export function freePort() {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.once('error', rej);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => res(port));
    });
  });
}

const children = new Set();
function track(child) {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}
/** Kills every process this file started, by PID. */
export function killAll() {
  for (const c of children) {
    try {
      process.kill(c.pid, 'SIGCONT');
      process.kill(c.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
}
process.on('exit', killAll);

async function waitFor(what, check, ms = 10000) {
  const until = Date.now() + ms;
  for (;;) {
    try {
      if (await check()) return;
    } catch {
      /* not yet */
    }
    if (Date.now() > until) throw new Error(`${what} did not come up within ${ms} ms`);
    await sleep(50);
  }
}

/** A private redis-server: { url, port, pid, stop(), freeze(), thaw(), con }. */
export async function startRedis() {
  const dir = mkdtempSync(join(tmpdir(), 'seatgate-node-redis-'));
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const child = track(
      spawn(
        'redis-server',
        ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--logfile', join(dir, 'redis.log')],
        { stdio: 'ignore' },
      ),
    );
    const url = `redis://127.0.0.1:${port}`;
    const con = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1, retryStrategy: () => 100 });
    con.on('error', () => {});
    try {
      await waitFor('redis-server', async () => (await con.ping()) === 'PONG', 5000);
    } catch (e) {
      con.disconnect();
      child.kill('SIGKILL');
      if (attempt < 3) continue;
      throw e;
    }
    return {
      url,
      port,
      pid: child.pid,
      dir,
      con,
      freeze: () => process.kill(child.pid, 'SIGSTOP'),
      thaw: () => process.kill(child.pid, 'SIGCONT'),
      async stop() {
        con.disconnect();
        try {
          process.kill(child.pid, 'SIGCONT');
        } catch {}
        child.kill('SIGKILL');
        rmSync(dir, { recursive: true, force: true });
      },
    };
  }
}

/** Settings every test process gets: a fast reaper, short blocks, warnings only. */
export function baseEnv(extra = {}) {
  return {
    ...process.env,
    RUST_LOG: 'warn',
    SEATGATE__STREAM__BLOCK_MS: '100',
    SEATGATE__REAPER__SCHEDULE: '* * * * * *',
    ...extra,
  };
}

/** `seatgate --redis <url> <args>`: { code, stdout, stderr }. */
export function seatgate(url, args, env = {}) {
  return new Promise((res) => {
    const child = track(spawn(bin(), ['--redis', url, ...args], { env: baseEnv(env) }));
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('exit', (code) => res({ code, stdout, stderr }));
  });
}

/** Like seatgate(), and fails unless it exits 0. */
export async function seatgateOk(url, args, env = {}) {
  const out = await seatgate(url, args, env);
  if (out.code !== 0) throw new Error(`seatgate ${args.join(' ')} exited ${out.code}: ${out.stderr}${out.stdout}`);
  return out.stdout;
}

/** `seatgate run` against `url`, ready (its /ready answers 200): { pid, stop() }. */
export async function startWorker(url, env = {}) {
  const port = await freePort();
  const child = track(
    spawn(bin(), ['--redis', url, 'run'], {
      env: baseEnv({ SEATGATE__METRICS__LISTEN: `127.0.0.1:${port}`, ...env }),
      stdio: ['ignore', 'ignore', 'inherit'],
    }),
  );
  await waitFor('seatgate run', async () => (await fetch(`http://127.0.0.1:${port}/ready`)).status === 200);
  return {
    pid: child.pid,
    stop() {
      child.kill('SIGKILL');
    },
  };
}

/** `seatgate gateway` on a loopback port over plain HTTP: { baseUrl, stop() }. */
export async function startGateway(url, env = {}, scheme = 'http') {
  const port = await freePort();
  const child = track(
    spawn(bin(), ['--redis', url, 'gateway'], {
      env: baseEnv({ SEATGATE__GATEWAY__LISTEN: `127.0.0.1:${port}`, ...env }),
      stdio: ['ignore', 'ignore', 'inherit'],
    }),
  );
  const baseUrl = `${scheme}://127.0.0.1:${port}`;
  // Up once it listens (over TLS the handshake fails for fetch, which trusts no test CA).
  await waitFor('seatgate gateway', () =>
    new Promise((res) => {
      const s = connect(port, '127.0.0.1', () => {
        s.destroy();
        res(true);
      });
      s.on('error', () => res(false));
    }),
  );
  return {
    baseUrl,
    pid: child.pid,
    stop() {
      child.kill('SIGKILL');
    },
  };
}

/** A Redis and a worker for one test file. */
export async function startService(env = {}) {
  const redis = await startRedis();
  const worker = await startWorker(redis.url, env);
  return {
    redis,
    worker,
    url: redis.url,
    env,
    async stop() {
      worker.stop();
      await redis.stop();
    },
  };
}

/** `seatgate license put <license> <args>`. */
export function licensePut(svc, license, args) {
  return seatgateOk(svc.url, ['license', 'put', license, ...args], svc.env);
}

/** Every event still on seat:events, fields as objects. */
export async function events(svc) {
  const entries = await svc.redis.con.xrange('seat:events', '-', '+');
  return entries.map(([id, flat]) => {
    const e = { id };
    for (let i = 0; i < flat.length; i += 2) e[flat[i]] = flat[i + 1];
    return e;
  });
}

/** Waits until an event matching `pred` is on the events stream; returns it. */
export async function waitForEvent(svc, pred, ms = 15000) {
  let found;
  await waitFor('the event', async () => {
    found = (await events(svc)).find(pred);
    return found !== undefined;
  }, ms);
  return found;
}

/** `seatgate status --json --license L`, parsed. */
export async function status(svc, license) {
  return JSON.parse(await seatgateOk(svc.url, ['status', '--json', '--license', license], svc.env));
}

export { readFileSync, spawnSync };
