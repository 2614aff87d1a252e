//! `seatgate audit`: replays the events of a window (every shard) against
//! the seat rules and the state in Redis now, and lists every violation,
//! each naming its license, session, event (stream entry id, `seq`) and
//! time, for an operator to hand to an auditor.
//!
//! Per license the events are replayed in decision order (`seq` order,
//! which is stream order, for events that carry `seq`; `at_ms` order for
//! older ones): who holds a seat, who lingers, who waits and with what
//! priority, and how many seats are in use, anchored on the first event's
//! `seats_used` (holds started before the window are known only as a
//! count). The rules checked are in docs/reports.md ("Audit"); each has
//! a [`Rule`]. What the events of a window cannot tell is not flagged:
//! a session whose first event is an end held its seat before the window;
//! a grant that skipped a waiter under a license with per-user or
//! per-group policies may be a legitimate fair skip.
//!
//! The events of the window are held in memory (about 400 bytes each):
//! `--license` or `--since` narrow an audit of a large deployment.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::Value;
use serde::Serialize;

use super::printable;
use super::usage::When;
use crate::config::Settings;
use crate::error::Error;
use seatgate_core::events::{field, EventRecord, EventType, SeatChange};
use seatgate_core::keys::{shard_name, shard_names, Keys, EVENTS_SHARDS};
use seatgate_core::records::{SessionRecord, WaiterRecord};

/// Entries per `XRANGE` page: bounds what one reply holds.
const PAGE: usize = 1000;
/// How far an event's stream id may lie from its `at_ms` (the events
/// shard's clock against the license's on a cluster): the id range read
/// is widened by this, and events are then kept or left by `at_ms`.
const ID_SLACK_MS: i64 = 60_000;
/// A hold or a wait in Redis is expected to have its start event in the
/// window only when it started at least this long after the window's first
/// event (clocks of a cluster's nodes differ a little; on one node the
/// entry id is never earlier than the decision).
const START_SLACK_MS: i64 = 1_000;
/// The per-license sequence number events carry (the events contract of
/// issue 22): +1 from one event of a license to the next.
const SEQ: &str = "seq";
/// 2^40: one priority level of a queue score (lua/includes/queue.lua).
const PRIORITY_STEP: f64 = 1_099_511_627_776.0;

/// What to audit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// Only this license (only its events shard is read).
    pub license: Option<String>,
    /// Start of the window; `None` = `events.retention` ago, all there is.
    pub since: Option<When>,
}

/// A rule an event (or the state in Redis) broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// An acquire or grant took the holders above `seats_total`.
    AboveSeats,
    /// An event's `seats_used` is not the count the events before it give.
    SeatsUsed,
    /// A hold ended (released, evicted, revoked) by a session not holding.
    EndedTwice,
    /// A hold the events started never ended: not a holder in Redis, or
    /// started again without an end.
    NeverEnded,
    /// A holder (or waiter) in Redis whose start the window covers has no
    /// `acquired`/`granted` (`queued`) event.
    NoStart,
    /// A seat went to someone while a waiter ahead of them (higher priority,
    /// or same priority and earlier) could have taken it.
    QueueOrder,
    /// An event disagrees with the final state (holders, lingering, borrowed, queue).
    FinalState,
    /// `seq` skips numbers: events were lost.
    SeqGap,
    /// A `seq` seen before: a duplicate event.
    SeqRepeat,
    /// `seq` went back: events out of decision order.
    SeqOrder,
    /// An event without `seq` after the license's events carry it.
    SeqMissing,
    /// An admin event (`license_put`, `license_deleted`, `groups_changed`)
    /// that does not say who changed what: no `actor`, a `before` or
    /// `after` that is no JSON object of strings, or a `license_put` whose
    /// `seats_total` is not the one its `after` sets.
    AdminEvent,
}

impl Rule {
    /// The name printed and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::AboveSeats => "above_seats",
            Rule::SeatsUsed => "seats_used",
            Rule::EndedTwice => "ended_twice",
            Rule::NeverEnded => "never_ended",
            Rule::NoStart => "no_start",
            Rule::QueueOrder => "queue_order",
            Rule::FinalState => "final_state",
            Rule::SeqGap => "seq_gap",
            Rule::SeqRepeat => "seq_repeat",
            Rule::SeqOrder => "seq_order",
            Rule::SeqMissing => "seq_missing",
            Rule::AdminEvent => "admin_event",
        }
    }
}

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// License id.
    pub license: String,
    /// Session id ("" when the violation is the license's).
    pub session: String,
    /// The event's `at_ms`; for a disagreement with Redis without an event,
    /// when the state was read (Redis clock, ms).
    pub at_ms: i64,
    /// The events stream (shard) of the event.
    pub stream: Option<String>,
    /// The event's stream entry id.
    pub entry_id: Option<String>,
    /// The event's `seq`, when it carries one.
    pub seq: Option<u64>,
    /// What broke, for people.
    pub detail: String,
}

/// The audit of a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditReport {
    /// Start of the window, unix ms (Redis clock).
    pub since_ms: i64,
    /// When the state in Redis was read, unix ms.
    pub checked_at_ms: i64,
    /// Licenses audited: with events in the window or provisioned.
    pub licenses: u64,
    /// Events of the window replayed.
    pub events: u64,
    /// Holds checked: seats taken in the window, holds ended in it that
    /// began before it, and holders in Redis with no event.
    pub holds: u64,
    /// Licenses with events whose `seq` could not be checked: their events
    /// carry none (written before events had it).
    pub seq_unchecked: Vec<String>,
    /// What the audit could not judge, for people.
    pub notes: Vec<String>,
    /// Every violation, by license, then time.
    pub violations: Vec<Violation>,
}

impl AuditReport {
    /// No violation.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// One event as the audit needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ev {
    id: String,
    kind: Option<EventType>,
    change: Option<SeatChange>,
    session: String,
    seats_used: i64,
    seats_total: i64,
    at_ms: i64,
    reason: Option<String>,
    waited_ms: Option<i64>,
    priority: i64,
    linger: bool,
    borrowed: bool,
    seq: Option<u64>,
    /// The admin events' `actor`, `before` and `after`.
    actor: Option<String>,
    before: Option<String>,
    after: Option<String>,
}

impl Ev {
    /// Reads an entry; `None` for one that is no event.
    fn parse<'v>(id: &str, get: impl Fn(&str) -> Option<&'v str> + Copy) -> Option<(String, Ev)> {
        let r = EventRecord::parse(get)?;
        let number = |name: &str| get(name).and_then(|v| v.parse::<i64>().ok());
        let ev = Ev {
            id: id.to_owned(),
            kind: r.kind,
            change: r.seat_change(),
            session: r.session,
            seats_used: r.seats_used,
            seats_total: r.seats_total,
            at_ms: r.at_ms,
            reason: r.reason,
            waited_ms: r.waited_ms,
            priority: number(field::PRIORITY).unwrap_or(0),
            linger: number(field::LINGER_MS).is_some_and(|l| l > 0),
            borrowed: number(field::BORROWED_UNTIL_MS).is_some(),
            seq: get(SEQ).and_then(|v| v.parse().ok()),
            actor: r.actor,
            before: r.before,
            after: r.after,
        };
        Some((r.license, ev))
    }

    fn is(&self, kind: EventType) -> bool {
        self.kind == Some(kind)
    }

    /// Ends a wait: ran out, left, revoked while waiting, or the license
    /// deleted under it (a `denied` with `waited_ms`).
    fn ends_wait(&self) -> bool {
        match self.kind {
            Some(EventType::QueueTimeout | EventType::LeftQueue) => true,
            Some(EventType::Revoked) => self.change == Some(SeatChange::Unchanged),
            Some(EventType::Denied) => self.waited_ms.is_some(),
            _ => false,
        }
    }

    /// An event of the license's deletion (its own, or a seat it ended),
    /// whose seat counts are 0 whatever was held.
    fn license_deleted(&self) -> bool {
        self.is(EventType::LicenseDeleted)
            || (self.is(EventType::Evicted) && self.reason.as_deref() == Some("license_deleted"))
    }

    fn is_admin(&self) -> bool {
        self.kind.is_some_and(EventType::is_admin)
    }

    /// What is wrong with this admin event, if anything.
    fn admin_fault(&self) -> Option<String> {
        let object = |what: &str, raw: &Option<String>| -> Result<BTreeMap<String, String>, String> {
            let raw = raw.as_deref().ok_or_else(|| format!("it has no {what}"))?;
            serde_json::from_str(raw).map_err(|_| format!("its {what} {raw:?} is no JSON object of strings"))
        };
        if self.actor.as_deref().is_none_or(|a| a.trim().is_empty()) {
            return Some("it names no actor: who made the change is not known".to_owned());
        }
        let (before, after) = match (object("before", &self.before), object("after", &self.after)) {
            (Ok(b), Ok(a)) => (b, a),
            (Err(e), _) | (_, Err(e)) => return Some(e),
        };
        if self.is(EventType::LicensePut) {
            if let Some(set) = after.get(field::SEATS_TOTAL) {
                if set.parse::<i64>().ok() != Some(self.seats_total) {
                    return Some(format!(
                        "it sets seats_total {set}, but says the license has {} seats",
                        self.seats_total
                    ));
                }
            }
            if before == after {
                return Some("it changes nothing (before and after are the same)".to_owned());
            }
        }
        None
    }
}

