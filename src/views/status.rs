//! `seatgate status`: who holds each license's seats and who waits, like
//! FlexLM's `lmstat`. Each license is read in one MULTI, so its holders and
//! queue are a consistent snapshot.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use redis::aio::ConnectionLike;
use serde::Serialize;

use super::printable;
use crate::engine::keys::Keys;
use crate::engine::license::{InvalidField, StoredRecord};
use crate::engine::policy::{score_priority, LicensePolicy};
use crate::engine::protocol::valid_id;
use crate::engine::records::{OwnerRecord, SessionRecord, WaiterRecord};
use crate::error::Error;

/// One seat holder.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    /// Session id.
    pub session: String,
    /// `user_email` from the metadata, if any.
    pub user: Option<String>,
    /// `hardware_id` from the metadata, if any.
    pub hardware_id: Option<String>,
    /// When the seat was taken (Redis clock, ms).
    pub acquired_at_ms: i64,
    /// Last heartbeat (Redis clock, ms); for a lingering or borrowed seat,
    /// which needs none, when it was taken.
    pub last_heartbeat_ms: i64,
    /// Heartbeats received.
    pub heartbeats: i64,
    /// Whether the seat is bound to a lease (the lease itself, and its hash,
    /// are never shown).
    pub leased: bool,
    /// The session's metadata.
    pub meta: serde_json::Value,
    /// The user the seat counts for (the acquire's `user`), if any.
    pub user_id: Option<String>,
    /// The group the seat counts for (the acquire's `group`), if any.
    pub group: Option<String>,
    /// Released, the seat lingers with the session until then (ms).
    pub lingering_until_ms: Option<i64>,
    /// Borrowed: held without heartbeats until then (ms).
    pub borrowed_until_ms: Option<i64>,
}

/// One waiting session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Waiter {
    /// 1-based place in the queue.
    pub position: usize,
    /// Session id.
    pub session: String,
    /// `user_email` from the metadata, if any.
    pub user: Option<String>,
    /// When it joined the queue (Redis clock, ms).
    pub queued_at_ms: i64,
    /// When it gives up (Redis clock, ms).
    pub deadline_ms: i64,
    /// Its priority in the queue, 0-9 (higher goes first).
    pub priority: u8,
    /// The user its seat will count for, if any.
    pub user_id: Option<String>,
    /// The group its seat will count for, if any.
    pub group: Option<String>,
    /// The borrow its grant starts, ms (0 = none).
    pub borrow_ms: u64,
}

/// One license's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LicenseStatus {
    /// License id.
    pub license: String,
    /// Seats held, lingering and borrowed ones included.
    pub seats_used: usize,
    /// Of `seats_used`, the seats lingering after a release.
    pub seats_lingering: usize,
    /// Of `seats_used`, the seats borrowed.
    pub seats_borrowed: usize,
    /// Seats provisioned (0 when the record is missing).
    pub seats_total: i64,
    /// The license's policies, as the scripts apply them.
    pub policy: LicensePolicy,
    /// Seats held per user, as the scripts count them for `max_per_user`.
    pub held_by_user: BTreeMap<String, i64>,
    /// Seats held per group, as the scripts count them for `group_max` and `group_reserve`.
    pub held_by_group: BTreeMap<String, i64>,
    /// Whether acquires are allowed.
    pub active: bool,
    /// Expiry (ms), 0 = never.
    pub expires_at_ms: i64,
    /// The field that breaks the record's rules, if one does (engine::license):
    /// acquires get LICENSE_INVALID until it is fixed. The seat fields then
    /// read it as absent. Absent from JSON when the record is valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<InvalidField>,
    /// Holders, longest-held first.
    pub holders: Vec<Holder>,
    /// Waiters in queue order.
    pub queue: Vec<Waiter>,
}

/// A snapshot of some licenses at one moment of the Redis clock.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// The Redis server's time when read, ms.
    pub at_ms: i64,
    /// The licenses.
    pub licenses: Vec<LicenseStatus>,
}

fn meta_field(meta: &serde_json::Value, field: &str) -> Option<String> {
    meta.get(field).and_then(|v| v.as_str()).map(str::to_owned)
}

