//! The wire contract's shared parts: the limits, the request fields, ids
//! and leases, an [`Invalid`] request's answer and the [`Reply`] every
//! request gets. Each op's own fields and parsing live in `engine::ops`
//! (one file per op); nothing here talks to Redis. docs/protocol.md is the
//! prose form of this file and of `engine::ops`.

use std::fmt;

use strum::{IntoStaticStr, VariantArray};

use crate::status::Status;

/// Longest license or session id, in bytes.
pub const MAX_ID_LEN: usize = 128;
/// Longest caller request id (`id`), in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Longest reply stream key (`reply_to`), in bytes.
pub const MAX_REPLY_TO_LEN: usize = 256;
/// Largest `meta` JSON document, in bytes.
pub const MAX_META_LEN: usize = 4096;
/// Deepest nesting of objects and arrays inside `meta`.
pub const MAX_META_DEPTH: usize = 8;
/// Longest time an acquire may wait in the queue (`wait_ms`): one day.
pub const MAX_WAIT_MS: u64 = 86_400_000;
/// Longest `reason` of a revoke, in bytes.
pub const MAX_REASON_LEN: usize = 512;
/// Longest `actor` of a revoke, in bytes.
pub const MAX_ACTOR_LEN: usize = 128;
/// Longest `cooldown_ms` of a revoke: seven days.
pub const MAX_COOLDOWN_MS: u64 = 7 * 86_400_000;
/// Most fields one request entry may have.
pub const MAX_FIELDS: usize = 32;
/// The field that opens the stub a worker reads (lua/read.lua) for an entry
/// over the limits, valued `<fields> <bytes>`: the entry's size as stored.
pub const OVERSIZE_FIELD: &str = "seatgate.oversize";
/// Largest value of any field we do not otherwise limit, in bytes.
pub const MAX_FIELD_LEN: usize = 8192;
/// Longest field name, in bytes.
pub const MAX_FIELD_NAME_LEN: usize = 64;
/// The default of `limits.max_entry_bytes`: the most bytes of field names
/// and values one request entry may hold.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 16 * 1024;
/// Shortest `lease`, in characters.
pub const MIN_LEASE_LEN: usize = 16;
/// Longest `lease`, in characters.
pub const MAX_LEASE_LEN: usize = 128;
/// Largest `ttl_ms` a request may carry: one day. What counts is at most
/// `requests.max_ttl_ms` ([`Rules::max_ttl_ms`]); a larger value counts as that.
pub const MAX_TTL_MS: u64 = 86_400_000;
/// The default of `requests.default_ttl_ms` and `requests.max_ttl_ms`: the
/// default dedupe window (config/default.toml says why).
pub const DEFAULT_TTL_MS: u64 = 60_000;

/// What the service's settings tell the parser: handed to it, so that the
/// engine reads no settings itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules<'a> {
    /// The namespace every `reply_to` must lie in (`replies.prefix`).
    pub reply_prefix: &'a str,
    /// Every acquire, heartbeat and release must carry a `lease`
    /// (`sessions.require_lease`).
    pub require_lease: bool,
    /// The most bytes of field names and values one entry may hold
    /// (`limits.max_entry_bytes`).
    pub max_entry_bytes: usize,
    /// The `ttl_ms` of a request that carries none (`requests.default_ttl_ms`;
    /// 0 = such a request never expires).
    pub default_ttl_ms: u64,
    /// The most a request's `ttl_ms` counts for (`requests.max_ttl_ms`).
    pub max_ttl_ms: u64,
}

impl<'a> Rules<'a> {
    /// The default rules under reply namespace `reply_prefix`: leases
    /// optional, entries up to [`DEFAULT_MAX_ENTRY_BYTES`], requests that
    /// expire [`DEFAULT_TTL_MS`] after their entry, or their `ttl_ms` if
    /// shorter.
    pub fn new(reply_prefix: &'a str) -> Rules<'a> {
        Rules {
            reply_prefix,
            require_lease: false,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            default_ttl_ms: DEFAULT_TTL_MS,
            max_ttl_ms: DEFAULT_TTL_MS,
        }
    }
}

/// A lease: the caller's secret that a seat (or place in the queue) is bound
/// to, 16 to 128 characters of `[A-Za-z0-9_-]`. Its `Debug` form hides it, so
/// that no log line, panic message or `{:?}` of a request shows it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Lease(String);

impl Lease {
    /// `s` as a lease, when it is one.
    pub fn parse(s: &str) -> Option<Lease> {
        valid_lease(s).then(|| Lease(s.to_owned()))
    }

    /// The lease itself, to send or to hand to a script.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lease(<redacted>)")
    }
}