/// Events in decision order: those without `seq` (older) by `at_ms`, then
/// those with it in stream order (which is their `seq` order, or a
/// violation the replay reports).
fn decision_order(mut events: Vec<Ev>) -> Vec<Ev> {
    let first_seq = events
        .iter()
        .position(|e| e.seq.is_some())
        .unwrap_or(events.len());
    events[..first_seq].sort_by_key(|e| e.at_ms);
    events
}

/// A session's seat, by the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Seat {
    #[default]
    Free,
    Held,
    Lingering,
}

/// A session waiting, by the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wait {
    priority: i64,
    /// Index of its `queued` event in decision order.
    queued: usize,
}

/// One session's replay.
#[derive(Debug, Clone, Default)]
struct Sess {
    seat: Seat,
    /// Its current hold's start (index of the take), when the window shows it.
    start: Option<usize>,
    /// Whether its seat is borrowed (an `acquired` with `borrowed_until_ms`).
    borrowed: bool,
    /// The last end of a hold in the window (index).
    ended: Option<usize>,
    /// Whether the window shows it take a seat.
    took: bool,
    wait: Option<Wait>,
    /// The last event that ended its wait (index).
    wait_ended: Option<usize>,
}

/// One license's events replayed.
struct Replayed {
    events: Vec<Ev>,
    sessions: HashMap<String, Sess>,
    /// Seats in use after the last event, once anchored.
    count: Option<i64>,
    holds: u64,
    /// Whether every event of the license carried `seq`.
    seq_checked: bool,
    violations: Vec<Violation>,
}

/// The replay of one license's events.
struct Replay<'a> {
    license: &'a str,
    stream: &'a str,
    /// Whether a limit (per user, per group, reservation) may have kept a
    /// waiter from a seat: then a grant that skips one may be fair, and
    /// queue order is not judged. `None`: unknown, not judged either.
    limits: Option<bool>,
    ev: &'a [Ev],
    sessions: HashMap<String, Sess>,
    /// The sessions waiting, by the index of their `queued` event.
    waiting: BTreeMap<usize, String>,
    /// A `seq` gap in the current decision step: events are known to be
    /// lost, so its count is the event's, not the replay's.
    lost: bool,
    count: Option<i64>,
    holds: u64,
    out: Vec<Violation>,
}

/// A seat taken in a decision step, for the queue order check.
#[derive(Debug, Clone, Copy)]
struct Take {
    /// Index of the `acquired` or `granted`.
    at: usize,
    /// The session's wait it ended, if the window shows it.
    wait: Option<Wait>,
    /// It took back the session's own lingering seat.
    reclaim: bool,
}

impl<'a> Replay<'a> {
    fn flag(&mut self, rule: Rule, i: usize, detail: String) {
        let e = &self.ev[i];
        self.out.push(Violation {
            rule,
            license: self.license.to_owned(),
            session: e.session.clone(),
            at_ms: e.at_ms,
            stream: Some(self.stream.to_owned()),
            entry_id: Some(e.id.clone()),
            seq: e.seq,
            detail,
        });
    }

    /// `entry <id> (seq n)` of event `i`, for details.
    fn name(&self, i: usize) -> String {
        let e = &self.ev[i];
        let kind = e.kind.map_or("event", EventType::as_str);
        match e.seq {
            Some(seq) => format!("{kind} entry {} (seq {seq})", e.id),
            None => format!("{kind} entry {}", e.id),
        }
    }

    /// Checks `seq` of event `i` against those before; false for a
    /// duplicate, which is not replayed.
    fn check_seq(&mut self, i: usize, seen: &mut HashSet<u64>, last: &mut Option<u64>) -> bool {
        let Some(seq) = self.ev[i].seq else {
            if let Some(prev) = *last {
                self.flag(
                    Rule::SeqMissing,
                    i,
                    format!(
                        "the event carries no seq, after events of the license that do (last seq {prev})"
                    ),
                );
            }
            return true;
        };
        if !seen.insert(seq) {
            self.flag(Rule::SeqRepeat, i, format!("seq {seq} again: a duplicate event"));
            return false;
        }
        match *last {
            Some(prev) if seq > prev + 1 => {
                let missing = seq - prev - 1;
                self.lost = true;
                self.flag(
                    Rule::SeqGap,
                    i,
                    format!("seq {prev} then {seq}: {missing} event(s) missing"),
                );
            }
            Some(prev) if seq <= prev => {
                self.flag(Rule::SeqOrder, i, format!("seq {seq} after seq {prev}"));
            }
            _ => {}
        }
        *last = Some(last.map_or(seq, |p| p.max(seq)));
        true
    }

    /// Applies event `i` to its session; the change of seats in use.
    fn apply(&mut self, i: usize) -> i64 {
        let ev = self.ev;
        let e = &ev[i];
        if e.is_admin() {
            // A change of the record or the group map: no session's seat.
            if let Some(fault) = e.admin_fault() {
                self.flag(Rule::AdminEvent, i, fault);
            }
            return 0;
        }
        let key = e.session.clone();
        let mut s = self.sessions.remove(&key).unwrap_or_default();
        let waited = s.wait;
        let mut delta = 0;
        match (e.kind, e.change) {
            (Some(EventType::Queued), _) => {
                s.wait = Some(Wait {
                    priority: e.priority,
                    queued: i,
                });
            }
            (_, Some(SeatChange::Taken)) => {
                self.holds += 1;
                match s.seat {
                    Seat::Free => delta = 1,
                    Seat::Lingering => {}
                    Seat::Held => {
                        let since = s
                            .start
                            .map_or_else(|| "before the window".to_owned(), |st| self.name(st));
                        self.flag(
                            Rule::NeverEnded,
                            i,
                            format!(
                                "took a seat it already held (since {since}): that hold's end is missing"
                            ),
                        );
                    }
                }
                s.wait = None;
                s.seat = Seat::Held;
                s.start = Some(i);
                s.took = true;
                // A lingering seat taken back keeps no borrow; a grant's
                // borrow end is not on its event (docs/protocol.md).
                s.borrowed = e.borrowed;
            }
            (_, Some(SeatChange::Freed)) => {
                let lingers = e.is(EventType::Released) && e.linger;
                match s.seat {
                    Seat::Held if lingers => s.seat = Seat::Lingering,
                    Seat::Held | Seat::Lingering
                        if !(s.seat == Seat::Lingering && e.is(EventType::Released)) =>
                    {
                        s.seat = Seat::Free;
                        delta = -1;
                    }
                    Seat::Free if !s.took && s.ended.is_none() => {
                        // Held since before the window: in the anchored count.
                        self.holds += 1;
                        s.seat = if lingers { Seat::Lingering } else { Seat::Free };
                        delta = if lingers { 0 } else { -1 };
                    }
                    _ => {
                        let last = s
                            .ended
                            .map_or_else(|| "its seat lingering".to_owned(), |x| self.name(x));
                        self.flag(
                            Rule::EndedTwice,
                            i,
                            format!("ended a hold it did not have (already ended by {last})"),
                        );
                    }
                }
                if s.seat != Seat::Held {
                    s.borrowed = false;
                }
                s.ended = Some(i);
                s.start = None;
                if e.is(EventType::Revoked) {
                    s.wait = None;
                }
            }
            _ if e.ends_wait() => {
                s.wait = None;
                s.wait_ended = Some(i);
            }
            _ => {}
        }
        if waited != s.wait {
            if let Some(w) = waited {
                self.waiting.remove(&w.queued);
            }
            if let Some(w) = s.wait {
                self.waiting.insert(w.queued, key.clone());
            }
        }
        self.sessions.insert(key, s);
        delta
    }

