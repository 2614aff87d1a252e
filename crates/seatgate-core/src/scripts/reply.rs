//! What the seat scripts answer, decoded in one place: the outcome of
//! acquire / release / heartbeat (shape: lua/includes/outcome.lua), the notes
//! inside it (lua/includes/outbox.lua) and a reap step (lua/reap.lua).
//! tests/it/scripts.rs runs every script against these decoders.

use redis::Value;

use crate::error::Error;
use crate::events::SeatsAt;
use crate::license::{Field, InvalidField};
use crate::policy::PolicyRefusal;
use crate::revocation::Revocation;
use crate::status::Status;

/// Follow-up work a script reports: a waiter to tell about its seat, its
/// timeout, or its place revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// GRANTED, QUEUE_TIMEOUT or SESSION_REVOKED.
    pub status: Status,
    /// The waiting session.
    pub session: String,
    /// The request id it queued with.
    pub request_id: String,
    /// The reply stream it queued with ("" = none).
    pub reply_to: String,
    /// How long it waited, ms.
    pub waited_ms: i64,
    /// Its field in the license's outbox, removed once delivered.
    pub note_id: String,
    /// Who sends its queue reply.
    pub delivery: Delivery,
    /// The license's heartbeat timeout in force, ms, which a GRANTED reply
    /// carries: not part of the note's own record, but of the script reply
    /// that carried it (the outcome's or reap step's), set when decoding.
    pub heartbeat_timeout_ms: Option<i64>,
    /// When the granted seat's heartbeat clock started (Redis ms): the
    /// grant, or its redelivery by the reaper, which restarts it. A GRANTED
    /// reply carries it; `None` for other notes.
    pub held_since_ms: Option<i64>,
    /// Why a QUEUE_TIMEOUT came before the wait ran out: `waiter_stale`,
    /// the waiter showed no sign of life for a heartbeat timeout
    /// (lua/includes/queue.lua, expire_stale_waiters); `None` otherwise.
    pub reason: Option<String>,
}

/// Who sends a note's queue reply (the note's eighth slot,
/// lua/includes/outbox.lua).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The caller of the script: the note waits in the outbox (or, without
    /// a reply stream, nowhere) until the worker or the reaper sends it.
    Caller,
    /// The script wrote it to the waiter's reply stream in the same step
    /// (one node: [`crate::keys::QueueReplies`]).
    Sent,
    /// The script could not: the reply stream lies outside
    /// `replies.prefix` or is no stream. Dropped, as the worker drops such
    /// a reply.
    Undeliverable,
}

/// What a seat script decided: its status, with what only that status
/// carries (the outcome's detail slot, lua/includes/outcome.lua, read
/// according to the status once, here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// ACQUIRED; for a borrowed seat, when it comes back (unix ms).
    Acquired {
        /// When the borrowed seat comes back, ms; `None` for a plain seat.
        borrowed_until_ms: Option<i64>,
    },
    /// QUEUED.
    Queued {
        /// 1-based place in the queue.
        position: i64,
        /// The queue priority the session got (0 = none; capped by the
        /// license's `max_priority`).
        priority: i64,
    },
    /// NO_SEATS_AVAILABLE, and why.
    NoSeatsAvailable(NoSeats),
    /// LIMIT_REACHED: the policy limit that refused the seat (never
    /// [`PolicyRefusal::Reserved`], which is a [`NoSeats`] reason).
    LimitReached(PolicyRefusal),
    /// LICENSE_INVALID: the record's field that breaks its rule, and its value.
    LicenseInvalid(InvalidField),
    /// RATE_LIMITED: by the session's or the license's limit, or by what
    /// the request's application may send about the license
    /// (`tenancy.application_requests`, detail `application`).
    RateLimited {
        /// The application's limit refused it.
        application: bool,
    },
    /// SESSION_REVOKED: who revoked the session, why, and its cooldown
    /// (`None` when the stored record is not of the scripts' form).
    SessionRevoked(Option<Revocation>),
    /// REVOKED (an administrator's revoke).
    Revoked {
        /// Whether the session held a seat (freed now) or waited in the
        /// queue: usage reports count only the first as the end of a hold.
        held: bool,
    },
    /// RELEASED; under a license's `linger_ms`, how long the seat lingers.
    Released {
        /// How long the released seat lingers with the session, ms; `None`
        /// when it was freed at once.
        linger_ms: Option<i64>,
    },
    /// HEARTBEAT_UPDATED.
    HeartbeatUpdated {
        /// Heartbeats the session has sent.
        heartbeats: i64,
    },
    /// SESSION_NOT_ACTIVE (a heartbeat) or SESSION_NOT_FOUND (a release)
    /// of a session of a license that has no record: the license was
    /// deleted and its seats with it (detail `license_deleted`), so the
    /// holder is told why it holds none.
    LicenseDeleted(Status),
    /// Any other status: one that carries nothing of its own (ALREADY_ACTIVE,
    /// SESSION_NOT_FOUND, LICENSE_EXPIRED, …). The decoder never puts a
    /// status of the variants above here.
    Plain(Status),
}

