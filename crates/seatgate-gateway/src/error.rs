//! The gateway's errors: typed inside, one line for people (what failed and
//! what to do; Redis named when Redis failed).

/// What went wrong starting or running the gateway, or in a token command.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Redis refused or could not be reached.
    #[error("{}", redis_line(.0))]
    Redis(#[from] redis::RedisError),
    /// A setting is wrong.
    #[error("{0}")]
    Config(String),
    /// A command was used wrongly.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The listener could not be bound or served.
    #[error("cannot listen on {addr} (gateway.listen): {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The seatgate client failed (Redis, or no worker answering).
    #[error("{0}")]
    Client(#[from] seatgate_client::Error),
    /// Something that should not fail did.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A Redis error for people: out of memory says so and what to do (as the
/// engine's errors do); anything else asks about the connection settings.
fn redis_line(e: &redis::RedisError) -> String {
    if seatgate_core::db::is_out_of_memory(e) {
        seatgate_core::Error::Redis(e.clone()).to_string()
    } else {
        format!("redis error: {e}; is Redis reachable with the gateway's credentials (redis.url, redis.username)?")
    }
}

/// Reads `path` (named by `setting` in the error).
pub(crate) fn read_file(setting: &str, path: &str) -> Result<Vec<u8>, GatewayError> {
    std::fs::read(path).map_err(|source| GatewayError::File {
        path: format!("{path} ({setting})"),
        source,
    })
}
