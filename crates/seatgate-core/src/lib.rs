//! seatgate-core: what a seat decision is, independent of how it is served.
//!
//! Key names and id rules, the wire statuses and protocol, the requests (one
//! file per op: its own fields, parsing and script call), the seat event
//! record, the license record and its policies, the Lua library with one
//! typed call per script, the records the scripts store, decoded, and the
//! connection to Redis (one node or a cluster). It knows nothing of HTTP,
//! settings files, the scheduler or the runtime: whatever it needs (a
//! prefix, a limit, a connection) it is handed. The server (`seatgate`) and
//! the client (`seatgate-client`) are built on it. docs/architecture.md
//! draws the layers; arrows point down only.
//!
//! - [`keys`]       every Redis key name, the per-license hash tag `{<license>}`, shards
//! - [`status`]     the wire statuses, one enum
//! - [`protocol`]   what every request shares on the wire: limits, field names, leases, the reply (docs/protocol.md)
//! - [`request`]    one file per op (acquire, release and heartbeat, revoke): its fields, parsing, script call, statuses;
//!   the guard every seat call carries (dedupe, expiry, rate limits)
//! - [`events`]     the seat event record: types, fields, encoded and decoded
//! - [`license`]    the license record: put / show / list / delete, its rules
//! - [`provision`]  changing a license record atomically with its check
//! - [`policy`]     license policies: per-user and per-group limits, reservations, priority, linger, borrowing
//! - [`scripts`]    the embedded Lua library (`lua/*.lua`, `lua/includes/`), one typed call per script,
//!   every reply decoded (a seat script's into a `Decision`)
//! - [`records`]    the records the scripts store (sessions, waiters, owners, dedupe), decoded
//! - [`revocation`] the record of a revoked session, and what it is told
//! - [`tenancy`]    who is asking: the application in every session, user and group id
//! - [`db`]         the connection: one node or Redis Cluster, same commands; [`db::RedisSettings`]
//! - [`error`]      the error type

pub mod db;
pub mod error;
pub mod events;
pub mod keys;
pub mod license;
pub mod policy;
pub mod protocol;
pub mod provision;
pub mod records;
pub mod request;
pub mod revocation;
pub mod scripts;
pub mod status;
pub mod tenancy;

pub use error::{Error, Result};
