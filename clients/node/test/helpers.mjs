// Test support: a real redis-server per test file on a free loopback port
// with its own temp dir (no persistence), `seatgate run` (and `seatgate
// gateway`) processes against it, and the seatgate CLI. Every process is
// killed by its PID when the file's tests end.

import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
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

export async function waitFor(what, check, ms = 10000) {
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

/** A private redis-server (`extra`: more arguments): { url, port, pid, stop(), kill9(), freeze(), thaw(), con }. */
export async function startRedis(extra = []) {
  const dir = mkdtempSync(join(tmpdir(), 'seatgate-node-redis-'));
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const child = track(
      spawn(
        'redis-server',
        ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, '--logfile', join(dir, 'redis.log'), ...extra],
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
      /** SIGKILL by PID, the files kept (stop() removes them). */
      kill9: () => {
        con.disconnect();
        child.kill('SIGKILL');
      },
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

/** The Sentinels' name of the master in startSentinel(). */
export const MASTER_NAME = 'seatgate';

/** A Sentinel's view: [command reply] of SENTINEL <args>, or undefined when it does not answer. */
async function askSentinel(port, ...args) {
  const con = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 1000, commandTimeout: 1000 });
  con.on('error', () => {});
  try {
    await con.connect();
    return await con.call('SENTINEL', ...args);
  } catch {
    return undefined;
  } finally {
    con.disconnect();
  }
}

async function roleOf(node) {
  try {
    return (await node.con.call('ROLE'))[0];
  } catch {
    return undefined;
  }
}

/**
 * A Redis Sentinel deployment: a master, `replicas` replicas of it
 * (--replicaof) and `sentinels` Sentinels (`redis-server <conf> --sentinel`)
 * monitoring it as MASTER_NAME with a majority quorum, calling it down after
 * 1 s; free loopback ports, temp dirs, killed by PID in stop(). Ready once
 * every Sentinel knows the master, its replicas and the other Sentinels and
 * every replica's link is up.
 */
export async function startSentinel(replicas = 1, sentinels = 3) {
  const nodes = [await startRedis(['--repl-diskless-sync-delay', '0'])];
  const procs = [];
  const stop = async () => {
    for (const p of procs) {
      p.child.kill('SIGKILL');
      rmSync(p.dir, { recursive: true, force: true });
    }
    for (const n of nodes) await n.stop();
  };
  try {
    const masterPort = nodes[0].port;
    for (let i = 0; i < replicas; i++) nodes.push(await startRedis(['--replicaof', '127.0.0.1', String(masterPort)]));
    const quorum = Math.floor(sentinels / 2) + 1;
    for (let i = 0; i < sentinels; i++) {
      const dir = mkdtempSync(join(tmpdir(), 'seatgate-node-sentinel-'));
      const port = await freePort();
      const conf = join(dir, 'sentinel.conf');
      writeFileSync(
        conf,
        `port ${port}\nbind 127.0.0.1\nprotected-mode yes\ndir ${dir}\nlogfile ${join(dir, 'sentinel.log')}\n` +
          `sentinel monitor ${MASTER_NAME} 127.0.0.1 ${masterPort} ${quorum}\n` +
          `sentinel down-after-milliseconds ${MASTER_NAME} 1000\n` +
          `sentinel failover-timeout ${MASTER_NAME} 10000\n` +
          `sentinel parallel-syncs ${MASTER_NAME} 1\n`,
      );
      procs.push({ child: track(spawn('redis-server', [conf, '--sentinel'], { stdio: 'ignore' })), port, dir });
    }
    await waitFor(
      'the Sentinels knowing the master, its replicas and each other',
      async () => {
        for (const p of procs) {
          const m = await askSentinel(p.port, 'MASTER', MASTER_NAME);
          if (!Array.isArray(m)) return false;
          const f = {};
          for (let i = 0; i + 1 < m.length; i += 2) f[m[i]] = m[i + 1];
          if (Number(f['num-slaves']) < replicas || Number(f['num-other-sentinels']) + 1 < sentinels) return false;
        }
        for (const n of nodes.slice(1)) {
          if (!/master_link_status:up/.test(await n.con.info('replication'))) return false;
        }
        return true;
      },
      20000,
    );
  } catch (e) {
    await stop();
    throw e;
  }
  /** The master's port as the Sentinel on `port` names it now. */
  const namedBy = async (port) => {
    const addr = await askSentinel(port, 'GET-MASTER-ADDR-BY-NAME', MASTER_NAME);
    return Array.isArray(addr) ? Number(addr[1]) : undefined;
  };
  return {
    nodes,
    /** For Client.connect({ sentinels }). */
    sentinels: procs.map((p) => ({ host: '127.0.0.1', port: p.port })),
    /** The SEATGATE__* variables that put seatgate in Sentinel mode. */
    env: {
      SEATGATE__REDIS__SENTINEL__URLS: procs.map((p) => `redis://127.0.0.1:${p.port}`).join(','),
      SEATGATE__REDIS__SENTINEL__MASTER_NAME: MASTER_NAME,
    },
    node: (port) => nodes.find((n) => n.port === port),
    role: roleOf,
    /** The master's port as the first Sentinel that answers names it. */
    async masterPort() {
      for (const p of procs) {
        const port = await namedBy(p.port);
        if (port !== undefined) return port;
      }
      return undefined;
    },
    /** Waits until every Sentinel names a master other than `old` and that node says it is one; its port. */
    async promoted(old, ms = 30000) {
      let found;
      await waitFor(
        `a replica of :${old} promoted`,
        async () => {
          const named = await Promise.all(procs.map((p) => namedBy(p.port)));
          const node = nodes.find((n) => n.port === named[0]);
          if (named[0] === undefined || named[0] === old || named.some((n) => n !== named[0]) || !node) return false;
          if ((await roleOf(node)) !== 'master') return false;
          found = named[0];
          return true;
        },
        ms,
      );
      return found;
    },
    stop,
  };
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
  /** Whether its /ready answers 200 now. */
  const ready = async () => {
    try {
      return (await fetch(`http://127.0.0.1:${port}/ready`)).status === 200;
    } catch {
      return false;
    }
  };
  await waitFor('seatgate run', ready);
  return {
    pid: child.pid,
    ready,
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

/** The admin trail's event types: a license's changes, not a seat's. */
const ADMIN_EVENTS = new Set(['license_put', 'license_deleted', 'groups_changed']);

/** Every seat event still on seat:events, fields as objects (the admin
 * trail's events, such as a license's creation, left out). */
export async function events(svc) {
  const entries = await svc.redis.con.xrange('seat:events', '-', '+');
  return entries
    .map(([id, flat]) => {
      const e = { id };
      for (let i = 0; i < flat.length; i += 2) e[flat[i]] = flat[i + 1];
      return e;
    })
    .filter((e) => !ADMIN_EVENTS.has(e.type));
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
