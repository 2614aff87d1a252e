//! The caller's side: the request/reply client (request.rs), its reply
//! reader (reader.rs), the waiter table (waiters.rs) and the reply itself
//! (reply.rs), imported by the other three; arrows point one way.
//! Uses the engine only (plus the connection and settings).

mod reader;
mod reply;
mod request;
mod waiters;

pub use reply::ReplyMsg;
pub use request::{Call, Client, Pending, Revoke, Stats, ADMIN_CLIENT_NAME};