/// Why NO_SEATS_AVAILABLE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSeats {
    /// Every seat is held (or others already wait for one).
    InUse,
    /// The license's wait queue is full as well.
    QueueFull,
    /// The user already has the license's `queue_max_per_user` sessions
    /// waiting (detail `queue_user_full`).
    QueueUserFull,
    /// The group already has the license's `queue_max_per_group` sessions
    /// waiting (detail `queue_group_full`).
    QueueGroupFull,
    /// The request's application already has `tenancy.application_waiters`
    /// sessions waiting for the license (detail `queue_application_full`).
    QueueApplicationFull,
    /// The free seats are reserved for others' groups.
    Reserved,
}

impl Decision {
    /// The wire status.
    pub fn status(&self) -> Status {
        match self {
            Decision::Acquired { .. } => Status::Acquired,
            Decision::Queued { .. } => Status::Queued,
            Decision::NoSeatsAvailable(_) => Status::NoSeatsAvailable,
            Decision::LimitReached(_) => Status::LimitReached,
            Decision::LicenseInvalid(_) => Status::LicenseInvalid,
            Decision::RateLimited { .. } => Status::RateLimited,
            Decision::SessionRevoked(_) => Status::SessionRevoked,
            Decision::Revoked { .. } => Status::Revoked,
            Decision::Released { .. } => Status::Released,
            Decision::HeartbeatUpdated { .. } => Status::HeartbeatUpdated,
            Decision::LicenseDeleted(status) | Decision::Plain(status) => *status,
        }
    }
}

/// What a seat script answered: its [`Decision`] and what every decision
/// carries (the seats, the Redis time, the waiters told on the way, and
/// what the worker files for the reaper).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The decision, with what only it carries.
    pub decision: Decision,
    /// Seats held after the script ran.
    pub seats_used: i64,
    /// The license's seat count (0 when there is no license).
    pub seats_total: i64,
    /// Whether the script changed state (false for a re-sent QUEUED acquire
    /// and for replays), so that an event is published once per change.
    pub changed: bool,
    /// The entry was decided before: this is the stored reply, replayed.
    pub replayed: bool,
    /// The Redis server's time when the script ran, ms.
    pub now_ms: i64,
    /// Waiters granted or timed out by this script.
    pub notes: Vec<Note>,
    /// When the license's oldest holder goes stale (Redis clock, ms), where
    /// the call may have moved it; the worker files it in the due index
    /// (runtime::due). `None`: nothing to file.
    pub stale_ms: Option<i64>,
    /// When the license next has other work for the reaper (waiters,
    /// undelivered replies; Redis clock, ms), where the call may have
    /// brought it forward; the worker files it with `ZADD … LT`. `None`:
    /// nothing to file.
    pub due_ms: Option<i64>,
    /// The license's heartbeat timeout in force, ms (its own, else the
    /// service's): ACQUIRED, ALREADY_ACTIVE and HEARTBEAT_UPDATED replies
    /// carry it (heartbeat.lua fills it in for a replay too). `None`
    /// where it is not known: an outcome that could not be decided, or one
    /// read back from a dedupe record, which does not keep it.
    pub heartbeat_timeout_ms: Option<i64>,
    /// When the seat's heartbeat clock last started (Redis ms: the seat
    /// taken, or its last heartbeat), which ACQUIRED and ALREADY_ACTIVE
    /// replies carry, replays included, so a client can tell an old answer
    /// (lua/includes/due.lua). `None` for other statuses.
    pub held_since_ms: Option<i64>,
}

impl Outcome {
    /// An outcome for a request that could not be decided.
    pub fn failed(status: Status) -> Outcome {
        Outcome {
            decision: Decision::Plain(status),
            seats_used: 0,
            seats_total: 0,
            changed: false,
            replayed: false,
            now_ms: 0,
            notes: Vec::new(),
            stale_ms: None,
            due_ms: None,
            heartbeat_timeout_ms: None,
            held_since_ms: None,
        }
    }

    /// The wire status of the decision.
    pub fn status(&self) -> Status {
        self.decision.status()
    }

