//! The Redis transport (docs/protocol.md, "Writing a client"): requests
//! XADDed on one connection, replies read by one loop on a connection of
//! its own from the client's reply stream, and handed to the request
//! waiting under the reply's `id`.

import { Redis } from 'ioredis';
import type { RedisOptions } from 'ioredis';

import type { AcquireAttempt, AcquireSpec, Backend, Logger, SeatTarget, Timing } from './backend.js';
import { OUT_OF_MEMORY, SeatgateError, describe, isOutOfMemory } from './errors.js';
import { Inbox, newLease, randomHex, RETRY_LATER, shardOf, sleep } from './wire.js';
import type { Received, Reply } from './wire.js';

/** How long one XREAD blocks. The loop is ended by disconnecting its
 * connection, so this only bounds how long a silent connection goes unnoticed. */
const READ_BLOCK_MS = 5000;
/** A read that has not returned this long after its block ended is taken
 * for a dead connection: the reader connects again. */
const READ_WATCHDOG_MS = READ_BLOCK_MS + 10_000;
/** Attempts of one request whose replies are still awaited (a release keeps all). */
const ATTEMPTS_KEPT = 4;

/** Redis Sentinel: the master is whichever node the Sentinels name. */
export interface SentinelSettings {
  /** The Sentinels, asked in turn. */
  readonly sentinels: readonly { host: string; port: number }[];
  /** The name the Sentinels monitor the master by (`sentinel monitor <name> …`). */
  readonly name: string;
  /** The Sentinels' own login (`requirepass` / ACL in sentinel.conf), if any. */
  readonly username: string | undefined;
  readonly password: string | undefined;
}

export interface RedisTransportOptions {
  /** The Redis URL ('' in Sentinel mode). */
  readonly url: string;
  /** Sentinel mode (then `url` is unused). */
  readonly sentinel?: SentinelSettings | undefined;
  readonly application: string | undefined;
  readonly username: string | undefined;
  readonly password: string | undefined;
  readonly keyPrefix: string;
  readonly connectTimeoutMs: number;
  readonly timing: Timing;
  readonly log: Logger;
}

/** What the workers record in `<prefix>:config` (docs/protocol.md, "Shards and Redis Cluster"). */
interface Topology {
  shards: number;
  requests: string;
  applications: string[];
  repliesPrefix: string;
}

/** What the client talks to, for messages (no password). */
function whereOf(opts: RedisTransportOptions): string {
  const s = opts.sentinel;
  if (s === undefined) return `Redis at ${safeUrl(opts.url)}`;
  return `the Redis master "${s.name}" of the Sentinels at ${s.sentinels.map((a) => `${a.host}:${a.port}`).join(', ')}`;
}

/** The URL without its password, for messages. */
function safeUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString().replace(/\/$/, '');
  } catch {
    return '(an invalid URL)';
  }
}

function fieldsOf(flat: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i] as string] = flat[i + 1] as string;
  return out;
}

function entryMs(entryId: string): number | undefined {
  const ms = Number(entryId.split('-')[0]);
  return Number.isFinite(ms) ? ms : undefined;
}

type XReadResult = [stream: string, entries: [id: string, fields: string[]][]][] | null;

export class RedisTransport implements Backend {
  readonly where: string;
  /** The stream replies come back on: `<replies_prefix><app>:<random>`. */
  readonly replyTo: string;
  private readonly opts: RedisTransportOptions;
  /** Requests go out here; commands time out after a while so that a frozen Redis leaks no promises. */
  private readonly writer: Redis;
  /** The blocking XREAD's own connection, without a command timeout shorter than the block. */
  private reader: Redis;
  private topology: Topology;
  private topologyReadAt = 0;
  private readonly waiters = new Map<string, Inbox<Received>>();
  private readonly idPrefix = randomHex(8);
  private counter = 0;
  private closing = false;
  private readLoop: Promise<void> | undefined;
  private lastError = '';
  /** Whether Redis refused the last request sent with OOM (until one is sent). */
  outOfMemory = false;

  private constructor(opts: RedisTransportOptions, writer: Redis, topology: Topology) {
    this.opts = opts;
    this.where = whereOf(opts);
    this.writer = writer;
    this.topology = topology;
    const app = opts.application ?? 'node';
    this.replyTo = `${topology.repliesPrefix}${app}:${randomHex(16)}`;
    this.reader = this.newConnection(false);
  }

