//! `seatgate status`: who holds each license's seats and who waits, like
//! FlexLM's `lmstat`. Each license is read in one MULTI, so its holders and
//! queue are a consistent snapshot (in a plain pipeline while Redis is out
//! of memory and refuses MULTI: [`read_snapshot`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use redis::aio::ConnectionLike;
use serde::Serialize;

use super::printable;
use crate::error::Error;
use seatgate_core::db::is_out_of_memory;
use seatgate_core::keys::Keys;
use seatgate_core::license::{InvalidField, StoredRecord};
use seatgate_core::policy::{score_priority, LicensePolicy};
use seatgate_core::protocol::valid_id;
use seatgate_core::records::{OwnerRecord, SessionRecord, WaiterRecord};

/// One seat holder.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Holder {
    /// Session id.
    pub session: String,
    /// The user the seat counts for: the acquire's `user`, as the owner
    /// record keeps it (lua/includes/owners.lua); `None` when it named none.
    pub user: Option<String>,
    /// `user_email` from the metadata, if any: display metadata the caller
    /// sent, never taken as the user.
    pub user_email: Option<String>,
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
    /// The user its seat will count for: the acquire's `user`, if any.
    pub user: Option<String>,
    /// `user_email` from the metadata, if any (display metadata only).
    pub user_email: Option<String>,
    /// When it joined the queue (Redis clock, ms).
    pub queued_at_ms: i64,
    /// When it gives up (Redis clock, ms).
    pub deadline_ms: i64,
    /// Its priority in the queue, 0-9 (higher goes first).
    pub priority: u8,
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

/// A session's metadata as JSON; `null` when there is none or it does not parse.
fn meta_json(raw: Option<&str>) -> serde_json::Value {
    raw.and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// One license's keys as read in one MULTI, still in the form the scripts
/// store them: what [`assemble`] makes a [`LicenseStatus`] of.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The license record: seats, expiry, the active flag, policies.
    pub record: HashMap<String, String>,
    /// Seat holders in score order, with their score: the last heartbeat
    /// (ms), `+inf` for a lingering seat, the borrow's end for a borrowed one.
    pub holders: Vec<(String, f64)>,
    /// Session id → its [`SessionRecord`].
    pub sessions: HashMap<String, String>,
    /// Waiting sessions in queue order, with their score (priority and
    /// arrival, [`score_priority`]).
    pub queue: Vec<(String, i64)>,
    /// Session id → its [`WaiterRecord`].
    pub waiters: HashMap<String, String>,
    /// Session id → when it gives up waiting, ms.
    pub deadlines: HashMap<String, i64>,
    /// `s:<session>` → its [`OwnerRecord`]; `u:<user>` and `g:<group>` →
    /// seats held.
    pub owners: HashMap<String, String>,
    /// Session id → until when its released seat lingers, ms.
    pub lingering: HashMap<String, i64>,
    /// Session id → until when its seat is borrowed, ms.
    pub borrowed: HashMap<String, i64>,
}

impl Snapshot {
    /// Whether there is nothing to show: no license record (none with
    /// `seats_total`: what acquires answer LICENSE_NOT_FOUND to), nobody
    /// holding a seat, nobody waiting. A record removed by hand while
    /// sessions hold seats still shows them.
    pub fn is_missing(&self) -> bool {
        !StoredRecord::from_map(&self.record).exists() && self.holders.is_empty() && self.queue.is_empty()
    }

    /// Who `session`'s seat (or place in the queue) counts for.
    fn owner(&self, session: &str) -> Option<OwnerRecord> {
        self.owners
            .get(&format!("s:{session}"))
            .and_then(|r| OwnerRecord::parse(r))
    }
}

/// Reads one license's [`Snapshot`] in one MULTI, so that its holders and
/// queue are consistent with each other. A Redis out of memory refuses a
/// MULTI whatever it holds (under `OOM` it queues no command, not even a
/// read): the same reads then go as a plain pipeline, which it answers, so
/// the views still work while Redis refuses writes, each key read as it is
/// a moment apart from the others.
pub async fn read_snapshot<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
) -> Result<Snapshot, Error> {
    match read_snapshot_in(con, keys, license, true).await {
        Err(e) if e.redis().is_some_and(is_out_of_memory) => {
            read_snapshot_in(con, keys, license, false).await
        }
        read => read,
    }
}