/// Reads one license.
pub async fn license_status<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
) -> Result<LicenseStatus, Error> {
    let k = keys.license(license);
    type Snapshot = (
        HashMap<String, String>,
        Vec<(String, f64)>,
        HashMap<String, String>,
        Vec<(String, i64)>,
        HashMap<String, String>,
        Vec<(String, i64)>,
        HashMap<String, String>,
        HashMap<String, i64>,
        HashMap<String, i64>,
    );
    let (fields, holders, sessions, queue, waiters, deadlines, owners, lingering, borrowed): Snapshot =
        redis::pipe()
            .atomic()
            .cmd("HGETALL")
            .arg(&k.license)
            .cmd("ZRANGE")
            .arg(&k.holders)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("HGETALL")
            .arg(&k.sessions)
            .cmd("ZRANGE")
            .arg(&k.queue)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("HGETALL")
            .arg(&k.waiters)
            .cmd("ZRANGE")
            .arg(&k.deadlines)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("HGETALL")
            .arg(&k.owners)
            .cmd("ZRANGE")
            .arg(&k.lingering)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("ZRANGE")
            .arg(&k.borrowed)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(con)
            .await?;
    let deadlines: HashMap<String, i64> = deadlines.into_iter().collect();
    let record = StoredRecord::from_map(&fields);
    let spec = record.spec();
    let owner = |session: &str| {
        owners
            .get(&format!("s:{session}"))
            .and_then(|r| OwnerRecord::parse(r))
    };
    let counts = |prefix: &str| -> BTreeMap<String, i64> {
        owners
            .iter()
            .filter_map(|(field, n)| Some((field.strip_prefix(prefix)?.to_owned(), n.parse().ok()?)))
            .collect()
    };
    let holders = holders
        .into_iter()
        .map(|(session, score)| {
            let record = sessions.get(&session).and_then(|r| SessionRecord::parse(r));
            let lingering_until_ms = lingering.get(&session).copied();
            let borrowed_until_ms = borrowed.get(&session).copied();
            // A lingering seat is scored +inf, a borrowed one with its end
            // (lua/includes/owners.lua): neither is a heartbeat.
            let held_without_heartbeats = lingering_until_ms.is_some() || borrowed_until_ms.is_some();
            let last = score as i64;
            let acquired_at_ms = record.as_ref().map_or(last, |r| r.acquired_at_ms);
            let heartbeats = record.as_ref().map_or(0, |r| r.heartbeats);
            let leased = record.as_ref().is_some_and(|r| r.lease_hash.is_some());
            let meta = record
                .and_then(|r| serde_json::from_str(&r.meta).ok())
                .unwrap_or(serde_json::Value::Null);
            let who = owner(&session);
            Holder {
                user: meta_field(&meta, "user_email"),
                hardware_id: meta_field(&meta, "hardware_id"),
                acquired_at_ms,
                last_heartbeat_ms: if held_without_heartbeats {
                    acquired_at_ms
                } else {
                    last
                },
                heartbeats,
                leased,
                meta,
                user_id: who.as_ref().and_then(|o| o.user.clone()),
                group: who.and_then(|o| o.group),
                lingering_until_ms,
                borrowed_until_ms,
                session,
            }
        })
        .collect::<Vec<_>>();
    let mut holders = holders;
    holders.sort_by_key(|h| h.acquired_at_ms);
    let queue = queue
        .into_iter()
        .enumerate()
        .map(|(i, (session, score))| {
            let record = waiters.get(&session).and_then(|r| WaiterRecord::parse(r));
            let meta = record
                .as_ref()
                .and_then(|r| serde_json::from_str(&r.meta).ok())
                .unwrap_or(serde_json::Value::Null);
            let who = owner(&session);
            Waiter {
                position: i + 1,
                user: meta_field(&meta, "user_email"),
                queued_at_ms: record.map_or(0, |r| r.queued_at),
                deadline_ms: deadlines.get(&session).copied().unwrap_or(0),
                priority: score_priority(score),
                user_id: who.as_ref().and_then(|o| o.user.clone()),
                group: who.as_ref().and_then(|o| o.group.clone()),
                borrow_ms: who.map_or(0, |o| o.borrow_ms),
                session,
            }
        })
        .collect();
    Ok(LicenseStatus {
        license: license.to_owned(),
        seats_used: holders.len(),
        seats_lingering: holders.iter().filter(|h| h.lingering_until_ms.is_some()).count(),
        seats_borrowed: holders.iter().filter(|h| h.borrowed_until_ms.is_some()).count(),
        seats_total: i64::try_from(spec.seats_total).unwrap_or(0),
        active: spec.active,
        expires_at_ms: i64::try_from(spec.expires_at_ms).unwrap_or(0),
        invalid: if record.exists() {
            record.validate().err()
        } else {
            None
        },
        policy: LicensePolicy::from_record(&fields).0,
        held_by_user: counts("u:"),
        held_by_group: counts("g:"),
        holders,
        queue,
    })
}

