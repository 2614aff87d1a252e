//! The runtime: serving the engine from Redis Streams.
//!
//! The worker reads requests, decides them with the engine's scripts and
//! settles them (relay, reply, XACK or dead letter); the reaper evicts,
//! times out and grants on a schedule, for the licenses the due index says
//! are due; the scripts record their events themselves, and on a cluster
//! `relay` moves them to the events shards; `publish` writes the replies,
//! those sent after the fact too.
//! Uses the engine; used by `ops`.

pub mod due;
pub mod fault;
pub mod health;
pub mod log_limit;
pub mod metrics;
pub mod publish;
pub mod reaper;
pub mod relay;
pub mod worker;