    /// The license's seats after the script, at its time.
    pub fn seats_at(&self) -> SeatsAt {
        SeatsAt {
            used: self.seats_used,
            total: self.seats_total,
            at_ms: self.now_ms,
        }
    }
}

/// Where a reaper pass stands in a license's outbox: reap.lua reads it one
/// bounded HSCAN page per step, and the reaper hands each step the position
/// the previous one returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxCursor {
    /// HSCAN cursor of the next page: "0" to start, "" once the scan is through.
    pub cursor: String,
    /// Due notes of the last page beyond the step's limit, by note id: the
    /// next step hands these out before it reads another page.
    pub pending: Vec<String>,
}

impl OutboxCursor {
    /// The start of a pass: scan the outbox from the beginning.
    pub fn start() -> OutboxCursor {
        OutboxCursor {
            cursor: "0".to_owned(),
            pending: Vec::new(),
        }
    }

    /// Whether this pass has handed out every due note of the outbox.
    pub fn is_done(&self) -> bool {
        self.cursor.is_empty() && self.pending.is_empty()
    }
}

/// What one reap step did for one license.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// Seats held afterwards.
    pub seats_used: i64,
    /// The license's seat count.
    pub seats_total: i64,
    /// The Redis server's time, ms.
    pub now_ms: i64,
    /// Sessions evicted for a stale heartbeat.
    pub evicted: Vec<String>,
    /// Waiters granted or timed out.
    pub notes: Vec<Note>,
    /// More work is left for this license (a part hit its limit, or the
    /// outbox scan is not through): step again with [`Reaped::outbox`].
    pub more: bool,
    /// Sessions still waiting.
    pub queue_depth: i64,
    /// Outbox notes left undelivered (their deliverer died): deliver again.
    pub redeliver: Vec<Note>,
    /// Where the next step of this pass goes on in the outbox.
    pub outbox: OutboxCursor,
    /// Sessions whose borrowed seat was freed: the borrow ended.
    pub borrow_ended: Vec<String>,
    /// Sessions whose lingering seat was freed: the linger ended.
    pub linger_ended: Vec<String>,
    /// Of `seats_used`, the seats lingering after a release.
    pub seats_lingering: i64,
    /// Of `seats_used`, the seats borrowed (held without heartbeats).
    pub seats_borrowed: i64,
    /// When the license's oldest holder goes stale after this step (Redis
    /// clock, ms); `None` when nobody holds a seat.
    pub stale_ms: Option<i64>,
    /// When it next has other work after this step (Redis clock, ms);
    /// `None` for never.
    pub due_ms: Option<i64>,
    /// The license's heartbeat timeout in force, ms.
    pub heartbeat_timeout_ms: Option<i64>,
    /// Sessions whose seat ended because the license record is gone
    /// (deleted behind seatgate's back; lua/includes/deleted.lua). Their
    /// waiters' LICENSE_NOT_FOUND notes are in `notes`.
    pub deleted: Vec<String>,
    /// Sessions stale by the plain timeout that the outage rule, or a grant
    /// not yet delivered, kept from eviction (lua/reap.lua).
    pub held: i64,
}

impl Reaped {
    /// The license's seats after the step, at its time.
    pub fn seats_at(&self) -> SeatsAt {
        SeatsAt {
            used: self.seats_used,
            total: self.seats_total,
            at_ms: self.now_ms,
        }
    }
}

fn bad(script: &'static str, detail: String) -> Error {
    Error::ScriptReply { script, detail }
}

fn int(script: &'static str, v: Option<&Value>, what: &str) -> Result<i64, Error> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(bad(script, format!("{what} is not an integer: {other:?}"))),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn string(script: &'static str, v: Option<&Value>, what: &str) -> Result<String, Error> {
    v.and_then(text)
        .ok_or_else(|| bad(script, format!("{what} is not a string: {v:?}")))
}

fn flag(script: &'static str, v: Option<&Value>, what: &str) -> Result<bool, Error> {
    match int(script, v, what)? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(bad(script, format!("{what} is {n}, not 0 or 1"))),
    }
}