/// Reads `only` (or every indexed license).
pub async fn status<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    only: Option<&str>,
) -> Result<Status, Error> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
    let ids = match only {
        Some(l) => vec![l.to_owned()],
        None => {
            let mut ids: Vec<String> = redis::cmd("SMEMBERS")
                .arg(keys.license_index())
                .query_async(con)
                .await?;
            ids.sort();
            ids
        }
    };
    let mut licenses = Vec::with_capacity(ids.len());
    for id in ids.iter().filter(|id| valid_id(id)) {
        licenses.push(license_status(con, keys, id).await?);
    }
    Ok(Status {
        at_ms: secs * 1000 + micros / 1000,
        licenses,
    })
}

/// `1h02m`, `3m05s`, `42s`, `850ms`.
fn ago(ms: i64) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `  user=ada group=cad priority=5` after a row: who a seat counts for, and
/// a waiter's priority above 0; "" when there is nothing to say.
fn owner_note(user: Option<&str>, group: Option<&str>, priority: Option<u8>) -> String {
    let mut out = String::new();
    if let Some(u) = user {
        let _ = write!(out, "  user={}", printable(u));
    }
    if let Some(g) = group {
        let _ = write!(out, "  group={}", printable(g));
    }
    if let Some(p) = priority.filter(|p| *p > 0) {
        let _ = write!(out, "  priority={p}");
    }
    out
}