    /// Whether waiter `w` was ahead of `take` (a grant to `of`, or a
    /// direct acquire when `of` is `None`): it queued before, with a higher
    /// priority than `of`'s, or the same one and earlier. Events without
    /// `seq` of the same millisecond are in no known order.
    fn ahead(&self, w: Wait, of: Option<Wait>, take: usize) -> bool {
        let known_before = |a: usize, b: usize| {
            let (x, y) = (&self.ev[a], &self.ev[b]);
            a < b && ((x.seq.is_some() && y.seq.is_some()) || x.at_ms < y.at_ms)
        };
        match of {
            None => known_before(w.queued, take),
            Some(s) => {
                w.priority > s.priority || (w.priority == s.priority && known_before(w.queued, s.queued))
            }
        }
    }

    /// Queue order of the takes of one decision step, judged against who
    /// still waits after it.
    fn check_queue_order(&mut self, takes: &[Take]) {
        if self.limits != Some(false) || takes.is_empty() || self.waiting.is_empty() {
            return;
        }
        let waiting: Vec<(String, Wait)> = self
            .waiting
            .values()
            .filter_map(|id| Some((id.clone(), self.sessions.get(id)?.wait?)))
            .collect();
        let ev = self.ev;
        for take in takes {
            let e = &ev[take.at];
            // A lingering seat taken back is the session's own; a grant to
            // a session queued before the window is of unknown priority.
            if take.reclaim || (e.is(EventType::Granted) && take.wait.is_none()) {
                continue;
            }
            let skipped: Vec<&(String, Wait)> = waiting
                .iter()
                .filter(|(id, w)| *id != e.session && self.ahead(*w, take.wait, take.at))
                .collect();
            if let Some((first, w)) = skipped.first() {
                let detail = format!(
                    "a seat went to it while {} session(s) ahead of it waited (first: {first}, priority {}, {}); the license has no per-user or per-group limit that lets a grant skip a waiter",
                    skipped.len(),
                    w.priority,
                    self.name(w.queued)
                );
                self.flag(Rule::QueueOrder, take.at, detail);
            }
        }
    }

    /// Ends a decision step (the events of one `at_ms`, up to `to`, the
    /// seats they took `takes`): seats in use against `seats_used` and
    /// `seats_total`.
    ///
    /// Only a seat newly taken can go above: a session taking back its own
    /// lingering seat holds no more seats than before, and may do so after
    /// `seats_total` was lowered below the seats in use (which evicts nobody).
    fn end_step(&mut self, to: usize, takes: &[Take], recon: Option<i64>) {
        let last = to - 1;
        let ev = self.ev;
        let e = &ev[last];
        let reported = e.seats_used;
        if let Some(take) = takes.iter().rev().find(|t| !t.reclaim).map(|t| t.at) {
            let total = self.ev[take].seats_total;
            // After a known loss (a seq gap) the replay's count is off by
            // the lost events: the event's own count is judged instead.
            let by_events = recon.filter(|_| !self.lost);
            if let Some(count) = by_events.filter(|&c| c > total) {
                self.flag(
                    Rule::AboveSeats,
                    take,
                    format!("{count} seats held after it, of {total}: a seat given beyond seats_total"),
                );
            } else if reported > total {
                self.flag(
                    Rule::AboveSeats,
                    take,
                    format!("the event itself says {reported} seats held of {total}"),
                );
            }
        }
        let deleted = e.license_deleted();
        match recon {
            Some(count) if !deleted && e.kind.is_some() && count != reported => {
                self.flag(
                    Rule::SeatsUsed,
                    last,
                    format!("seats_used {reported}, but the events before it give {count} (an event lost, duplicated or made up)"),
                );
            }
            _ => {}
        }
        self.count = Some(if deleted { recon.unwrap_or(0) } else { reported });
        self.lost = false;
    }

    fn run(mut self) -> Replayed {
        let ev = self.ev;
        let mut seen = HashSet::new();
        let mut last_seq = None;
        let mut i = 0;
        while i < self.ev.len() {
            let at = self.ev[i].at_ms;
            let mut recon = self.count;
            let mut takes = Vec::new();
            let mut step_takes = Vec::new();
            while i < self.ev.len() && self.ev[i].at_ms == at {
                if self.check_seq(i, &mut seen, &mut last_seq) {
                    let e = &ev[i];
                    if e.change == Some(SeatChange::Taken) {
                        let s = self.sessions.get(&e.session);
                        let take = Take {
                            at: i,
                            wait: s.and_then(|s| s.wait),
                            reclaim: e.is(EventType::Acquired)
                                && s.is_some_and(|s| s.seat == Seat::Lingering),
                        };
                        // With `seq` the order inside the millisecond is
                        // known: the take is judged against who waits at
                        // that instant (a waiter queued after it, in the
                        // same millisecond, was not skipped). Without it,
                        // against who still waits after the step.
                        if e.seq.is_some() {
                            self.check_queue_order(std::slice::from_ref(&take));
                        } else {
                            step_takes.push(take);
                        }
                        takes.push(take);
                    }
                    let delta = self.apply(i);
                    recon = recon.map(|c| c + delta);
                }
                i += 1;
            }
            self.check_queue_order(&step_takes);
            self.end_step(i, &takes, recon);
        }
        let seq_checked = !self.ev.is_empty() && self.ev.iter().all(|e| e.seq.is_some());
        Replayed {
            events: Vec::new(),
            sessions: self.sessions,
            count: self.count,
            holds: self.holds,
            seq_checked,
            violations: self.out,
        }
    }
}

/// Replays one license's events (in stream order as read).
fn replay(license: &str, stream: &str, limits: Option<bool>, events: Vec<Ev>) -> Replayed {
    let events = decision_order(events);
    let replay = Replay {
        license,
        stream,
        limits,
        ev: &events,
        sessions: HashMap::new(),
        waiting: BTreeMap::new(),
        lost: false,
        count: None,
        holds: 0,
        out: Vec::new(),
    };
    let mut replayed = replay.run();
    replayed.events = events;
    replayed
}

/// One license's state in Redis.
#[derive(Debug, Clone, Default, PartialEq)]
struct FinalState {
    /// Holder -> when its seat was taken (its session record), if readable.
    holders: HashMap<String, Option<i64>>,
    lingering: HashSet<String>,
    borrowed: HashSet<String>,
    /// Waiter -> its priority (from its queue score) and when it queued.
    queue: HashMap<String, (i64, Option<i64>)>,
    /// Whether the license record holds a per-user or per-group limit or
    /// a reservation; `None` without a record (deleted).
    limits: Option<bool>,
}

