//! Typed errors of the engine, the connection and the client. A program
//! turns them into one line for people: each message says what failed and,
//! where it helps, what to do; a Redis failure says Redis.

use std::time::Duration;

/// Everything that can go wrong talking seat decisions to Redis, one
/// variant per kind of failure, each keeping its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A connection setting is unusable (a TLS file, a password file); the
    /// message names the setting.
    #[error("bad configuration: {0}")]
    Config(String),
    /// Redis could not be reached or answered with an error. Its `OOM`
    /// refusal says that Redis is out of memory and what to do
    /// ([`is_out_of_memory`]).
    #[error("redis error: {}", redis_message(.0))]
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
    /// A call that cannot be made as asked (a wrong op for the call, a
    /// license change that names nothing to change).
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
    /// A license record that breaks the provisioning rules (`license`),
    /// refused before it is written; the message names the field and value.
    #[error("{0}")]
    InvalidLicense(String),
}

/// What a Redis error says to people: Redis's own words, and for an `OOM`
/// refusal what it means and what to do first.
fn redis_message(e: &redis::RedisError) -> String {
    if is_out_of_memory(e) {
        format!("Redis is out of memory (OOM) and refuses writes: raise its maxmemory or free memory ({e})")
    } else {
        e.to_string()
    }
}

/// Whether Redis refused for lack of memory: `OOM` (used memory above
/// `maxmemory` under `maxmemory-policy noeviction`: every command that may
/// add data is refused, reads are not), also as the reason a transaction
/// was aborted (a MULTI under OOM queues no command, reads included).
pub fn is_out_of_memory(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM")
        || (e.code() == Some("EXECABORT")
            && e.clone()
                .into_server_errors()
                .is_some_and(|errors| errors.iter().any(|(_, err)| err.code() == "OOM")))
}

/// Result with the engine's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_refusal_says_redis_is_out_of_memory_and_what_to_do() {
        let oom = redis::make_extension_error(
            "OOM".to_owned(),
            Some("command not allowed when used memory > 'maxmemory'.".to_owned()),
        );
        assert!(is_out_of_memory(&oom));
        let line = Error::Redis(oom).to_string();
        assert!(
            line.starts_with("redis error: Redis is out of memory (OOM) and refuses writes: raise its maxmemory or free memory ("),
            "{line}"
        );
        assert!(
            line.contains("command not allowed when used memory > 'maxmemory'"),
            "{line}"
        );
        let other = redis::make_extension_error("WRONGTYPE".to_owned(), None);
        assert!(!is_out_of_memory(&other));
        assert!(!Error::Redis(other).to_string().contains("OOM"));
    }
}
