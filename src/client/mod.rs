//! The caller's side: the request/reply client (request.rs), the seat
//! handle built on it (seat.rs: heartbeats, re-sends, releases), its reply
//! reader (reader.rs), the waiter table (waiters.rs) and the reply itself
//! (reply.rs), imported by the others; arrows point one way.
//! Uses the engine only (plus the connection and settings).

mod reader;
mod reply;
mod request;
mod seat;
mod waiters;

pub use reply::ReplyMsg;
pub use request::{Call, Client, Pending, Revoke, Stats, ADMIN_CLIENT_NAME};
pub use seat::{AcquireError, Seat, SeatOptions, SeatState};
