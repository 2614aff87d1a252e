//! Integration tests against real redis-server processes started by the
//! harness (see `support`). One binary, one module per area.

mod acl;
mod admin;
mod audit;
mod bounds;
mod cli;
mod client;
mod cluster;
mod delete;
mod due;
mod events_once;
mod examples;
mod faults;
mod gateway;
mod hardening;
mod history;
mod invalid;
mod lease;
mod metrics;
mod once;
mod outage;
mod package;
mod page;
mod policy;
mod prometheus;
mod queue;
mod report;
mod revoke;
mod scripts;
mod seams;
mod speed;
mod stream;
mod support;
mod tls;
