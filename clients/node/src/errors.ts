//! The one error type of the package: a code to match on and one line for people.

import type { Reply } from './wire.js';

/**
 * What went wrong, by `code`:
 *
 * - a wire status (`NO_SEATS_AVAILABLE`, `QUEUE_TIMEOUT`, `LIMIT_REACHED`,
 *   `LICENSE_NOT_FOUND`, `SESSION_NOT_ACTIVE`, …) when the service refused:
 *   `reply` is its answer;
 * - `REDIS_UNAVAILABLE`: Redis could not be reached or failed (also when a
 *   request got no reply because Redis refused its sends with `OOM`: the
 *   message says Redis is out of memory);
 * - `GATEWAY_UNAVAILABLE`: the gateway could not be reached, or answered an
 *   HTTP error of its own (`reply.code` says which, e.g. `UNAUTHENTICATED`);
 * - `TIMEOUT`: no answer in time (is a `seatgate run` worker serving?);
 * - `ABORTED`: the caller's AbortSignal fired;
 * - `CLOSED`: the client was closed;
 * - `INVALID_ARGUMENT`: a value the service would refuse.
 */
export type SeatgateErrorCode =
  | 'REDIS_UNAVAILABLE'
  | 'GATEWAY_UNAVAILABLE'
  | 'TIMEOUT'
  | 'ABORTED'
  | 'CLOSED'
  | 'INVALID_ARGUMENT'
  | (string & {});

export class SeatgateError extends Error {
  /** What kind of failure: see {@link SeatgateErrorCode}. */
  readonly code: SeatgateErrorCode;
  /** The service's answer, for a refusal. */
  readonly reply: Reply | undefined;

  constructor(code: SeatgateErrorCode, message: string, options?: { reply?: Reply; cause?: unknown }) {
    super(oneLine(message), options?.cause !== undefined ? { cause: options.cause } : undefined);
    this.name = 'SeatgateError';
    this.code = code;
    this.reply = options?.reply;
  }

  /** A refusal by the service: the reply's status is the code. */
  static refused(what: string, reply: Reply): SeatgateError {
    const status = reply['status'] ?? 'UNKNOWN';
    const error = reply['error'] ? `: ${reply['error']}` : '';
    return new SeatgateError(status, `${what} refused: ${status}${error}`, { reply });
  }
}

function oneLine(text: string): string {
  return text.replace(/\s*[\r\n]+\s*/g, ' ').trim();
}

/** What a Redis `OOM` refusal means, and what to do. */
export const OUT_OF_MEMORY = 'Redis is out of memory (OOM) and refuses writes: raise its maxmemory or free memory';

/** Whether `e` is Redis's `OOM` refusal (used memory above maxmemory). */
export function isOutOfMemory(e: unknown): boolean {
  return e instanceof Error && e.message.startsWith('OOM ');
}

/** A short description of an unknown thrown value; Redis's `OOM` refusal says what it means. */
export function describe(e: unknown): string {
  if (isOutOfMemory(e)) return `${OUT_OF_MEMORY} (${(e as Error).message})`;
  if (e instanceof Error) return e.message;
  return String(e);
}
