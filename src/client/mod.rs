//! The caller's side: the request/reply client, `seatgate status` and
//! `seatgate report` (usage over a period, from the events).
//! Uses the engine only (plus the connection and settings).

pub mod report;
mod request;
pub mod usage;

pub use request::{Call, Client, ReplyMsg, Revoke, ADMIN_CLIENT_NAME};
