//! The wire statuses: the one home of every outcome a request can have.
//!
//! Scripts return these strings as the first element of their reply, the
//! worker copies them into the `status` field of the reply stream entry.
//! Adding a status means adding its variant here (the compiler then asks for
//! its `ok` and its refusal reason, the tests for its row in the table below
//! and in docs/protocol.md) and in the Lua script that returns it.

use std::fmt;

use strum::{EnumString, IntoStaticStr, VariantArray};

/// The outcome of one request, as it appears in the reply's `status` field.
///
/// The wire form is the variant's name in SCREAMING_SNAKE_CASE, derived, so
/// the name, the string and the list of statuses cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
#[strum(
    serialize_all = "SCREAMING_SNAKE_CASE",
    parse_err_ty = UnknownStatus,
    parse_err_fn = UnknownStatus::new
)]
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
    /// The license record breaks the provisioning rules (a field that is not
    /// a whole number in range, an `active` other than 0 or 1): no seat is
    /// handed out from it until it is fixed; the `error` field names the
    /// field and its value.
    LicenseInvalid,
    /// The session's seat (or its place in the queue) is bound to a lease
    /// and the request carried another one, or none: nothing changed.
    LeaseMismatch,
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
    /// `revoke` (admin stream): the session's seat was freed, or its place in
    /// the queue taken away; the next waiter got the seat.
    Revoked,
    /// The session was revoked by an administrator: its heartbeat and
    /// release after the revocation, and its acquires during a cooldown. The
    /// `error` field carries who revoked it and why.
    SessionRevoked,
    /// A license policy's limit keeps the session from a seat: its user's
    /// `max_per_user`, its group's `group_max:<group>`, or a borrow the
    /// license does not allow; the `error` field says which. Nothing changed.
    LimitReached,
    /// The request was read after its deadline (its stream entry's time plus
    /// its `ttl_ms`, or `requests.default_ttl_ms`) and was not decided:
    /// nothing changed. Final: send it again with a new id if still wanted.
    RequestExpired,
}

impl Status {
    /// Every status, in declaration order, for tables and tests. Derived:
    /// a new variant is in it without anyone remembering to add it.
    pub const ALL: &'static [Status] = <Status as VariantArray>::VARIANTS;

    /// The status as written on the wire.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether the request got what it asked for (the reply's `ok` field).
    /// An idempotent acquire counts: the session holds its seat. QUEUED does
    /// not (yet): the GRANTED that may follow does.
    pub fn is_ok(self) -> bool {
        // No wildcard: a new status must be sorted into one of the two arms.
        match self {
            Status::Acquired
            | Status::AlreadyActive
            | Status::Released
            | Status::HeartbeatUpdated
            | Status::Granted
            | Status::LeftQueue
            | Status::Revoked => true,
            Status::NoSeatsAvailable
            | Status::SessionNotFound
            | Status::SessionNotActive
            | Status::LicenseNotFound
            | Status::LicenseInactive
            | Status::LicenseExpired
            | Status::LicenseInvalid
            | Status::LeaseMismatch
            | Status::Queued
            | Status::QueueTimeout
            | Status::RateLimited
            | Status::InvalidRequest
            | Status::Error
            | Status::SessionRevoked
            | Status::LimitReached
            | Status::RequestExpired => false,
        }
    }

    /// Whether this is the last reply to its request. Only QUEUED is
    /// followed by another (GRANTED, QUEUE_TIMEOUT or SESSION_REVOKED, with the same id).
    pub fn is_final(self) -> bool {
        self != Status::Queued
    }

