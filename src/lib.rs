//! seatgate: a floating-license seat service on Redis.
//!
//! Services XADD `acquire` / `release` / `heartbeat` requests to a Redis
//! Stream; `seatgate run` workers (one consumer group, any number of
//! processes) decide each with an atomic Lua script and XADD the reply to the
//! caller's `reply_to` stream. The map:
//!
//! - [`config`]     typed settings: config/default.toml → `--config` file → `SEATGATE__*` env
//! - [`db`]         the connection: one node or Redis Cluster, same commands
//! - [`error`]      the library's error type
//! - [`keys`]       every Redis key name, with the per-license hash tag `{<license>}`
//! - [`scripts`]    the embedded Lua registry (lua/*.lua) and typed calls into it
//! - [`status`]     the wire statuses, one enum
//! - [`protocol`]   request parsing and validation, reply formatting (docs/protocol.md)
//! - [`worker`]     the XREADGROUP consumer: decide → reply → XACK
//! - [`events`]     the events stream and replies sent later (GRANTED, QUEUE_TIMEOUT)
//! - [`report`]     `seatgate status`: holders and queues per license
//! - [`reaper`]     scheduled eviction of stale sessions, queue timeouts, self-healing grants
//! - [`license`]    license records: put / show / list / delete
//! - [`client`]     a request/reply client (the CLI's `acquire`, tests, benchmarks)
//! - [`telemetry`]  tracing setup and every metric name
//! - [`http`]       `/metrics`, `/live`, `/ready`
//! - [`local_redis`] a private redis-server on a free port (benchmark, tests)
//! - [`bench`]      `seatgate bench`: seatgate beside direct EVALSHA and the Redis ceiling
//! - [`cli`]        the `seatgate` command line; `main.rs` only calls it
//! - [`service`]    `seatgate run`: worker + HTTP endpoint + graceful shutdown

pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod error;
pub mod events;
pub mod http;
pub mod keys;
pub mod license;
pub mod local_redis;
pub mod protocol;
pub mod reaper;
pub mod report;
pub mod scripts;
pub mod service;
pub mod status;
pub mod telemetry;
pub mod worker;

pub use error::{Error, Result};

/// Opens the shared connection for scripts, replies and acks (one node or a cluster).
pub async fn connect(settings: &config::Settings) -> Result<db::Db> {
    db::Db::connect(&settings.redis).await
}
