//! The caller's side: the request/reply client, `seatgate status` and
//! `seatgate report` (usage over a period, from the events).
//! The request/reply client is request.rs, its reply reader reader.rs, the
//! waiter table waiters.rs; the reply itself (reply.rs) is imported by the
//! other three, so the arrows between them point one way.
//! Uses the engine only (plus the connection and settings).

mod reader;
mod reply;
pub mod report;
mod request;
pub mod usage;
mod waiters;

pub use reply::ReplyMsg;
pub use request::{Call, Client, Pending, Revoke, Stats, ADMIN_CLIENT_NAME};
