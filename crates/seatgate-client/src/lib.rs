//! The Rust client of [seatgate], a floating-license seat service on Redis:
//! ask for a seat of a license, keep it while the program runs, give it back.
//!
//! ```no_run
//! use seatgate_client::{Call, Client, SeatOptions};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder()
//!     .url("redis://127.0.0.1:6379")
//!     .application("cad")
//!     .connect()
//!     .await?;
//! // Waits up to a minute in the queue if every seat is taken.
//! let call = Call::acquire("cad-pro", "ws-7").with_user("ada").with_wait(std::time::Duration::from_secs(60));
//! let seat = client.acquire_seat(&call, &SeatOptions::default()).await?;
//! // The product runs while the seat heartbeats by itself, until the user
//! // quits (here: Ctrl-C) or the service takes the seat away.
//! tokio::select! {
//!     _ = tokio::signal::ctrl_c() => {}
//!     why = seat.lost() => eprintln!("the seat was taken away: {why:?}"),
//! }
//! seat.release().await?;
//! client.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The builder needs only the Redis and the application's name: the
//! requests stream, its shards and the reply namespace are read from the
//! deployment, where `seatgate run` records them (`<prefix>:config`). Under
//! the shipped ACL an application's Redis user may send on its own stream
//! and read its own replies, nothing else (docs/configuration.md,
//! "Access control").
//!
//! - [`Client`]: one request connection and one reply stream, shared by every
//!   clone; any number of tasks call at once. [`Client::call`] sends a
//!   [`Call`] and returns its first [`Reply`]; [`Reply::decision`] says what
//!   was decided, typed ([`Decision`]).
//! - [`Seat`]: the seat handle of [`Client::acquire_seat`]. It sends `ttl_ms`
//!   with every request and sends a timed-out one again under a new id with
//!   the same lease, waits out QUEUED, heartbeats at a third of the timeout
//!   the service last gave, tells you when and why the seat was lost
//!   ([`Seat::lost`], [`Seat::watch`]), and releases it on [`Seat::release`]
//!   or drop.
//! - [`AdminClient`]: an administrator's client ([`ClientBuilder::connect_admin`]),
//!   the only one that can revoke a seat.
//!
//! The wire contract underneath, for clients in other languages, is
//! docs/protocol.md. Inside: the request side (request.rs), the seat handle
//! (seat.rs), the reply reader (reader.rs), the waiter table (waiters.rs), the leases
//! (leases.rs) and
//! the reply itself (reply.rs), imported by the others; arrows point one way.
//!
//! [seatgate]: https://seatgate.example/seatgate

mod leases;
mod reader;
mod reply;
mod request;
mod seat;
mod waiters;

pub use reply::{Decision, Reply};
pub use request::{
    AdminClient, Call, Client, ClientBuilder, Pending, Revoke, SeatOp, Stats, ADMIN_CLIENT_NAME,
};
pub use seat::{AcquireError, Released, Seat, SeatOptions, SeatState};
pub use seatgate_core::db::RedisSettings;
pub use seatgate_core::keys::Topology;
pub use seatgate_core::policy::RequestPolicy;
pub use seatgate_core::protocol::Lease;
pub use seatgate_core::status::Status;
pub use seatgate_core::Error;