/// The snapshot's reads, in one MULTI when `atomic`.
async fn read_snapshot_in<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
    atomic: bool,
) -> Result<Snapshot, Error> {
    fn zrange(pipe: &mut redis::Pipeline, key: &str) {
        pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
    }
    let k = keys.license(license);
    let mut pipe = redis::pipe();
    if atomic {
        pipe.atomic();
    }
    pipe.cmd("HGETALL").arg(&k.license);
    zrange(&mut pipe, &k.holders);
    pipe.cmd("HGETALL").arg(&k.sessions);
    zrange(&mut pipe, &k.queue);
    pipe.cmd("HGETALL").arg(&k.waiters);
    zrange(&mut pipe, &k.deadlines);
    pipe.cmd("HGETALL").arg(&k.owners);
    zrange(&mut pipe, &k.lingering);
    zrange(&mut pipe, &k.borrowed);
    // One reply per command, in the order sent; the types are the fields'.
    let (record, holders, sessions, queue, waiters, deadlines, owners, lingering, borrowed) =
        pipe.query_async(con).await?;
    Ok(Snapshot {
        record,
        holders,
        sessions,
        queue,
        waiters,
        deadlines,
        owners,
        lingering,
        borrowed,
    })
}

/// Reads one license.
pub async fn license_status<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: &str,
) -> Result<LicenseStatus, Error> {
    Ok(assemble(license, &read_snapshot(con, keys, license).await?))
}

/// License `license`'s status as `snapshot` shows it: its seats and
/// policies as the scripts read them, holders longest-held first, waiters in
/// queue order.
pub fn assemble(license: &str, snapshot: &Snapshot) -> LicenseStatus {
    let record = StoredRecord::from_map(&snapshot.record);
    let spec = record.spec();
    let mut holders: Vec<Holder> = snapshot
        .holders
        .iter()
        .map(|(session, score)| holder(snapshot, session, *score))
        .collect();
    holders.sort_by_key(|h| h.acquired_at_ms);
    let queue = snapshot
        .queue
        .iter()
        .enumerate()
        .map(|(i, (session, score))| waiter(snapshot, i + 1, session, *score))
        .collect();
    let held = |prefix: &str| -> BTreeMap<String, i64> {
        snapshot
            .owners
            .iter()
            .filter_map(|(field, n)| Some((field.strip_prefix(prefix)?.to_owned(), n.parse().ok()?)))
            .collect()
    };
    LicenseStatus {
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
        policy: LicensePolicy::from_record(&snapshot.record),
        held_by_user: held("u:"),
        held_by_group: held("g:"),
        holders,
        queue,
    }
}

/// The holder `session`, whose holders score is `score`.
fn holder(snapshot: &Snapshot, session: &str, score: f64) -> Holder {
    let record = snapshot
        .sessions
        .get(session)
        .and_then(|r| SessionRecord::parse(r));
    let lingering_until_ms = snapshot.lingering.get(session).copied();
    let borrowed_until_ms = snapshot.borrowed.get(session).copied();
    // A lingering seat is scored +inf, a borrowed one with its end
    // (lua/includes/owners.lua): neither is a heartbeat.
    let held_without_heartbeats = lingering_until_ms.is_some() || borrowed_until_ms.is_some();
    let last = score as i64;
    let acquired_at_ms = record.as_ref().map_or(last, |r| r.acquired_at_ms);
    let meta = meta_json(record.as_ref().map(|r| r.meta.as_str()));
    let who = snapshot.owner(session);
    Holder {
        session: session.to_owned(),
        user: who.as_ref().and_then(|o| o.user.clone()),
        user_email: meta_field(&meta, "user_email"),
        hardware_id: meta_field(&meta, "hardware_id"),
        acquired_at_ms,
        last_heartbeat_ms: if held_without_heartbeats {
            acquired_at_ms
        } else {
            last
        },
        heartbeats: record.as_ref().map_or(0, |r| r.heartbeats),
        leased: record.as_ref().is_some_and(|r| r.lease_hash.is_some()),
        meta,
        group: who.and_then(|o| o.group),
        lingering_until_ms,
        borrowed_until_ms,
    }
}

