//! The runtime: serving the engine from Redis Streams.
//!
//! The worker reads requests, decides them with the engine's scripts and
//! settles them (reply, event, XACK or dead letter); the reaper evicts,
//! times out and grants on a schedule, for the licenses the due index says
//! are due; `publish` writes events and the replies sent after the fact.
//! Uses the engine; used by `ops`.

pub mod due;
pub mod health;
pub mod log_limit;
pub mod metrics;
pub mod publish;
pub mod reaper;
pub mod worker;
