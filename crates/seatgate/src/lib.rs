//! seatgate: the floating-license seat server. `seatgate run` serves the
//! engine (`seatgate-core`) from Redis Streams; the other subcommands are
//! the operator's tools over the same Redis.
//!
//! Services XADD `acquire` / `release` / `heartbeat` requests to a Redis
//! Stream; `seatgate run` workers (one consumer group, any number of
//! processes) decide each with an atomic Lua function and XADD the reply to
//! the caller's `reply_to` stream. docs/architecture.md walks one request
//! through the crates and layers below; arrows point down only.
//!
//! - `main.rs` and `cli/`: the `seatgate` command line (one file per
//!   subcommand; sets the binary's allocator, mimalloc, behind the default
//!   `mimalloc` feature)
//! - [`service`]  running it as a service
//!   - [`service::run`]        `seatgate run`: worker + reaper + HTTP endpoint + graceful shutdown
//!   - [`service::http`]       `/metrics`, `/live`, `/ready`, and the page's own listener
//!   - [`service::page`]       the live status page: `/`, `/status.json`, `/license.json`
//!   - [`service::telemetry`]  tracing setup and the Prometheus exporter (names: `runtime::metrics`)
//! - [`runtime`]  serving the engine from Redis Streams
//!   - [`runtime::worker`]   XREADGROUP → decide → reply → XACK, claims, dead letters
//!   - [`runtime::reaper`]   scheduled eviction, queue timeouts, self-healing grants, stream upkeep
//!   - [`runtime::publish`]  replies sent later (GRANTED, QUEUE_TIMEOUT); the scripts record events
//!   - [`runtime::relay`]    on a cluster, each license's events from its own log to its shard
//!   - [`runtime::fault`]    the tests' fault hook (`SEATGATE_FAULT`, feature `fault-injection`)
//! - [`views`]    read models for operators, below both `service` and the command line
//!   - [`views::status`]  `seatgate status` and the status page's snapshot
//!   - [`views::usage`]   `seatgate report`: usage per license over a period, from the events
//!   - [`views::audit`]   `seatgate audit`: the events replayed against the seat rules and the state in Redis
//! - [`config`]   typed settings: config/default.toml → `--config` file → `SEATGATE__*` env
//! - [`error`]    the server's error type (the engine's errors inside `Error::Core`)
//!
//! Below this crate: `seatgate-client` (the Rust client and seat handle, used by
//! the command line's requests) and `seatgate-core` (keys, protocol, requests,
//! the Lua library, the connection).

pub mod config;
pub mod error;
pub mod runtime;
pub mod service;
pub mod views;

pub use error::{Error, Result};

/// Opens the shared connection for scripts, replies and acks (one node or a cluster).
pub async fn connect(settings: &config::Settings) -> Result<seatgate_core::db::Db> {
    Ok(seatgate_core::db::Db::connect(&settings.redis).await?)
}
