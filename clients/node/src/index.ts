//! seatgate's TypeScript client.
//!
//! - `client.ts`: `Client.connect` (Redis mode), `Client.gateway` (HTTP mode), `close()`.
//! - `seat.ts`: the seat handle — acquire (with the wait queue), heartbeats, lost, honest release.
//! - `redis.ts`: the Redis Streams transport (one request connection, one blocking reply reader).
//! - `gateway.ts`: the HTTPS gateway transport (JSON calls, SSE for waits).
//! - `wire.ts`: statuses, replies, leases, shards (docs/protocol.md).
//! - `errors.ts`: SeatgateError.

export { Client } from './client.js';
export type { CommonOptions, ConnectOptions, GatewayOptions } from './client.js';
export { Seat } from './seat.js';
export type { AcquireOptions, ReleaseResult, SeatEvents, SeatLoss, SeatState } from './seat.js';
export { SeatgateError } from './errors.js';
export type { SeatgateErrorCode } from './errors.js';
export type { Logger } from './backend.js';
export type { Reply } from './wire.js';
export { crc32 } from './wire.js';
