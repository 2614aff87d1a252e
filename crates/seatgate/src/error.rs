//! Typed errors of the server and its command line. `main` turns them into
//! one line for people: each message says what failed and, where it helps,
//! what to do.

use std::net::SocketAddr;

/// Everything that can go wrong in `seatgate`, one variant per kind of
/// failure, each keeping its source. What the engine, the connection or the
/// client report comes as [`Error::Core`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine, the connection to Redis or the client failed.
    #[error(transparent)]
    Core(#[from] seatgate_core::Error),
    /// A setting is unusable; the message names the key.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The settings could not be read or parsed (file, environment).
    #[error("bad configuration: {0}")]
    Settings(#[from] config::ConfigError),
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
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
    /// The function library on Redis under this build's name holds other
    /// code (someone replaced it): nothing is decided with it.
    #[error("the function library {0} on Redis holds code that is not this build's (replaced with FUNCTION LOAD REPLACE): remove it with FUNCTION DELETE {0}, and a worker loads its own")]
    ForeignLibrary(String),
    /// The gateway, or a token command, failed.
    #[error(transparent)]
    Gateway(#[from] seatgate_gateway::GatewayError),
    /// Something local (socket, file) failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error::Core(seatgate_core::Error::Redis(e))
    }
}

impl Error {
    /// The Redis error underneath, if Redis is what failed.
    pub fn redis(&self) -> Option<&redis::RedisError> {
        match self {
            Error::Core(seatgate_core::Error::Redis(e)) => Some(e),
            Error::Core(seatgate_core::Error::Connect { source, .. }) => Some(source),
            _ => None,
        }
    }
}

/// Result with the server's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether this is a connection to Redis that broke under a command (a
    /// Redis restart, a failover): the next command on a managed connection,
    /// which has reconnected, does not meet it, so one more try is worth it.
    pub fn is_broken_connection(&self) -> bool {
        match self {
            Error::Core(seatgate_core::Error::Redis(e)) => e.is_io_error() || e.is_connection_dropped(),
            _ => false,
        }
    }
}