/// The waiter `session` at 1-based `position`, whose queue score is `score`.
fn waiter(snapshot: &Snapshot, position: usize, session: &str, score: i64) -> Waiter {
    let record = snapshot.waiters.get(session).and_then(|r| WaiterRecord::parse(r));
    let meta = meta_json(record.as_ref().map(|r| r.meta.as_str()));
    let who = snapshot.owner(session);
    Waiter {
        position,
        session: session.to_owned(),
        user: who.as_ref().and_then(|o| o.user.clone()),
        user_email: meta_field(&meta, "user_email"),
        queued_at_ms: record.map_or(0, |r| r.queued_at),
        deadline_ms: snapshot.deadlines.get(session).copied().unwrap_or(0),
        priority: score_priority(score),
        group: who.as_ref().and_then(|o| o.group.clone()),
        borrow_ms: who.map_or(0, |o| o.borrow_ms),
    }
}

/// Reads `only` (or every indexed license). `only` is left out when it
/// [is missing](Snapshot::is_missing), so `licenses` is empty when the one
/// license asked for does not exist.
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
        let snapshot = read_snapshot(con, keys, id).await?;
        if only.is_some() && snapshot.is_missing() {
            continue;
        }
        licenses.push(assemble(id, &snapshot));
    }
    Ok(Status {
        at_ms: secs * 1000 + micros / 1000,
        licenses,
    })
}

impl LicenseStatus {
    /// Seats free now: provisioned minus in use, never below 0.
    pub fn seats_free(&self) -> i64 {
        (self.seats_total - i64::try_from(self.seats_used).unwrap_or(i64::MAX)).max(0)
    }

    /// Whether a new acquire would wait: no seat free, or sessions waiting
    /// already (`seatgate status --full-only`).
    pub fn is_full(&self) -> bool {
        self.seats_free() == 0 || !self.queue.is_empty()
    }

    /// Whether the license has expired by `now_ms` (Redis clock).
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms > 0 && self.expires_at_ms <= now_ms
    }
}

/// The order `seatgate status --sort` lists licenses in; ties by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Order {
    /// By license id (the default).
    #[default]
    Name,
    /// Most seats in use first.
    Used,
    /// Fewest seats free first.
    Free,
    /// Most sessions waiting first.
    Queued,
    /// Soonest expiry first; licenses that never expire last.
    Expiry,
}

/// Which licenses `seatgate status` shows, and in what order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only licenses whose id matches: a glob (`*` any run, `?` one
    /// character) when it has either, else a substring.
    pub filter: Option<String>,
    /// Only [full](LicenseStatus::is_full) licenses.
    pub full_only: bool,
    /// The order.
    pub order: Order,
}

impl Selection {
    /// Keeps the licenses of `status` this selection shows, in its order.
    pub fn apply(&self, status: &mut Status) {
        status.licenses.retain(|l| {
            self.filter.as_deref().is_none_or(|f| id_matches(f, &l.license))
                && (!self.full_only || l.is_full())
        });
        let expiry = |l: &LicenseStatus| {
            if l.expires_at_ms > 0 {
                l.expires_at_ms
            } else {
                i64::MAX
            }
        };
        let key = |l: &LicenseStatus| -> i64 {
            match self.order {
                Order::Name => 0,
                Order::Used => -i64::try_from(l.seats_used).unwrap_or(i64::MAX),
                Order::Free => l.seats_free(),
                Order::Queued => -i64::try_from(l.queue.len()).unwrap_or(i64::MAX),
                Order::Expiry => expiry(l),
            }
        };
        status
            .licenses
            .sort_by(|a, b| key(a).cmp(&key(b)).then_with(|| a.license.cmp(&b.license)));
    }
}