    /// Whether the status refuses someone a seat: what usage reports and the
    /// `seatgate_denials_total` metric count, and what `denied` events (and
    /// `queue_timeout`, for a wait that ran out) record. Not a refusal of a
    /// seat: a release or heartbeat of a session that holds none (it has
    /// nothing to refuse), and invalid requests and errors (nothing was
    /// decided). `const`, so the metric's reason list is derived from it.
    pub const fn is_denial(self) -> bool {
        // No wildcard: a new status must say whether it denies a seat.
        match self {
            Status::NoSeatsAvailable
            | Status::QueueTimeout
            | Status::LicenseNotFound
            | Status::LicenseInactive
            | Status::LicenseExpired
            | Status::LicenseInvalid
            | Status::RateLimited
            | Status::LimitReached => true,
            // A lease mismatch refuses the request, not a seat: the seat
            // asked about is held (or awaited) under another lease.
            Status::LeaseMismatch
            | Status::Acquired
            | Status::AlreadyActive
            | Status::Released
            | Status::SessionNotFound
            | Status::HeartbeatUpdated
            | Status::SessionNotActive
            | Status::Queued
            | Status::Granted
            | Status::LeftQueue
            | Status::InvalidRequest
            | Status::Error
            | Status::Revoked => false,
            // Not decided at all: it asked too late, nobody refused it.
            Status::RequestExpired => false,
            // A revocation's consequence, not a shortage of seats: the
            // `revoked` event records the administrator's decision.
            Status::SessionRevoked => false,
        }
    }

