//! What the seat handle needs from a transport (Redis Streams or the HTTPS
//! gateway): an acquire carried through timeouts, heartbeats and releases.

import type { Received, Reply } from './wire.js';

/** The seat (or place in the queue) a request is about. */
export interface SeatTarget {
  readonly license: string;
  readonly session: string;
  readonly lease: string;
}

/** An acquire as the seat handle asks for it. */
export interface AcquireSpec {
  readonly license: string;
  readonly session: string;
  /** The caller's lease; the Redis transport makes one when absent, the gateway always makes its own. */
  readonly lease: string | undefined;
  readonly user: string | undefined;
  readonly group: string | undefined;
  readonly priority: number | undefined;
  readonly borrowMs: number | undefined;
  readonly waitMs: number;
  readonly meta: Readonly<Record<string, unknown>> | undefined;
}

/** One acquire: its attempts, and every reply to any of them. */
export interface AcquireAttempt {
  /** The lease the seat is bound to (the gateway's is known after `first`). */
  readonly lease: string;
  /** How many attempts went out. */
  readonly attempts: number;
  /** When (Date.now()) the first attempt went out. */
  readonly firstSentAt: number;
  /**
   * The first final-or-QUEUED answer (never REQUEST_EXPIRED), sending again
   * after each request timeout without one; null when `signal` aborts.
   * Throws SeatgateError TIMEOUT at `giveUpAt`.
   */
  first(giveUpAt: number, signal?: AbortSignal): Promise<Received | null>;
  /** The next reply to any attempt (QUEUED again, GRANTED, QUEUE_TIMEOUT, …), or null at `untilMs`. */
  next(untilMs: number, signal?: AbortSignal): Promise<Received | null>;
  /** Stops listening. */
  close(): void;
}

export interface Backend {
  /** Where it talks to, for messages ("Redis at redis://…", "the gateway at https://…"). */
  readonly where: string;
  startAcquire(spec: AcquireSpec): AcquireAttempt;
  /**
   * One heartbeat, sent again under new ids until answered (never
   * REQUEST_EXPIRED); null when `signal` aborts or `untilMs` passes first.
   */
  heartbeat(target: SeatTarget, signal: AbortSignal | undefined, untilMs: number | undefined): Promise<Received | null>;
  /**
   * One release, sent again (same lease, every attempt listened to) until
   * answered or `untilMs`: null when nothing answered by then.
   */
  release(target: SeatTarget, untilMs: number): Promise<Reply | null>;
  close(): Promise<void>;
}

/** Timing shared by the client, its transports and its seats. */
export interface Timing {
  /** How long a reply is waited for before the request goes again under a new id. */
  readonly requestTimeoutMs: number;
  /** The ttl_ms every request carries. */
  readonly ttlMs: number;
  /** How long an acquire goes on sending before it gives up; a release goes on at least this long. */
  readonly giveUpAfterMs: number;
  /** The heartbeat timeout assumed when a reply carries none. */
  readonly defaultHeartbeatTimeoutMs: number;
}

/** Where the package's diagnostics go. */
export type Logger = (level: 'debug' | 'info' | 'warn', message: string) => void;
