//! The engine: what a seat decision is, independent of how it is served.
//!
//! Key names and id rules, the wire statuses and protocol, the license
//! record, and the Lua script registry with one typed call per script. It
//! knows nothing of HTTP, settings files or the tokio runtime: whatever it
//! needs (a prefix, a limit, a connection) it is handed.

pub mod keys;
pub mod license;
pub mod protocol;
pub mod scripts;
pub mod status;
