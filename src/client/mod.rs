//! The caller's side: the request/reply client, `seatgate status` reports.
//! Uses the engine only (plus the connection and settings).

mod reader;
pub mod report;
mod request;
mod waiters;

pub use request::{Call, Client, Pending, ReplyMsg, Stats};
