//! Typed errors of the library. `main` turns them into one line for people.

use std::time::Duration;

/// Everything that can go wrong inside seatgate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings are unusable; the message says which key.
    #[error("bad configuration: {0}")]
    Config(String),
    /// Redis could not be reached or answered with an error.
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
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
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
    /// Something local (socket bind, I/O) failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Result with seatgate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