  /** Connects and reads the service's topology; throws REDIS_UNAVAILABLE naming Redis when it cannot. */
  static async connect(opts: RedisTransportOptions): Promise<RedisTransport> {
    let writer: Redis | undefined;
    try {
      writer = connection(opts, true);
      const w = writer;
      let lastError = '';
      w.on('error', (e: Error) => {
        // ioredis's "All sentinels are unreachable" says it retries: here it does not.
        lastError = e.message.replace(/ Retrying from scratch after \d+ms\./, '');
      });
      // Sentinel mode: the Sentinels are asked, then the master.
      const within = opts.connectTimeoutMs * (opts.sentinel === undefined ? 1 : 2);
      await withTimeout(w.connect(), within, () => lastError || 'no answer');
      const topology = await readTopology(w, opts);
      const t = new RedisTransport(opts, w, topology);
      t.writer.removeAllListeners('error');
      t.writer.on('error', (e: Error) => t.noteError('requests', e));
      t.topologyReadAt = Date.now();
      t.readLoop = t.read();
      return t;
    } catch (e) {
      writer?.disconnect();
      // No answer in time (in Sentinel mode ioredis goes on asking the
      // Sentinels by itself) is Redis unavailable too, saying why.
      if (e instanceof SeatgateError && e.code !== 'TIMEOUT') throw e;
      throw new SeatgateError('REDIS_UNAVAILABLE', `cannot connect to ${whereOf(opts)}: ${describe(e)}`, {
        cause: e,
      });
    }
  }

  private noteError(which: string, e: Error): void {
    if (this.closing) return;
    if (e.message !== this.lastError) this.opts.log('warn', `Redis (${which} connection): ${e.message}`);
    this.lastError = e.message;
  }

  private newConnection(forRequests: boolean): Redis {
    const r = connection(this.opts, forRequests);
    r.on('error', (e: Error) => this.noteError(forRequests ? 'requests' : 'replies', e));
    r.connect().catch(() => {
      /* reported through 'error'; ioredis keeps reconnecting */
    });
    return r;
  }

  /** The requests stream (shard) a request about `license` goes to. */
  private streamFor(license: string): string {
    const t = this.topology;
    const app = this.opts.application;
    const base = app !== undefined && t.applications.includes(app) ? `${t.requests}:app:${app}` : t.requests;
    return shardOf(base, t.shards, license);
  }

  /** Reads the topology again (before re-sending a request that got no answer), at most once a second. */
  private refreshTopology(): void {
    if (Date.now() - this.topologyReadAt < 1000) return;
    this.topologyReadAt = Date.now();
    readTopology(this.writer, this.opts).then(
      (t) => {
        this.topology = t;
      },
      () => {
        /* Redis away: keep the last one */
      },
    );
  }

  /**
   * Sends one request: registers `inbox` under a new id before the XADD
   * (the reply can be read before the XADD's own answer), then XADDs. A
   * failed XADD is only logged: the caller sends again after its request
   * timeout. Returns the id.
   */
  send(op: string, license: string, session: string, fields: Record<string, string>, inbox: Inbox<Received>): string {
    if (this.closing) throw new SeatgateError('CLOSED', 'the seatgate client is closed');
    const id = `${this.idPrefix}-${++this.counter}`;
    this.waiters.set(id, inbox);
    const args: string[] = ['op', op, 'id', id, 'license', license, 'session', session, 'reply_to', this.replyTo];
    for (const [k, v] of Object.entries(fields)) args.push(k, v);
    this.writer.xadd(this.streamFor(license), '*', ...args).then(
      () => {
        this.outOfMemory = false;
      },
      (e: unknown) => {
        this.outOfMemory = isOutOfMemory(e);
        if (!this.closing) this.opts.log('warn', `cannot send ${op} for ${license}/${session} to ${this.where} (${describe(e)}); trying again`);
      },
    );
    return id;
  }

  /** Stops handing replies for `id` to anyone. */
  forget(id: string): void {
    this.waiters.delete(id);
  }

