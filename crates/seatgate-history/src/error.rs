//! The history run's error: what the server, the engine, the client or a
//! private redis-server reported, or a failure of the history run itself.

/// Why the history run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server library (settings, runtime) failed.
    #[error(transparent)]
    Seatgate(#[from] seatgate::Error),
    /// The engine, the connection to Redis or the client failed.
    #[error(transparent)]
    Core(#[from] seatgate_core::Error),
    /// A private redis-server or cluster would not start or change.
    #[error(transparent)]
    LocalRedis(#[from] seatgate_testkit::Error),
    /// Redis answered with an error or could not be reached.
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    /// A file or process failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A task of the history run panicked or was cancelled.
    #[error("a task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// Bad options.
    #[error("{0}")]
    Usage(String),
    /// The history run itself failed; the message says how.
    #[error("history run: {0}")]
    History(String),
}