/// Checks that `s` is 16 to 128 characters of `[A-Za-z0-9_-]`: URL- and
/// shell-safe, and long enough for a random lease to be unguessable.
pub fn valid_lease(s: &str) -> bool {
    (MIN_LEASE_LEN..=MAX_LEASE_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// The fields of a request entry, as a refusal names them: the wire name is
/// also the `field` label of `seatgate_invalid_requests_total` (derived, so
/// the metric's label set follows this list). `Fields` stands for the entry
/// as a whole (too many fields, too many bytes, a repeated name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum RequestField {
    ReplyTo,
    Id,
    Fields,
    Op,
    License,
    Session,
    TtlMs,
    Meta,
    WaitMs,
    Lease,
    User,
    Group,
    Priority,
    BorrowMs,
    Reason,
    Actor,
    CooldownMs,
    CooldownScope,
}

impl RequestField {
    /// Every field, in the order the parser checks them.
    pub const ALL: &'static [RequestField] = <RequestField as VariantArray>::VARIANTS;

    /// The field's wire name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for RequestField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a request was refused, and what is known of the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// One line naming the field and the problem; sent back in `error`.
    pub reason: String,
    /// A short, bounded label for metrics (the offending field).
    pub field: &'static str,
    /// Whatever could be salvaged to address the reply (boxed: refusals are rare).
    pub echo: Box<Echo>,
}

/// Fields echoed in a reply, kept when they were themselves valid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Echo {
    /// The request id (or the entry id).
    pub id: String,
    /// The op, as sent, when it was valid UTF-8 and short.
    pub op: String,
    /// The license, when valid.
    pub license: String,
    /// The session, when valid.
    pub session: String,
    /// The reply stream, when valid.
    pub reply_to: Option<String>,
}

/// Checks that an id (license or session) is 1..=128 bytes of `[A-Za-z0-9._:@-]`.
/// Braces are excluded on purpose: a license id becomes a Redis Cluster hash tag.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'@'))
}

/// One reply, as XADDed to the caller's `reply_to` stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The request id being answered.
    pub id: String,
    /// The op being answered (as sent, or empty when it was unusable).
    pub op: String,
    /// The outcome.
    pub status: Status,
    /// The license (empty when the request had no valid one).
    pub license: String,
    /// The session (empty when the request had no valid one).
    pub session: String,
    /// Seats held after the request.
    pub seats_used: i64,
    /// The license's seat count.
    pub seats_total: i64,
    /// Heartbeats the session has sent (heartbeat replies only).
    pub heartbeats: Option<i64>,
    /// 1-based place in the queue (QUEUED only).
    pub position: Option<i64>,
    /// How long the session waited in the queue, ms (GRANTED, QUEUE_TIMEOUT).
    pub waited_ms: Option<i64>,
    /// The license's heartbeat timeout in force, ms (ACQUIRED,
    /// ALREADY_ACTIVE, GRANTED, HEARTBEAT_UPDATED): the holder heartbeats
    /// well within it (a third of it), without having to know the service's
    /// settings, and follows it when an operator changes it.
    pub heartbeat_timeout_ms: Option<i64>,
    /// When the seat's heartbeat clock last started, Redis ms (ACQUIRED,
    /// ALREADY_ACTIVE, GRANTED, and their replays): the session must
    /// heartbeat before this plus `heartbeat_timeout_ms`; a client that
    /// reads an old answer sees so and heartbeats at once.
    pub held_since_ms: Option<i64>,
    /// The queue priority the session got (QUEUED with a priority above 0).
    pub priority: Option<i64>,
    /// How long the released seat lingers with the session, ms (RELEASED
    /// under the license's `linger_ms`).
    pub linger_ms: Option<i64>,
    /// When the borrowed seat comes back, unix ms (ACQUIRED with `borrow_ms`).
    pub borrowed_until_ms: Option<i64>,
    /// A human-readable reason, for refusals and errors.
    pub error: Option<String>,
}

impl Reply {
    /// The reply to an invalid request.
    pub fn invalid(bad: &Invalid) -> Reply {
        Reply {
            id: bad.echo.id.clone(),
            op: bad.echo.op.clone(),
            status: Status::InvalidRequest,
            license: bad.echo.license.clone(),
            session: bad.echo.session.clone(),
            seats_used: 0,
            seats_total: 0,
            heartbeats: None,
            position: None,
            waited_ms: None,
            heartbeat_timeout_ms: None,
            held_since_ms: None,
            priority: None,
            linger_ms: None,
            borrowed_until_ms: None,
            error: Some(bad.reason.clone()),
        }
    }

    /// The field/value pairs of the reply stream entry.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("id", self.id.clone()),
            ("op", self.op.clone()),
            ("status", self.status.as_str().to_owned()),
            ("ok", if self.status.is_ok() { "1" } else { "0" }.to_owned()),
            ("license", self.license.clone()),
            ("session", self.session.clone()),
            ("seats_used", self.seats_used.to_string()),
            ("seats_total", self.seats_total.to_string()),
        ];
        if let Some(n) = self.heartbeats {
            out.push(("heartbeats", n.to_string()));
        }
        if let Some(n) = self.position {
            out.push(("position", n.to_string()));
        }
        if let Some(n) = self.waited_ms {
            out.push(("waited_ms", n.to_string()));
        }
        if let Some(n) = self.heartbeat_timeout_ms {
            out.push(("heartbeat_timeout_ms", n.to_string()));
        }
        if let Some(n) = self.held_since_ms {
            out.push(("held_since_ms", n.to_string()));
        }
        let policy = [
            ("priority", self.priority),
            ("linger_ms", self.linger_ms),
            ("borrowed_until_ms", self.borrowed_until_ms),
        ];
        for (field, value) in policy {
            if let Some(n) = value {
                out.push((field, n.to_string()));
            }
        }
        if let Some(e) = &self.error {
            out.push(("error", e.clone()));
        }
        out
    }
}
