//! A reply as the client receives it: [`Reply`], its typed accessors, the
//! [`Decision`] it carries, and how a reply-stream entry becomes one. The reader, the waiter table and
//! the request side all import it; it imports none of them.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::streams::StreamId;
use serde::Serialize;

use seatgate_core::protocol::Lease;
use seatgate_core::status::Status;

/// A reply as received: every field, plus typed accessors for the common
/// ones, and the lease the client sent the request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The reply entry's fields.
    pub fields: BTreeMap<String, String>,
    /// The lease this client sent with the request (the reply never carries
    /// it): what the session's heartbeats and release must send.
    pub lease: Option<Lease>,
    /// When the reply was written, on Redis's clock (the ms part of its
    /// reply-stream entry id); `None` for a reply not read from a stream.
    /// Beside `held_since_ms` it says how old a grant's news is.
    pub written_ms: Option<u64>,
}

/// The reply's fields, and `lease` when the request carried one: the CLI's
/// `--json` output, so a script can pick up the lease it must send later.
impl Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (k, v) in &self.fields {
            if k != "lease" {
                map.serialize_entry(k, v)?;
            }
        }
        if let Some(lease) = &self.lease {
            map.serialize_entry("lease", lease.as_str())?;
        }
        map.end()
    }
}

/// What a reply says was decided, typed: match on this rather than on the
/// status's text. Every status that is not one of the outcomes below is a
/// refusal ([`Decision::Refused`]) with the status and its one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The session holds a seat: ACQUIRED, ALREADY_ACTIVE (it held one
    /// already) or GRANTED (after waiting in the queue).
    Seat {
        /// Which of the three.
        status: Status,
        /// The license's heartbeat timeout in force: heartbeat at a third of it.
        heartbeat_timeout: Option<Duration>,
    },
    /// The session waits in the queue (QUEUED): a GRANTED or QUEUE_TIMEOUT
    /// follows under the same request id.
    Queued {
        /// The 1-based place in the queue.
        position: u64,
    },
    /// The heartbeat kept the seat (HEARTBEAT_UPDATED).
    HeartbeatUpdated {
        /// The heartbeat timeout in force now.
        heartbeat_timeout: Option<Duration>,
    },
    /// The seat was given back (RELEASED); under the license's `linger_ms`
    /// it stays with the session for `linger`.
    Released {
        /// How long the seat lingers with the session, if it does.
        linger: Option<Duration>,
    },
    /// The session's place in the queue was given back (LEFT_QUEUE).
    LeftQueue,
    /// An administrator's revoke took the seat or place (REVOKED).
    Revoked,
    /// Anything else: no seat, a refusal or an error. `reason` is the
    /// reply's `error` text, for people; match on `status`.
    Refused {
        /// The status (NO_SEATS_AVAILABLE, QUEUE_TIMEOUT, LEASE_MISMATCH, ...).
        status: Status,
        /// One line saying why.
        reason: String,
    },
}

impl Reply {
    /// What was decided, typed.
    pub fn decision(&self) -> Decision {
        let millis = |field: &str| {
            self.get(field)
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
        };
        match self.status() {
            status @ (Status::Acquired | Status::AlreadyActive | Status::Granted) => Decision::Seat {
                status,
                heartbeat_timeout: self.heartbeat_timeout(),
            },
            Status::Queued => Decision::Queued {
                position: self.get("position").parse().unwrap_or(0),
            },
            Status::HeartbeatUpdated => Decision::HeartbeatUpdated {
                heartbeat_timeout: self.heartbeat_timeout(),
            },
            Status::Released => Decision::Released {
                linger: millis("linger_ms"),
            },
            Status::LeftQueue => Decision::LeftQueue,
            Status::Revoked => Decision::Revoked,
            status => Decision::Refused {
                status,
                reason: self.get("error").to_owned(),
            },
        }
    }

    /// The license the reply is about ("" when the request named no valid one).
    pub fn license(&self) -> &str {
        self.get("license")
    }

    /// The session the reply is about ("" when the request named no valid one).
    pub fn session(&self) -> &str {
        self.get("session")
    }

    /// The request id the reply answers.
    pub fn id(&self) -> &str {
        self.get("id")
    }

    /// Seats held on the license after the request, and its seats in all.
    pub fn seats(&self) -> (u64, u64) {
        let n = |field: &str| self.get(field).parse().unwrap_or(0);
        (n("seats_used"), n("seats_total"))
    }

    /// The reply's `error` text: one line for people, "" on success.
    pub fn error(&self) -> &str {
        self.get("error")
    }

    /// The lease the request was sent with, if any.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// A field's value, or "" when absent.
    pub fn get(&self, field: &str) -> &str {
        self.fields.get(field).map(String::as_str).unwrap_or("")
    }

    /// The parsed status (unknown statuses are reported as `Error`).
    pub fn status(&self) -> Status {
        self.get("status").parse().unwrap_or(Status::Error)
    }

    /// Whether the request got what it asked for.
    pub fn ok(&self) -> bool {
        self.get("ok") == "1"
    }