/// Decodes a list of notes: `{kind, session, request_id, reply_to, waited_ms,
/// note_id, held_since_ms, delivery, reason}` each (lua/includes/outbox.lua; a note
/// read back from a dedupe record written before held_since_ms has 6 slots,
/// one written before delivery 7), of a
/// license whose heartbeat timeout in force is `timeout`.
fn notes(
    script: &'static str,
    v: Option<&Value>,
    what: &str,
    timeout: Option<i64>,
) -> Result<Vec<Note>, Error> {
    let items = match v {
        Some(Value::Array(items)) => items.as_slice(),
        // None: the request scripts answer nil rather than an empty list
        // (lua/includes/outcome.lua, replied).
        Some(Value::Nil) => &[],
        _ => return Err(bad(script, format!("{what} are not a list: {v:?}"))),
    };
    items
        .iter()
        .map(|item| {
            let Value::Array(f) = item else {
                return Err(bad(script, format!("note is not a list: {item:?}")));
            };
            if !(6..=9).contains(&f.len()) {
                return Err(bad(script, format!("note has {} fields, not 6 to 9", f.len())));
            }
            let status = string(script, f.first(), "note kind")?
                .parse::<Status>()
                .map_err(|e| bad(script, format!("note: {e}")))?;
            Ok(Note {
                status,
                session: string(script, f.get(1), "session")?,
                request_id: string(script, f.get(2), "request_id")?,
                reply_to: string(script, f.get(3), "reply_to")?,
                waited_ms: int(script, f.get(4), "waited_ms")?,
                note_id: string(script, f.get(5), "note_id")?,
                delivery: match f.get(7) {
                    None => Delivery::Caller,
                    Some(v) => match int(script, Some(v), "delivery")? {
                        0 => Delivery::Caller,
                        1 => Delivery::Sent,
                        2 => Delivery::Undeliverable,
                        n => return Err(bad(script, format!("note delivery is {n}, not 0, 1 or 2"))),
                    },
                },
                heartbeat_timeout_ms: timeout.filter(|_| status == Status::Granted),
                held_since_ms: match f.get(6) {
                    Some(v) => Some(int(script, Some(v), "held_since_ms")?),
                    None => None,
                }
                .filter(|ms| *ms > 0 && status == Status::Granted),
                reason: match f.get(8) {
                    Some(v) => Some(string(script, Some(v), "reason")?).filter(|r| !r.is_empty()),
                    None => None,
                },
            })
        })
        .collect()
}

/// Decodes the detail of LICENSE_INVALID, `{field, value}`
/// (lua/includes/license.lua). The value is what Redis stored, cut to 64
/// bytes, perhaps mid-character: read leniently.
fn invalid_field(script: &'static str, detail: &Value) -> Result<InvalidField, Error> {
    let parts = match detail {
        Value::Array(parts) if parts.len() == 2 => parts,
        other => {
            return Err(bad(
                script,
                format!("LICENSE_INVALID detail is not {{field, value}}: {other:?}"),
            ))
        }
    };
    let name = string(script, parts.first(), "invalid field")?;
    let (field, group) =
        Field::parse_name(&name).ok_or_else(|| bad(script, format!("unknown license field {name:?}")))?;
    let value = match &parts[1] {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => {
            text(other).ok_or_else(|| bad(script, format!("invalid value is not a string: {other:?}")))?
        }
    };
    Ok(InvalidField { field, group, value })
}

/// A time for the due index as the scripts report it: 0 for none.
fn due(script: &'static str, v: Option<&Value>, what: &str) -> Result<Option<i64>, Error> {
    let due = int(script, v, what)?;
    Ok(Some(due).filter(|ms| *ms > 0))
}

/// A heartbeat timeout as the scripts report it: positive (0 stands for
/// one not known, as in a dedupe record read back).
fn timeout(script: &'static str, v: Option<&Value>) -> Result<Option<i64>, Error> {
    match int(script, v, "heartbeat_timeout_ms")? {
        0 => Ok(None),
        ms if ms > 0 => Ok(Some(ms)),
        ms => Err(bad(script, format!("heartbeat_timeout_ms is {ms}, not positive"))),
    }
}

/// Decodes an outcome `{status, seats_used, seats_total, detail, now_ms,
/// notes, changed, replayed, stale, due, heartbeat_timeout_ms,
/// held_since_ms?}` (lua/includes/outcome.lua) of `script`.
pub(crate) fn decode_outcome(script: &'static str, value: Value) -> Result<Outcome, Error> {
    let Value::Array(items) = value else {
        return Err(bad(script, format!("expected an array, got {value:?}")));
    };
    if items.len() != 11 && items.len() != 12 {
        return Err(bad(
            script,
            format!("outcome has {} slots, not 11 or 12", items.len()),
        ));
    }
    let heartbeat_timeout_ms = timeout(script, items.get(10))?;
    let status = string(script, items.first(), "status")?
        .parse::<Status>()
        .map_err(|e| bad(script, e.to_string()))?;
    Ok(Outcome {
        decision: decision(script, status, &items[3])?,
        seats_used: int(script, items.get(1), "seats_used")?,
        seats_total: int(script, items.get(2), "seats_total")?,
        now_ms: int(script, items.get(4), "now_ms")?,
        notes: notes(script, items.get(5), "notes", heartbeat_timeout_ms)?,
        changed: flag(script, items.get(6), "changed")?,
        replayed: flag(script, items.get(7), "replayed")?,
        stale_ms: due(script, items.get(8), "stale")?,
        due_ms: due(script, items.get(9), "due")?,
        heartbeat_timeout_ms,
        held_since_ms: match items.get(11) {
            Some(v) => due(script, Some(v), "held_since_ms")?,
            None => None,
        },
    })
}

