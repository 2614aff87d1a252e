//! The seat handle: a seat that keeps itself (docs/protocol.md, "What the
//! seat handles do"), the same over Redis and over the gateway.
//!
//! `acquireSeat` resolves once the session holds a seat: at once, or after
//! waiting in the queue, heartbeating while it waits (the waiter liveness
//! of the wait queue) and claiming a GRANTED at once with a heartbeat.
//! From then on the Seat heartbeats at a third of the latest
//! heartbeat_timeout_ms, tells its owner when the service takes the seat
//! (`lost`), and gives it back with an honest `release()`.

import { EventEmitter } from 'node:events';

import type { AcquireAttempt, AcquireSpec, Backend, Logger, SeatTarget, Timing } from './backend.js';
import { SeatgateError, describe } from './errors.js';
import {
  deferred,
  firstPauseMs,
  GAVE_BACK,
  GRANTS,
  heartbeatTimeoutMs,
  intField,
  isId,
  isLease,
  MIN_PAUSE_MS,
  QUEUE_MARGIN_MS,
  randomHex,
  RETRY_LATER,
  sleep,
} from './wire.js';
import type { Received, Reply } from './wire.js';

/** What an acquire asks for. */
export interface AcquireOptions {
  /** The session (one per running copy of the product); default: a new random one. */
  session?: string;
  /** The user the seat counts for (per-user policies, `seatgate status`). Through the gateway the credential decides it. */
  user?: string;
  /** The user's group (group limits and reservations). */
  group?: string;
  /** Queue priority 0–9 (the license's max_priority caps it). */
  priority?: number;
  /** Borrow the seat for this long, ms: held without heartbeats until then. */
  borrowMs?: number;
  /** How long to wait in the queue when no seat is free, ms (0, the default: answer at once). */
  waitMs?: number;
  /** Display data kept with the session (a JSON object, at most 4096 bytes). */
  meta?: Readonly<Record<string, unknown>>;
  /** The lease to bind the seat to (Redis mode; default: a new random one). Keep it to take the seat back after a restart. */
  lease?: string;
  /** Gives the acquire up: the session is released (a queued one leaves the queue). */
  signal?: AbortSignal;
  /** Told the place in the queue at QUEUED, and each time a waiter heartbeat says it again. */
  onQueued?: (position: number) => void;
}

/** Why the service took a seat. */
export interface SeatLoss {
  /** The status that said so: SESSION_NOT_ACTIVE (evicted), SESSION_REVOKED, LEASE_MISMATCH, … */
  readonly status: string;
  /** Its `error` text ("" when none). */
  readonly error: string;
  /** The whole reply, when there was one. */
  readonly reply: Reply | undefined;
}

/** What a release learnt; never `unknown` for a release that was answered. */
export interface ReleaseResult {
  /**
   * - `released`: the service gave the seat back (RELEASED) or took the
   *   session out of the queue (LEFT_QUEUE);
   * - `already_gone`: the seat was no longer the session's (SESSION_NOT_FOUND,
   *   SESSION_REVOKED, LEASE_MISMATCH, …), `reply` says why;
   * - `unknown`: no attempt was answered before the seat's heartbeat timeout
   *   ran out since its last heartbeat: if none ever arrives, the seat has
   *   been evicted by then.
   */
  readonly outcome: 'released' | 'already_gone' | 'unknown';
  readonly reply?: Reply;
}

export type SeatState = 'held' | 'lost' | 'released';

/** The events a Seat emits. */
export interface SeatEvents {
  /** A heartbeat was answered HEARTBEAT_UPDATED. */
  heartbeat: [reply: Reply];
  /** The service took the seat. */
  lost: [loss: SeatLoss];
  /** The seat was given back (`release()`, the client's close). */
  released: [result: ReleaseResult];
}

/** What the client keeps for its seats. */
export interface SeatOwner {
  readonly backend: Backend;
  readonly timing: Timing;
  readonly log: Logger;
  adopt(seat: Seat): void;
  disown(seat: Seat): void;
  /** Runs an undo in the background, tracked so close() can wait for it. */
  track(p: Promise<void>): void;
}

/** A seat the session holds, kept by a heartbeat loop of its own. */
export class Seat extends EventEmitter<SeatEvents> {
  readonly license: string;
  readonly session: string;
  /** The lease the seat is bound to: keep it to take the seat back after a restart (Redis mode). */
  readonly lease: string;
  /** The reply that gave the seat (ACQUIRED, ALREADY_ACTIVE or GRANTED). */
  readonly grant: Reply;
  /** Resolves when the service takes the seat (never when it is released). */
  readonly lost: Promise<SeatLoss>;

