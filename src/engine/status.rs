//! The wire statuses: the one home of every outcome a request can have.
//!
//! Scripts return these strings as the first element of their reply, the
//! worker copies them into the `status` field of the reply stream entry.
//! Adding a status means adding it here, in the Lua script that returns it
//! and in docs/protocol.md.

use std::fmt;
use std::str::FromStr;

/// The outcome of one request, as it appears in the reply's `status` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// A seat was taken for the session.
    Acquired,
    /// The session already held a seat; nothing changed (idempotent acquire).
    AlreadyActive,
    /// Every seat is held; nothing changed.
    NoSeatsAvailable,
    /// The session's seat was freed.
    Released,
    /// `release` of a session that holds no seat.
    SessionNotFound,
    /// The session's heartbeat clock was restarted.
    HeartbeatUpdated,
    /// `heartbeat` of a session that holds no seat: acquire again.
    SessionNotActive,
    /// No license record exists under that id.
    LicenseNotFound,
    /// The license record has `active = 0`.
    LicenseInactive,
    /// The license record's `expires_at_ms` has passed.
    LicenseExpired,
    /// No seat was free; the session waits in the license's queue (`position`).
    Queued,
    /// A queued session now holds a seat (sent later, with the original request id).
    Granted,
    /// A queued session's `wait_ms` ran out; it left the queue without a seat.
    QueueTimeout,
    /// `release` of a queued session: it left the queue.
    LeftQueue,
    /// Too many requests from this session or license in the rate window; nothing changed.
    RateLimited,
    /// The request could not be parsed; the `error` field says why.
    InvalidRequest,
    /// The request was well formed but could not be carried out (for example
    /// a Redis error that persisted); the `error` field says why.
    Error,
}

impl Status {
    /// Every status, for tables and tests.
    pub const ALL: [Status; 17] = [
        Status::Acquired,
        Status::AlreadyActive,
        Status::NoSeatsAvailable,
        Status::Released,
        Status::SessionNotFound,
        Status::HeartbeatUpdated,
        Status::SessionNotActive,
        Status::LicenseNotFound,
        Status::LicenseInactive,
        Status::LicenseExpired,
        Status::Queued,
        Status::Granted,
        Status::QueueTimeout,
        Status::LeftQueue,
        Status::RateLimited,
        Status::InvalidRequest,
        Status::Error,
    ];

    /// The status as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Acquired => "ACQUIRED",
            Status::AlreadyActive => "ALREADY_ACTIVE",
            Status::NoSeatsAvailable => "NO_SEATS_AVAILABLE",
            Status::Released => "RELEASED",
            Status::SessionNotFound => "SESSION_NOT_FOUND",
            Status::HeartbeatUpdated => "HEARTBEAT_UPDATED",
            Status::SessionNotActive => "SESSION_NOT_ACTIVE",
            Status::LicenseNotFound => "LICENSE_NOT_FOUND",
            Status::LicenseInactive => "LICENSE_INACTIVE",
            Status::LicenseExpired => "LICENSE_EXPIRED",
            Status::Queued => "QUEUED",
            Status::Granted => "GRANTED",
            Status::QueueTimeout => "QUEUE_TIMEOUT",
            Status::LeftQueue => "LEFT_QUEUE",
            Status::RateLimited => "RATE_LIMITED",
            Status::InvalidRequest => "INVALID_REQUEST",
            Status::Error => "ERROR",
        }
    }

    /// Whether the request got what it asked for (the reply's `ok` field).
    /// An idempotent acquire counts: the session holds its seat. QUEUED does
    /// not (yet): the GRANTED that may follow does.
    pub fn is_ok(self) -> bool {
        matches!(
            self,
            Status::Acquired
                | Status::AlreadyActive
                | Status::Released
                | Status::HeartbeatUpdated
                | Status::Granted
                | Status::LeftQueue
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that seatgate does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_through_its_wire_form() {
        for status in Status::ALL {
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
        }
    }

    #[test]
    fn wire_forms_are_the_documented_ones() {
        let table = [
            (Status::Acquired, "ACQUIRED", true),
            (Status::AlreadyActive, "ALREADY_ACTIVE", true),
            (Status::NoSeatsAvailable, "NO_SEATS_AVAILABLE", false),
            (Status::Released, "RELEASED", true),
            (Status::SessionNotFound, "SESSION_NOT_FOUND", false),
            (Status::HeartbeatUpdated, "HEARTBEAT_UPDATED", true),
            (Status::SessionNotActive, "SESSION_NOT_ACTIVE", false),
            (Status::LicenseNotFound, "LICENSE_NOT_FOUND", false),
            (Status::LicenseInactive, "LICENSE_INACTIVE", false),
            (Status::LicenseExpired, "LICENSE_EXPIRED", false),
            (Status::Queued, "QUEUED", false),
            (Status::Granted, "GRANTED", true),
            (Status::QueueTimeout, "QUEUE_TIMEOUT", false),
            (Status::LeftQueue, "LEFT_QUEUE", true),
            (Status::RateLimited, "RATE_LIMITED", false),
            (Status::InvalidRequest, "INVALID_REQUEST", false),
            (Status::Error, "ERROR", false),
        ];
        assert_eq!(table.len(), Status::ALL.len());
        for (status, wire, ok) in table {
            assert_eq!(status.as_str(), wire);
            assert_eq!(status.is_ok(), ok, "{wire}");
        }
    }

    #[test]
    fn unknown_status_is_an_error() {
        assert!("GRANTED!".parse::<Status>().is_err());
    }
}