/// Compares a license's replay with its state in Redis. `covered_from`:
/// a hold or wait that started after it has its start event in the window
/// (or it was lost). `busy`: sessions with events after the replayed ones
/// (appended while the audit ran), not compared; while there are any, the
/// license's seat count is not compared either.
fn compare(
    license: &str,
    r: &Replayed,
    state: &FinalState,
    covered_from: i64,
    busy: &HashSet<String>,
    now_ms: i64,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let ev = |i: usize| &r.events[i];
    let mut flag = |rule, session: &str, at: Option<usize>, detail: String| {
        out.push(Violation {
            rule,
            license: license.to_owned(),
            session: session.to_owned(),
            at_ms: at.map_or(now_ms, |i| ev(i).at_ms),
            stream: None,
            entry_id: at.map(|i| ev(i).id.clone()),
            seq: at.and_then(|i| ev(i).seq),
            detail,
        });
    };
    let name = |i: usize| {
        let e = ev(i);
        format!("{} entry {}", e.kind.map_or("event", EventType::as_str), e.id)
    };
    let mut sessions: Vec<(&String, &Sess)> = r.sessions.iter().collect();
    sessions.sort_by_key(|(id, _)| id.as_str());
    for (id, s) in sessions {
        if busy.contains(id) {
            continue;
        }
        let holds = state.holders.contains_key(id);
        match s.seat {
            Seat::Held | Seat::Lingering if !holds => {
                let what = if s.seat == Seat::Lingering {
                    "lingers with it"
                } else {
                    "is held"
                };
                let since = s.start.or(s.ended);
                flag(
                    Rule::NeverEnded,
                    id,
                    since,
                    format!("by the events its seat {what}, but Redis has no such holder: the end of its hold has no event"),
                );
            }
            Seat::Held if state.lingering.contains(id) => flag(
                Rule::FinalState,
                id,
                s.start,
                "held by the events, but lingering in Redis: its release has no event".to_owned(),
            ),
            Seat::Held if s.borrowed && !state.borrowed.contains(id) => flag(
                Rule::FinalState,
                id,
                s.start,
                "borrowed by the events, but Redis has no borrow for it".to_owned(),
            ),
            Seat::Lingering if !state.lingering.contains(id) => flag(
                Rule::FinalState,
                id,
                s.ended,
                "released to linger by the events, but a live holder in Redis: its taking back has no event"
                    .to_owned(),
            ),
            Seat::Free if holds && (s.took || s.ended.is_some()) => {
                let end = s.ended.map_or_else(String::new, |i| format!(" ({})", name(i)));
                flag(
                    Rule::FinalState,
                    id,
                    s.ended,
                    format!("its hold ended by the events{end}, but it holds a seat in Redis: the new hold has no event"),
                );
            }
            _ => {}
        }
        match (s.wait, state.queue.get(id)) {
            (Some(w), None) => flag(
                Rule::FinalState,
                id,
                Some(w.queued),
                "waits by the events, but is not in the queue in Redis: the end of its wait has no event"
                    .to_owned(),
            ),
            (Some(w), Some(&(priority, _))) if priority != w.priority => flag(
                Rule::FinalState,
                id,
                Some(w.queued),
                format!(
                    "queued with priority {} by the events, but waits with priority {priority} in Redis",
                    w.priority
                ),
            ),
            (None, Some(_)) if s.wait_ended.is_some() => flag(
                Rule::FinalState,
                id,
                s.wait_ended,
                "its wait ended by the events, but it waits in the queue in Redis: its new wait has no event"
                    .to_owned(),
            ),
            _ => {}
        }
    }
    let known = |id: &String| r.sessions.get(id);
    let mut holders: Vec<(&String, &Option<i64>)> = state.holders.iter().collect();
    holders.sort();
    for (id, since) in holders {
        if busy.contains(id) {
            continue;
        }
        let seen = known(id).is_some_and(|s| s.took || s.ended.is_some());
        if let (false, Some(since)) = (seen, *since) {
            if since >= covered_from.saturating_add(START_SLACK_MS) {
                flag(
                    Rule::NoStart,
                    id,
                    None,
                    format!(
                        "holds a seat in Redis since {}, inside the window, but no acquired or granted event shows it",
                        rfc3339(since)
                    ),
                );
            }
        }
    }
    let mut queue: Vec<(&String, &(i64, Option<i64>))> = state.queue.iter().collect();
    queue.sort_by_key(|(id, _)| id.as_str());
    for (id, &(_, queued_at)) in queue {
        if busy.contains(id) || known(id).is_some_and(|s| s.wait.is_some() || s.wait_ended.is_some()) {
            continue;
        }
        if let Some(at) = queued_at.filter(|&at| at >= covered_from.saturating_add(START_SLACK_MS)) {
            flag(
                Rule::NoStart,
                id,
                None,
                format!(
                    "waits in the queue in Redis since {}, inside the window, but no queued event shows it",
                    rfc3339(at)
                ),
            );
        }
    }
    if let (Some(count), true) = (r.count, busy.is_empty()) {
        let held = i64::try_from(state.holders.len()).unwrap_or(i64::MAX);
        if count != held {
            flag(
                Rule::FinalState,
                "",
                None,
                format!("{count} seats in use by the events, {held} holders in Redis"),
            );
        }
    }
    out
}