/// The terminal rendering; every value read from Redis goes through
/// [`printable`]. (`--json` prints the values exactly, JSON-escaped.)
pub fn render(status: &Status) -> String {
    let mut out = String::new();
    if status.licenses.is_empty() {
        out.push_str("no licenses\n");
    }
    let now = status.at_ms;
    for l in &status.licenses {
        let _ = write!(
            out,
            "{}: {} of {} seats in use",
            printable(&l.license),
            l.seats_used,
            l.seats_total
        );
        if l.seats_lingering + l.seats_borrowed > 0 {
            let _ = write!(
                out,
                " ({} lingering, {} borrowed)",
                l.seats_lingering, l.seats_borrowed
            );
        }
        if !l.queue.is_empty() {
            let _ = write!(out, ", {} waiting", l.queue.len());
        }
        if !l.active {
            out.push_str("  [INACTIVE]");
        }
        if l.expires_at_ms > 0 && l.expires_at_ms <= now {
            out.push_str("  [EXPIRED]");
        }
        if let Some(bad) = &l.invalid {
            let _ = write!(out, "  [INVALID: {}=\"{}\"]", bad.field, bad.shown_value());
        }
        out.push('\n');
        if !l.policy.is_empty() {
            let _ = writeln!(out, "  policy: {}", printable(&l.policy.describe()));
        }
        if !l.held_by_user.is_empty() || !l.held_by_group.is_empty() {
            let held = |by: &BTreeMap<String, i64>, kind: &str| {
                by.iter()
                    .map(|(id, n)| format!("{kind} {} {n}", printable(id)))
                    .collect::<Vec<_>>()
            };
            let mut parts = held(&l.held_by_user, "user");
            parts.extend(held(&l.held_by_group, "group"));
            let _ = writeln!(out, "  held: {}", parts.join(", "));
        }
        if !l.holders.is_empty() {
            let _ = writeln!(
                out,
                "  {:<24} {:<28} {:<16} {:>8} {:>14}",
                "SESSION", "USER", "HARDWARE", "HELD", "LAST HEARTBEAT"
            );
            for h in &l.holders {
                let last = match (h.lingering_until_ms, h.borrowed_until_ms) {
                    (Some(until), _) => format!("lingers {}", ago(until - now)),
                    (None, Some(until)) => format!("borrowed {}", ago(until - now)),
                    (None, None) => format!("{} ago", ago(now - h.last_heartbeat_ms)),
                };
                let _ = writeln!(
                    out,
                    "  {:<24} {:<28} {:<16} {:>8} {:>14}{}",
                    printable(&h.session),
                    printable(h.user.as_deref().unwrap_or("-")),
                    printable(h.hardware_id.as_deref().unwrap_or("-")),
                    ago(now - h.acquired_at_ms),
                    last,
                    owner_note(h.user_id.as_deref(), h.group.as_deref(), None),
                );
            }
        }
        if !l.queue.is_empty() {
            let _ = writeln!(
                out,
                "  {:<4} {:<24} {:<28} {:>8} {:>10}",
                "POS", "WAITING SESSION", "USER", "WAITING", "GIVES UP"
            );
            for w in &l.queue {
                let _ = writeln!(
                    out,
                    "  {:<4} {:<24} {:<28} {:>8} {:>10}{}",
                    w.position,
                    printable(&w.session),
                    printable(w.user.as_deref().unwrap_or("-")),
                    ago(now - w.queued_at_ms),
                    format!("in {}", ago(w.deadline_ms - now)),
                    owner_note(w.user_id.as_deref(), w.group.as_deref(), Some(w.priority)),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::license::Field;

    fn holder(session: &str, meta: serde_json::Value) -> Holder {
        Holder {
            session: session.into(),
            user: meta_field(&meta, "user_email"),
            hardware_id: meta_field(&meta, "hardware_id"),
            acquired_at_ms: 1_000,
            last_heartbeat_ms: 2_000,
            heartbeats: 1,
            leased: true,
            meta,
            user_id: None,
            group: None,
            lingering_until_ms: None,
            borrowed_until_ms: None,
        }
    }

    #[test]
    fn control_characters_in_values_are_escaped_in_text_only() {
        let meta = serde_json::json!({
            "user_email": "\u{1b}[2J\u{1b}[Hroot@evil",
            "hardware_id": "hw\r\nFAKE LINE\u{7}\u{202E}gnp.exe",
        });
        let status = Status {
            at_ms: 3_000,
            licenses: vec![LicenseStatus {
                license: "cad".into(),
                seats_used: 1,
                seats_lingering: 0,
                seats_borrowed: 0,
                seats_total: 2,
                active: true,
                expires_at_ms: 0,
                invalid: Some(InvalidField {
                    field: Field::SeatsTotal,
                    group: None,
                    value: "5\u{1b}[2J".into(),
                }),
                policy: LicensePolicy::default(),
                held_by_user: [("u\u{1b}[2J".to_owned(), 1)].into(),
                held_by_group: BTreeMap::new(),
                holders: vec![holder("s-1", meta.clone())],
                queue: vec![Waiter {
                    position: 1,
                    session: "w-1".into(),
                    user: Some("bell\u{7}".into()),
                    queued_at_ms: 2_500,
                    deadline_ms: 9_000,
                    priority: 3,
                    user_id: Some("u\u{1b}[2J".into()),
                    group: None,
                    borrow_ms: 0,
                }],
            }],
        };
        let text = render(&status);
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202E}'),
            "{text:?}"
        );
        assert_eq!(text.lines().count(), 6, "one line per row: {text}");
        assert!(text.contains(r"user=u\u{1b}[2J  priority=3"), "{text}");
        assert!(text.contains(r"held: user u\u{1b}[2J 1"), "{text}");
        assert!(text.contains(r"\u{1b}[2J\u{1b}[Hroot@evil"), "{text}");
        assert!(text.contains(r"hw\r\nFAKE LINE\u{7}\u{202e}gnp.exe"), "{text}");
        assert!(text.contains(r"bell\u{7}"), "{text}");
        assert!(text.contains(r#"[INVALID: seats_total="5\u{1b}[2J"]"#), "{text}");
        // JSON keeps the exact values.
        let json: serde_json::Value = serde_json::to_value(&status).unwrap();
        assert_eq!(json["licenses"][0]["holders"][0]["meta"], meta);
        assert_eq!(printable("ünïcödé ok"), "ünïcödé ok");
    }

    #[test]
    fn durations_read_like_lmstat() {
        assert_eq!(ago(850), "850ms");
        assert_eq!(ago(42_000), "42s");
        assert_eq!(ago(185_000), "3m05s");
        assert_eq!(ago(3_720_000), "1h02m");
        assert_eq!(ago(-5), "0ms");
    }
}
