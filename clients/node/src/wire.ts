//! The wire protocol's names and rules (docs/protocol.md) that both
//! transports share: statuses, replies, leases, the shard of a license.

import { randomBytes } from 'node:crypto';
import { crc32 as zlibCrc32 } from 'node:zlib';

/** A reply as the service wrote it: every field a string (docs/protocol.md, "Replies"). */
export type Reply = Readonly<Record<string, string>>;

/** Statuses after which the session holds a seat. */
export const GRANTS: ReadonlySet<string> = new Set(['ACQUIRED', 'ALREADY_ACTIVE', 'GRANTED']);
/** Statuses of a release that gave the seat (or the place in the queue) back. */
export const GAVE_BACK: ReadonlySet<string> = new Set(['RELEASED', 'LEFT_QUEUE']);
/** Replies that decide nothing about the seat: try again sooner. */
export const RETRY_LATER: ReadonlySet<string> = new Set(['RATE_LIMITED', 'ERROR']);

/** What a client assumes when a reply carries no heartbeat_timeout_ms
 * (the service's default, sessions.heartbeat_timeout_ms). */
export const DEFAULT_HEARTBEAT_TIMEOUT_MS = 90_000;
/** How much longer than its wait_ms a queued acquire waits for its final
 * reply: a QUEUE_TIMEOUT can come a reaper period late, later still when
 * its first delivery failed. */
export const QUEUE_MARGIN_MS = 30_000;
/** The shortest pause between heartbeats, whatever the timeout says. */
export const MIN_PAUSE_MS = 10;

const LEASE_RE = /^[A-Za-z0-9_-]{16,128}$/;
const ID_RE = /^[A-Za-z0-9._:@-]{1,128}$/;

/** A new lease: 32 hex digits from the OS's randomness (docs/protocol.md, "Leases"). */
export function newLease(): string {
  return randomBytes(16).toString('hex');
}

/** Random hex, `bytes` bytes of it. */
export function randomHex(bytes: number): string {
  return randomBytes(bytes).toString('hex');
}

/** Whether `lease` is one the service takes. */
export function isLease(lease: string): boolean {
  return LEASE_RE.test(lease);
}

/** Whether `id` is a license, session, user or group id the service takes. */
export function isId(id: string): boolean {
  return ID_RE.test(id);
}

/** A whole number field of a reply, or undefined. */
export function intField(reply: Reply, name: string): number | undefined {
  const raw = reply[name];
  if (raw === undefined || !/^\d+$/.test(raw)) return undefined;
  return Number(raw);
}

/** The heartbeat timeout a reply carries, else `fallback`. */
export function heartbeatTimeoutMs(reply: Reply, fallback: number): number {
  const ms = intField(reply, 'heartbeat_timeout_ms');
  return ms !== undefined && ms > 0 ? ms : fallback;
}

/**
 * How long the first heartbeat waits after a grant: a third of the timeout
 * after the seat's heartbeat clock started (docs/protocol.md, "Heartbeats").
 * `writtenMs` is the reply entry's time on Redis's clock (its stream id),
 * `sinceFirstSentMs` how long ago the acquire's first attempt went out.
 */
export function firstPauseMs(grant: Reply, timeoutMs: number, writtenMs: number | undefined, sinceFirstSentMs: number): number {
  const heldSince = intField(grant, 'held_since_ms');
  let age: number;
  if (heldSince !== undefined && writtenMs !== undefined) {
    age = Math.max(0, writtenMs - heldSince);
  } else if (grant['status'] === 'ALREADY_ACTIVE') {
    age = timeoutMs; // its clock may be older than this acquire: at once
  } else {
    age = sinceFirstSentMs;
  }
  return Math.max(0, Math.floor(timeoutMs / 3) - age);
}

/** CRC-32 (IEEE, zlib's) of `text` as UTF-8: the shard of a license. */
export function crc32(text: string): number {
  return zlibCrc32(text);
}

/** The stream (shard) of `base` that serves `license` with `shards` shards. */
export function shardOf(base: string, shards: number, license: string): string {
  return shards > 1 ? `${base}:{${crc32(license) % shards}}` : base;
}

/** A promise and its resolvers. */
export interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(reason: unknown): void;
}

export function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (reason: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Sleeps `ms`, or less when `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, Math.max(0, ms));
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}

/**
 * Replies to one request (all its attempts), in arrival order, read with a
 * deadline by one reader at a time. A transport pushes, the seat handle pulls.
 */
export class Inbox<T> {
  private readonly items: T[] = [];
  private waiter: ((r: T | null) => void) | undefined;
  private closed = false;

  push(reply: T): void {
    if (this.closed) return;
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      w(reply);
    } else {
      this.items.push(reply);
    }
  }

  /** Ends every wait: `next` answers null from now on. */
  close(): void {
    this.closed = true;
    const w = this.waiter;
    this.waiter = undefined;
    w?.(null);
  }

  /** The next item, or null once `untilMs` (Date.now() time) passes, `signal` aborts or the queue closes. */
  next(untilMs: number, signal?: AbortSignal): Promise<T | null> {
    const first = this.items.shift();
    if (first) return Promise.resolve(first);
    if (this.closed || signal?.aborted) return Promise.resolve(null);
    return new Promise((resolve) => {
      const finish = (r: T | null): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        if (this.waiter === finish) this.waiter = undefined;
        resolve(r);
      };
      const onAbort = (): void => finish(null);
      const timer = setTimeout(() => finish(null), Math.max(0, untilMs - Date.now()));
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiter = finish;
    });
  }
}

/** A reply and when it was written, on Redis's clock (its reply stream entry's id), when known. */
export interface Received {
  readonly reply: Reply;
  readonly writtenMs: number | undefined;
}
