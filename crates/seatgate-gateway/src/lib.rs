//! `seatgate gateway`: the front door of a seatgate deployment. A stateless
//! HTTPS service that takes seat requests from desktops and services in any
//! language, decides who is asking from the bearer credential (a gateway
//! token, or an OpenID Connect access token), and sends each request to the
//! workers through the Rust client on the caller's application's requests
//! stream, like any other application: every promise of the engine holds
//! through it. Any number of gateways can run behind a load balancer; they
//! share nothing but Redis.
//!
//! - [`config`]: the `gateway` settings;
//! - [`tokens`]: gateway tokens, stored as hashes (`seatgate token`);
//! - `auth`: who a credential is; `state`: what the handlers share;
//! - `api`: the routes (docs/gateway.md), [`openapi`]: their document;
//! - [`events`]: server-sent events from the license's events stream;
//! - [`borrow`]: signed borrow tokens and their keys;
//! - [`problem`]: RFC 9457 errors;
//! - `server`: TLS, limits, `Host` and CORS, the listener.

// A handler's error is its HTTP answer (a `Problem`, some 150 bytes), made
// once per refused request: boxing it would buy nothing.
#![allow(clippy::result_large_err)]

mod api;
mod auth;
pub mod borrow;
pub mod config;
mod error;
pub mod events;
pub mod metrics;
pub mod openapi;
pub mod problem;
mod server;
mod state;
pub mod tokens;

pub use api::{IDEMPOTENCY_HEADER, LEASE_HEADER};
pub use auth::{AuthFailure, Caller};
pub use config::GatewaySettings;
pub use error::GatewayError;
pub use server::{serve, use_ring_for_tls};
pub use state::Deployment;