/// Whether license id `id` matches `pattern`: a glob when it has `*` or
/// `?`, else a substring. License ids are case-sensitive, so is this.
pub fn id_matches(pattern: &str, id: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return id.contains(pattern);
    }
    // An id holds no `[`, so a pattern is only `*`, `?` and literals; a
    // run of `*` is one (the glob crate reads `**` as a path wildcard).
    let mut collapsed = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if !(c == '*' && collapsed.ends_with('*')) {
            collapsed.push(c);
        }
    }
    glob::Pattern::new(&collapsed).is_ok_and(|p| p.matches(id))
}

/// The sums over the licenses shown: what `seatgate status` prints last
/// and its JSON carries as `totals`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Licenses shown.
    pub licenses: usize,
    /// Of all the licenses read, before `--filter` and `--full-only`.
    pub licenses_read: usize,
    /// Seats provisioned.
    pub seats_total: i64,
    /// Seats in use, lingering and borrowed ones included.
    pub seats_used: usize,
    /// Of those, lingering.
    pub seats_lingering: usize,
    /// Of those, borrowed.
    pub seats_borrowed: usize,
    /// Seats free.
    pub seats_free: i64,
    /// Sessions waiting.
    pub waiting: usize,
    /// Licenses with no seat free or someone waiting.
    pub full: usize,
    /// Licenses expired.
    pub expired: usize,
    /// Licenses not active.
    pub inactive: usize,
    /// Licenses whose record breaks the rules.
    pub invalid: usize,
}

impl Totals {
    /// The sums over `status`'s licenses, of `licenses_read` read.
    pub fn of(status: &Status, licenses_read: usize) -> Totals {
        let mut t = Totals {
            licenses_read,
            ..Totals::default()
        };
        for l in &status.licenses {
            t.licenses += 1;
            t.seats_total += l.seats_total;
            t.seats_used += l.seats_used;
            t.seats_lingering += l.seats_lingering;
            t.seats_borrowed += l.seats_borrowed;
            t.seats_free += l.seats_free();
            t.waiting += l.queue.len();
            t.full += usize::from(l.is_full());
            t.expired += usize::from(l.is_expired(status.at_ms));
            t.inactive += usize::from(!l.active);
            t.invalid += usize::from(l.invalid.is_some());
        }
        t
    }