/// Reads an outcome's detail slot (lua/includes/outcome.lua) as `status`
/// says: one match, so that what a slot means is decided in one place.
fn decision(script: &'static str, status: Status, detail: &Value) -> Result<Decision, Error> {
    let refuse = || {
        bad(
            script,
            format!("{status} detail is not one the scripts return: {detail:?}"),
        )
    };
    // A number the status carries, where 0 stands for none.
    let positive = || match detail {
        Value::Int(0) => Ok(None),
        Value::Int(n) => Ok(Some(*n)),
        _ => Err(refuse()),
    };
    Ok(match status {
        Status::Acquired => Decision::Acquired {
            borrowed_until_ms: positive()?,
        },
        Status::Released => Decision::Released {
            linger_ms: positive()?,
        },
        Status::HeartbeatUpdated => match detail {
            Value::Int(n) => Decision::HeartbeatUpdated { heartbeats: *n },
            _ => return Err(refuse()),
        },
        Status::Revoked => match detail {
            Value::Int(n) => Decision::Revoked { held: *n == 1 },
            _ => return Err(refuse()),
        },
        Status::Queued => match detail {
            Value::Int(position) => Decision::Queued {
                position: *position,
                priority: 0,
            },
            Value::Array(pair) => match pair.as_slice() {
                [Value::Int(position), Value::Int(priority)] => Decision::Queued {
                    position: *position,
                    priority: *priority,
                },
                _ => return Err(refuse()),
            },
            _ => return Err(refuse()),
        },
        Status::LicenseInvalid => Decision::LicenseInvalid(invalid_field(script, detail)?),
        // A revocation record the scripts stored; one that does not read
        // as one (written by a later version) is no revocation to show.
        Status::SessionRevoked => {
            Decision::SessionRevoked(text(detail).and_then(|raw| Revocation::parse(&raw)))
        }
        Status::NoSeatsAvailable => match detail {
            Value::Int(_) => Decision::NoSeatsAvailable(NoSeats::InUse),
            other => match text(other).as_deref() {
                Some("queue_full") => Decision::NoSeatsAvailable(NoSeats::QueueFull),
                Some("queue_user_full") => Decision::NoSeatsAvailable(NoSeats::QueueUserFull),
                Some("queue_group_full") => Decision::NoSeatsAvailable(NoSeats::QueueGroupFull),
                Some("queue_application_full") => Decision::NoSeatsAvailable(NoSeats::QueueApplicationFull),
                Some("reserved") => Decision::NoSeatsAvailable(NoSeats::Reserved),
                _ => return Err(refuse()),
            },
        },
        Status::RateLimited => match detail {
            Value::Int(_) => Decision::RateLimited { application: false },
            other if text(other).as_deref() == Some("application") => {
                Decision::RateLimited { application: true }
            }
            _ => return Err(refuse()),
        },
        Status::LimitReached => match text(detail).as_deref().and_then(PolicyRefusal::parse) {
            Some(limit) if limit != PolicyRefusal::Reserved && !matches!(detail, Value::Int(_)) => {
                Decision::LimitReached(limit)
            }
            _ => return Err(refuse()),
        },
        Status::SessionNotActive | Status::SessionNotFound if !matches!(detail, Value::Int(_)) => {
            match text(detail).as_deref() {
                Some("license_deleted") => Decision::LicenseDeleted(status),
                _ => return Err(refuse()),
            }
        }
        other => match detail {
            Value::Int(_) => Decision::Plain(other),
            _ => return Err(refuse()),
        },
    })
}