    /// Whether this is the last reply to its request: anything but the
    /// QUEUED of an acquire (a waiting session's heartbeat is answered
    /// QUEUED too, and nothing follows that).
    pub fn is_final(&self) -> bool {
        self.status().is_final() || self.get("op") == "heartbeat"
    }

    /// An integer field, 0 when absent or malformed.
    pub fn int(&self, field: &str) -> i64 {
        self.get(field).parse().unwrap_or(0)
    }

    /// The license's heartbeat timeout in force, which ACQUIRED,
    /// ALREADY_ACTIVE, GRANTED and HEARTBEAT_UPDATED replies carry: a seat
    /// whose last heartbeat is older is evicted. Heartbeat at a third of the
    /// latest value, so one lost or late heartbeat never costs the seat and
    /// a timeout an operator lowers is followed from the next heartbeat on.
    /// `None` on other replies (and from a service older than this field).
    pub fn heartbeat_timeout(&self) -> Option<Duration> {
        self.get("heartbeat_timeout_ms")
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
    }

    /// When the seat's heartbeat clock started, on Redis's clock
    /// (`held_since_ms`, on replies that grant or replay a seat); `None`
    /// from a service that does not send it.
    pub fn held_since_ms(&self) -> Option<u64> {
        self.get("held_since_ms").parse().ok()
    }

    /// How long before its writing the seat's heartbeat clock started,
    /// both on Redis's clock: a reply replayed from an outbox or a dedupe
    /// record may bring old news. `None` unless the reply carries
    /// `held_since_ms` and was read from a stream.
    pub fn clock_age(&self) -> Option<Duration> {
        Some(Duration::from_millis(
            self.written_ms?.saturating_sub(self.held_since_ms()?),
        ))
    }

    /// A reply entry as read from the reply stream; a value that is not
    /// text reads as "". The client adds the lease when it hands the reply
    /// to its caller.
    pub(crate) fn from_entry(entry: StreamId) -> Reply {
        let written_ms = entry.id.split('-').next().and_then(|ms| ms.parse().ok());
        Reply {
            written_ms,
            fields: entry
                .map
                .into_iter()
                .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap_or_default()))
                .collect(),
            lease: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_serialises_with_the_lease_it_was_sent_with() {
        let lease = Lease::parse("abcdefghijklmnop").unwrap();
        let reply = Reply {
            fields: BTreeMap::from([("status".to_owned(), "ACQUIRED".to_owned())]),
            lease: Some(lease),
            written_ms: Some(5),
        };
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"status":"ACQUIRED","lease":"abcdefghijklmnop"}"#
        );
    }
}

#[cfg(test)]
mod decision_tests {
    use super::*;

    fn reply(fields: &[(&str, &str)]) -> Reply {
        Reply {
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            lease: None,
            written_ms: None,
        }
    }

    #[test]
    fn each_outcome_reads_as_its_decision() {
        assert_eq!(
            reply(&[("status", "GRANTED"), ("heartbeat_timeout_ms", "15000")]).decision(),
            Decision::Seat {
                status: Status::Granted,
                heartbeat_timeout: Some(Duration::from_secs(15))
            }
        );
        assert_eq!(
            reply(&[("status", "QUEUED"), ("position", "3")]).decision(),
            Decision::Queued { position: 3 }
        );
        assert_eq!(
            reply(&[("status", "RELEASED"), ("linger_ms", "600000")]).decision(),
            Decision::Released {
                linger: Some(Duration::from_secs(600))
            }
        );
        assert_eq!(
            reply(&[("status", "RELEASED")]).decision(),
            Decision::Released { linger: None }
        );
        let refused = reply(&[
            ("status", "NO_SEATS_AVAILABLE"),
            ("error", "no free seat"),
            ("seats_used", "5"),
            ("seats_total", "5"),
        ]);
        assert_eq!(
            refused.decision(),
            Decision::Refused {
                status: Status::NoSeatsAvailable,
                reason: "no free seat".into()
            }
        );
        assert_eq!(refused.seats(), (5, 5));
        assert_eq!(
            reply(&[("status", "SOMETHING_NEW")]).decision(),
            Decision::Refused {
                status: Status::Error,
                reason: String::new()
            },
            "a status this client does not know is an error, never a seat"
        );
    }
}

#[cfg(test)]
mod age_tests {
    use super::*;

    #[test]
    fn a_grant_tells_its_age_from_its_entry_id_and_held_since() {
        let entry = StreamId {
            id: "1700000009000-3".to_owned(),
            map: [
                ("status".to_owned(), redis::Value::BulkString(b"GRANTED".to_vec())),
                (
                    "held_since_ms".to_owned(),
                    redis::Value::BulkString(b"1700000006500".to_vec()),
                ),
            ]
            .into(),
            ..Default::default()
        };
        let reply = Reply::from_entry(entry);
        assert_eq!(reply.written_ms, Some(1_700_000_009_000));
        assert_eq!(reply.clock_age(), Some(Duration::from_millis(2500)));
        let mut without = reply.clone();
        without.fields.remove("held_since_ms");
        assert_eq!(without.clock_age(), None, "no held_since_ms, no age");
    }
}
