//! The HTTP transport: the same seat handle through `seatgate gateway`
//! (docs/gateway.md). The credential decides the application, user and
//! group; the gateway makes the lease; a wait is followed on the seat's
//! server-sent events, reconnecting with Last-Event-ID.

import * as http from 'node:http';
import * as https from 'node:https';

import type { AcquireAttempt, AcquireSpec, Backend, Logger, SeatTarget, Timing } from './backend.js';
import { SeatgateError, describe } from './errors.js';
import { Inbox, randomHex, RETRY_LATER, sleep } from './wire.js';
import type { Received, Reply } from './wire.js';

export interface GatewayTransportOptions {
  readonly baseUrl: string;
  readonly token: string;
  /** PEM of the CA(s) to trust for https. */
  readonly ca: string | Buffer | undefined;
  readonly timing: Timing;
  readonly log: Logger;
}

/** How long an HTTP call waits for its answer: above the gateway's reply_timeout_ms (10 s). */
const CALL_TIMEOUT_MS = 15_000;

interface Answer {
  readonly status: number;
  readonly body: Record<string, unknown>;
}

/** A JSON answer's fields as a wire reply: every value a string. */
function toReply(body: Record<string, unknown>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(body)) {
    if (v === null || v === undefined) continue;
    out[k] = typeof v === 'string' ? v : typeof v === 'number' || typeof v === 'boolean' ? String(v) : JSON.stringify(v);
  }
  // A problem+json carries the wire status in `code` and the text in `detail`.
  if (out['status'] !== undefined && /^\d+$/.test(out['status']) && out['code'] !== undefined) {
    out['http_status'] = out['status'];
    out['status'] = out['code'];
    if (out['detail'] !== undefined) out['error'] = out['detail'];
  }
  return out;
}

/** The gateway's own codes, which are no answer about the seat: try again. */
const GATEWAY_TRANSIENT: ReadonlySet<string> = new Set(['UNAVAILABLE', 'TIMEOUT', 'RATE_LIMITED']);
/** The gateway's own refusals of the caller: no use trying again. */
const GATEWAY_FATAL: ReadonlySet<string> = new Set(['UNAUTHENTICATED', 'FORBIDDEN', 'MISDIRECTED', 'BAD_REQUEST']);

export class GatewayTransport implements Backend {
  readonly where: string;
  private readonly opts: GatewayTransportOptions;
  private readonly base: URL;
  private readonly agent: http.Agent;
  private readonly open = new Set<http.ClientRequest>();
  private closing = false;
  /** The last failure to get an answer, for the message of a give-up. */
  private lastFailure = '';

  constructor(opts: GatewayTransportOptions) {
    this.opts = opts;
    this.base = new URL(opts.baseUrl);
    if (this.base.protocol !== 'https:' && this.base.protocol !== 'http:') {
      throw new SeatgateError('INVALID_ARGUMENT', `the gateway's baseUrl must be https:// (or http:// on loopback), not ${opts.baseUrl}`);
    }
    this.where = `the gateway at ${this.base.origin}`;
    this.agent =
      this.base.protocol === 'https:'
        ? new https.Agent({ keepAlive: true, ...(opts.ca !== undefined ? { ca: opts.ca } : {}) })
        : new http.Agent({ keepAlive: true });
  }

  private headers(extra: Record<string, string>): Record<string, string> {
    return { authorization: `Bearer ${this.opts.token}`, accept: 'application/json', ...extra };
  }