  private _state: SeatState = 'held';
  private _heartbeatTimeoutMs: number;
  private _heartbeats = 0;
  private _loss: SeatLoss | undefined;
  private lastBeatAt: number;
  private readonly owner: SeatOwner;
  private readonly stop = new AbortController();
  private readonly loop: Promise<void>;
  private readonly lostDeferred = deferred<SeatLoss>();
  private readonly firstBeat = deferred<SeatLoss | undefined>();
  private releasing: Promise<ReleaseResult> | undefined;

  /** @internal */
  constructor(owner: SeatOwner, target: SeatTarget, grant: Reply, timeoutMs: number, firstPause: number) {
    super();
    this.owner = owner;
    this.license = target.license;
    this.session = target.session;
    this.lease = target.lease;
    this.grant = grant;
    this._heartbeatTimeoutMs = timeoutMs;
    this.lastBeatAt = Date.now();
    this.lost = this.lostDeferred.promise;
    owner.adopt(this);
    this.loop = this.heartbeatLoop(firstPause);
  }

  /** `held`, `lost` (the service took it) or `released`. */
  get state(): SeatState {
    return this._state;
  }

  /** The heartbeat timeout the service last gave, ms; the handle heartbeats at a third of it. */
  get heartbeatTimeoutMs(): number {
    return this._heartbeatTimeoutMs;
  }

  /** Heartbeats answered HEARTBEAT_UPDATED so far. */
  get heartbeats(): number {
    return this._heartbeats;
  }

  /** Why the seat was lost, once it was. */
  get loss(): SeatLoss | undefined {
    return this._loss;
  }

  /** @internal Resolves after the first heartbeat's answer: undefined when it kept the seat, else the loss. */
  get firstHeartbeat(): Promise<SeatLoss | undefined> {
    return this.firstBeat.promise;
  }

  private target(): SeatTarget {
    return { license: this.license, session: this.session, lease: this.lease };
  }

  private async heartbeatLoop(firstPause: number): Promise<void> {
    let pause = firstPause;
    const signal = this.stop.signal;
    for (;;) {
      await sleep(Math.max(pause, pause === 0 ? 0 : MIN_PAUSE_MS), signal);
      if (signal.aborted) return;
      let got: Received | null;
      try {
        got = await this.owner.backend.heartbeat(this.target(), signal, undefined);
      } catch (e) {
        if (signal.aborted) return;
        // The client closed under it.
        this.lose({ status: 'ERROR', error: describe(e), reply: undefined });
        return;
      }
      if (got === null || signal.aborted) return;
      const status = got.reply['status'] ?? '';
      if (status === 'HEARTBEAT_UPDATED') {
        // A service that does not send the timeout on heartbeats leaves the grant's in force.
        this._heartbeatTimeoutMs = heartbeatTimeoutMs(got.reply, this._heartbeatTimeoutMs);
        this._heartbeats += 1;
        this.lastBeatAt = Date.now();
        pause = this._heartbeatTimeoutMs / 3;
        this.firstBeat.resolve(undefined);
        this.emit('heartbeat', got.reply);
      } else if (RETRY_LATER.has(status) || status === 'QUEUED') {
        // Nothing decided about the seat (QUEUED: a grant not yet seen by
        // the service's heartbeat, never expected): try again sooner.
        pause = this._heartbeatTimeoutMs / 6;
      } else {
        this.lose({ status, error: got.reply['error'] ?? '', reply: got.reply });
        return;
      }
    }
  }

  private lose(loss: SeatLoss): void {
    if (this._state !== 'held') return;
    this._state = 'lost';
    this._loss = loss;
    this.owner.disown(this);
    this.owner.log('warn', `lost the seat of ${this.license}/${this.session}: ${loss.status} ${loss.error}`.trim());
    this.firstBeat.resolve(loss);
    this.lostDeferred.resolve(loss);
    this.emit('lost', loss);
  }

  /**
   * Stops heartbeating and gives the seat back. Never reports a release
   * that worked as failed: it keeps sending (the same id while Redis's
   * client retries it, then new ids, the same lease; a reply to any attempt
   * counts) until the service answers, or until the seat's heartbeat
   * timeout has run out since its last answered heartbeat (and at least
   * the client's giveUpAfterMs), through a Redis outage or freeze.
   */
  release(): Promise<ReleaseResult> {
    return this.releaseBy(undefined);
  }

  /** @internal The release, stopping at `untilMs` if that comes first (the client's close). */
  releaseBy(untilMs: number | undefined): Promise<ReleaseResult> {
    this.releasing ??= this.doRelease(untilMs);
    return this.releasing;
  }

