//! Typed errors of the library. `main` turns them into one line for people:
//! each message says what failed and, where it helps, what to do.

use std::net::SocketAddr;
use std::time::Duration;

/// Everything that can go wrong inside seatgate, one variant per kind of
/// failure, each keeping its source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is unusable; the message names the key.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The settings could not be read or parsed (file, environment).
    #[error("bad configuration: {0}")]
    Settings(#[from] config::ConfigError),
    /// Redis could not be reached or answered with an error.
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis could not be reached in a way that points at a setting: a plain
    /// URL against a TLS-only server, an untrusted certificate, a missing
    /// client certificate. The hint says what to change.
    #[error("redis error: {source}; {hint}")]
    Connect {
        /// What redis-rs reported.
        source: redis::RedisError,
        /// What to check or change, in a few words.
        hint: &'static str,
    },
    /// A script answered something its header does not promise.
    #[error("unexpected reply from the {script} script: {detail}")]
    ScriptReply {
        /// Script name.
        script: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A client request got no reply in time.
    #[error("no reply within {0:?}; is `seatgate run` running against the same Redis and stream?")]
    ReplyTimeout(Duration),
    /// The request client cannot go on: its reply reader stopped, or a
    /// request id already has a waiter.
    #[error("client: {0}")]
    Client(String),
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
    /// A license or session id outside `[A-Za-z0-9._:@-]{1,128}`.
    #[error("{what} id {value:?} must be 1 to 128 characters of A-Z a-z 0-9 . _ - : @")]
    InvalidId {
        /// `license` or `session`.
        what: &'static str,
        /// The id as given.
        value: String,
    },
    /// A license record that breaks the provisioning rules (engine::license),
    /// refused before it is written; the message names the field and value.
    #[error("{0}")]
    InvalidLicense(String),
    /// An HTTP endpoint could not bind its address.
    #[error("cannot listen on {setting} {addr}: {source}")]
    Listen {
        /// The setting that names the address (`metrics.listen`, `http.page_listen`).
        setting: &'static str,
        /// The configured address.
        addr: SocketAddr,
        /// Why the bind failed.
        source: std::io::Error,
    },
    /// The Prometheus exporter could not be installed.
    #[error("cannot install the Prometheus exporter: {0}")]
    Metrics(String),
    /// The reaper's `reaper.schedule` is not a cron expression.
    #[error("reaper.schedule {schedule:?} is not a 6-field cron expression (sec min hour day month weekday): {source}")]
    Schedule {
        /// The expression as configured.
        schedule: String,
        /// The parser's complaint.
        source: tokio_cron_scheduler::JobSchedulerError,
    },
    /// The reaper's scheduler failed to start or stop.
    #[error("reaper scheduler: {0}")]
    Scheduler(#[from] tokio_cron_scheduler::JobSchedulerError),
    /// A task of this process panicked or was cancelled.
    #[error("a seatgate task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A private redis-server or cluster (tests, benchmark) would not start.
    #[error("local redis-server: {0}")]
    LocalRedis(String),
    /// A benchmark scenario failed.
    #[error("benchmark: {0}")]
    Bench(String),
    /// A history run (tools::history) could not be run.
    #[error("history run: {0}")]
    History(String),
    /// Something local (socket, file) failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Result with seatgate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
