//! seatgate: a floating-license seat service on Redis.
//!
//! Services XADD `acquire` / `release` / `heartbeat` requests to a Redis
//! Stream; `seatgate run` workers (one consumer group, any number of
//! processes) decide each with an atomic Lua script and XADD the reply to the
//! caller's `reply_to` stream. docs/architecture.md walks one request through
//! the layers below; arrows point down only.
//!
//! - [`cli`]      the `seatgate` command line; `main.rs` only calls it (and
//!   sets the binary's allocator, mimalloc, behind the default `mimalloc` feature)
//! - [`ops`]      running it as a service
//!   - [`ops::service`]    `seatgate run`: worker + reaper + HTTP endpoint + graceful shutdown
//!   - [`ops::http`]       `/metrics`, `/live`, `/ready`, and the page's own listener
//!   - [`ops::page`]       the live status page: `/`, `/status.json`, `/license.json`; one snapshot per interval for every viewer
//!   - [`ops::telemetry`]  tracing setup and the Prometheus exporter (names: `runtime::metrics`)
//! - [`runtime`]  serving the engine from Redis Streams
//!   - [`runtime::worker`]   XREADGROUP → decide → reply → XACK, claims, dead letters
//!   - [`runtime::reaper`]   scheduled eviction, queue timeouts, self-healing grants, stream upkeep
//!   - [`runtime::publish`]  replies sent later (GRANTED, QUEUE_TIMEOUT); the scripts record events
//!   - [`runtime::relay`]    on a cluster, each license's events from its own log to its shard
//!   - [`runtime::fault`]    the tests' fault hook (`SEATGATE_FAULT`, feature `tools`)
//! - [`views`]    read models for operators, below both `ops` and `cli`
//!   - [`views::status`]  `seatgate status` and the status page's snapshot: holders and queues per license
//!   - [`views::usage`]   `seatgate report`: usage per license over a period, from the events
//!   - [`views::audit`]   `seatgate audit`: the events replayed against the seat rules and the state in Redis
//! - [`client`]   the caller's side
//!   - [`client::Client`]    the request/reply client: clones share one connection and one reply stream
//!   - [`client::ReplyMsg`]  a reply as received (client/reply.rs, below the reader and the waiter table)
//! - [`engine`]   what a seat decision is
//!   - [`engine::keys`]      every Redis key name, the per-license hash tag `{<license>}`, shards
//!   - [`engine::status`]    the wire statuses, one enum
//!   - [`engine::protocol`]  what every request shares on the wire: limits, field names, leases, the reply (docs/protocol.md)
//!   - [`engine::ops`]       one file per op (acquire, release, heartbeat, revoke): its fields, parsing, script call, statuses
//!   - [`engine::events`]    the seat event record: types, fields, encoded and decoded
//!   - [`engine::license`]   the license record: put / show / list / delete, its rules
//!   - [`engine::policy`]    license policies: per-user and per-group limits, reservations, priority, linger, borrowing
//!   - [`engine::scripts`]   the embedded Lua registry (lua/*.lua, lua/includes/), one typed call per script,
//!     every reply decoded (a seat script's into a `Decision`)
//!   - [`engine::records`]   the records the scripts store (sessions, waiters, owners, dedupe), decoded
//!   - [`engine::revocation`] the record of a revoked session, and what it is told
//! - [`config`]   typed settings: config/default.toml → `--config` file → `SEATGATE__*` env
//! - [`db`]       the connection: one node or Redis Cluster, same commands
//! - [`error`]    the library's error type
//! - `tools`      (feature `tools`) `seatgate bench`, private redis-server and clusters

pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod engine;
pub mod error;
pub mod ops;
pub mod runtime;
#[cfg(feature = "tools")]
pub mod tools;
pub mod views;

pub use error::{Error, Result};

/// Opens the shared connection for scripts, replies and acks (one node or a cluster).
pub async fn connect(settings: &config::Settings) -> Result<db::Db> {
    db::Db::connect(&settings.redis).await
}
