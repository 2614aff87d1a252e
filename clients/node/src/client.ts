//! The client: one per process, in Redis mode (`Client.connect`) or
//! through the HTTPS gateway (`Client.gateway`), with the same seat handle.

import type { Backend, Logger, Timing } from './backend.js';
import { SeatgateError, describe } from './errors.js';
import { GatewayTransport } from './gateway.js';
import { RedisTransport } from './redis.js';
import type { SentinelSettings } from './redis.js';
import { acquireSeat, Seat } from './seat.js';
import type { AcquireOptions, ReleaseResult, SeatOwner } from './seat.js';
import { DEFAULT_HEARTBEAT_TIMEOUT_MS } from './wire.js';

/** Timing and shutdown settings both modes take. */
export interface CommonOptions {
  /** How long a reply is waited for before the request is sent again under a new id (default 5000). */
  requestTimeoutMs?: number;
  /** The ttl_ms every request carries (default: requestTimeoutMs, at most 5000… keep it at most requestTimeoutMs). */
  ttlMs?: number;
  /** How long an acquire goes on sending before it gives up (default 30000); a release goes on at least this long. */
  giveUpAfterMs?: number;
  /** The heartbeat timeout assumed when a reply carries none (default 90000, the service's). */
  defaultHeartbeatTimeoutMs?: number;
  /** How long `close()` lets the releases of the seats still held take before it drops the connections (default 1500). */
  closeTimeoutMs?: number;
  /** Release every seat on the way out of the process: beforeExit, SIGINT and SIGTERM (then the signal is raised again). Default false. */
  releaseOnExit?: boolean;
  /** Where diagnostics go (default: nowhere). */
  logger?: Logger;
}

export interface ConnectOptions extends CommonOptions {
  /** redis:// or rediss:// URL of the Redis the workers serve; or, instead, `sentinels` and `name`. */
  url?: string;
  /**
   * Redis Sentinel: the Sentinels (the service's redis.sentinel.urls). The
   * client asks them for the master named `name`, and again whenever a
   * connection to it drops or it answers READONLY, so every seat follows a
   * failover.
   */
  sentinels?: { host: string; port: number }[];
  /** With `sentinels`: the name they monitor the master by (the service's redis.sentinel.master_name). */
  name?: string;
  /** With `sentinels`: the Sentinels' own ACL user, if any. */
  sentinelUsername?: string;
  /** With `sentinels`: the Sentinels' own password (default: env SEATGATE_REDIS_SENTINEL_PASSWORD). */
  sentinelPassword?: string;
  /** The application: with a stream of its own (stream.applications) requests go there; it names the reply stream. */
  application?: string;
  /** The Redis ACL user, if not in the URL. */
  username?: string;
  /** The Redis password (default: the URL's, else env SEATGATE_REDIS_PASSWORD). */
  password?: string;
  /** The service's keys.prefix (default "seat"). */
  keyPrefix?: string;
  /** How long connecting may take (default 5000). */
  connectTimeoutMs?: number;
}

export interface GatewayOptions extends CommonOptions {
  /** The gateway's base URL, e.g. https://seats.example.com:8443 (http:// only on loopback). */
  baseUrl: string;
  /** A gateway token (sgt_…) or an OpenID Connect access token. */
  token: string;
  /** PEM of the CA to trust for the gateway's certificate. */
  ca?: string | Buffer;
}

const noLog: Logger = () => undefined;

function timingOf(o: CommonOptions): Timing {
  const requestTimeoutMs = o.requestTimeoutMs ?? 5000;
  return {
    requestTimeoutMs,
    ttlMs: Math.max(1, Math.min(o.ttlMs ?? 5000, requestTimeoutMs)),
    giveUpAfterMs: o.giveUpAfterMs ?? 30_000,
    defaultHeartbeatTimeoutMs: o.defaultHeartbeatTimeoutMs ?? DEFAULT_HEARTBEAT_TIMEOUT_MS,
  };
}

/** A seatgate client: see the package README. */
export class Client {
  private readonly backend: Backend;
  private readonly timing: Timing;
  private readonly log: Logger;
  private readonly closeTimeoutMs: number;
  private readonly seats = new Set<Seat>();
  private readonly undoing = new Set<Promise<void>>();
  /** The acquires under way, and what aborts them all at close(). */
  private readonly acquiring = new Set<Promise<unknown>>();
  private readonly closeSignal = new AbortController();
  private readonly owner: SeatOwner;
  private closing: Promise<void> | undefined;
  private unhook: (() => void) | undefined;

  private constructor(backend: Backend, o: CommonOptions) {
    this.backend = backend;
    this.timing = timingOf(o);
    this.log = o.logger ?? noLog;
    this.closeTimeoutMs = o.closeTimeoutMs ?? 1500;
    const seats = this.seats;
    const undoing = this.undoing;
    this.owner = {
      backend,
      timing: this.timing,
      log: this.log,
      adopt: (s) => void seats.add(s),
      disown: (s) => void seats.delete(s),
      track: (p) => {
        undoing.add(p);
        void p.finally(() => undoing.delete(p));
      },
    };
    if (o.releaseOnExit) this.unhook = this.hookExit();
  }

  /** Connects to Redis (Redis mode). Throws SeatgateError REDIS_UNAVAILABLE when Redis cannot be reached. */
  static async connect(o: ConnectOptions): Promise<Client> {
    if (o.application !== undefined && !/^[A-Za-z0-9._-]{1,64}$/.test(o.application)) {
      throw new SeatgateError('INVALID_ARGUMENT', 'an application is 1 to 64 characters of A-Z a-z 0-9 . _ -');
    }
    const timing = timingOf(o);
    const sentinel = sentinelOf(o);
    const url = sentinel === undefined ? (o.url as string) : '';
    const backend = await RedisTransport.connect({
      url,
      sentinel,
      application: o.application,
      username: o.username,
      password: o.password ?? (hasPassword(url) ? undefined : process.env['SEATGATE_REDIS_PASSWORD'] || undefined),
      keyPrefix: o.keyPrefix ?? 'seat',
      connectTimeoutMs: o.connectTimeoutMs ?? 5000,
      timing,
      log: o.logger ?? noLog,
    });
    return new Client(backend, o);
  }