  /** The reply loop: XREAD BLOCK from the last id read, each entry to its waiter. */
  private async read(): Promise<void> {
    let last = '0-0'; // the stream is new and ours alone
    let backoff = 50;
    while (!this.closing) {
      let result: XReadResult;
      const reader = this.reader;
      try {
        result = (await withTimeout(
          reader.xread('COUNT', 500, 'BLOCK', READ_BLOCK_MS, 'STREAMS', this.replyTo, last) as Promise<XReadResult>,
          READ_WATCHDOG_MS,
          () => 'the read did not return',
        )) as XReadResult;
        backoff = 50;
      } catch (e) {
        if (this.closing) return;
        this.opts.log('warn', `cannot read replies from ${this.where} (${describe(e)}); reading again from ${last}`);
        if (e instanceof SeatgateError && e.code === 'TIMEOUT') {
          // A connection that went silent: a fresh one.
          reader.disconnect();
          this.reader = this.newConnection(false);
        }
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 2000);
        continue;
      }
      for (const [, entries] of result ?? []) {
        for (const [entryId, flat] of entries) {
          last = entryId;
          const reply = fieldsOf(flat);
          const inbox = this.waiters.get(reply['id'] ?? '');
          // No waiter: a late reply (its caller gave up) or a repeat.
          inbox?.push({ reply, writtenMs: entryMs(entryId) });
        }
      }
    }
  }

  startAcquire(spec: AcquireSpec): AcquireAttempt {
    const lease = spec.lease ?? newLease();
    const fields: Record<string, string> = { lease, ttl_ms: String(this.opts.timing.ttlMs) };
    if (spec.user !== undefined) fields['user'] = spec.user;
    if (spec.group !== undefined) fields['group'] = spec.group;
    if (spec.priority) fields['priority'] = String(spec.priority);
    if (spec.borrowMs) fields['borrow_ms'] = String(spec.borrowMs);
    if (spec.meta !== undefined) fields['meta'] = JSON.stringify(spec.meta);
    if (spec.waitMs > 0) fields['wait_ms'] = String(spec.waitMs);
    const ex = new Exchange(this, 'acquire', spec.license, spec.session, fields, ATTEMPTS_KEPT);
    return {
      lease,
      get attempts() {
        return ex.sent;
      },
      get firstSentAt() {
        return ex.firstSentAt;
      },
      first: (giveUpAt, signal) => ex.answer(giveUpAt, signal),
      next: (until, signal) => ex.next(until, signal),
      close: () => ex.close(),
    };
  }

  private seatFields(target: SeatTarget): Record<string, string> {
    return { lease: target.lease, ttl_ms: String(this.opts.timing.ttlMs) };
  }

  async heartbeat(target: SeatTarget, signal: AbortSignal | undefined, untilMs: number | undefined): Promise<Received | null> {
    const ex = new Exchange(this, 'heartbeat', target.license, target.session, this.seatFields(target), ATTEMPTS_KEPT);
    try {
      return await ex.answer(untilMs, signal);
    } catch (e) {
      if (e instanceof SeatgateError && e.code === 'TIMEOUT') return null;
      throw e;
    } finally {
      ex.close();
    }
  }

  async release(target: SeatTarget, untilMs: number): Promise<Reply | null> {
    // Every attempt is listened to: a frozen Redis decides them all at
    // once, the first RELEASED and the rest SESSION_NOT_FOUND.
    const ex = new Exchange(this, 'release', target.license, target.session, this.seatFields(target), Infinity);
    try {
      for (;;) {
        let got: Received | null;
        try {
          got = await ex.answer(untilMs);
        } catch (e) {
          if (e instanceof SeatgateError && e.code === 'TIMEOUT') return null;
          throw e;
        }
        if (got === null) return null;
        const status = got.reply['status'] ?? '';
        if (!RETRY_LATER.has(status)) return got.reply;
        if (Date.now() >= untilMs) return null;
        await sleep(Math.max(10, this.opts.timing.requestTimeoutMs / 5));
        ex.send();
      }
    } finally {
      ex.close();
    }
  }

  /** Refreshes the topology before a re-send (an operator may have changed the shard count). */
  beforeResend(): void {
    this.refreshTopology();
  }

  get timing(): Timing {
    return this.opts.timing;
  }

  get isClosing(): boolean {
    return this.closing;
  }

  /** Ends both connections at once; the blocked read returns with them. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    // The blocking read's connection is dropped, not quit: QUIT would wait
    // behind the XREAD for up to its block.
    this.reader.disconnect();
    for (const inbox of this.waiters.values()) inbox.close();
    this.waiters.clear();
    try {
      await withTimeout(this.writer.quit(), 500, () => 'QUIT unanswered');
    } catch {
      /* dropped below */
    }
    this.writer.disconnect();
    await this.readLoop?.catch(() => undefined);
  }
}

/** One request carried through timeouts: every attempt under a new id with
 * the same fields (lease and ttl_ms included); a reply to any answers it. */
class Exchange {
  readonly inbox = new Inbox<Received>();
  private readonly ids: string[] = [];
  sent = 0;
  firstSentAt = 0;
  private lastSentAt = 0;

  constructor(
    private readonly t: RedisTransport,
    private readonly op: string,
    private readonly license: string,
    private readonly session: string,
    private readonly fields: Record<string, string>,
    private readonly keep: number,
  ) {}

  send(): void {
    const now = Date.now();
    if (this.sent === 0) this.firstSentAt = now;
    else this.t.beforeResend();
    this.lastSentAt = now;
    this.sent += 1;
    const id = this.t.send(this.op, this.license, this.session, this.fields, this.inbox);
    this.ids.push(id);
    while (this.ids.length > this.keep) this.t.forget(this.ids.shift() as string);
  }

  next(untilMs: number, signal?: AbortSignal): Promise<Received | null> {
    return this.inbox.next(untilMs, signal);
  }