  private async doRelease(untilMs: number | undefined): Promise<ReleaseResult> {
    this.stop.abort();
    await this.loop;
    const t = this.owner.timing;
    const timeout = this._state === 'held' ? this._heartbeatTimeoutMs : 0;
    let deadline = Math.max(this.lastBeatAt + timeout + t.requestTimeoutMs, Date.now() + t.giveUpAfterMs);
    if (untilMs !== undefined) deadline = Math.min(deadline, untilMs);
    let reply: Reply | null;
    try {
      reply = await this.owner.backend.release(this.target(), deadline);
    } catch (e) {
      this.owner.log('warn', `release of ${this.license}/${this.session}: ${describe(e)}`);
      reply = null;
    }
    this.owner.disown(this);
    let result: ReleaseResult;
    if (reply === null) result = { outcome: 'unknown' };
    else if (GAVE_BACK.has(reply['status'] ?? '')) result = { outcome: 'released', reply };
    else result = { outcome: 'already_gone', reply };
    if (this._state === 'held' && result.outcome !== 'unknown') this._state = 'released';
    this.firstBeat.resolve(undefined);
    this.emit('released', result);
    return result;
  }

  /** `await using seat = await client.acquireSeat(…)` releases it on the way out. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this._state === 'held') await this.release();
  }
}

/** Takes a seat: see the module's doc. */
export async function acquireSeat(owner: SeatOwner, license: string, opts: AcquireOptions): Promise<Seat> {
  const spec = checkSpec(license, opts);
  const t = owner.timing;
  const signal = opts.signal;
  const aborted = (): SeatgateError => new SeatgateError('ABORTED', `acquire of ${license}/${spec.session} was aborted`);
  if (signal?.aborted) throw aborted();
  const attempt = owner.backend.startAcquire(spec);
  // Armed until the acquire ends in a seat or a plain refusal: any other
  // way out undoes it in the background.
  let armed = true;
  try {
    let got = await attempt.first(Date.now() + t.giveUpAfterMs, signal);
    if (got === null) throw aborted();
    const target: SeatTarget = { license, session: spec.session, lease: attempt.lease };
    if (got.reply['status'] === 'QUEUED') {
      got = await waitInQueue(owner, attempt, target, got.reply, spec.waitMs, opts);
    }
    const reply = got.reply;
    const status = reply['status'] ?? '';
    if (!GRANTS.has(status)) {
      // One attempt answered is the whole story; with more, an older one
      // might still be decided, so the undo stays armed to release it.
      if (attempt.attempts <= 1) armed = false;
      throw SeatgateError.refused(`acquire of ${license}/${spec.session}`, reply);
    }
    armed = false;
    const timeoutMs = heartbeatTimeoutMs(reply, t.defaultHeartbeatTimeoutMs);
    // A GRANTED is claimed at once (the claim window); other grants
    // heartbeat a third of the timeout after their clock started.
    const pause = status === 'GRANTED' ? 0 : firstPauseMs(reply, timeoutMs, got.writtenMs, Date.now() - attempt.firstSentAt);
    const seat = new Seat(owner, target, reply, timeoutMs, pause);
    if (status === 'GRANTED') {
      const loss = await raceAbort(seat.firstHeartbeat, signal);
      if (loss === 'aborted') {
        owner.track(seat.release().then(() => undefined));
        throw aborted();
      }
      if (loss !== undefined) {
        throw SeatgateError.refused(`claim of the seat granted to ${license}/${spec.session}`, loss.reply ?? { status: loss.status, error: loss.error });
      }
    }
    return seat;
  } finally {
    if (armed) owner.track(undo(owner, attempt, { license, session: spec.session, lease: attempt.lease }));
    else attempt.close();
  }
}

/**
 * After QUEUED: waits for the final reply under the acquire's id, up to
 * its wait_ms plus the request timeout plus a margin, heartbeating every
 * third of the heartbeat timeout so the place is kept (a service without
 * waiter liveness answers SESSION_NOT_ACTIVE: no news).
 */
async function waitInQueue(
  owner: SeatOwner,
  attempt: AcquireAttempt,
  target: SeatTarget,
  queued: Reply,
  waitMs: number,
  opts: AcquireOptions,
): Promise<Received> {
  const t = owner.timing;
  const signal = opts.signal;
  const tell = (r: Reply): void => {
    const position = intField(r, 'position');
    if (position !== undefined) opts.onQueued?.(position);
  };
  tell(queued);
  let timeoutMs = heartbeatTimeoutMs(queued, t.defaultHeartbeatTimeoutMs);
  const deadline = Date.now() + waitMs + t.requestTimeoutMs + QUEUE_MARGIN_MS;
  let nextBeat = Date.now() + timeoutMs / 3;
  const stopBeats = new AbortController();
  let beating: Promise<void> | undefined;
  try {
    for (;;) {
      const got = await attempt.next(Math.min(deadline, nextBeat), signal);
      if (signal?.aborted) throw new SeatgateError('ABORTED', `acquire of ${target.license}/${target.session} was aborted`);
      if (got === null) {
        if (Date.now() >= deadline) {
          throw new SeatgateError('TIMEOUT', `no final answer to the queued acquire of ${target.license}/${target.session} from ${owner.backend.where} within its wait`);
        }
        if (Date.now() >= nextBeat) {
          nextBeat = Date.now() + timeoutMs / 3;
          beating ??= (async () => {
            try {
              const beat = await owner.backend.heartbeat(target, stopBeats.signal, Date.now() + 2 * t.requestTimeoutMs);
              if (beat === null) return;
              const s = beat.reply['status'];
              if (s === 'QUEUED') {
                timeoutMs = heartbeatTimeoutMs(beat.reply, timeoutMs);
                tell(beat.reply);
              }
              // HEARTBEAT_UPDATED: the grant was claimed before its GRANTED
              // was read, which follows. SESSION_NOT_ACTIVE from a service
              // without waiter heartbeats: no news.
            } catch (e) {
              owner.log('debug', `waiter heartbeat of ${target.license}/${target.session}: ${describe(e)}`);
            } finally {
              beating = undefined;
            }
          })();
        }
        continue;
      }
      const s = got.reply['status'];
      if (s === 'QUEUED') {
        tell(got.reply);
        continue;
      }
      if (s === 'REQUEST_EXPIRED') continue;
      return got;
    }
  } finally {
    stopBeats.abort();
  }
}

/**
 * Releases a session whose acquire was given up on (a queued one leaves
 * the queue), then keeps listening to the acquire's attempts for a while
 * and releases again after any grant that still comes.
 */
async function undo(owner: SeatOwner, attempt: AcquireAttempt, target: SeatTarget): Promise<void> {
  const t = owner.timing;
  try {
    if (!target.lease) return; // the gateway never answered: it made no lease we could send
    const first = await owner.backend.release(target, Date.now() + t.giveUpAfterMs);
    if (first === null) owner.log('warn', `no answer to the release of the given-up acquire of ${target.license}/${target.session}`);
    const until = Date.now() + t.giveUpAfterMs;
    for (;;) {
      const late = await attempt.next(until);
      if (late === null) return;
      if (GRANTS.has(late.reply['status'] ?? '')) {
        owner.log('info', `releasing ${target.license}/${target.session}, granted after its acquire was given up on`);
        await owner.backend.release(target, Date.now() + t.giveUpAfterMs);
      }
    }
  } catch (e) {
    owner.log('warn', `could not undo the acquire of ${target.license}/${target.session}: ${describe(e)}`);
  } finally {
    attempt.close();
  }
}

function raceAbort<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T | 'aborted'> {
  if (!signal) return p;
  if (signal.aborted) return Promise.resolve('aborted');
  return new Promise((resolve, reject) => {
    const onAbort = (): void => resolve('aborted');
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}

function checkSpec(license: string, opts: AcquireOptions): AcquireSpec {
  const bad = (what: string): SeatgateError => new SeatgateError('INVALID_ARGUMENT', what);
  if (!isId(license)) throw bad(`license ${JSON.stringify(license)} is not 1 to 128 characters of A-Z a-z 0-9 . _ - : @`);
  const session = opts.session ?? `node-${randomHex(8)}`;
  if (!isId(session)) throw bad(`session ${JSON.stringify(session)} is not 1 to 128 characters of A-Z a-z 0-9 . _ - : @`);
  for (const [name, v] of [['user', opts.user], ['group', opts.group]] as const) {
    if (v !== undefined && !isId(v)) throw bad(`${name} ${JSON.stringify(v)} is not 1 to 128 characters of A-Z a-z 0-9 . _ - : @`);
  }
  if (opts.lease !== undefined && !isLease(opts.lease)) throw bad('a lease is 16 to 128 characters of A-Z a-z 0-9 _ -');
  const whole = (name: string, v: number | undefined, max: number): void => {
    if (v !== undefined && (!Number.isInteger(v) || v < 0 || v > max)) throw bad(`${name} must be a whole number from 0 to ${max}`);
  };
  whole('priority', opts.priority, 9);
  whole('borrowMs', opts.borrowMs, 31_536_000_000);
  whole('waitMs', opts.waitMs, 86_400_000);
  if (opts.meta !== undefined && (opts.meta === null || typeof opts.meta !== 'object' || Array.isArray(opts.meta))) {
    throw bad('meta must be a JSON object');
  }
  return {
    license,
    session,
    lease: opts.lease,
    user: opts.user,
    group: opts.group,
    priority: opts.priority,
    borrowMs: opts.borrowMs,
    waitMs: opts.waitMs ?? 0,
    meta: opts.meta,
  };
}