/// Decodes a reap step `{seats_used, seats_total, now_ms, evicted, notes,
/// more, queue_depth, redeliver, outbox_cursor, outbox_pending, borrow_ended,
/// linger_ended, seats_lingering, seats_borrowed, stale, due,
/// heartbeat_timeout_ms, deleted, held}` (lua/reap.lua).
pub(crate) fn decode_reaped(script: &'static str, value: Value) -> Result<Reaped, Error> {
    let Value::Array(items) = value else {
        return Err(bad(script, format!("expected an array, got {value:?}")));
    };
    if items.len() != 19 {
        return Err(bad(
            script,
            format!("reap step has {} slots, not 19", items.len()),
        ));
    }
    let heartbeat_timeout_ms = timeout(script, items.get(16))?;
    let strings = |v: &Value, what: &str| match v {
        Value::Array(v) => v.iter().map(|s| string(script, Some(s), what)).collect(),
        // An empty list comes as nil (outcome.lua, list_or_nil).
        Value::Nil => Ok(Vec::new()),
        other => Err(bad(script, format!("{what} is not a list: {other:?}"))),
    };
    Ok(Reaped {
        seats_used: int(script, items.first(), "seats_used")?,
        seats_total: int(script, items.get(1), "seats_total")?,
        now_ms: int(script, items.get(2), "now_ms")?,
        evicted: strings(&items[3], "evicted")?,
        notes: notes(script, items.get(4), "notes", heartbeat_timeout_ms)?,
        more: flag(script, items.get(5), "more")?,
        queue_depth: int(script, items.get(6), "queue_depth")?,
        redeliver: notes(script, items.get(7), "redeliver", heartbeat_timeout_ms)?,
        outbox: OutboxCursor {
            cursor: string(script, items.get(8), "outbox_cursor")?,
            pending: strings(&items[9], "outbox_pending")?,
        },
        borrow_ended: strings(&items[10], "borrow_ended")?,
        linger_ended: strings(&items[11], "linger_ended")?,
        seats_lingering: int(script, items.get(12), "seats_lingering")?,
        seats_borrowed: int(script, items.get(13), "seats_borrowed")?,
        stale_ms: due(script, items.get(14), "stale")?,
        due_ms: due(script, items.get(15), "due")?,
        heartbeat_timeout_ms,
        deleted: strings(&items[17], "deleted")?,
        held: int(script, items.get(18), "held")?,
    })
}

/// What one step of lua/delete_license.lua did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    /// This step deleted the license record (the first step of a delete
    /// of a license that existed).
    pub existed: bool,
    /// The Redis server's time, ms: when the seats and waits ended.
    pub now_ms: i64,
    /// Sessions whose seat ended.
    pub ended: Vec<String>,
    /// A LICENSE_NOT_FOUND note per waiter whose wait ended.
    pub notes: Vec<Note>,
    /// Seats or waits are left: call again.
    pub more: bool,
}

