//! The engine: what a seat decision is, independent of how it is served.
//!
//! Key names and id rules, the wire statuses and protocol, the ops (one
//! file each: a request's own fields, parsing and script call), the seat event
//! record, the license record and its policies, the Lua script registry
//! with one typed call per script, and the records the scripts store,
//! decoded. It knows nothing of HTTP, settings files or the tokio runtime:
//! whatever it needs (a prefix, a limit, a connection) it is handed.

pub mod events;
pub mod keys;
pub mod license;
pub mod ops;
pub mod policy;
pub mod protocol;
pub mod provision;
pub mod records;
pub mod revocation;
pub mod scripts;
pub mod status;
