//! Running seatgate as a service: logs and metrics, the HTTP endpoint
//! (`/metrics`, `/live`, `/ready`, the status page) and `seatgate run`, which
//! wires the runtime together and shuts it down gracefully. Uses the runtime
//! (and the status view, for the page).

pub mod http;
pub mod page;
pub mod run;
pub mod telemetry;