  /** One HTTP call; throws GATEWAY_UNAVAILABLE when no answer came. */
  private call(method: string, path: string, headers: Record<string, string>, body?: unknown, signal?: AbortSignal): Promise<Answer> {
    if (this.closing) return Promise.reject(new SeatgateError('CLOSED', 'the seatgate client is closed'));
    const url = new URL(path, this.base);
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const lib = url.protocol === 'https:' ? https : http;
    return new Promise<Answer>((resolve, reject) => {
      const req = lib.request(
        url,
        {
          method,
          agent: this.agent,
          headers: this.headers({
            ...headers,
            ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}),
          }),
          timeout: CALL_TIMEOUT_MS,
          ...(signal ? { signal } : {}),
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            this.open.delete(req);
            const text = Buffer.concat(chunks).toString('utf8');
            let parsed: unknown = {};
            try {
              parsed = text ? JSON.parse(text) : {};
            } catch {
              parsed = { detail: text };
            }
            const obj = parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : {};
            resolve({ status: res.statusCode ?? 0, body: obj });
          });
          res.on('error', (e) => {
            this.open.delete(req);
            reject(new SeatgateError('GATEWAY_UNAVAILABLE', `${this.where}: ${e.message}`, { cause: e }));
          });
        },
      );
      this.open.add(req);
      req.on('timeout', () => req.destroy(new Error(`no answer within ${CALL_TIMEOUT_MS} ms`)));
      req.on('error', (e) => {
        this.open.delete(req);
        reject(new SeatgateError('GATEWAY_UNAVAILABLE', `cannot reach ${this.where}: ${e.message}`, { cause: e }));
      });
      req.end(payload);
    });
  }

  /**
   * Calls until an answer about the seat comes (a wire status, or a
   * gateway refusal of the caller, which is thrown); network failures and
   * the gateway's own 503/504/429 are tried again after a pause. null at
   * `untilMs` or when `signal` aborts.
   */
  private async callUntilAnswered(
    what: string,
    method: string,
    path: string,
    headers: Record<string, string>,
    body: unknown,
    untilMs: number | undefined,
    signal: AbortSignal | undefined,
  ): Promise<Reply | null> {
    let pause = 200;
    for (;;) {
      if (signal?.aborted) return null;
      if (untilMs !== undefined && Date.now() >= untilMs) return null;
      let failure: string;
      try {
        const a = await this.call(method, path, headers, body, signal);
        const reply = toReply(a.body);
        const code = reply['status'] ?? '';
        if (a.status === 401 || (GATEWAY_FATAL.has(code) && a.status >= 400)) {
          throw new SeatgateError('GATEWAY_UNAVAILABLE', `${what} refused by ${this.where}: ${code || a.status} ${reply['error'] ?? ''}`, {
            reply,
          });
        }
        // 429 (a worker's RATE_LIMITED or the gateway's own), 503
        // UNAVAILABLE, 504 TIMEOUT / REQUEST_EXPIRED and a 5xx without a
        // problem decided nothing: try again. Any other answer is the seat's.
        const undecided =
          a.status === 429 || GATEWAY_TRANSIENT.has(code) || code === 'REQUEST_EXPIRED' || (a.status >= 500 && code === '');
        if (!undecided) return reply;
        failure = `${a.status} ${code} ${reply['error'] ?? ''}`.trim();
      } catch (e) {
        if (e instanceof SeatgateError && e.code !== 'GATEWAY_UNAVAILABLE') throw e;
        if (e instanceof SeatgateError && e.reply) throw e;
        if (signal?.aborted || this.closing) return null;
        failure = describe(e);
      }
      this.lastFailure = failure;
      this.opts.log('warn', `${what}: ${failure}; trying again`);
      const left = untilMs === undefined ? pause : Math.min(pause, untilMs - Date.now());
      await sleep(left, signal);
      pause = Math.min(pause * 2, 2000);
    }
  }

  private seatPath(license: string, session?: string): string {
    const l = `/v1/licenses/${encodeURIComponent(license)}/seats`;
    return session === undefined ? l : `${l}/${encodeURIComponent(session)}`;
  }

  startAcquire(spec: AcquireSpec): AcquireAttempt {
    // The same key on every try: the gateway derives the same lease and
    // answers the same seat (ALREADY_ACTIVE) or place (QUEUED).
    const key = randomHex(16);
    const body: Record<string, unknown> = { session: spec.session };
    if (spec.meta !== undefined) body['meta'] = spec.meta;
    if (spec.waitMs > 0) body['wait_ms'] = spec.waitMs;
    if (spec.priority) body['priority'] = spec.priority;
    if (spec.borrowMs) body['borrow_ms'] = spec.borrowMs;
    if (spec.user !== undefined) body['user'] = spec.user;
    if (spec.group !== undefined) body['group'] = spec.group;
    const inbox = new Inbox<Received>();
    const follow = new AbortController();
    let lease = '';
    let attempts = 0;
    let firstSentAt = 0;
    const self = this;
    const path = this.seatPath(spec.license);
    return {
      get lease() {
        return lease;
      },
      get attempts() {
        return attempts;
      },
      get firstSentAt() {
        return firstSentAt;
      },
      async first(giveUpAt, signal) {
        firstSentAt = Date.now();
        attempts = 1;
        const reply = await self.callUntilAnswered(
          `acquire ${spec.license}/${spec.session}`,
          'POST',
          path,
          { 'idempotency-key': key },
          body,
          giveUpAt,
          signal,
        );
        if (reply === null) {
          if (signal?.aborted) return null;
          const last = self.lastFailure ? ` (last: ${self.lastFailure})` : '';
          throw new SeatgateError('TIMEOUT', `no answer to acquire ${spec.license}/${spec.session} from ${self.where}${last}`);
        }
        lease = reply['lease'] ?? '';
        if (reply['status'] === 'QUEUED' && reply['events'] && lease) {
          void self.follow(reply['events'], lease, spec.session, inbox, follow.signal);
        }
        return { reply, writtenMs: undefined };
      },
      next(until, signal) {
        return inbox.next(until, signal);
      },
      close() {
        follow.abort();
        inbox.close();
      },
    };
  }

  /**
   * Follows a wait's events (SSE), reconnecting with Last-Event-ID, and
   * pushes the wire reply each ending event stands for: granted → GRANTED,
   * queue_timeout → QUEUE_TIMEOUT, revoked → SESSION_REVOKED, …
   */
  private async follow(link: string, lease: string, session: string, inbox: Inbox<Received>, signal: AbortSignal): Promise<void> {
    let lastId = '';
    let pause = 200;
    while (!signal.aborted && !this.closing) {
      try {
        const ended = await this.readEvents(link, lease, lastId, signal, (id, event, data) => {
          if (id) lastId = id;
          const reply = eventReply(event, data, session);
          if (reply) inbox.push({ reply, writtenMs: undefined });
          return reply !== undefined && reply['status'] !== 'QUEUED';
        });
        if (ended) return;
        pause = 200;
      } catch (e) {
        if (signal.aborted || this.closing) return;
        this.opts.log('warn', `following the wait of ${session} on ${this.where}: ${describe(e)}; reconnecting`);
      }
      await sleep(pause, signal);
      pause = Math.min(pause * 2, 2000);
    }
  }

  /** Reads one SSE connection until it ends, `onEvent` says the wait ended (true), or `signal`. */
  private readEvents(
    link: string,
    lease: string,
    lastId: string,
    signal: AbortSignal,
    onEvent: (id: string, event: string, data: Record<string, unknown>) => boolean,
  ): Promise<boolean> {
    const url = new URL(link, this.base);
    const lib = url.protocol === 'https:' ? https : http;
    const headers = this.headers({ accept: 'text/event-stream', 'seatgate-lease': lease, ...(lastId ? { 'last-event-id': lastId } : {}) });
    return new Promise<boolean>((resolve, reject) => {
      const req = lib.request(url, { method: 'GET', agent: this.agent, headers, signal }, (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          this.open.delete(req);
          reject(new Error(`events answered HTTP ${res.statusCode}`));
          return;
        }
        res.setEncoding('utf8');
        let buf = '';
        let done = false;
        res.on('data', (chunk: string) => {
          buf += chunk.replace(/\r\n/g, '\n');
          let end: number;
          while (!done && (end = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, end);
            buf = buf.slice(end + 2);
            let id = '';
            let event = '';
            let data = '';
            for (const line of block.split('\n')) {
              if (line.startsWith('id:')) id = line.slice(3).trim();
              else if (line.startsWith('event:')) event = line.slice(6).trim();
              else if (line.startsWith('data:')) data += line.slice(5).trimStart();
            }
            if (!event) continue; // a keep-alive comment
            let parsed: Record<string, unknown> = {};
            try {
              const p: unknown = JSON.parse(data || '{}');
              if (p !== null && typeof p === 'object') parsed = p as Record<string, unknown>;
            } catch {
              /* an event we cannot read is skipped */
            }
            if (onEvent(id, event, parsed)) {
              done = true;
              this.open.delete(req);
              req.destroy();
              resolve(true);
            }
          }
        });
        res.on('end', () => {
          this.open.delete(req);
          if (!done) resolve(false);
        });
        res.on('error', (e) => {
          this.open.delete(req);
          if (!done) reject(e);
        });
      });
      this.open.add(req);
      req.on('error', (e) => {
        this.open.delete(req);
        reject(e);
      });
      req.end();
    });
  }

  async heartbeat(target: SeatTarget, signal: AbortSignal | undefined, untilMs: number | undefined): Promise<Received | null> {
    const reply = await this.callUntilAnswered(
      `heartbeat ${target.license}/${target.session}`,
      'POST',
      `${this.seatPath(target.license, target.session)}/heartbeat`,
      { 'seatgate-lease': target.lease },
      undefined,
      untilMs,
      signal,
    );
    return reply === null ? null : { reply, writtenMs: undefined };
  }

  async release(target: SeatTarget, untilMs: number): Promise<Reply | null> {
    for (;;) {
      const reply = await this.callUntilAnswered(
        `release ${target.license}/${target.session}`,
        'DELETE',
        this.seatPath(target.license, target.session),
        { 'seatgate-lease': target.lease },
        undefined,
        untilMs,
        undefined,
      );
      if (reply === null || !RETRY_LATER.has(reply['status'] ?? '')) return reply;
      if (Date.now() >= untilMs) return null;
      await sleep(Math.max(10, this.opts.timing.requestTimeoutMs / 5));
    }
  }

  async close(): Promise<void> {
    this.closing = true;
    for (const req of this.open) req.destroy();
    this.open.clear();
    this.agent.destroy();
  }
}

