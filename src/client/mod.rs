//! The caller's side: the request/reply client, `seatgate status` and
//! `seatgate report` (usage over a period, from the events).
//! Uses the engine only (plus the connection and settings).

mod reader;
pub mod report;
mod request;
pub mod usage;
mod waiters;

pub use request::{Call, Client, Pending, ReplyMsg, Revoke, Stats, ADMIN_CLIENT_NAME};