    /// The reply's `error` text for a refusal whose script gives none; `None`
    /// for successes, for QUEUED (not an answer yet) and for the statuses
    /// whose producer writes a reason of its own.
    pub fn refusal_reason(self) -> Option<&'static str> {
        // No wildcard: a new status must say whether it carries a reason.
        match self {
            Status::NoSeatsAvailable => {
                Some("no free seat: every seat is in use, or others are already waiting for one")
            }
            Status::SessionNotFound => Some("the session neither holds a seat nor waits for one"),
            Status::SessionNotActive => Some("the session holds no seat; acquire again"),
            Status::LicenseNotFound => Some("no such license"),
            Status::LicenseInactive => Some("the license is deactivated"),
            Status::LicenseExpired => Some("the license has expired"),
            Status::LeaseMismatch => Some(
                "the session's seat or place in the queue is bound to another lease; send the lease it was acquired with",
            ),
            Status::RateLimited => {
                Some("too many requests from this session or license; slow down and retry")
            }
            // The worker writes the revocation's own text (who, why, how long)
            // when the script hands the record back; a waiter told later
            // (through the outbox) gets this.
            Status::SessionRevoked => Some("the session was revoked by an administrator"),
            Status::LimitReached => Some("limit reached: a per-user or per-group limit of the license"),
            Status::RequestExpired => Some(
                "the request was read after its ttl_ms had run out and was not decided; nothing changed: send it again with a new id if still wanted",
            ),
            Status::Acquired
            | Status::AlreadyActive
            | Status::Released
            | Status::HeartbeatUpdated
            | Status::Granted
            | Status::LeftQueue
            | Status::Queued
            | Status::Revoked => None,
            // Their reason is written where they are produced: the wait's
            // length, the parser's complaint, the dead letter's cause, the
            // license field that breaks the rules.
            Status::QueueTimeout | Status::InvalidRequest | Status::Error | Status::LicenseInvalid => None,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status string that seatgate does not know (the `FromStr` error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}")]
pub struct UnknownStatus(pub String);

impl UnknownStatus {
    /// The derived `FromStr` calls this with the text it could not match.
    fn new(s: &str) -> UnknownStatus {
        UnknownStatus(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented wire form and `ok` of every status. A match without a
    /// wildcard, so a new status does not compile until it has its row here.
    fn documented(status: Status) -> (&'static str, bool) {
        match status {
            Status::Acquired => ("ACQUIRED", true),
            Status::AlreadyActive => ("ALREADY_ACTIVE", true),
            Status::NoSeatsAvailable => ("NO_SEATS_AVAILABLE", false),
            Status::Released => ("RELEASED", true),
            Status::SessionNotFound => ("SESSION_NOT_FOUND", false),
            Status::HeartbeatUpdated => ("HEARTBEAT_UPDATED", true),
            Status::SessionNotActive => ("SESSION_NOT_ACTIVE", false),
            Status::LicenseNotFound => ("LICENSE_NOT_FOUND", false),
            Status::LicenseInactive => ("LICENSE_INACTIVE", false),
            Status::LicenseExpired => ("LICENSE_EXPIRED", false),
            Status::LicenseInvalid => ("LICENSE_INVALID", false),
            Status::LeaseMismatch => ("LEASE_MISMATCH", false),
            Status::Queued => ("QUEUED", false),
            Status::Granted => ("GRANTED", true),
            Status::QueueTimeout => ("QUEUE_TIMEOUT", false),
            Status::LeftQueue => ("LEFT_QUEUE", true),
            Status::RateLimited => ("RATE_LIMITED", false),
            Status::InvalidRequest => ("INVALID_REQUEST", false),
            Status::Error => ("ERROR", false),
            Status::Revoked => ("REVOKED", true),
            Status::SessionRevoked => ("SESSION_REVOKED", false),
            Status::LimitReached => ("LIMIT_REACHED", false),
            Status::RequestExpired => ("REQUEST_EXPIRED", false),
        }
    }

    #[test]
    fn every_status_round_trips_through_its_wire_form() {
        for &status in Status::ALL {
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
            assert_eq!(status.to_string(), status.as_str());
        }
    }

    #[test]
    fn wire_forms_are_the_documented_ones() {
        for &status in Status::ALL {
            let (wire, ok) = documented(status);
            assert_eq!(status.as_str(), wire);
            assert_eq!(status.is_ok(), ok, "{wire}");
        }
    }

    #[test]
    fn every_status_has_its_row_in_the_protocol_document() {
        let doc = include_str!("../../../docs/protocol.md");
        for &status in Status::ALL {
            let (wire, ok) = documented(status);
            let row = doc
                .lines()
                .find(|line| line.starts_with(&format!("| `{wire}`")))
                .unwrap_or_else(|| panic!("docs/protocol.md has no row for {wire}"));
            let ok_column = row.split('|').nth(2).map(str::trim);
            assert_eq!(ok_column, Some(if ok { "1" } else { "0" }), "{row}");
        }
    }

    #[test]
    fn refusals_say_why_and_successes_do_not() {
        for &status in Status::ALL {
            if status.is_ok() {
                assert_eq!(status.refusal_reason(), None, "{status}");
            }
            if let Some(reason) = status.refusal_reason() {
                assert!(!reason.is_empty() && !reason.contains('\n'), "{status}");
            }
        }
        assert_eq!(Status::LicenseNotFound.refusal_reason(), Some("no such license"));
    }

    #[test]
    fn denials_are_refusals() {
        for &status in Status::ALL {
            if status.is_denial() {
                assert!(!status.is_ok(), "{status}");
            }
        }
        let denials: Vec<_> = Status::ALL
            .iter()
            .filter(|s| s.is_denial())
            .map(|s| s.as_str())
            .collect();
        assert_eq!(
            denials,
            [
                "NO_SEATS_AVAILABLE",
                "LICENSE_NOT_FOUND",
                "LICENSE_INACTIVE",
                "LICENSE_EXPIRED",
                "LICENSE_INVALID",
                "QUEUE_TIMEOUT",
                "RATE_LIMITED",
                "LIMIT_REACHED"
            ]
        );
    }

    #[test]
    fn unknown_status_is_an_error() {
        assert!("GRANTED!".parse::<Status>().is_err());
        assert_eq!(
            "GRANTED!".parse::<Status>(),
            Err(UnknownStatus("GRANTED!".to_owned()))
        );
        assert_eq!(UnknownStatus("x".into()).to_string(), "unknown status \"x\"");
    }
}