  /** The first reply that is not REQUEST_EXPIRED (one for an older attempt
   * is ignored, one for the latest sends again at once); null when `signal`
   * aborts; throws TIMEOUT at `giveUpAt` (undefined: never). */
  async answer(giveUpAt: number | undefined, signal?: AbortSignal): Promise<Received | null> {
    if (this.sent === 0) this.send();
    for (;;) {
      if (signal?.aborted) return null;
      if (this.t.isClosing) throw new SeatgateError('CLOSED', 'the seatgate client is closed');
      const resendAt = this.lastSentAt + this.t.timing.requestTimeoutMs;
      const until = giveUpAt === undefined ? resendAt : Math.min(resendAt, giveUpAt);
      const got = await this.inbox.next(until, signal);
      if (got === null) {
        if (signal?.aborted) return null;
        if (this.t.isClosing) throw new SeatgateError('CLOSED', 'the seatgate client is closed');
        if (giveUpAt !== undefined && Date.now() >= giveUpAt && this.t.outOfMemory) {
          throw new SeatgateError(
            'REDIS_UNAVAILABLE',
            `no reply to ${this.op} ${this.license}/${this.session} from ${this.t.where}: ${OUT_OF_MEMORY}`,
          );
        }
        if (giveUpAt !== undefined && Date.now() >= giveUpAt) {
          throw new SeatgateError(
            'TIMEOUT',
            `no reply to ${this.op} ${this.license}/${this.session} from ${this.t.where} after ${this.sent} attempts: is a seatgate run worker serving it?`,
          );
        }
        this.send();
      } else if (got.reply['status'] === 'REQUEST_EXPIRED') {
        if (got.reply['id'] === this.ids[this.ids.length - 1]) this.send();
      } else {
        return got;
      }
    }
  }

  close(): void {
    for (const id of this.ids) this.t.forget(id);
    this.ids.length = 0;
    this.inbox.close();
  }
}

function connection(opts: RedisTransportOptions, forRequests: boolean): Redis {
  const options: RedisOptions = {
    lazyConnect: true,
    connectTimeout: opts.connectTimeoutMs,
    // Requests: a command Redis does not answer (frozen, failing over) is
    // given up on after a while; the seat handle has sent it again by
    // then. Replies: no timeout below the block (a watchdog above it).
    ...(forRequests ? { commandTimeout: Math.max(opts.timing.requestTimeoutMs * 2, 1000) } : {}),
    maxRetriesPerRequest: forRequests ? 3 : null,
    retryStrategy: (times: number) => Math.min(50 * 2 ** Math.min(times, 6), 1000),
    enableReadyCheck: false,
    ...(opts.username !== undefined ? { username: opts.username } : {}),
    ...(opts.password !== undefined ? { password: opts.password } : {}),
  };
  const s = opts.sentinel;
  if (s === undefined) return new Redis(opts.url, options);
  // Sentinel mode, ioredis's own: every (re)connection asks the Sentinels
  // for the master, so after the master's connection drops both
  // connections find the replica they promoted. A demoted master answers
  // READONLY: that connection is dropped and made again (the write was
  // not done, so it is sent again at once).
  return new Redis({
    ...options,
    sentinels: s.sentinels.map((a) => ({ host: a.host, port: a.port })),
    name: s.name,
    role: 'master',
    ...(s.username !== undefined ? { sentinelUsername: s.username } : {}),
    ...(s.password !== undefined ? { sentinelPassword: s.password } : {}),
    sentinelCommandTimeout: opts.connectTimeoutMs,
    // Every Sentinel unreachable: ask them all again, backing off to 1 s.
    sentinelRetryStrategy: (times: number) => Math.min(50 * 2 ** Math.min(times, 6), 1000),
    reconnectOnError: (e: Error) => (e.message.startsWith('READONLY') ? 2 : false),
  });
}

async function readTopology(r: Redis, opts: RedisTransportOptions): Promise<Topology> {
  const raw = (await r.hgetall(`${opts.keyPrefix}:config`)) as Record<string, string>;
  const shards = Number(raw['shards'] ?? '1');
  return {
    shards: Number.isInteger(shards) && shards > 0 ? shards : 1,
    requests: raw['requests'] || `${opts.keyPrefix}:requests`,
    applications: (raw['applications'] ?? '')
      .split(',')
      .map((a) => a.trim())
      .filter((a) => a.length > 0),
    repliesPrefix: raw['replies_prefix'] || `${opts.keyPrefix}:reply:`,
  };
}

/** `p`, or a TIMEOUT SeatgateError after `ms`. */
function withTimeout<T>(p: Promise<T>, ms: number, why: () => string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new SeatgateError('TIMEOUT', why())), ms);
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

export { safeUrl };