/// Audits the events of the window against the rules and the state in Redis.
pub async fn audit<C: ConnectionLike>(
    con: &mut C,
    settings: &Settings,
    query: &Query,
) -> Result<AuditReport, Error> {
    let now_ms = redis_ms(con).await?;
    let retention = i64::try_from(settings.events.retention.as_millis()).unwrap_or(i64::MAX);
    let since_ms = query.since.map_or(now_ms.saturating_sub(retention), |w| match w {
        When::Ago(d) => now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        When::At(ms) => ms,
    });
    let base = &settings.events.stream;
    let keys = Keys::new(settings.keys.prefix.clone());
    // The events shard count the workers recorded is where the events are
    // (`events_shards`, or before it was recorded `shards`, the requests
    // stream's, which it then equalled); a user without access to that
    // HASH (the dashboard's) goes by the settings.
    let recorded: Option<usize> = redis::cmd("HMGET")
        .arg(keys.deployment())
        .arg(EVENTS_SHARDS)
        .arg("shards")
        .query_async::<Vec<Option<String>>>(con)
        .await
        .ok()
        .and_then(|v| v.into_iter().flatten().next())
        .and_then(|raw| raw.parse().ok())
        .filter(|&n| n >= 1);
    let shards = recorded.unwrap_or(settings.events_shards());
    let streams = match &query.license {
        Some(l) => vec![shard_name(base, shards, l)],
        None => shard_names(base, shards),
    };

    // The events of the window, per license, and where each shard was read to.
    let mut by_license: BTreeMap<String, Vec<Ev>> = BTreeMap::new();
    let mut read_to: Vec<(String, Option<String>, Option<i64>)> = Vec::new();
    let mut deleted = Vec::new();
    for stream in &streams {
        let first = first_entry_ms(con, stream).await?;
        if let Some(id) = last_deleted(con, stream).await {
            deleted.push(format!("{stream} (the last one {id})"));
        }
        let mut start = since_ms.saturating_sub(ID_SLACK_MS).max(0).to_string();
        let mut last_read = None;
        loop {
            let page = xrange(con, stream, &start, "+").await?;
            let full = page.len() == PAGE;
            for (id, fields) in &page {
                let get = |name: &str| text_field(fields, name);
                let Some((license, ev)) = Ev::parse(id, get) else {
                    continue;
                };
                if ev.at_ms < since_ms || query.license.as_ref().is_some_and(|l| *l != license) {
                    continue;
                }
                by_license.entry(license).or_default().push(ev);
            }
            let Some((id, _)) = page.last() else { break };
            last_read = Some(id.clone());
            if !full {
                break;
            }
            start = format!("({id}");
        }
        read_to.push((stream.clone(), last_read, first));
    }

    // Every provisioned license too: a holder whose events are all gone is a finding.
    let mut licenses: Vec<String> = match &query.license {
        Some(l) => vec![l.clone()],
        None => {
            redis::cmd("SMEMBERS")
                .arg(keys.license_index())
                .query_async(con)
                .await?
        }
    };
    licenses.extend(by_license.keys().cloned());
    licenses.sort();
    licenses.dedup();

    let mut states = HashMap::new();
    for license in &licenses {
        states.insert(license.clone(), read_state(con, &keys, license).await?);
    }
    let checked_at_ms = redis_ms(con).await?;

    // Events appended while the state was read: their sessions are not compared.
    let mut busy: HashMap<String, HashSet<String>> = HashMap::new();
    for (stream, last, _) in &read_to {
        let window = since_ms.saturating_sub(ID_SLACK_MS).max(0).to_string();
        let mut start = last.as_ref().map_or(window, |id| format!("({id}"));
        loop {
            let page = xrange(con, stream, &start, "+").await?;
            for (id, fields) in &page {
                let get = |name: &str| text_field(fields, name);
                if let Some((license, ev)) = Ev::parse(id, get) {
                    busy.entry(license).or_default().insert(ev.session);
                }
            }
            match page.last() {
                Some((id, _)) if page.len() == PAGE => start = format!("({id}"),
                _ => break,
            }
        }
    }
    // On a cluster the scripts record into each license's own log, and the
    // relay moves the entries on to the shard (within a reaper period): a
    // session with an entry still there is in flight, like one above.
    if settings.redis.is_cluster() {
        for license in &licenses {
            let log = keys.event_keys(license).log;
            let mut start = "-".to_owned();
            loop {
                let page = xrange(con, &log, &start, "+").await?;
                for (id, fields) in &page {
                    let get = |name: &str| text_field(fields, name);
                    if let Some((license, ev)) = Ev::parse(id, get) {
                        busy.entry(license).or_default().insert(ev.session);
                    }
                }
                match page.last() {
                    Some((id, _)) if page.len() == PAGE => start = format!("({id}"),
                    _ => break,
                }
            }
        }
    }

    let mut report = AuditReport {
        since_ms,
        checked_at_ms,
        licenses: licenses.len() as u64,
        events: 0,
        holds: 0,
        seq_unchecked: Vec::new(),
        notes: Vec::new(),
        violations: Vec::new(),
    };
    if shards != settings.events_shards() {
        report.notes.push(format!(
            "events read from the {shards} shard(s) this deployment records ({}, field {EVENTS_SHARDS}), not the {} of the settings",
            keys.deployment(),
            settings.events_shards()
        ));
    }
    let mut policies_unjudged = Vec::new();
    for license in &licenses {
        let stream = shard_name(base, shards, license);
        let state = states.remove(license).unwrap_or_default();
        let events = by_license.remove(license).unwrap_or_default();
        report.events += events.len() as u64;
        let had_events = !events.is_empty();
        let r = replay(license, &stream, state.limits, events);
        if had_events && !r.seq_checked {
            report.seq_unchecked.push(license.clone());
        }
        if had_events && state.limits != Some(false) {
            policies_unjudged.push(license.clone());
        }
        let first = read_to
            .iter()
            .find(|(s, _, _)| *s == stream)
            .and_then(|(_, _, f)| *f);
        let covered_from = since_ms.max(first.unwrap_or(i64::MAX));
        let none = HashSet::new();
        let busy = busy.get(license).unwrap_or(&none);
        report.holds += r.holds;
        report.holds += state
            .holders
            .keys()
            .filter(|h| !r.sessions.get(*h).is_some_and(|s| s.took || s.ended.is_some()))
            .count() as u64;
        report.violations.extend(r.violations.iter().cloned());
        for mut v in compare(license, &r, &state, covered_from, busy, checked_at_ms) {
            if v.entry_id.is_some() {
                v.stream = Some(stream.clone());
            }
            report.violations.push(v);
        }
    }
    if !deleted.is_empty() {
        // Trimming by age never sets it; seatgate deletes no event: someone did.
        report.notes.push(format!(
            "entries were deleted (XDEL) from {}: events may be missing where no other rule shows it",
            deleted.join(", ")
        ));
    }
    if !report.seq_unchecked.is_empty() {
        report.notes.push(format!(
            "seq not checked on {} license(s): their events carry none",
            report.seq_unchecked.len()
        ));
    }
    if !policies_unjudged.is_empty() {
        report.notes.push(format!(
            "queue order not judged on {} license(s) with per-user or per-group limits or reservations, or deleted",
            policies_unjudged.len()
        ));
    }
    report
        .violations
        .sort_by(|a, b| (&a.license, a.at_ms, a.rule).cmp(&(&b.license, b.at_ms, b.rule)));
    Ok(report)
}

/// Reads one license's state: holders, lingering, borrowed, queue, limits.
async fn read_state<C: ConnectionLike>(con: &mut C, keys: &Keys, license: &str) -> Result<FinalState, Error> {
    let k = keys.license(license);
    let mut pipe = redis::pipe();
    pipe.cmd("ZRANGE").arg(&k.holders).arg(0).arg(-1);
    pipe.cmd("ZRANGE").arg(&k.lingering).arg(0).arg(-1);
    pipe.cmd("ZRANGE").arg(&k.borrowed).arg(0).arg(-1);
    pipe.cmd("ZRANGE").arg(&k.queue).arg(0).arg(-1).arg("WITHSCORES");
    pipe.cmd("HGETALL").arg(&k.license);
    pipe.cmd("HGETALL").arg(&k.sessions);
    pipe.cmd("HGETALL").arg(&k.waiters);
    #[allow(clippy::type_complexity)]
    let (holders, lingering, borrowed, queue, record, sessions, waiters): (
        Vec<String>,
        Vec<String>,
        Vec<String>,
        Vec<(String, f64)>,
        HashMap<String, String>,
        HashMap<String, String>,
        HashMap<String, String>,
    ) = pipe.query_async(con).await?;
    let limits = (!record.is_empty()).then(|| {
        record
            .keys()
            .any(|f| f == "max_per_user" || f.starts_with("group_max:") || f.starts_with("group_reserve:"))
    });
    Ok(FinalState {
        holders: holders
            .into_iter()
            .map(|h| {
                let at = sessions
                    .get(&h)
                    .and_then(|raw| SessionRecord::parse(raw))
                    .map(|r| r.acquired_at_ms);
                (h, at)
            })
            .collect(),
        lingering: lingering.into_iter().collect(),
        borrowed: borrowed.into_iter().collect(),
        queue: queue
            .into_iter()
            .map(|(w, score)| {
                let at = waiters
                    .get(&w)
                    .and_then(|raw| WaiterRecord::parse(raw))
                    .map(|r| r.queued_at);
                (w, (score_priority(score), at))
            })
            .collect(),
        limits,
    })
}

/// The priority a queue score stands for (policy.lua's score_priority).
fn score_priority(score: f64) -> i64 {
    ((PRIORITY_STEP - score - 1.0) / PRIORITY_STEP).floor() as i64
}

async fn redis_ms<C: ConnectionLike>(con: &mut C) -> Result<i64, Error> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
    Ok(secs * 1000 + micros / 1000)
}

type Entries = Vec<(String, Vec<(String, Value)>)>;

async fn xrange<C: ConnectionLike>(
    con: &mut C,
    stream: &str,
    start: &str,
    end: &str,
) -> Result<Entries, Error> {
    Ok(redis::cmd("XRANGE")
        .arg(stream)
        .arg(start)
        .arg(end)
        .arg("COUNT")
        .arg(PAGE)
        .query_async(con)
        .await?)
}

/// The ms of a stream's first entry: before it, events were trimmed (or
/// there were none).
async fn first_entry_ms<C: ConnectionLike>(con: &mut C, stream: &str) -> Result<Option<i64>, Error> {
    let first: Entries = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query_async(con)
        .await?;
    Ok(first
        .first()
        .and_then(|(id, _)| id.split('-').next()?.parse().ok()))
}

/// The last entry id deleted from `stream` with `XDEL` (Redis 7's
/// `max-deleted-entry-id`), if any; `None` too when `XINFO` is not allowed
/// (the dashboard's ACL user) or the stream does not exist.
async fn last_deleted<C: ConnectionLike>(con: &mut C, stream: &str) -> Option<String> {
    let info: HashMap<String, Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(stream)
        .query_async(con)
        .await
        .ok()?;
    let id: String = redis::from_redis_value(info.get("max-deleted-entry-id")?.clone()).ok()?;
    (id != "0-0").then_some(id)
}

fn text_field<'v>(fields: &'v [(String, Value)], name: &str) -> Option<&'v str> {
    fields.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s.as_str()),
        _ => None,
    })
}

fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// The report for people: one line per violation, then one summary line.
pub fn render(report: &AuditReport) -> String {
    let mut out = String::new();
    for v in &report.violations {
        let _ = write!(
            out,
            "{}  {:<12} license={} session={}",
            rfc3339(v.at_ms),
            v.rule.as_str(),
            printable(&v.license),
            if v.session.is_empty() {
                "-".into()
            } else {
                printable(&v.session)
            },
        );
        if let Some(seq) = v.seq {
            let _ = write!(out, " seq={seq}");
        }
        match (&v.stream, &v.entry_id) {
            (Some(stream), Some(id)) => {
                let _ = write!(out, " entry={}/{id}", printable(stream));
            }
            (None, Some(id)) => {
                let _ = write!(out, " entry={id}");
            }
            _ => {}
        }
        let _ = writeln!(out, "  {}", printable(&v.detail));
    }
    let verdict = if report.is_clean() {
        "audit clean".to_owned()
    } else {
        format!("audit FAILED: {} violation(s)", report.violations.len())
    };
    let _ = write!(
        out,
        "{verdict}: {} license(s), {} event(s), {} hold(s) checked since {}",
        report.licenses,
        report.events,
        report.holds,
        rfc3339(report.since_ms)
    );
    for note in &report.notes {
        let _ = write!(out, "; {note}");
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event entry as the stream holds it: its fields by name.
    #[derive(Clone)]
    struct E(Vec<(&'static str, String)>);

    /// `kind` of `session`, seats `used` of `total` afterwards, at `at`.
    fn e(kind: &str, session: &str, used: i64, total: i64, at: i64) -> E {
        E(vec![
            ("type", kind.to_owned()),
            ("license", "lic".to_owned()),
            ("session", session.to_owned()),
            ("seats_used", used.to_string()),
            ("seats_total", total.to_string()),
            ("at_ms", at.to_string()),
        ])
    }

    impl E {
        fn with(mut self, name: &'static str, value: impl ToString) -> E {
            self.0.push((name, value.to_string()));
            self
        }
    }

    /// The entries parsed as the audit reads them, ids `<at>-<n>`.
    fn parse(entries: &[E]) -> Vec<Ev> {
        entries
            .iter()
            .enumerate()
            .map(|(n, E(fields))| {
                let get = |name: &str| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str());
                let at = get("at_ms").unwrap_or("0");
                Ev::parse(&format!("{at}-{n}"), get).expect("an event").1
            })
            .collect()
    }

    fn run(limits: Option<bool>, entries: &[E]) -> Replayed {
        replay("lic", "seat:events", limits, parse(entries))
    }

    fn rules(vs: &[Violation]) -> Vec<(Rule, String)> {
        vs.iter().map(|v| (v.rule, v.session.clone())).collect()
    }

    /// Numbers the entries' `seq` from `first`.
    fn numbered(first: u64, entries: Vec<E>) -> Vec<E> {
        entries
            .into_iter()
            .zip(first..)
            .map(|(e, seq)| e.with("seq", seq))
            .collect()
    }

    /// A history a real worker writes: queue, grant on release (both at the
    /// state after the grant), linger and its end, a borrow, a revoke, a
    /// wait that ran out, a denial.
    fn clean_history() -> Vec<E> {
        vec![
            e("acquired", "a", 1, 2, 10),
            e("acquired", "b", 2, 2, 11).with("borrowed_until_ms", 500),
            e("denied", "c", 2, 2, 12).with("reason", "NO_SEATS_AVAILABLE"),
            e("queued", "d", 2, 2, 13).with("priority", 0),
            e("queued", "e", 2, 2, 14).with("priority", 3),
            e("released", "a", 2, 2, 20),
            e("granted", "e", 2, 2, 20).with("waited_ms", 6),
            e("released", "e", 2, 2, 30).with("linger_ms", 50),
            e("acquired", "e", 2, 2, 31),
            e("revoked", "e", 2, 2, 40).with("held", 1).with("actor", "ops"),
            e("granted", "d", 2, 2, 40).with("waited_ms", 27),
            e("queued", "f", 2, 2, 41).with("priority", 0),
            e("queue_timeout", "f", 2, 2, 45).with("waited_ms", 4),
            e("released", "d", 2, 2, 50).with("linger_ms", 50),
            e("evicted", "d", 1, 2, 100).with("reason", "linger_ended"),
        ]
    }

    /// `b` (borrowed) holds a seat at the end.
    fn clean_state() -> FinalState {
        FinalState {
            holders: HashMap::from([("b".to_owned(), Some(11))]),
            borrowed: HashSet::from(["b".to_owned()]),
            limits: Some(false),
            ..FinalState::default()
        }
    }

    #[test]
    fn a_clean_history_has_no_violation_with_or_without_seq() {
        for entries in [clean_history(), numbered(7, clean_history())] {
            let r = run(Some(false), &entries);
            assert_eq!(rules(&r.violations), [], "{:?}", r.violations);
            let found = compare("lic", &r, &clean_state(), 0, &HashSet::new(), 1_000);
            assert_eq!(rules(&found), [], "{found:?}");
            assert_eq!(r.count, Some(1));
            assert_eq!(r.holds, 5);
        }
        assert!(!run(Some(false), &clean_history()).seq_checked);
        assert!(run(Some(false), &numbered(1, clean_history())).seq_checked);
    }

    /// The admin trail among seat events: created, raised, a group map
    /// change, then deleted with a holder (whose `evicted` follows).
    fn admin(kind: &str, used: i64, total: i64, at: i64, before: &str, after: &str) -> E {
        e(kind, "", used, total, at)
            .with("actor", "ada")
            .with("before", before)
            .with("after", after)
    }

    #[test]
    fn admin_events_are_accepted_and_checked() {
        let history = numbered(
            1,
            vec![
                admin(
                    "license_put",
                    0,
                    1,
                    5,
                    "{}",
                    r#"{"seats_total":"1","active":"1"}"#,
                ),
                e("acquired", "a", 1, 1, 10),
                admin(
                    "license_put",
                    1,
                    2,
                    12,
                    r#"{"seats_total":"1"}"#,
                    r#"{"seats_total":"2"}"#,
                ),
                e("acquired", "b", 2, 2, 13),
                admin("groups_changed", 2, 2, 14, "{}", r#"{"ada":"eng"}"#),
                e("released", "b", 1, 2, 15),
                admin("license_deleted", 0, 0, 20, r#"{"seats_total":"2"}"#, "{}"),
                e("evicted", "a", 0, 0, 20).with("reason", "license_deleted"),
            ],
        );
        let r = run(Some(false), &history);
        assert_eq!(rules(&r.violations), [], "{:?}", r.violations);
        let gone = FinalState {
            limits: None,
            ..FinalState::default()
        };
        let found = compare("lic", &r, &gone, 0, &HashSet::new(), 1_000);
        assert_eq!(rules(&found), [], "{found:?}");
        assert_eq!(r.count, Some(0));

        let bad = numbered(
            1,
            vec![
                e("license_put", "", 0, 3, 5)
                    .with("before", "{}")
                    .with("after", r#"{"seats_total":"3"}"#),
                admin(
                    "license_put",
                    0,
                    4,
                    6,
                    r#"{"seats_total":"3"}"#,
                    r#"{"seats_total":"5"}"#,
                ),
                admin("groups_changed", 0, 4, 7, "not json", "{}"),
            ],
        );
        let r = run(Some(false), &bad);
        let details: Vec<(Rule, &str)> = r.violations.iter().map(|v| (v.rule, v.detail.as_str())).collect();
        assert_eq!(details.len(), 3, "{details:?}");
        assert!(
            details.iter().all(|(rule, _)| *rule == Rule::AdminEvent),
            "{details:?}"
        );
        assert!(details[0].1.contains("no actor"), "{details:?}");
        assert!(details[1].1.contains("seats_total 5"), "{details:?}");
        assert!(details[2].1.contains("before"), "{details:?}");
    }

    #[test]
    fn a_seat_given_beyond_seats_total_is_flagged_and_lowering_it_evicts_nobody() {
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 2, 10),
                e("acquired", "b", 2, 2, 11),
                // seats_total lowered to 1: both keep their seats.
                e("denied", "c", 2, 1, 12).with("reason", "NO_SEATS_AVAILABLE"),
                e("released", "a", 1, 1, 13),
                e("acquired", "x", 2, 1, 14),
            ],
        );
        assert_eq!(rules(&r.violations), [(Rule::AboveSeats, "x".to_owned())]);
        assert_eq!(r.violations[0].entry_id.as_deref(), Some("14-4"));
        assert!(r.violations[0].detail.contains("2 seats held after it, of 1"));
        // A made-up acquire that claims to fit is counted, not believed.
        let r = run(
            Some(false),
            &[e("acquired", "a", 1, 1, 10), e("acquired", "x", 1, 1, 11)],
        );
        assert_eq!(
            rules(&r.violations),
            [
                (Rule::AboveSeats, "x".to_owned()),
                (Rule::SeatsUsed, "x".to_owned())
            ]
        );
        // The first event anchors the count: its own claim is checked.
        let r = run(Some(false), &[e("granted", "a", 3, 2, 10)]);
        assert_eq!(rules(&r.violations), [(Rule::AboveSeats, "a".to_owned())]);
    }

    #[test]
    fn seats_used_that_the_events_before_do_not_give_is_flagged_once() {
        // a's release was lost: the next events count one seat less.
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 3, 10),
                e("acquired", "b", 1, 3, 20),
                e("acquired", "c", 2, 3, 30),
            ],
        );
        assert_eq!(rules(&r.violations), [(Rule::SeatsUsed, "b".to_owned())]);
        assert_eq!(r.count, Some(2));
        // Holds from before the window are in the first event's count.
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 3, 3, 10),
                e("released", "old1", 2, 3, 11),
                e("evicted", "old2", 1, 3, 12).with("reason", "heartbeat_timeout"),
            ],
        );
        assert_eq!(rules(&r.violations), []);
        assert_eq!(r.holds, 3);
    }

    #[test]
    fn a_hold_ended_twice_is_flagged_but_one_begun_before_the_window_is_not() {
        let r = run(
            Some(false),
            &[
                e("released", "old", 0, 1, 5),
                e("acquired", "a", 1, 1, 10),
                e("released", "a", 0, 1, 20),
                e("evicted", "a", 0, 1, 30).with("reason", "heartbeat_timeout"),
                e("revoked", "old", 0, 1, 40).with("held", 1),
                // A revoke of a waiter ends no hold.
                e("revoked", "w", 0, 1, 50).with("held", 0),
            ],
        );
        assert_eq!(
            rules(&r.violations),
            [
                (Rule::EndedTwice, "a".to_owned()),
                (Rule::EndedTwice, "old".to_owned())
            ]
        );
        // A lingering seat released again.
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 1, 10),
                e("released", "a", 1, 1, 20).with("linger_ms", 100),
                e("released", "a", 1, 1, 30),
            ],
        );
        assert_eq!(rules(&r.violations), [(Rule::EndedTwice, "a".to_owned())]);
    }

    #[test]
    fn taking_back_a_lingering_seat_after_the_seats_were_lowered_is_no_overuse() {
        // Two seats held, seats_total lowered to 1 (which evicts nobody); a
        // releases to linger and takes its seat back: still 2 held, no new
        // seat. (Found by the history checker, seed 2.)
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 2, 10),
                e("acquired", "b", 2, 2, 11),
                e("released", "a", 2, 1, 20).with("linger_ms", 1500),
                e("acquired", "a", 2, 1, 21),
            ],
        );
        assert_eq!(rules(&r.violations), []);
        // A seat newly taken there is overuse.
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 2, 10),
                e("acquired", "b", 2, 2, 11),
                e("acquired", "c", 3, 1, 21),
            ],
        );
        assert_eq!(rules(&r.violations), [(Rule::AboveSeats, "c".to_owned())]);
    }

    #[test]
    fn a_hold_that_never_ended_is_flagged() {
        // a took a seat twice without an end between.
        let entries = [
            e("acquired", "a", 1, 2, 10),
            e("released", "a", 0, 2, 20),
            e("acquired", "a", 1, 2, 30),
            e("acquired", "a", 1, 2, 40),
        ];
        let r = run(Some(false), &entries);
        assert_eq!(rules(&r.violations), [(Rule::NeverEnded, "a".to_owned())]);
        // b holds by the events, not in Redis: its release was lost.
        let r = run(Some(false), &[e("acquired", "b", 1, 2, 10)]);
        let found = compare("lic", &r, &FinalState::default(), 0, &HashSet::new(), 99);
        assert_eq!(
            rules(&found),
            [
                (Rule::NeverEnded, "b".to_owned()),
                (Rule::FinalState, String::new())
            ]
        );
        assert_eq!(found[0].entry_id.as_deref(), Some("10-0"));
        // Unless b has events the replay did not see (appended meanwhile).
        let busy = HashSet::from(["b".to_owned()]);
        assert_eq!(
            rules(&compare("lic", &r, &FinalState::default(), 0, &busy, 99)),
            []
        );
    }

    #[test]
    fn a_holder_whose_start_the_window_covers_needs_an_event() {
        let r = run(Some(false), &[e("acquired", "a", 1, 3, 5_000)]);
        let state = FinalState {
            holders: HashMap::from([
                ("a".to_owned(), Some(5_000)),
                ("early".to_owned(), Some(500)),
                ("late".to_owned(), Some(9_000)),
            ]),
            queue: HashMap::from([("w".to_owned(), (0, Some(9_500)))]),
            limits: Some(false),
            ..FinalState::default()
        };
        // Events from 1000 on: early started before, late and w after.
        let found = compare("lic", &r, &state, 1_000, &HashSet::new(), 10_000);
        assert_eq!(
            rules(&found),
            [
                (Rule::NoStart, "late".to_owned()),
                (Rule::NoStart, "w".to_owned()),
                (Rule::FinalState, String::new())
            ]
        );
        assert!(found[0].detail.contains("no acquired or granted event"));
    }

    #[test]
    fn grants_follow_priority_then_arrival_unless_a_limit_may_skip() {
        let history = |grant: &str| {
            vec![
                e("acquired", "a", 1, 1, 10),
                e("queued", "w1", 1, 1, 11).with("priority", 0),
                e("queued", "w2", 1, 1, 12).with("priority", 5),
                e("queued", "w3", 1, 1, 13).with("priority", 5),
                e("released", "a", 1, 1, 20),
                e("granted", grant, 1, 1, 20),
            ]
        };
        assert_eq!(rules(&run(Some(false), &history("w2")).violations), []);
        for skipped in ["w1", "w3"] {
            let r = run(Some(false), &history(skipped));
            assert_eq!(rules(&r.violations), [(Rule::QueueOrder, skipped.to_owned())]);
            assert!(
                r.violations[0].detail.contains("first: w2"),
                "{}",
                r.violations[0].detail
            );
            // Under per-user or group limits (or unknown policies) a grant
            // past a waiter may be a fair skip: not judged.
            assert_eq!(rules(&run(Some(true), &history(skipped)).violations), []);
            assert_eq!(rules(&run(None, &history(skipped)).violations), []);
        }
        // A direct acquire while someone waits jumps the queue; taking back
        // one's own lingering seat does not.
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 2, 10),
                e("acquired", "b", 2, 2, 11),
                e("queued", "w", 2, 2, 12).with("priority", 0),
                e("released", "a", 2, 2, 13).with("linger_ms", 100),
                e("acquired", "a", 2, 2, 14),
                e("released", "b", 1, 2, 15),
                e("acquired", "x", 2, 2, 16),
            ],
        );
        assert_eq!(rules(&r.violations), [(Rule::QueueOrder, "x".to_owned())]);
        // With `seq`, a waiter that queued after a grant of the same
        // millisecond was not skipped by it, whatever its priority (the
        // 30-minute history run, seed 11: grants seq 1083 and 1084, then a
        // priority-3 waiter queued seq 1085, all in one millisecond).
        let same_ms = |late: i64| {
            vec![
                e("acquired", "a", 1, 2, 10),
                e("acquired", "b", 2, 2, 10),
                e("queued", "w1", 2, 2, 11).with("priority", 0),
                e("queued", "w2", 2, 2, 12).with("priority", 0),
                e("released", "a", 1, 2, 20),
                e("granted", "w1", 2, 2, 20).with("priority", 0),
                e("released", "b", 1, 2, 20),
                e("granted", "w2", 2, 2, 20).with("priority", 0),
                e("queued", "late", 2, 2, late).with("priority", 3),
            ]
        };
        assert_eq!(rules(&run(Some(false), &numbered(1, same_ms(20))).violations), []);
        // The same waiter queued before the grants is skipped by both.
        let mut before = same_ms(15);
        let late = before.remove(8);
        before.insert(4, late);
        let r = run(Some(false), &numbered(1, before));
        assert_eq!(
            rules(&r.violations),
            [
                (Rule::QueueOrder, "w1".to_owned()),
                (Rule::QueueOrder, "w2".to_owned())
            ]
        );
        // A wait that ended in the same step as the acquire is no jump.
        let r = run(
            Some(false),
            &[
                e("queued", "w", 1, 1, 11).with("priority", 0),
                e("queue_timeout", "w", 1, 1, 20),
                e("released", "old", 0, 1, 20),
                e("acquired", "x", 1, 1, 20),
            ],
        );
        assert_eq!(rules(&r.violations), []);
    }

    #[test]
    fn events_that_disagree_with_the_final_state_are_flagged() {
        let r = run(
            Some(false),
            &[
                e("acquired", "lin", 1, 5, 10),
                e("released", "lin", 1, 5, 11).with("linger_ms", 1000),
                e("acquired", "bor", 2, 5, 12).with("borrowed_until_ms", 9_000),
                e("acquired", "gone", 3, 5, 13),
                e("released", "gone", 2, 5, 14),
                e("queued", "w", 2, 5, 15).with("priority", 2),
                e("queued", "t", 2, 5, 16),
                e("queue_timeout", "t", 2, 5, 17),
            ],
        );
        assert_eq!(rules(&r.violations), []);
        let state = FinalState {
            // lin a live holder, bor without its borrow, gone holding again,
            // w waiting at another priority, t waiting again.
            holders: HashMap::from([
                ("lin".to_owned(), Some(10)),
                ("bor".to_owned(), Some(12)),
                ("gone".to_owned(), Some(13)),
            ]),
            queue: HashMap::from([("w".to_owned(), (0, Some(15))), ("t".to_owned(), (0, Some(16)))]),
            limits: Some(false),
            ..FinalState::default()
        };
        let found = compare("lic", &r, &state, 0, &HashSet::new(), 99);
        assert_eq!(
            rules(&found),
            [
                (Rule::FinalState, "bor".to_owned()),
                (Rule::FinalState, "gone".to_owned()),
                (Rule::FinalState, "lin".to_owned()),
                (Rule::FinalState, "t".to_owned()),
                (Rule::FinalState, "w".to_owned()),
                (Rule::FinalState, String::new()),
            ],
            "{found:#?}"
        );
        // Agreeing: lin lingers, bor borrowed, w at priority 2.
        let state = FinalState {
            holders: HashMap::from([("lin".to_owned(), Some(10)), ("bor".to_owned(), Some(12))]),
            lingering: HashSet::from(["lin".to_owned()]),
            borrowed: HashSet::from(["bor".to_owned()]),
            queue: HashMap::from([("w".to_owned(), (2, Some(15)))]),
            limits: Some(false),
        };
        assert_eq!(rules(&compare("lic", &r, &state, 0, &HashSet::new(), 99)), []);
    }

    #[test]
    fn seq_gaps_repeats_and_missing_seq_are_flagged() {
        let base = || {
            vec![
                e("acquired", "a", 1, 2, 10).with("seq", 41),
                e("released", "a", 0, 2, 20).with("seq", 42),
                e("acquired", "b", 1, 2, 30).with("seq", 43),
            ]
        };
        assert_eq!(rules(&run(Some(false), &base()).violations), []);
        // 42 lost: a gap (and a's hold, by the events, never ended).
        let mut lost = base();
        lost.remove(1);
        let r = run(Some(false), &lost);
        assert_eq!(
            rules(&r.violations),
            [(Rule::SeqGap, "b".to_owned()), (Rule::SeatsUsed, "b".to_owned())]
        );
        assert!(r.violations[0]
            .detail
            .contains("seq 41 then 43: 1 event(s) missing"));
        // On one seat: the lost release makes b's acquire look like a
        // second seat; with the gap known, b's own count is judged (one of
        // one), without seq there is no telling.
        let one_seat = |seq: bool| {
            let entries = [e("acquired", "a", 1, 1, 10), e("acquired", "b", 1, 1, 30)];
            let entries: Vec<E> = if seq {
                vec![
                    entries[0].clone().with("seq", 1),
                    entries[1].clone().with("seq", 3),
                ]
            } else {
                entries.to_vec()
            };
            rules(&run(Some(false), &entries).violations)
        };
        assert_eq!(
            one_seat(true),
            [(Rule::SeqGap, "b".to_owned()), (Rule::SeatsUsed, "b".to_owned())]
        );
        assert_eq!(
            one_seat(false),
            [
                (Rule::AboveSeats, "b".to_owned()),
                (Rule::SeatsUsed, "b".to_owned())
            ]
        );
        // 42 twice: the duplicate is flagged, not replayed.
        let mut twice = base();
        twice.insert(2, e("released", "a", 0, 2, 20).with("seq", 42));
        assert_eq!(
            rules(&run(Some(false), &twice).violations),
            [(Rule::SeqRepeat, "a".to_owned())]
        );
        // Out of order, and one without seq among them.
        let swapped = vec![
            e("acquired", "a", 1, 2, 10).with("seq", 41),
            e("acquired", "b", 2, 2, 10).with("seq", 43),
            e("released", "a", 1, 2, 10).with("seq", 42),
            e("acquired", "x", 2, 2, 40),
        ];
        let r = run(Some(false), &swapped);
        assert_eq!(
            rules(&r.violations),
            [
                (Rule::SeqGap, "b".to_owned()),
                (Rule::SeqOrder, "a".to_owned()),
                (Rule::SeqMissing, "x".to_owned())
            ]
        );
        assert!(!r.seq_checked);
    }

    #[test]
    fn older_events_are_replayed_in_decision_time_order() {
        // Appended out of order (at most once, after the script): b's
        // acquire was decided after a's release.
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 1, 10),
                e("acquired", "b", 1, 1, 30),
                e("released", "a", 0, 1, 20),
            ],
        );
        assert_eq!(rules(&r.violations), []);
    }

    #[test]
    fn queue_scores_give_the_priority_back() {
        let step = PRIORITY_STEP;
        for (priority, arrival) in [(0.0, 1.0), (3.0, 17.0), (9.0, 123_456.0)] {
            assert_eq!(score_priority(arrival - priority * step), priority as i64);
        }
    }

    #[test]
    fn a_report_renders_one_line_per_violation_and_a_summary() {
        let clean = AuditReport {
            since_ms: 0,
            checked_at_ms: 1,
            licenses: 2,
            events: 30,
            holds: 4,
            seq_unchecked: Vec::new(),
            notes: Vec::new(),
            violations: Vec::new(),
        };
        assert_eq!(
            render(&clean),
            "audit clean: 2 license(s), 30 event(s), 4 hold(s) checked since 1970-01-01T00:00:00.000Z\n"
        );
        let r = run(
            Some(false),
            &[
                e("acquired", "a", 1, 1, 10),
                e("acquired", "x\u{1b}", 2, 1, 11).with("seq", 9),
            ],
        );
        let failed = AuditReport {
            violations: r.violations,
            ..clean
        };
        let text = render(&failed);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0],
            "1970-01-01T00:00:00.011Z  above_seats  license=lic session=x\\u{1b} seq=9 entry=seat:events/11-1  2 seats held after it, of 1: a seat given beyond seats_total"
        );
        assert!(
            lines[1].starts_with("audit FAILED: 1 violation(s): 2 license(s)"),
            "{text}"
        );
    }
}
