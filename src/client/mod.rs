//! The caller's side: the request/reply client, `seatgate status` reports.
//! Uses the engine only (plus the connection and settings).

pub mod report;
mod request;

pub use request::{Call, Client, ReplyMsg, Revoke, ADMIN_CLIENT_NAME};
