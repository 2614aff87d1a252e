//! Integration tests against real redis-server processes started by the
//! harness (see `support`). One binary, one module per area.

mod cli;
mod cluster;
mod faults;
mod invalid;
mod queue;
mod scripts;
mod stream;
mod support;
mod tls;
