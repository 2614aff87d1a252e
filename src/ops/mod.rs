//! Running seatgate as a service: logs and metrics, the HTTP endpoint
//! (`/metrics`, `/live`, `/ready`) and `seatgate run`, which wires the
//! runtime together and shuts it down gracefully. Uses the runtime.

pub mod http;
pub mod service;
pub mod telemetry;