/** The wire reply an event of the waiting session stands for, if any. */
function eventReply(event: string, data: Record<string, unknown>, session: string): Record<string, string> | undefined {
  const fields = toReply(data);
  if (fields['session'] !== undefined && fields['session'] !== session) return undefined;
  const base = { ...fields, session, op: 'acquire' };
  switch (event) {
    case 'granted':
      return { ...base, status: 'GRANTED', ok: '1' };
    case 'acquired':
      return { ...base, status: 'ACQUIRED', ok: '1' };
    case 'queued':
      return { ...base, status: 'QUEUED', ok: '0' };
    case 'queue_timeout':
      return { ...base, status: 'QUEUE_TIMEOUT', ok: '0', error: fields['error'] ?? `waited ${fields['waited_ms'] ?? '?'} ms without a seat` };
    case 'revoked':
      return { ...base, status: 'SESSION_REVOKED', ok: '0', error: `revoked by ${fields['actor'] ?? 'unknown'}: ${fields['reason'] ?? ''}` };
    case 'left_queue':
      return { ...base, status: 'LEFT_QUEUE', ok: '0', error: 'the session left the queue' };
    case 'denied':
      return { ...base, status: fields['reason'] ?? 'DENIED', ok: '0', error: `denied: ${fields['reason'] ?? ''}` };
    case 'evicted':
    case 'released':
      return { ...base, status: 'SESSION_NOT_ACTIVE', ok: '0', error: `the seat ended (${event} ${fields['reason'] ?? ''})`.trim() };
    default:
      return undefined;
  }
}