/// Decodes a delete step `{existed, now_ms, ended, notes, more}`
/// (lua/delete_license.lua).
pub(crate) fn decode_deleted(script: &'static str, value: Value) -> Result<Deleted, Error> {
    let Value::Array(items) = value else {
        return Err(bad(script, format!("expected an array, got {value:?}")));
    };
    if items.len() != 5 {
        return Err(bad(
            script,
            format!("delete step has {} slots, not 5", items.len()),
        ));
    }
    let ended = match &items[2] {
        Value::Array(v) => v
            .iter()
            .map(|s| string(script, Some(s), "ended"))
            .collect::<Result<_, _>>()?,
        other => return Err(bad(script, format!("ended is not a list: {other:?}"))),
    };
    Ok(Deleted {
        existed: flag(script, items.first(), "existed")?,
        now_ms: int(script, items.get(1), "now_ms")?,
        ended,
        notes: notes(script, items.get(3), "notes", None)?,
        more: flag(script, items.get(4), "more")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn outcome(status: &str, detail: Value, notes: Vec<Value>) -> Value {
        Value::Array(vec![
            bulk(status),
            Value::Int(1),
            Value::Int(5),
            detail,
            Value::Int(1_000),
            Value::Array(notes),
            Value::Int(1),
            Value::Int(0),
            Value::Int(91_000),
            Value::Int(1_000),
            Value::Int(90_000),
        ])
    }

    #[test]
    fn the_due_time_and_the_timeout_in_force_come_with_every_outcome() {
        let note = |kind: &str| {
            Value::Array(vec![
                bulk(kind),
                bulk("w1"),
                bulk("r-1"),
                bulk("seat:reply:w"),
                Value::Int(5),
                bulk("id"),
            ])
        };
        let o = decode_outcome(
            "release",
            outcome(
                "RELEASED",
                Value::Int(0),
                vec![note("GRANTED"), note("QUEUE_TIMEOUT")],
            ),
        )
        .unwrap();
        assert_eq!(
            (o.stale_ms, o.due_ms, o.heartbeat_timeout_ms),
            (Some(91_000), Some(1_000), Some(90_000))
        );
        let timeouts: Vec<Option<i64>> = o.notes.iter().map(|n| n.heartbeat_timeout_ms).collect();
        assert_eq!(timeouts, [Some(90_000), None], "only a grant carries it");
        let Value::Array(mut idle) = outcome("RELEASED", Value::Int(0), vec![]) else {
            unreachable!()
        };
        idle[8] = Value::Int(0);
        idle[9] = Value::Int(0);
        let idle = decode_outcome("release", Value::Array(idle)).unwrap();
        assert_eq!((idle.stale_ms, idle.due_ms), (None, None), "nothing to file");
    }

    /// The request scripts answer no notes as nil (outcome.lua, replied);
    /// a list is still read, and anything else still refused.
    #[test]
    fn no_notes_come_as_nil() {
        let Value::Array(mut none) = outcome("ACQUIRED", Value::Int(0), vec![]) else {
            unreachable!()
        };
        none[5] = Value::Nil;
        let o = decode_outcome("acquire", Value::Array(none.clone())).unwrap();
        assert!(o.notes.is_empty());
        none[5] = Value::Int(0);
        assert!(decode_outcome("acquire", Value::Array(none)).is_err());
    }

    #[test]
    fn held_since_ms_comes_with_a_held_seat_and_a_grant() {
        let Value::Array(mut acquired) = outcome("ACQUIRED", Value::Int(0), vec![]) else {
            unreachable!()
        };
        assert_eq!(
            decode_outcome("acquire", Value::Array(acquired.clone()))
                .unwrap()
                .held_since_ms,
            None,
            "11 slots: none"
        );
        acquired.push(Value::Int(77_000));
        let o = decode_outcome("acquire", Value::Array(acquired)).unwrap();
        assert_eq!(o.held_since_ms, Some(77_000));
        let note = |kind: &str| {
            Value::Array(vec![
                bulk(kind),
                bulk("w1"),
                bulk("r-1"),
                bulk("seat:reply:w"),
                Value::Int(5),
                bulk("id"),
                Value::Int(88_000),
            ])
        };
        let o = decode_outcome(
            "release",
            outcome(
                "RELEASED",
                Value::Int(0),
                vec![note("GRANTED"), note("QUEUE_TIMEOUT"), note("SESSION_NOT_ACTIVE")],
            ),
        )
        .unwrap();
        let since: Vec<(Status, Option<i64>)> = o.notes.iter().map(|n| (n.status, n.held_since_ms)).collect();
        assert_eq!(
            since,
            [
                (Status::Granted, Some(88_000)),
                (Status::QueueTimeout, None),
                (Status::SessionNotActive, None)
            ],
            "only a grant carries it"
        );
    }

    #[test]
    fn the_detail_slot_means_what_the_status_says() {
        let o = decode_outcome("heartbeat", outcome("HEARTBEAT_UPDATED", Value::Int(7), vec![])).unwrap();
        assert_eq!(o.decision, Decision::HeartbeatUpdated { heartbeats: 7 });
        let o = decode_outcome("acquire", outcome("QUEUED", Value::Int(3), vec![])).unwrap();
        assert_eq!(
            o.decision,
            Decision::Queued {
                position: 3,
                priority: 0
            }
        );
        let o = decode_outcome("acquire", outcome("NO_SEATS_AVAILABLE", Value::Int(0), vec![])).unwrap();
        assert_eq!(o.decision, Decision::NoSeatsAvailable(NoSeats::InUse));
        let o = decode_outcome(
            "acquire",
            outcome("NO_SEATS_AVAILABLE", bulk("queue_full"), vec![]),
        )
        .unwrap();
        assert_eq!(o.decision, Decision::NoSeatsAvailable(NoSeats::QueueFull));
        let record = r#"{"reason":"audit","actor":"ada","at":1,"cooldown_until":0}"#;
        let o = decode_outcome("heartbeat", outcome("SESSION_REVOKED", bulk(record), vec![])).unwrap();
        let Decision::SessionRevoked(Some(revocation)) = o.decision else {
            panic!("{o:?}")
        };
        assert_eq!(revocation.actor, "ada");
        let o = decode_outcome("heartbeat", outcome("SESSION_REVOKED", bulk("{nope"), vec![])).unwrap();
        assert_eq!(
            o.decision,
            Decision::SessionRevoked(None),
            "a record of another form"
        );
        let o = decode_outcome("acquire", outcome("ALREADY_ACTIVE", Value::Int(0), vec![])).unwrap();
        assert_eq!(o.decision, Decision::Plain(Status::AlreadyActive));
    }

    #[test]
    fn policy_details_decode_per_status() {
        let o = decode_outcome(
            "acquire",
            outcome("QUEUED", Value::Array(vec![Value::Int(2), Value::Int(7)]), vec![]),
        )
        .unwrap();
        assert_eq!(
            o.decision,
            Decision::Queued {
                position: 2,
                priority: 7
            }
        );
        let o = decode_outcome("acquire", outcome("QUEUED", Value::Int(4), vec![])).unwrap();
        assert_eq!(
            o.decision,
            Decision::Queued {
                position: 4,
                priority: 0
            }
        );
        let o = decode_outcome("acquire", outcome("LIMIT_REACHED", bulk("group_max"), vec![])).unwrap();
        assert_eq!(o.decision, Decision::LimitReached(PolicyRefusal::GroupMax));
        let o = decode_outcome("acquire", outcome("NO_SEATS_AVAILABLE", bulk("reserved"), vec![])).unwrap();
        assert_eq!(o.decision, Decision::NoSeatsAvailable(NoSeats::Reserved));
        let o = decode_outcome("release", outcome("RELEASED", Value::Int(30_000), vec![])).unwrap();
        assert_eq!(
            o.decision,
            Decision::Released {
                linger_ms: Some(30_000)
            }
        );
        let o = decode_outcome("release", outcome("RELEASED", Value::Int(0), vec![])).unwrap();
        assert_eq!(o.decision, Decision::Released { linger_ms: None });
        let o = decode_outcome(
            "acquire",
            outcome("ACQUIRED", Value::Int(1_800_000_000_000), vec![]),
        )
        .unwrap();
        assert_eq!(
            o.decision,
            Decision::Acquired {
                borrowed_until_ms: Some(1_800_000_000_000)
            }
        );
        let o = decode_outcome("acquire", outcome("ACQUIRED", Value::Int(0), vec![])).unwrap();
        assert_eq!(
            o.decision,
            Decision::Acquired {
                borrowed_until_ms: None
            }
        );
        for (status, detail) in [
            ("LIMIT_REACHED", Value::Int(1)),
            ("LIMIT_REACHED", bulk("reserved")),
            ("LIMIT_REACHED", bulk("max_seats")),
            ("ACQUIRED", bulk("reserved")),
            ("RELEASED", Value::Array(vec![Value::Int(1), Value::Int(2)])),
        ] {
            assert!(
                decode_outcome("acquire", outcome(status, detail, vec![])).is_err(),
                "{status}"
            );
        }
    }

    #[test]
    fn license_invalid_carries_the_field_and_its_value() {
        let detail = Value::Array(vec![bulk("seats_total"), Value::BulkString(b"5.5\xff".to_vec())]);
        let o = decode_outcome("acquire", outcome("LICENSE_INVALID", detail, vec![])).unwrap();
        let Decision::LicenseInvalid(invalid) = o.decision else {
            panic!("{o:?}")
        };
        assert_eq!(
            (invalid.field, invalid.value.as_str()),
            (Field::SeatsTotal, "5.5\u{fffd}")
        );
        assert!(decode_outcome("acquire", outcome("LICENSE_INVALID", Value::Int(0), vec![])).is_err());
        let unknown = Value::Array(vec![bulk("colour"), bulk("red")]);
        assert!(decode_outcome("acquire", outcome("LICENSE_INVALID", unknown, vec![])).is_err());
    }

    #[test]
    fn refuses_replies_outside_the_contract() {
        assert!(decode_outcome("acquire", Value::Int(1)).is_err());
        assert!(decode_outcome("acquire", Value::Array(vec![bulk("MAYBE")])).is_err());
        assert!(decode_outcome("acquire", outcome("MAYBE", Value::Int(0), vec![])).is_err());
        assert!(decode_outcome("acquire", outcome("QUEUED", bulk("soon"), vec![])).is_err());
        let short_note = Value::Array(vec![bulk("GRANTED"), bulk("s9")]);
        assert!(decode_outcome("release", outcome("RELEASED", Value::Int(0), vec![short_note])).is_err());
        let Value::Array(mut seven) = outcome("RELEASED", Value::Int(0), vec![]) else {
            unreachable!()
        };
        seven.pop();
        assert!(decode_outcome("release", Value::Array(seven)).is_err());
        let Value::Array(mut no_timeout) = outcome("ACQUIRED", Value::Int(0), vec![]) else {
            unreachable!()
        };
        no_timeout[10] = Value::Int(-1);
        assert!(decode_outcome("acquire", Value::Array(no_timeout)).is_err());
        assert!(decode_reaped("reap", Value::Array(vec![Value::Int(1)])).is_err());
        assert!(decode_deleted("delete_license", Value::Array(vec![Value::Int(1)])).is_err());
    }
}