  /** A client of `seatgate gateway` (HTTP mode). Nothing is sent until the first acquire. */
  static gateway(o: GatewayOptions): Client {
    const backend = new GatewayTransport({
      baseUrl: o.baseUrl,
      token: o.token,
      ca: o.ca,
      timing: timingOf(o),
      log: o.logger ?? noLog,
    });
    return new Client(backend, o);
  }

  /** Where the client talks to ("Redis at redis://…", "the gateway at https://…"). */
  get where(): string {
    return this.backend.where;
  }

  /** In Redis mode, the stream replies come back on. */
  get replyStream(): string | undefined {
    return this.backend instanceof RedisTransport ? this.backend.replyTo : undefined;
  }

  /** The seats this client holds now. */
  get heldSeats(): readonly Seat[] {
    return [...this.seats];
  }

  /**
   * Takes a seat of `license` and returns a handle that keeps it. With
   * `waitMs` it may wait in the queue. Rejects with a SeatgateError whose
   * code is the refusal's status (NO_SEATS_AVAILABLE, QUEUE_TIMEOUT, …),
   * or TIMEOUT, ABORTED, CLOSED, REDIS_UNAVAILABLE, GATEWAY_UNAVAILABLE.
   */
  acquireSeat(license: string, options: AcquireOptions = {}): Promise<Seat> {
    if (this.closing) return Promise.reject(new SeatgateError('CLOSED', 'the seatgate client is closed'));
    const stop = this.closeSignal.signal;
    const signal = options.signal ? AbortSignal.any([options.signal, stop]) : stop;
    const p = acquireSeat(this.owner, license, { ...options, signal });
    const settled = p.catch(() => undefined);
    this.acquiring.add(settled);
    void settled.finally(() => this.acquiring.delete(settled));
    return p;
  }

  /**
   * Aborts the acquires under way (a queued one leaves the queue) and
   * releases every seat still held (for at most closeTimeoutMs), then
   * drops the connections: it ends within about 2 s even while a read is
   * blocked. Returns the same promise when called again.
   */
  close(): Promise<void> {
    this.closing ??= this.doClose();
    return this.closing;
  }

  private async doClose(): Promise<void> {
    this.unhook?.();
    const until = Date.now() + this.closeTimeoutMs;
    // Acquires under way first (a queued one leaves the queue), so that a
    // seat released below is not granted to one of our own waits.
    this.closeSignal.abort();
    await Promise.race([
      Promise.all([...this.acquiring]),
      new Promise((r) => setTimeout(r, Math.max(0, until - Date.now())).unref()),
    ]);
    const releases: Promise<ReleaseResult | void>[] = [...this.seats].map((s) => s.releaseBy(until));
    const bounded = (p: Promise<unknown>): Promise<unknown> =>
      Promise.race([p.catch(() => undefined), new Promise((r) => setTimeout(r, Math.max(0, until - Date.now())).unref())]);
    await bounded(Promise.all([...releases, ...this.undoing]));
    try {
      await this.backend.close();
    } catch (e) {
      this.log('warn', `closing: ${describe(e)}`);
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** Releases the seats on the way out of the process; returns the unhook. */
  private hookExit(): () => void {
    const onBeforeExit = (): void => {
      void this.close();
    };
    const onSignal = (signal: NodeJS.Signals): void => {
      void this.close().finally(() => {
        unhook();
        // Nobody else asked for the signal: die of it as if unhandled.
        if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
      });
    };
    process.once('beforeExit', onBeforeExit);
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    const unhook = (): void => {
      process.off('beforeExit', onBeforeExit);
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
    };
    return unhook;
  }
}

/** Sentinel mode's settings from the options, or undefined in URL mode; throws INVALID_ARGUMENT for a mix or a gap. */
function sentinelOf(o: ConnectOptions): SentinelSettings | undefined {
  const bad = (why: string): SeatgateError => new SeatgateError('INVALID_ARGUMENT', why);
  if (o.sentinels === undefined) {
    if (typeof o.url !== 'string' || o.url === '') throw bad('give url (redis://…) or sentinels and name');
    if (o.name !== undefined) throw bad('name is the Sentinels\' name of the master: it goes with sentinels, not url');
    return undefined;
  }
  if (o.url !== undefined) throw bad('give url or sentinels, not both');
  if (!o.name) throw bad("sentinels needs name (the Sentinels' name of the master)");
  if (!Array.isArray(o.sentinels) || o.sentinels.length === 0) throw bad('sentinels names no Sentinel');
  for (const a of o.sentinels) {
    if (typeof a?.host !== 'string' || a.host === '' || !Number.isInteger(a.port) || a.port < 1 || a.port > 65535) {
      throw bad(`a Sentinel is { host, port }, not ${JSON.stringify(a)}`);
    }
  }
  return {
    sentinels: o.sentinels.map((a) => ({ host: a.host, port: a.port })),
    name: o.name,
    username: o.sentinelUsername,
    password: o.sentinelPassword ?? (process.env['SEATGATE_REDIS_SENTINEL_PASSWORD'] || undefined),
  };
}

function hasPassword(url: string): boolean {
  try {
    return new URL(url).password !== '';
  } catch {
    return false;
  }
}
