//! Read models for operators: what the licenses look like now (`seatgate
//! status`, the status page's snapshot) and what they were used for
//! over a period (`seatgate report`, and its daily rollups), checked against
//! the seat rules (`seatgate audit`). Below both `ops` and `cli`; uses the
//! engine (and the connection, settings and errors) only.

pub mod audit;
pub mod rollup;
pub mod status;
mod text;
pub mod usage;

pub use text::printable;