    /// One line: `total: 3 licenses (of 5), 7 of 12 seats in use (1
    /// lingering, 0 borrowed), 5 free, 2 waiting; 1 full, 0 expired, 0
    /// inactive, 0 invalid`.
    pub fn render(&self) -> String {
        let mut out = format!("total: {} licenses", self.licenses);
        if self.licenses != self.licenses_read {
            let _ = write!(out, " (of {})", self.licenses_read);
        }
        let _ = write!(out, ", {} of {} seats in use", self.seats_used, self.seats_total);
        if self.seats_lingering + self.seats_borrowed > 0 {
            let _ = write!(
                out,
                " ({} lingering, {} borrowed)",
                self.seats_lingering, self.seats_borrowed
            );
        }
        let _ = writeln!(
            out,
            ", {} free, {} waiting; {} full, {} expired, {} inactive, {} invalid",
            self.seats_free, self.waiting, self.full, self.expired, self.inactive, self.invalid
        );
        out
    }
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

/// `  group=cad priority=5` after a row: the group a seat counts for, and a
/// waiter's priority above 0; "" when there is nothing to say. (The user
/// has its own column.)
fn owner_note(group: Option<&str>, priority: Option<u8>) -> String {
    let mut out = String::new();
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
        if l.is_expired(now) {
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
                "  {:<24} {:<20} {:<28} {:<16} {:>8} {:>14}",
                "SESSION", "USER", "EMAIL", "HARDWARE", "HELD", "LAST HEARTBEAT"
            );
            for h in &l.holders {
                let last = match (h.lingering_until_ms, h.borrowed_until_ms) {
                    (Some(until), _) => format!("lingers {}", ago(until - now)),
                    (None, Some(until)) => format!("borrowed {}", ago(until - now)),
                    (None, None) => format!("{} ago", ago(now - h.last_heartbeat_ms)),
                };
                let _ = writeln!(
                    out,
                    "  {:<24} {:<20} {:<28} {:<16} {:>8} {:>14}{}",
                    printable(&h.session),
                    printable(h.user.as_deref().unwrap_or("-")),
                    printable(h.user_email.as_deref().unwrap_or("-")),
                    printable(h.hardware_id.as_deref().unwrap_or("-")),
                    ago(now - h.acquired_at_ms),
                    last,
                    owner_note(h.group.as_deref(), None),
                );
            }
        }
        if !l.queue.is_empty() {
            let _ = writeln!(
                out,
                "  {:<4} {:<24} {:<20} {:<28} {:>8} {:>10}",
                "POS", "WAITING SESSION", "USER", "EMAIL", "WAITING", "GIVES UP"
            );
            for w in &l.queue {
                let _ = writeln!(
                    out,
                    "  {:<4} {:<24} {:<20} {:<28} {:>8} {:>10}{}",
                    w.position,
                    printable(&w.session),
                    printable(w.user.as_deref().unwrap_or("-")),
                    printable(w.user_email.as_deref().unwrap_or("-")),
                    ago(now - w.queued_at_ms),
                    format!("in {}", ago(w.deadline_ms - now)),
                    owner_note(w.group.as_deref(), Some(w.priority)),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use seatgate_core::license::Field;

    fn holder(session: &str, meta: serde_json::Value) -> Holder {
        Holder {
            session: session.into(),
            user: Some("root".into()),
            user_email: meta_field(&meta, "user_email"),
            hardware_id: meta_field(&meta, "hardware_id"),
            acquired_at_ms: 1_000,
            last_heartbeat_ms: 2_000,
            heartbeats: 1,
            leased: true,
            meta,
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
                    user: Some("u\u{1b}[2J".into()),
                    user_email: Some("bell\u{7}".into()),
                    queued_at_ms: 2_500,
                    deadline_ms: 9_000,
                    priority: 3,
                    group: Some("g\u{1b}[2J".into()),
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
        assert!(text.contains(r"group=g\u{1b}[2J  priority=3"), "{text}");
        assert!(text.contains(r"w-1                      u\u{1b}[2J"), "{text}");
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

    fn map<V: Clone>(pairs: &[(&str, V)]) -> HashMap<String, V> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    /// Queue score of the `arrival`th waiter at `priority` (lua/includes/queue.lua).
    fn queue_score(arrival: i64, priority: i64) -> i64 {
        arrival - priority * seatgate_core::policy::PRIORITY_STEP
    }

    #[test]
    fn a_snapshot_assembles_holders_longest_held_first_and_waiters_in_queue_order() {
        let snapshot = Snapshot {
            record: map(&[
                ("seats_total", "3".to_owned()),
                ("expires_at_ms", "0".to_owned()),
                ("active", "1".to_owned()),
                ("policy", "1".to_owned()),
                ("max_per_user", "2".to_owned()),
            ]),
            holders: vec![
                ("beating".into(), 5_000.0),
                ("borrowing".into(), 90_000.0),
                ("lingering".into(), f64::INFINITY),
            ],
            sessions: map(&[
                (
                    "beating",
                    r#"2000:3:0123456789abcdef:{"user_email":"ada@x","hardware_id":"hw-1"}"#.to_owned(),
                ),
                ("borrowing", "3000:0:{}".to_owned()),
                ("lingering", r#"1000:7:{"user_email":"eve@x"}"#.to_owned()),
            ]),
            queue: vec![
                ("w-late".into(), queue_score(9, 3)),
                ("w-early".into(), queue_score(8, 0)),
            ],
            waiters: map(&[
                (
                    "w-late",
                    "2500::req-9\nseat:reply:app:1\n{\"user_email\":\"bob@x\"}".to_owned(),
                ),
                ("w-early", "2400::req-8\nseat:reply:app:1\n{}".to_owned()),
            ]),
            deadlines: map(&[("w-late", 9_500), ("w-early", 9_400)]),
            owners: map(&[
                ("s:beating", "ada|cad|0".to_owned()),
                // A lingering seat whose acquire named nobody (owners.lua).
                ("s:lingering", "||0".to_owned()),
                ("s:w-late", "bob||60000".to_owned()),
                ("u:ada", "1".to_owned()),
                ("g:cad", "2".to_owned()),
            ]),
            lingering: map(&[("lingering", 7_000)]),
            borrowed: map(&[("borrowing", 90_000)]),
        };
        let l = assemble("cad", &snapshot);
        assert_eq!(l.license, "cad");
        assert_eq!((l.seats_used, l.seats_lingering, l.seats_borrowed), (3, 1, 1));
        assert_eq!(
            (l.seats_total, l.active, l.expires_at_ms, l.invalid),
            (3, true, 0, None)
        );
        assert_eq!(l.policy.max_per_user, Some(2));
        assert_eq!(l.held_by_user, BTreeMap::from([("ada".to_owned(), 1)]));
        assert_eq!(l.held_by_group, BTreeMap::from([("cad".to_owned(), 2)]));

        let sessions: Vec<&str> = l.holders.iter().map(|h| h.session.as_str()).collect();
        assert_eq!(sessions, ["lingering", "beating", "borrowing"]);
        let [lingering, beating, borrowing] = &l.holders[..] else {
            panic!("three holders: {:?}", l.holders)
        };
        // Held without heartbeats: the last one is when the seat was taken.
        assert_eq!(
            (lingering.last_heartbeat_ms, lingering.lingering_until_ms),
            (1_000, Some(7_000))
        );
        assert_eq!(
            (borrowing.last_heartbeat_ms, borrowing.borrowed_until_ms),
            (3_000, Some(90_000))
        );
        assert_eq!(
            (
                beating.acquired_at_ms,
                beating.last_heartbeat_ms,
                beating.heartbeats
            ),
            (2_000, 5_000, 3)
        );
        assert!(beating.leased && !lingering.leased);
        // The user is the acquire's, from the owner record; the metadata's
        // email is shown beside it, never in its place.
        assert_eq!(
            (
                beating.user.as_deref(),
                beating.user_email.as_deref(),
                beating.hardware_id.as_deref()
            ),
            (Some("ada"), Some("ada@x"), Some("hw-1"))
        );
        assert_eq!(beating.group.as_deref(), Some("cad"));
        assert_eq!(
            (lingering.user.as_deref(), lingering.user_email.as_deref()),
            (None, Some("eve@x"))
        );
        assert_eq!(
            (borrowing.user.as_deref(), borrowing.user_email.as_deref()),
            (None, None)
        );

        let [late, early] = &l.queue[..] else {
            panic!("two waiters: {:?}", l.queue)
        };
        assert_eq!(
            (late.position, late.session.as_str(), late.priority),
            (1, "w-late", 3)
        );
        assert_eq!(
            (early.position, early.session.as_str(), early.priority),
            (2, "w-early", 0)
        );
        assert_eq!(
            (late.queued_at_ms, late.deadline_ms, late.user_email.as_deref()),
            (2_500, 9_500, Some("bob@x"))
        );
        assert_eq!(
            (late.user.as_deref(), late.group.as_deref(), late.borrow_ms),
            (Some("bob"), None, 60_000)
        );
        assert_eq!((early.user.as_deref(), early.borrow_ms), (None, 0));
    }

    #[test]
    fn a_broken_record_is_named_and_a_missing_one_reads_as_no_seats() {
        let broken = Snapshot {
            record: map(&[("seats_total", "5.5".to_owned())]),
            ..Snapshot::default()
        };
        let l = assemble("cad", &broken);
        assert_eq!(l.invalid.map(|bad| bad.field), Some(Field::SeatsTotal));
        assert_eq!(l.seats_total, 0);

        let missing = assemble("gone", &Snapshot::default());
        assert_eq!(missing.invalid, None);
        assert_eq!((missing.seats_total, missing.seats_used), (0, 0));
        assert!(missing.holders.is_empty() && missing.queue.is_empty());

        assert!(Snapshot::default().is_missing());
        assert!(!broken.is_missing(), "a broken record is there to be fixed");
        let stranded = Snapshot {
            holders: vec![("s1".to_owned(), 1.0)],
            ..Snapshot::default()
        };
        assert!(!stranded.is_missing(), "seats held without a record are shown");
        let stranded = Snapshot {
            queue: vec![("s1".to_owned(), 1)],
            ..Snapshot::default()
        };
        assert!(!stranded.is_missing(), "waiters without a record are shown");
    }

    fn license(id: &str, used: usize, total: i64, waiting: usize, expires_at_ms: i64) -> LicenseStatus {
        let mut l = assemble(id, &Snapshot::default());
        l.seats_used = used;
        l.seats_total = total;
        l.expires_at_ms = expires_at_ms;
        l.queue = (0..waiting)
            .map(|i| Waiter {
                position: i + 1,
                session: format!("w{i}"),
                user: None,
                user_email: None,
                queued_at_ms: 0,
                deadline_ms: 0,
                priority: 0,
                group: None,
                borrow_ms: 0,
            })
            .collect();
        l
    }

    fn ids(status: &Status) -> Vec<&str> {
        status.licenses.iter().map(|l| l.license.as_str()).collect()
    }

    #[test]
    fn licenses_are_sorted_filtered_and_totalled() {
        let mut all = Status {
            at_ms: 5_000,
            licenses: vec![
                license("cad-a", 2, 2, 1, 0),
                license("cad-b", 1, 4, 0, 9_000),
                license("eda", 3, 5, 0, 4_000),
                license("sim", 0, 1, 0, 0),
            ],
        };
        all.licenses[3].active = false;
        let shown = |sel: Selection| {
            let mut s = all.clone();
            sel.apply(&mut s);
            s
        };
        let by = |order| {
            shown(Selection {
                order,
                ..Selection::default()
            })
        };
        assert_eq!(ids(&by(Order::Name)), ["cad-a", "cad-b", "eda", "sim"]);
        assert_eq!(ids(&by(Order::Used)), ["eda", "cad-a", "cad-b", "sim"]);
        assert_eq!(ids(&by(Order::Free)), ["cad-a", "sim", "eda", "cad-b"]);
        assert_eq!(ids(&by(Order::Queued)), ["cad-a", "cad-b", "eda", "sim"]);
        assert_eq!(ids(&by(Order::Expiry)), ["eda", "cad-b", "cad-a", "sim"]);
        let filtered = |f: &str| {
            shown(Selection {
                filter: Some(f.to_owned()),
                ..Selection::default()
            })
        };
        assert_eq!(ids(&filtered("cad")), ["cad-a", "cad-b"]);
        assert_eq!(ids(&filtered("*a")), ["cad-a", "eda"]);
        assert_eq!(ids(&filtered("?ad-?")), ["cad-a", "cad-b"]);
        assert_eq!(ids(&filtered("s*m")), ["sim"]);
        assert!(ids(&filtered("CAD")).is_empty(), "ids are case-sensitive");
        let full = shown(Selection {
            full_only: true,
            order: Order::Used,
            ..Selection::default()
        });
        assert_eq!(ids(&full), ["cad-a"], "no seat free, or someone waiting");

        let t = Totals::of(&all, 4);
        assert_eq!(
            (t.licenses, t.seats_used, t.seats_total, t.seats_free, t.waiting),
            (4, 6, 12, 6, 1)
        );
        assert_eq!((t.full, t.expired, t.inactive, t.invalid), (1, 1, 1, 0));
        assert_eq!(
            t.render(),
            "total: 4 licenses, 6 of 12 seats in use, 6 free, 1 waiting; 1 full, 1 expired, 1 inactive, 0 invalid\n"
        );
        let t = Totals::of(&full, 4);
        assert!(
            t.render()
                .starts_with("total: 1 licenses (of 4), 2 of 2 seats in use, 0 free"),
            "{}",
            t.render()
        );
    }

    #[test]
    fn globs_match_the_whole_id() {
        for (pattern, id, matches) in [
            ("*", "", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("*-pro", "cad-pro", true),
            ("*-pro", "cad-pro2", false),
            ("c?d", "cad", true),
            ("c?d", "cd", false),
            ("**a", "a", true),
        ] {
            assert_eq!(id_matches(pattern, id), matches, "{pattern:?} {id:?}");
        }
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
