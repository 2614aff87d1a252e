//! The model a history is checked against, one function per rule; each
//! anomaly carries its evidence (ids, entry ids, times). The rules are
//! docs/protocol.md's promises:
//!
//! - `seats_replies`, `seats_events`, `seats_samples`: no acquire or grant
//!   takes a license above `seats_total`; sampled holders never exceed it
//!   (but after the administrator lowered it, until they drained below);
//! - `answered`: every request that reached the stream is answered, once
//!   the faults healed;
//! - `duplicates`: a request id answered twice is answered the same;
//! - `replies_events`: every seat change a reply reports has its one event,
//!   and every event its reply (evictions aside, which have none);
//! - `event_seq`: once events carry `seq`, per license no gap, no repeat,
//!   and stream order is `seq` order;
//! - `user_limit`: replaying the events, no user holds more than its
//!   license's `max_per_user`;
//! - `final_state`: once clients stopped and the reaper caught up, nothing
//!   is held, queued, left in an outbox or (on a cluster) left in a
//!   license's events log unrelayed, and the events replayed agree;
//! - `fresh_holders`: no holder whose heartbeats came in time lost its
//!   seat (heartbeat answers, and `evicted` events' times);
//! - `audit`: `seatgate audit` ran and found nothing (not run is an anomaly);
//! - `report`: `seatgate report --format json`'s figures per license equal
//!   the history's ([`totals`]): holds, denials by reason, queue timeouts,
//!   peak seats, and seat time within the bounds the seat samples and the
//!   events put on it ([`seat_ms_bounds`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use super::record::{entry_ms, AdminKind, Event, History, Hold, HoldEnd, Received};

/// One broken rule, with its evidence.
#[derive(Debug, Clone)]
pub struct Anomaly {
    pub check: &'static str,
    pub detail: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.check, self.detail)
    }
}

/// What checking a history found: its size, the checks run (with how many
/// items each looked at) and the anomalies.
#[derive(Debug, Clone)]
pub struct Checked {
    pub seed: u64,
    /// The run was on a Redis Cluster.
    pub cluster: bool,
    pub requests: usize,
    pub sends: usize,
    pub replies: usize,
    pub events: usize,
    pub holds: usize,
    pub samples: usize,
    pub faults: BTreeMap<String, usize>,
    pub checks: Vec<(&'static str, usize)>,
    pub anomalies: Vec<Anomaly>,
    /// The history's totals per license, what `seatgate report` must agree with.
    pub totals: BTreeMap<String, Totals>,
}

/// Per license, the seat changes and refusals the replies report, each
/// request counted once (its first answer of the kind): the figures a usage
/// report over the run must give (issue 22: "the report's totals equal to
/// the history's"; the `report` check compares them with `seatgate report
/// --format json`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// Seats taken: ACQUIRED (but a session taking back its own lingering
    /// seat, which never stopped counting) and GRANTED.
    pub holds: u64,
    /// The most seats in use the ACQUIRED and GRANTED replies report.
    pub peak_seats: u64,
    pub acquired: u64,
    pub granted: u64,
    pub released: u64,
    pub left_queue: u64,
    pub queue_timeouts: u64,
    pub revoked: u64,
    /// Denials by status (the `denied` events' reasons).
    pub denied: BTreeMap<String, u64>,
}

/// The history's [`Totals`], per license.
pub fn totals(h: &History) -> BTreeMap<String, Totals> {
    let mut out: BTreeMap<String, Totals> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for r in &h.received {
        let status = r.get("status");
        if !seen.insert((r.get("id").to_owned(), status.to_owned())) {
            continue;
        }
        let t = out.entry(r.get("license").to_owned()).or_default();
        if matches!(status, "ACQUIRED" | "GRANTED") {
            if let Some((used, _)) = seats_of(&r.fields) {
                t.peak_seats = t.peak_seats.max(used);
            }
            if status == "GRANTED" || !takes_back(h, r) {
                t.holds += 1;
            }
        }
        match status {
            "ACQUIRED" => t.acquired += 1,
            "GRANTED" => t.granted += 1,
            "RELEASED" => t.released += 1,
            "LEFT_QUEUE" => t.left_queue += 1,
            "QUEUE_TIMEOUT" => t.queue_timeouts += 1,
            "REVOKED" => t.revoked += 1,
            // Whatever the op (a heartbeat can be RATE_LIMITED too): each
            // denial reply has its `denied` event (replies_events).
            s if DENIALS.contains(&s) => *t.denied.entry(s.to_owned()).or_default() += 1,
            _ => {}
        }
    }
    out
}

impl fmt::Display for Checked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "history seed {}{}: {} requests ({} sends), {} replies, {} events, {} holds, {} samples",
            self.seed,
            if self.cluster { " on a cluster" } else { "" },
            self.requests,
            self.sends,
            self.replies,
            self.events,
            self.holds,
            self.samples
        )?;
        let faults: Vec<String> = self.faults.iter().map(|(k, n)| format!("{k}={n}")).collect();
        writeln!(
            f,
            "faults: {}",
            if faults.is_empty() {
                "none".to_owned()
            } else {
                faults.join(" ")
            }
        )?;
        let checks: Vec<String> = self.checks.iter().map(|(c, n)| format!("{c}({n})")).collect();
        writeln!(f, "checks: {}", checks.join(" "))?;
        for (license, t) in &self.totals {
            let denied: u64 = t.denied.values().sum();
            writeln!(
                f,
                "  {license}: acquired {} granted {} (holds {}, peak {}) released {} left_queue {} queue_timeout {} revoked {} denied {denied}",
                t.acquired, t.granted, t.holds, t.peak_seats, t.released, t.left_queue, t.queue_timeouts, t.revoked
            )?;
        }
        let killed = self.faults.get("cluster_master_kill9").copied().unwrap_or(0);
        if killed > 0 && !self.anomalies.is_empty() {
            // Not silently a seatgate anomaly: Redis's own documented loss.
            writeln!(
                f,
                "after {killed} kill -9 of a master: Redis Cluster replicates asynchronously, so a killed master's last acknowledged writes may be lost (docs/running.md, \"The failover window\"); the anomalies below may be that loss rather than seatgate's"
            )?;
            writeln!(
                f,
                "anomalies (possibly Redis's replication loss): {}",
                self.anomalies.len()
            )?;
        } else {
            writeln!(f, "anomalies: {}", self.anomalies.len())?;
        }
        for a in self.anomalies.iter().take(50) {
            writeln!(f, "  {a}")?;
        }
        if self.anomalies.len() > 50 {
            writeln!(f, "  … and {} more", self.anomalies.len() - 50)?;
        }
        Ok(())
    }
}

/// Statuses a denied event stands for (Status::is_denial, less QUEUE_TIMEOUT).
const DENIALS: [&str; 7] = [
    "NO_SEATS_AVAILABLE",
    "LICENSE_NOT_FOUND",
    "LICENSE_INACTIVE",
    "LICENSE_EXPIRED",
    "LICENSE_INVALID",
    "RATE_LIMITED",
    "LIMIT_REACHED",
];

/// Checks `h` against the model.
pub fn check(h: &History) -> Checked {
    let mut out = Checked {
        seed: h.seed,
        cluster: h.cluster,
        requests: h.sent.iter().map(|s| &s.id).collect::<BTreeSet<_>>().len(),
        sends: h.sent.len(),
        replies: h.received.len(),
        events: h.events.len(),
        holds: h.holds.len(),
        samples: h.samples.len(),
        faults: h.faults_by_kind(),
        checks: Vec::new(),
        anomalies: Vec::new(),
        totals: totals(h),
    };
    let by_id = replies_by_id(h);
    let ordered = ordered_events(h);
    let mut run = |name: &'static str, (n, found): (usize, Vec<String>)| {
        out.checks.push((name, n));
        out.anomalies
            .extend(found.into_iter().map(|detail| Anomaly { check: name, detail }));
    };
    run("seats_replies", seats_replies(h));
    run("seats_events", seats_events(&ordered));
    run("seat_takes", seat_takes(&ordered));
    run("seats_samples", seats_samples(h));
    run("answered", answered(h, &by_id));
    run("duplicates", duplicates(h, &by_id));
    run("replies_events", replies_events(h, &by_id));
    run("event_seq", event_seq(h));
    run("user_limit", user_limit(h, &ordered));
    run("final_state", final_state(h, &ordered));
    run("fresh_holders", fresh_holders(h, &by_id));
    // `seatgate audit` over the same Redis: not run is no pass.
    run(
        "audit",
        (
            1,
            match &h.audit {
                Some(Ok(())) => Vec::new(),
                Some(Err(e)) => vec![e.clone()],
                None => vec!["seatgate audit was not run".to_owned()],
            },
        ),
    );
    let totals = out.totals.clone();
    run("report", report(h, &totals));
    out
}

/// `seatgate report --format json` against the history, per license:
/// holds (the users' `holds` summed), denials by reason, queue timeouts and
/// peak seats equal; `seat_ms` within [`seat_ms_bounds`].
fn report(h: &History, totals: &BTreeMap<String, Totals>) -> (usize, Vec<String>) {
    let rep = match &h.report {
        Some(Ok(r)) => r,
        Some(Err(e)) => return (1, vec![e.clone()]),
        None => return (1, vec!["seatgate report was not run".to_owned()]),
    };
    let mut found = Vec::new();
    let mut n = 0;
    let names: BTreeSet<&str> = totals
        .keys()
        .map(String::as_str)
        .chain(h.licenses.iter().map(|l| l.name.as_str()))
        .collect();
    for name in names {
        let t = totals.get(name).cloned().unwrap_or_default();
        let Some(l) = rep.licenses.iter().find(|l| l.license == name) else {
            if t != Totals::default() {
                found.push(format!(
                    "license {name}: not in the report, though the replies show {t:?}"
                ));
            }
            continue;
        };
        n += 1;
        let mut differ = |what: &str, report: u64, history: u64| {
            if report != history {
                found.push(format!(
                    "license {name}: the report says {what} {report}, the history {history}"
                ));
            }
        };
        differ("holds", l.users.iter().map(|u| u.holds).sum(), t.holds);
        differ(
            "peak_seats",
            u64::try_from(l.peak_seats).unwrap_or(0),
            t.peak_seats,
        );
        let folded = h.events.iter().any(|e| {
            e.get("license") == name && e.get("type") == "denied" && e.num("folded").unwrap_or(0) > 0
        });
        if folded {
            // Folded denials carry no reason of their own: the total.
            differ(
                "denials (all but QUEUE_TIMEOUT)",
                l.denials
                    .iter()
                    .filter(|(r, _)| *r != "QUEUE_TIMEOUT")
                    .map(|(_, n)| n)
                    .sum(),
                t.denied.values().sum(),
            );
        }
        let reasons: BTreeSet<&str> = l
            .denials
            .keys()
            .map(String::as_str)
            .chain(t.denied.keys().map(String::as_str))
            .filter(|r| *r != "QUEUE_TIMEOUT" && !folded)
            .collect();
        for reason in reasons {
            differ(
                &format!("denials {reason}"),
                l.denials.get(reason).copied().unwrap_or(0),
                t.denied.get(reason).copied().unwrap_or(0),
            );
        }
        differ(
            "denials QUEUE_TIMEOUT",
            l.denials.get("QUEUE_TIMEOUT").copied().unwrap_or(0),
            t.queue_timeouts,
        );
        let (lo, hi) = seat_ms_bounds(h, name, u64::try_from(rep.until_ms).unwrap_or(0));
        let seat_ms = u64::try_from(l.seat_ms).unwrap_or(0);
        if seat_ms < lo || seat_ms > hi {
            found.push(format!(
                "license {name}: the report says seat_ms {seat_ms}, the samples and events bound it to {lo}..={hi}"
            ));
        }
    }
    (n, found)
}

/// Bounds on license `name`'s seat time (seats in use integrated over
/// time, ms) up to `until_ms`, from the seat samples (holders read with
/// Redis's clock every 150 ms) and the events' `seats_used` and `at_ms`:
/// between two samples with no event of the license the holders did not
/// change (exact); across an interval with events they stayed between the
/// least and the most of the samples' and events' counts. Before the first
/// sample and after the last, 0 to the most the events there show. Slack: 2
/// ms per event (the events' and the samples' clocks are ms, an event's
/// `at_ms` is its script's start). The bounds are as tight as the samples
/// are dense, whatever the faults: Redis away means no sample but no change
/// either, and the reaper's lateness moves a hold's end, which the samples
/// see, not the bound.
pub(crate) fn seat_ms_bounds(h: &History, name: &str, until_ms: u64) -> (u64, u64) {
    let mut samples: Vec<(u64, u64)> = h
        .samples
        .iter()
        .filter(|s| s.license == name)
        .map(|s| (s.at_ms, s.holders))
        .collect();
    samples.sort();
    let mut events: Vec<(u64, u64)> = h
        .events
        .iter()
        .filter(|e| e.get("license") == name)
        .filter_map(|e| Some((e.num("at_ms")?, e.num("seats_used")?)))
        .collect();
    events.sort();
    let slack = 2 * events.len() as u64;
    let used_in = |from: u64, to: u64| {
        events
            .iter()
            .filter(move |(at, _)| (from..=to).contains(at))
            .map(|(_, u)| *u)
    };
    let (mut lo, mut hi) = (0u64, 0u64);
    let Some(&(first, _)) = samples.first() else {
        // No samples: only the events' most, from the first to `until_ms`.
        let max = events.iter().map(|(_, u)| *u).max().unwrap_or(0);
        let from = events.first().map(|(at, _)| *at).unwrap_or(until_ms);
        return (0, max * until_ms.saturating_sub(from) + slack);
    };
    if let Some(&(at, _)) = events.first() {
        if at < first {
            hi += used_in(at, first).max().unwrap_or(0) * (first - at);
        }
    }
    for w in samples.windows(2) {
        let ((t0, a), (t1, b)) = (w[0], w[1]);
        let dt = t1 - t0;
        let mn = used_in(t0, t1).chain([a, b]).min().unwrap_or(0);
        let mx = used_in(t0, t1).chain([a, b]).max().unwrap_or(0);
        lo += mn * dt;
        hi += mx * dt;
    }
    if let Some(&(last, a)) = samples.last() {
        let mx = used_in(last, u64::MAX).chain([a]).max().unwrap_or(0);
        hi += mx * until_ms.saturating_sub(last);
    }
    (lo.saturating_sub(slack), hi + slack)
}

/// Every reply, by request id, in the order read (per client stream).
fn replies_by_id(h: &History) -> BTreeMap<&str, Vec<&Received>> {
    let mut by: BTreeMap<&str, Vec<&Received>> = BTreeMap::new();
    for r in &h.received {
        by.entry(r.get("id")).or_default().push(r);
    }
    for v in by.values_mut() {
        v.sort_by_key(|r| (entry_ms(&r.entry), r.entry.clone()));
    }
    by
}

/// Events in decision order per license (the replays are per license): by
/// `seq` when events carry it (the events contract), else by `at_ms`, then
/// stream entry id.
fn ordered_events(h: &History) -> Vec<&Event> {
    let mut ev: Vec<&Event> = h.events.iter().collect();
    ev.sort_by_key(|e| {
        (
            e.get("license").to_owned(),
            e.num("seq").unwrap_or(0),
            e.num("at_ms").unwrap_or(0),
            entry_ms(&e.entry),
            e.entry.clone(),
        )
    });
    ev
}

/// Once events carry `seq` (per license, +1 from one event to the next,
/// never restarting): no gap (a lost event) and no repeat (a duplicate),
/// and the stream holds them in `seq` order. Judges nothing while events
/// carry no `seq`.
fn event_seq(h: &History) -> (usize, Vec<String>) {
    let mut per: BTreeMap<&str, Vec<(u64, &Event)>> = BTreeMap::new();
    for e in &h.events {
        if let Some(seq) = e.num("seq") {
            per.entry(e.get("license")).or_default().push((seq, e));
        }
    }
    let mut n = 0;
    let mut found = Vec::new();
    for (license, mut seqs) in per {
        // Stream order first: it must already be seq order.
        for w in seqs.windows(2) {
            if w[1].0 <= w[0].0 {
                found.push(format!(
                    "{license}: event {} (seq {}) follows event {} (seq {}) in the stream",
                    w[1].1.entry, w[1].0, w[0].1.entry, w[0].0
                ));
            }
        }
        seqs.sort_by_key(|(seq, e)| (*seq, e.entry.clone()));
        n += seqs.len();
        for w in seqs.windows(2) {
            let (a, b) = (w[0].0, w[1].0);
            if b == a {
                found.push(format!(
                    "{license}: seq {a} twice (events {} and {})",
                    w[0].1.entry, w[1].1.entry
                ));
            } else if b != a + 1 {
                found.push(format!(
                    "{license}: seq {a} (event {}) then {b} (event {}): {} events lost",
                    w[0].1.entry,
                    w[1].1.entry,
                    b - a - 1
                ));
            }
        }
    }
    (n, found)
}

fn seats_of(fields: &BTreeMap<String, String>) -> Option<(u64, u64)> {
    Some((
        fields.get("seats_used")?.parse().ok()?,
        fields.get("seats_total")?.parse().ok()?,
    ))
}

fn seats_replies(h: &History) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut found = Vec::new();
    for r in &h.received {
        if matches!(r.get("status"), "ACQUIRED" | "GRANTED") {
            n += 1;
            if let Some((used, total)) = seats_of(&r.fields) {
                if used > total && !takes_back(h, r) {
                    found.push(format!(
                        "reply {} {} of {} to session {} says seats {used}/{total} (entry {})",
                        r.get("id"),
                        r.get("status"),
                        r.get("license"),
                        r.get("session"),
                        r.entry
                    ));
                }
            }
        }
    }
    (n, found)
}

/// Whether ACQUIRED `r` is its session taking back its own lingering seat
/// (no new seat: it never stopped counting).
///
/// Judged on the session's events in `seq` order: the `acquired` that
/// answered `r` (the session's last one decided by the time of the reply)
/// takes a seat back when the session's seat event before it is a
/// `released` under linger, with nothing ending the lingering seat between
/// (a `linger_ended` eviction, a revoke, the license deleted). Without
/// those events (a run of a service that records none) it falls back on
/// the replies: released with `linger_ms`, and `r` within that linger or
/// before any `linger_ended` eviction.
fn takes_back(h: &History, r: &Received) -> bool {
    let (license, session, at) = (r.get("license"), r.get("session"), entry_ms(&r.entry));
    let mut seat_events: Vec<&Event> = h
        .events
        .iter()
        .filter(|e| {
            e.get("license") == license
                && e.get("session") == session
                && e.num("at_ms").unwrap_or(0) <= at
                && matches!(
                    e.get("type"),
                    "acquired" | "granted" | "released" | "evicted" | "revoked"
                )
        })
        .collect();
    if !seat_events.is_empty() && seat_events.iter().all(|e| e.num("seq").is_some()) {
        seat_events.sort_by_key(|e| e.num("seq"));
        if let Some(i) = seat_events.iter().rposition(|e| e.get("type") == "acquired") {
            return i > 0 && {
                let before = seat_events[i - 1];
                before.get("type") == "released" && before.num("linger_ms").is_some_and(|l| l > 0)
            };
        }
    }
    let released = h.received.iter().filter(|x| {
        x.get("license") == license
            && x.get("session") == session
            && x.get("status") == "RELEASED"
            && entry_ms(&x.entry) <= at
    });
    released
        .filter_map(|x| Some((entry_ms(&x.entry), x.get("linger_ms").parse::<u64>().ok()?)))
        .any(|(rel, linger)| {
            at <= rel + linger
                || !h.events.iter().any(|e| {
                    e.get("license") == license
                        && e.get("session") == session
                        && e.get("reason") == "linger_ended"
                        && (rel..=at).contains(&e.num("at_ms").unwrap_or(0))
                })
        })
}

/// Over the events replayed in order: an acquired or granted event that
/// adds a holder (not a take-back of a lingering seat) above seats_total.
fn seats_events(ordered: &[&Event]) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut found = Vec::new();
    replay(ordered, |e, _, was_holding| {
        n += 1;
        if let Some((used, total)) = seats_of(&e.fields) {
            if used > total && !was_holding {
                found.push(format!(
                    "event {} {} of {} session {} says seats {used}/{total}",
                    e.entry,
                    e.get("type"),
                    e.get("license"),
                    e.get("session")
                ));
            }
        }
    });
    (n, found)
}

/// Over the events replayed in order, a seat's takes and ends: no session
/// takes a seat of the license while it holds a live one (a holder's
/// acquire is answered ALREADY_ACTIVE and changes nothing); a seat released
/// under linger_ms is its session's to take back, so its acquire is neither
/// queued nor refused for want of a seat meanwhile; and only a seat still
/// lingering ends by `linger_ended` (one taken back holds on).
fn seat_takes(ordered: &[&Event]) -> (usize, Vec<String>) {
    // License → its holders, and of them those whose released seat lingers.
    let mut held: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut lingering: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut n = 0;
    let mut found = Vec::new();
    for e in ordered {
        let (kind, license, session) = (e.get("type"), e.get("license"), e.get("session"));
        let held = held.entry(license).or_default();
        let lingering = lingering.entry(license).or_default();
        let wrong = match kind {
            "acquired" | "granted" => {
                n += 1;
                let taken_back = lingering.remove(session);
                (!held.insert(session) && !taken_back).then_some("which held a seat of it already")
            }
            "queued" => lingering
                .contains(session)
                .then_some("though its released seat lingered with it"),
            "denied" if matches!(e.get("reason"), "NO_SEATS_AVAILABLE" | "LIMIT_REACHED") => lingering
                .contains(session)
                .then_some("though its released seat lingered with it"),
            "released" if e.fields.contains_key("linger_ms") => {
                lingering.insert(session);
                None
            }
            "evicted" if e.get("reason") == "linger_ended" && !lingering.contains(session) => {
                Some("whose seat was not lingering")
            }
            _ => None,
        };
        if let Some(why) = wrong {
            found.push(format!(
                "event {} {kind} of {license} session {session}, {why}",
                e.entry
            ));
        }
        if ends_seat(e) {
            held.remove(session);
            lingering.remove(session);
        }
    }
    (n, found)
}

/// Holders above seats in a sample are allowed only after the seats were
/// lowered, up to the old count, until a sample shows them drained.
fn seats_samples(h: &History) -> (usize, Vec<String>) {
    let mut found = Vec::new();
    let mut samples: Vec<_> = h.samples.iter().collect();
    samples.sort_by_key(|s| s.at_ms);
    let mut lowered: Vec<_> = h
        .admin
        .iter()
        .filter_map(|a| match a.what {
            AdminKind::Seats { from, to } if to < from => {
                Some((a.start_ms, a.license.as_str(), from, a.end_ms))
            }
            _ => None,
        })
        .collect();
    lowered.sort();
    // License → (holders allowed, until when a lowering may still be under way).
    let mut allowance: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut next = 0;
    for s in &samples {
        while next < lowered.len() && lowered[next].0 <= s.at_ms {
            let (_, license, from, end_ms) = lowered[next];
            let a = allowance.entry(license).or_insert((0, 0));
            *a = (a.0.max(from), a.1.max(end_ms));
            next += 1;
        }
        let Some(total) = s.seats_total else { continue };
        let allowed = allowance.get(s.license.as_str()).copied();
        if s.holders <= total {
            // Drained below the new count (once the change is surely in).
            if allowed.is_some_and(|(_, end_ms)| s.at_ms > end_ms) {
                allowance.remove(s.license.as_str());
            }
        } else if s.holders > allowed.map(|(n, _)| n).unwrap_or(total) {
            let last_change = h
                .admin
                .iter()
                .filter(|a| a.license == s.license && a.start_ms <= s.at_ms)
                .max_by_key(|a| a.start_ms);
            found.push(format!(
                "license {} at {} ms: {} holders of {} seats (no lowering of its seats explains it; its last change before: {:?})",
                s.license, s.at_ms, s.holders, total, last_change
            ));
        }
    }
    (samples.len(), found)
}

fn answered(h: &History, by_id: &BTreeMap<&str, Vec<&Received>>) -> (usize, Vec<String>) {
    let mut found = Vec::new();
    let mut reached: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in &h.sent {
        if let Some(entry) = &s.entry {
            reached.entry(&s.id).or_default().push(entry);
        }
    }
    for (id, entries) in &reached {
        if !by_id.contains_key(id) {
            found.push(format!(
                "request {id} (entries {}) was never answered",
                entries.join(", ")
            ));
        }
    }
    if h.pending_at_end > 0 {
        found.push(format!(
            "{} requests were still pending or unread in the group a minute after the faults healed ({})",
            h.pending_at_end,
            h.pending_where.join(", ")
        ));
    }
    (reached.len(), found)
}

/// The one documented repeat that differs (docs/protocol.md, the outbox):
/// a `GRANTED` delivered, then, re-delivered by the reaper after its seat
/// was revoked meanwhile, `SESSION_NOT_ACTIVE` saying the seat was taken
/// back. `later` must be that SESSION_NOT_ACTIVE (with its `error`), and a
/// `revoked` event of the session's held seat must lie between the
/// session's `granted` event and `later`; no GRANTED may follow it.
fn grant_taken_back(h: &History, first: &Received, later: &Received, after: &[&&Received]) -> bool {
    if first.get("status") != "GRANTED"
        || later.get("status") != "SESSION_NOT_ACTIVE"
        || !later
            .get("error")
            .contains("taken back before the grant was delivered")
        || after.iter().any(|r| r.get("status") == "GRANTED")
    {
        return false;
    }
    let (license, session, until) = (later.get("license"), later.get("session"), entry_ms(&later.entry));
    let of_session = |ty: &'static str| {
        h.events.iter().filter(move |e| {
            e.get("license") == license && e.get("session") == session && e.get("type") == ty
        })
    };
    let Some(granted) = of_session("granted").filter_map(|e| e.num("at_ms")).min() else {
        return false;
    };
    of_session("revoked")
        .filter(|e| e.get("held") == "1")
        .filter_map(|e| e.num("at_ms"))
        .any(|at| granted <= at && at <= until)
}

fn duplicates(h: &History, by_id: &BTreeMap<&str, Vec<&Received>>) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut found = Vec::new();
    for (id, replies) in by_id {
        let finals: Vec<&&Received> = replies.iter().filter(|r| r.get("status") != "QUEUED").collect();
        if finals.len() < 2 {
            continue;
        }
        n += 1;
        let first = finals[0];
        for (i, r) in finals.iter().enumerate().skip(1) {
            if grant_taken_back(h, first, r, &finals[i + 1..]) {
                continue;
            }
            let same_status = r.get("status") == first.get("status");
            let same_seats = seats_of(&r.fields) == seats_of(&first.fields);
            if !same_status || !same_seats {
                found.push(format!(
                    "request {id} answered {} seats {:?} (entry {}) and then {} seats {:?} (entry {})",
                    first.get("status"),
                    seats_of(&first.fields),
                    first.entry,
                    r.get("status"),
                    seats_of(&r.fields),
                    r.entry
                ));
            }
        }
    }
    (n, found)
}

/// The event type (and denial reason) a final reply status stands for.
fn event_of(status: &str) -> Option<(&'static str, &str)> {
    Some(match status {
        "ACQUIRED" => ("acquired", ""),
        "GRANTED" => ("granted", ""),
        "RELEASED" => ("released", ""),
        "LEFT_QUEUE" => ("left_queue", ""),
        "QUEUE_TIMEOUT" => ("queue_timeout", ""),
        "REVOKED" => ("revoked", ""),
        s if DENIALS.contains(&s) => ("denied", s),
        _ => return None,
    })
}

fn replies_events(h: &History, by_id: &BTreeMap<&str, Vec<&Received>>) -> (usize, Vec<String>) {
    // (license, session, type, reason) → request ids / event entries.
    type Key<'a> = (&'a str, &'a str, &'a str, &'a str);
    let mut from_replies: BTreeMap<Key, Vec<&str>> = BTreeMap::new();
    for (id, replies) in by_id {
        let mut seen = BTreeSet::new();
        for r in replies {
            if let Some((ty, reason)) = event_of(r.get("status")) {
                // One event per decision: a repeat of the same answer is no new one.
                if seen.insert(ty) {
                    from_replies
                        .entry((r.get("license"), r.get("session"), ty, reason))
                        .or_default()
                        .push(id);
                }
            }
        }
    }
    let mut from_events: BTreeMap<Key, Vec<&str>> = BTreeMap::new();
    for e in &h.events {
        let ty = e.get("type");
        if matches!(ty, "evicted" | "queued") {
            continue;
        }
        let reason = if ty == "denied" { e.get("reason") } else { "" };
        let ty = match ty {
            "acquired" => Some("acquired"),
            "granted" => Some("granted"),
            "released" => Some("released"),
            "left_queue" => Some("left_queue"),
            "queue_timeout" => Some("queue_timeout"),
            "revoked" => Some("revoked"),
            "denied" => Some("denied"),
            _ => None,
        };
        let Some(ty) = ty else { continue };
        from_events
            .entry((e.get("license"), e.get("session"), ty, reason))
            .or_default()
            .push(&e.entry);
    }
    // Denial sampling (events.denials_per_window): past the rate a denial
    // is no event of its own but folded into the `folded` count of the
    // license's next recorded `denied` (or of the reaper's aggregate one).
    // On a license where that happened, denials are counted, not matched:
    // denial replies = `denied` events + their `folded`, per license (the
    // aggregate, with no session and no reason, is only its `folded`).
    let mut folding: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for e in &h.events {
        if e.get("type") == "denied" && e.num("folded").unwrap_or(0) > 0 {
            folding.insert(e.get("license"), (0, 0));
        }
    }
    for e in &h.events {
        if e.get("type") == "denied" {
            if let Some(c) = folding.get_mut(e.get("license")) {
                let aggregate = e.get("session").is_empty() && e.get("reason").is_empty();
                c.1 += u64::from(!aggregate) + e.num("folded").unwrap_or(0);
            }
        }
    }
    let mut found = Vec::new();
    let keys: BTreeSet<&Key> = from_replies.keys().chain(from_events.keys()).collect();
    for k in &keys {
        if k.2 == "denied" {
            if let Some(c) = folding.get_mut(k.0) {
                c.0 += from_replies.get(k).map(Vec::len).unwrap_or(0) as u64;
                continue;
            }
        }
        let replies = from_replies.get(k).map(Vec::len).unwrap_or(0);
        let events = from_events.get(k).map(Vec::len).unwrap_or(0);
        if replies != events {
            let (license, session, ty, reason) = k;
            found.push(format!(
                "{license}/{session}: {replies} replies report {ty}{} (ids {:?}) but {events} `{ty}` events (entries {:?})",
                if reason.is_empty() { String::new() } else { format!(" {reason}") },
                from_replies.get(k).cloned().unwrap_or_default(),
                from_events.get(k).cloned().unwrap_or_default(),
            ));
        }
    }
    for (license, (replies, events)) in &folding {
        if replies != events {
            found.push(format!(
                "{license}: {replies} denial replies but {events} denials in the `denied` events (each one plus its `folded`)"
            ));
        }
    }
    (keys.len(), found)
}

/// Replays `ordered` events: the holders of each license after each event.
/// Calls `on_take` for each acquired/granted with the holders after it and
/// whether its session held already (a lingering seat taken back).
fn replay<'a>(
    ordered: &[&'a Event],
    mut on_take: impl FnMut(&'a Event, &BTreeSet<&'a str>, bool),
) -> BTreeMap<&'a str, BTreeSet<&'a str>> {
    let mut holders: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in ordered {
        let set = holders.entry(e.get("license")).or_default();
        let session = e.get("session");
        match e.get("type") {
            "acquired" | "granted" => {
                let was_holding = !set.insert(session);
                on_take(e, set, was_holding);
            }
            _ if ends_seat(e) => {
                set.remove(session);
            }
            _ => {}
        }
    }
    holders
}

/// Whether event `e` ends its session's seat: a release without linger, an
/// eviction (a linger's end too), a revocation of a held seat.
fn ends_seat(e: &Event) -> bool {
    match e.get("type") {
        "released" => !e.fields.contains_key("linger_ms"),
        "evicted" => true,
        "revoked" => e.get("held") == "1",
        _ => false,
    }
}

fn user_limit(h: &History, ordered: &[&Event]) -> (usize, Vec<String>) {
    let limits: HashMap<&str, u64> = h
        .licenses
        .iter()
        .filter_map(|l| Some((l.name.as_str(), l.max_per_user?)))
        .collect();
    let mut n = 0;
    let mut found = Vec::new();
    replay(ordered, |e, set, _| {
        let Some(&max) = limits.get(e.get("license")) else {
            return;
        };
        let Some(user) = h.users.get(e.get("session")) else {
            return;
        };
        n += 1;
        let same: Vec<&&str> = set.iter().filter(|s| h.users.get(**s) == Some(user)).collect();
        if same.len() as u64 > max {
            found.push(format!(
                "event {} {} of {}: user {user} now holds {} seats ({:?}), max_per_user {max}",
                e.entry,
                e.get("type"),
                e.get("license"),
                same.len(),
                same
            ));
        }
    });
    (n, found)
}

fn final_state(h: &History, ordered: &[&Event]) -> (usize, Vec<String>) {
    let mut found = Vec::new();
    let replayed = replay(ordered, |_, _, _| {});
    for (license, f) in &h.final_state {
        if !f.holders.is_empty() {
            found.push(format!(
                "license {license}: seats still held after the run quiesced and the reaper caught up: {:?}",
                f.holders
            ));
        }
        if !f.waiting.is_empty() {
            found.push(format!(
                "license {license}: sessions still queued at the end: {:?}",
                f.waiting
            ));
        }
        if f.outbox > 0 {
            found.push(format!(
                "license {license}: {} queue replies still in the outbox",
                f.outbox
            ));
        }
        if f.unrelayed > 0 {
            found.push(format!(
                "license {license}: {} events still in its own log, never relayed to its events shard",
                f.unrelayed
            ));
        }
        let from_events: Vec<&str> = replayed
            .get(license.as_str())
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let mut held: Vec<&str> = f.holders.iter().map(String::as_str).collect();
        held.sort();
        if from_events != held {
            found.push(format!(
                "license {license}: the events replayed leave {from_events:?} holding, Redis holds {held:?}"
            ));
        }
    }
    (h.final_state.len(), found)
}

/// A hold's life signs up to `until`: its start and the first XADD time of
/// each heartbeat answered HEARTBEAT_UPDATED (those were decided no earlier).
fn alive_times(hold: &Hold, until: u64) -> Vec<u64> {
    let mut t: Vec<u64> = std::iter::once(hold.start_ms)
        .chain(hold.heartbeats.iter().copied())
        .filter(|&t| t <= until)
        .collect();
    t.sort();
    t
}

fn fresh_holders(h: &History, by_id: &BTreeMap<&str, Vec<&Received>>) -> (usize, Vec<String>) {
    let mut found = Vec::new();
    let revoked: BTreeSet<(&str, &str)> = by_id
        .values()
        .flatten()
        .filter(|r| r.get("status") == "REVOKED")
        .map(|r| (r.get("license"), r.get("session")))
        .collect();
    let deleted = |license: &str, from: u64, to: u64| {
        h.admin.iter().any(|a| {
            a.license == license && a.what == AdminKind::Delete && a.start_ms <= to && a.end_ms + 2000 >= from
        })
    };
    // The service's own record of a seat ended for an administrator: a
    // revoke of the held seat or the license deleted, between `from` and
    // `to`. The administrator's record of when it acted can miss it: while
    // Redis is stopped its reply or its clock read times out, and the
    // command runs when Redis goes on.
    let ended_by_admin = |license: &str, session: &str, from: u64, to: u64| {
        h.events.iter().any(|e| {
            e.get("license") == license
                && e.get("session") == session
                && ((e.get("type") == "revoked" && e.get("held") != "0")
                    || (e.get("type") == "evicted" && e.get("reason") == "license_deleted"))
                && e.num("at_ms").is_some_and(|t| from <= t && t <= to)
        })
    };
    let mut n = 0;
    // A heartbeat (or release) told a holder its seat was gone.
    for hold in &h.holds {
        let HoldEnd::Lost(at, answered, status) = &hold.end else {
            continue;
        };
        n += 1;
        // An administrator's act up to the answer excuses it: the request
        // was decided somewhere between its XADD and its reply (a license
        // deleted while a slow worker had the heartbeat in hand).
        let excused = match status.as_str() {
            "SESSION_REVOKED" => {
                revoked.contains(&(hold.license.as_str(), hold.session.as_str()))
                    || ended_by_admin(&hold.license, &hold.session, hold.start_ms, *answered)
            }
            // A holder's acquire asked again (the seat no longer its own)
            // as a heartbeat's SESSION_NOT_ACTIVE.
            "SESSION_NOT_ACTIVE" | "SESSION_NOT_FOUND" | "ACQUIRED" | "QUEUED" | "NO_SEATS_AVAILABLE"
            | "LIMIT_REACHED" | "LICENSE_NOT_FOUND" | "LICENSE_INACTIVE" | "LICENSE_EXPIRED" => {
                deleted(&hold.license, hold.start_ms, *answered)
                    || revoked.contains(&(hold.license.as_str(), hold.session.as_str()))
                    || ended_by_admin(&hold.license, &hold.session, hold.start_ms, *answered)
            }
            _ => false,
        };
        if excused {
            continue;
        }
        let times = alive_times(hold, *at);
        let half = hold.timeout_ms / 2;
        let in_time =
            times.windows(2).all(|w| w[1] - w[0] <= half) && times.last().is_some_and(|&t| at - t <= half);
        if in_time {
            found.push(format!(
                "{}/{} (client {}) was answered {status} at {at} ms though it heartbeated in time (timeout {} ms; held since {}, heartbeats {:?})",
                hold.license, hold.session, hold.client, hold.timeout_ms, hold.start_ms, hold.heartbeats
            ));
        }
    }
    // An eviction for a stale heartbeat must come a whole timeout after
    // the last sign of life.
    let mut holds_of: HashMap<(&str, &str), Vec<&Hold>> = HashMap::new();
    for hold in &h.holds {
        holds_of
            .entry((hold.license.as_str(), hold.session.as_str()))
            .or_default()
            .push(hold);
    }
    for e in &h.events {
        if e.get("type") != "evicted" || e.get("reason") != "heartbeat_timeout" {
            continue;
        }
        let Some(at) = e.num("at_ms") else { continue };
        let Some(holds) = holds_of.get(&(e.get("license"), e.get("session"))) else {
            continue;
        };
        let Some(hold) = holds
            .iter()
            .filter(|h| h.start_ms <= at)
            .max_by_key(|h| h.start_ms)
        else {
            continue;
        };
        n += 1;
        let last = alive_times(hold, at).last().copied().unwrap_or(hold.start_ms);
        if at < last + hold.timeout_ms {
            found.push(format!(
                "event {}: {}/{} evicted (heartbeat_timeout) at {at} ms, {} ms after its last sign of life at {last} ms (timeout {} ms)",
                e.entry,
                e.get("license"),
                e.get("session"),
                at - last,
                hold.timeout_ms
            ));
        }
    }
    (n, found)
}

#[cfg(test)]
mod tests {
    //! Each rule on a small made-up history: it holds on a good one and
    //! names the break in a bad one (the mutation run, ops/mutate.sh, shows
    //! the same on real runs).

    use super::*;
    use crate::record::{AdminAction, Event, Hold, HoldEnd, Received, Sample, Sent};
    use seatgate::views::usage::{LicenseUsage, Share, Sources, UsageReport, Waits};

    fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn reply(entry: &str, pairs: &[(&str, &str)]) -> Received {
        Received {
            client: 0,
            entry: entry.to_owned(),
            fields: fields(pairs),
        }
    }

    fn event(entry: &str, pairs: &[(&str, &str)]) -> Event {
        Event {
            stream: "seat:events".into(),
            entry: entry.to_owned(),
            fields: fields(pairs),
        }
    }

    fn sent(id: &str, entry: &str) -> Sent {
        Sent {
            client: 0,
            id: id.into(),
            op: "acquire".into(),
            license: "L".into(),
            session: "s".into(),
            entry: Some(entry.into()),
            xadd_error: None,
            resend: false,
        }
    }

    /// One acquire of session `s` on `L`, answered ACQUIRED 1/2, its event.
    fn good() -> History {
        History {
            sent: vec![sent("a1", "1000-0")],
            received: vec![reply(
                "1001-0",
                &[
                    ("id", "a1"),
                    ("op", "acquire"),
                    ("status", "ACQUIRED"),
                    ("license", "L"),
                    ("session", "s"),
                    ("seats_used", "1"),
                    ("seats_total", "2"),
                ],
            )],
            events: vec![event(
                "1001-1",
                &[
                    ("type", "acquired"),
                    ("license", "L"),
                    ("session", "s"),
                    ("seats_used", "1"),
                    ("seats_total", "2"),
                    ("at_ms", "1001"),
                ],
            )],
            audit: Some(Ok(())),
            report: Some(Ok(report_of(1, 1, 1000))),
            ..History::default()
        }
    }

    /// `seatgate report`'s JSON for license `L` over 0..2001 ms: `holds`
    /// holds by user ada, `peak` seats at most, `seat_ms` of seat time.
    fn report_of(holds: u64, peak: i64, seat_ms: i64) -> UsageReport {
        UsageReport {
            since_ms: 0,
            until_ms: 2001,
            events: 1,
            first_event_ms: Some(1001),
            last_event_ms: Some(1001),
            sources: Sources::default(),
            licenses: vec![LicenseUsage {
                license: "L".into(),
                seats_total: 2,
                peak_seats: peak,
                peak_at_ms: Some(1001),
                seat_ms,
                seat_hours: 0.0,
                capacity_ms: 0,
                utilisation_pct: None,
                full_ms: 0,
                peaks_hourly: Vec::new(),
                peaks_daily: Vec::new(),
                denials: BTreeMap::new(),
                denials_total: 0,
                queue_waits: Waits {
                    count: 0,
                    p50_ms: None,
                    p95_ms: None,
                    max_ms: None,
                },
                queue_wait_ms: 0,
                queue_wait_full_ms: 0,
                users: vec![Share {
                    name: Some("ada".into()),
                    holds,
                    seat_ms,
                    seat_hours: 0.0,
                    denials: 0,
                }],
                groups: Vec::new(),
                unattributed_ms: 0,
                missing_events: 0,
            }],
        }
    }

    fn found(h: &History, check_name: &str) -> Vec<String> {
        super::check(h)
            .anomalies
            .into_iter()
            .filter(|a| a.check == check_name)
            .map(|a| a.detail)
            .collect()
    }

    #[test]
    fn a_good_history_has_no_anomaly() {
        let checked = super::check(&good());
        assert!(checked.anomalies.is_empty(), "{checked}");
        // The seat is still held in the replay: the final state (none
        // recorded here) is not judged.
    }

    #[test]
    fn a_seat_above_seats_total_is_found_in_replies_events_and_samples() {
        let mut h = good();
        h.received[0].fields.insert("seats_used".into(), "3".into());
        h.events[0].fields.insert("seats_used".into(), "3".into());
        h.samples.push(Sample {
            license: "L".into(),
            at_ms: 1002,
            holders: 3,
            seats_total: Some(2),
        });
        assert_eq!(found(&h, "seats_replies").len(), 1);
        assert_eq!(found(&h, "seats_events").len(), 1);
        assert_eq!(found(&h, "seats_samples").len(), 1);
        // After the seats were lowered from 3, three holders are allowed...
        h.admin.push(AdminAction {
            license: "L".into(),
            what: AdminKind::Seats { from: 3, to: 2 },
            start_ms: 1001,
            end_ms: 1001,
            ok: true,
        });
        assert!(found(&h, "seats_samples").is_empty());
        // ...until a sample showed them drained below the new count.
        h.samples.insert(
            0,
            Sample {
                license: "L".into(),
                at_ms: 1002,
                holders: 1,
                seats_total: Some(2),
            },
        );
        h.samples[1].at_ms = 1003;
        assert_eq!(found(&h, "seats_samples").len(), 1);
    }

    /// Events of session `s` of license `L`, numbered in order.
    fn takes(kinds: &[(&str, &[(&str, &str)])]) -> Vec<Event> {
        kinds
            .iter()
            .enumerate()
            .map(|(i, (kind, more))| {
                let (entry, seq) = (format!("{}-0", 1000 + i), (i + 1).to_string());
                let mut pairs = vec![
                    ("type", *kind),
                    ("license", "L"),
                    ("session", "s"),
                    ("seq", seq.as_str()),
                ];
                pairs.extend_from_slice(more);
                event(&entry, &pairs)
            })
            .collect()
    }

    #[test]
    fn a_seat_taken_twice_or_its_linger_broken_is_found() {
        let linger: &[(&str, &str)] = &[("linger_ms", "400")];
        let linger_ended: &[(&str, &str)] = &[("reason", "linger_ended")];
        let no_seats: &[(&str, &str)] = &[("reason", "NO_SEATS_AVAILABLE")];
        let mut h = good();
        // Released under linger_ms, taken back, released, granted again;
        // then lingering until the linger ends: all as it should be.
        h.events = takes(&[
            ("acquired", &[]),
            ("released", linger),
            ("acquired", &[]),
            ("released", &[]),
            ("granted", &[]),
            ("released", linger),
            ("evicted", linger_ended),
        ]);
        assert!(
            found(&h, "seat_takes").is_empty(),
            "{:?}",
            found(&h, "seat_takes")
        );
        // A live holder takes a second seat.
        h.events = takes(&[("acquired", &[]), ("acquired", &[])]);
        assert_eq!(found(&h, "seat_takes").len(), 1);
        // A lingering seat refused to its session, or its session queued.
        h.events = takes(&[("acquired", &[]), ("released", linger), ("denied", no_seats)]);
        assert_eq!(found(&h, "seat_takes").len(), 1);
        h.events = takes(&[("acquired", &[]), ("released", linger), ("queued", &[])]);
        assert_eq!(found(&h, "seat_takes").len(), 1);
        // A seat taken back whose linger ends under it all the same.
        h.events = takes(&[
            ("acquired", &[]),
            ("released", linger),
            ("acquired", &[]),
            ("evicted", linger_ended),
        ]);
        assert_eq!(found(&h, "seat_takes").len(), 1);
    }

    #[test]
    fn a_request_never_answered_is_found() {
        let mut h = good();
        h.sent.push(sent("a2", "1005-0"));
        assert_eq!(found(&h, "answered").len(), 1);
    }

    #[test]
    fn a_repeat_answered_otherwise_is_found() {
        let mut h = good();
        let mut again = h.received[0].clone();
        again.entry = "1010-0".into();
        again.fields.insert("status".into(), "ALREADY_ACTIVE".into());
        h.received.push(again);
        assert_eq!(found(&h, "duplicates").len(), 1);
    }

    #[test]
    fn a_lost_or_extra_event_is_found() {
        let mut h = good();
        h.events.clear();
        assert_eq!(found(&h, "replies_events").len(), 1);
        let mut h = good();
        let mut twice = h.events[0].clone();
        twice.entry = "1001-2".into();
        h.events.push(twice);
        assert_eq!(found(&h, "replies_events").len(), 1);
    }

    #[test]
    fn a_gap_or_a_repeat_in_seq_is_found() {
        let mut h = good();
        h.events[0].fields.insert("seq".into(), "1".into());
        assert!(found(&h, "event_seq").is_empty());
        let mut next = h.events[0].clone();
        next.entry = "1002-0".into();
        next.fields.insert("type".into(), "released".into());
        next.fields.insert("seq".into(), "3".into());
        h.events.push(next);
        let f = found(&h, "event_seq");
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("1 events lost"));
        h.events[1].fields.insert("seq".into(), "1".into());
        assert_eq!(found(&h, "event_seq").len(), 2, "a repeat, out of order too");
    }

    #[test]
    fn a_lingering_seat_ended_by_a_delete_or_revoke_is_no_take_back() {
        let ev = |seq: &str, at: &str, kind: &str, extra: &[(&str, &str)]| {
            let mut pairs = vec![
                ("type", kind),
                ("license", "L"),
                ("session", "s"),
                ("at_ms", at),
                ("seq", seq),
            ];
            pairs.extend_from_slice(extra);
            event(&format!("{at}-0"), &pairs)
        };
        let acquired = |entry: &str| {
            reply(
                entry,
                &[
                    ("id", "a2"),
                    ("status", "ACQUIRED"),
                    ("license", "L"),
                    ("session", "s"),
                ],
            )
        };
        let mut h = History {
            received: vec![reply(
                "1100-0",
                &[
                    ("id", "r1"),
                    ("status", "RELEASED"),
                    ("license", "L"),
                    ("session", "s"),
                    ("linger_ms", "5000"),
                ],
            )],
            events: vec![
                ev("1", "1000", "acquired", &[]),
                ev("2", "1100", "released", &[("linger_ms", "5000")]),
                ev("3", "2000", "acquired", &[]),
            ],
            ..History::default()
        };
        // Within the linger, nothing ended it: the same seat, taken back.
        assert!(takes_back(&h, &acquired("2001-0")));
        // The license deleted (or the session revoked) under the lingering
        // seat, then an acquire within what was the linger: a new seat.
        for (kind, extra) in [
            ("evicted", [("reason", "license_deleted")]),
            ("revoked", [("reason", "admin")]),
        ] {
            let mut h = h.clone();
            h.events[2] = ev("3", "1500", kind, &extra);
            h.events.push(ev("4", "2000", "acquired", &[]));
            assert!(!takes_back(&h, &acquired("2001-0")), "{kind}");
        }
        // Taken back, released without linger, acquired again: new.
        h.events.push(ev("4", "2500", "released", &[]));
        h.events.push(ev("5", "3000", "acquired", &[]));
        assert!(!takes_back(&h, &acquired("3001-0")));
    }

    #[test]
    fn a_seat_left_held_at_the_end_is_found() {
        let mut h = good();
        h.final_state.insert(
            "L".into(),
            crate::record::FinalLicense {
                holders: vec!["s".into()],
                exists: true,
                ..Default::default()
            },
        );
        let f = found(&h, "final_state");
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("still held"));
    }

    #[test]
    fn events_left_unrelayed_in_a_license_log_are_found() {
        let mut h = good();
        let mut f = crate::record::FinalLicense {
            holders: vec!["s".into()],
            exists: true,
            ..Default::default()
        };
        f.unrelayed = 2;
        h.final_state.insert("L".into(), f);
        let f = found(&h, "final_state");
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(
            f.iter().any(|a| a.contains("2 events still in its own log")),
            "{f:?}"
        );
    }

    /// A hold of session `s` of license `L` from 1001 ms under a 4 s
    /// timeout, with `heartbeats` and `end`.
    fn held_by_s(heartbeats: Vec<u64>, end: HoldEnd) -> Hold {
        Hold {
            client: 0,
            license: "L".into(),
            session: "s".into(),
            user: "ada".into(),
            start_ms: 1001,
            timeout_ms: 4000,
            heartbeats,
            end,
        }
    }

    /// Entry `entry`: session `s` of license `L` evicted for `reason` at `at_ms`.
    fn evicted_s(entry: &str, reason: &str, at_ms: &str) -> Event {
        event(
            entry,
            &[
                ("type", "evicted"),
                ("license", "L"),
                ("session", "s"),
                ("reason", reason),
                ("at_ms", at_ms),
            ],
        )
    }

    #[test]
    fn a_holder_evicted_before_its_timeout_is_found() {
        let mut h = good();
        h.holds.push(held_by_s(
            vec![2000, 3000],
            HoldEnd::Lost(4000, 4000, "SESSION_NOT_ACTIVE".into()),
        ));
        // Told its seat was gone though it heartbeated every second.
        assert_eq!(found(&h, "fresh_holders").len(), 1);
        // Unless the license was deleted meanwhile, as the events say, when
        // the administrator's own record of its delete missed it; an
        // eviction for a stale heartbeat excuses nothing.
        for (reason, excused) in [("license_deleted", true), ("heartbeat_timeout", false)] {
            let mut h = h.clone();
            h.events.push(evicted_s("3500-0", reason, "3500"));
            assert_eq!(found(&h, "fresh_holders").is_empty(), excused, "{reason}");
        }
        // The license deleted after the heartbeat's XADD (4000) but before
        // its answer (5000), which a slow worker decided after the delete
        // (the 30-minute run, seed 11): excused; after the answer, not.
        for (answered, excused) in [(5000, true), (4100, false)] {
            let mut h = h.clone();
            h.holds[0].end = HoldEnd::Lost(4000, answered, "SESSION_NOT_ACTIVE".into());
            h.events.push(evicted_s("4200-0", "license_deleted", "4200"));
            assert_eq!(
                found(&h, "fresh_holders").is_empty(),
                excused,
                "answered {answered}"
            );
        }
        // Evicted 2 s after its last heartbeat under a 4 s timeout.
        h.holds[0].end = HoldEnd::Unknown;
        h.events.push(evicted_s("5000-0", "heartbeat_timeout", "5000"));
        assert_eq!(found(&h, "fresh_holders").len(), 1);
        // A whole timeout after it: fine.
        h.events[1].fields.insert("at_ms".into(), "7001".into());
        assert!(found(&h, "fresh_holders").is_empty());
    }

    #[test]
    fn a_holder_asking_again_is_answered_its_own_seat_while_it_heartbeats_in_time() {
        // A holder that asks for its seat again (a restarted client) and is
        // given a new one, or none, though it heartbeated every second: its
        // seat was taken from it.
        for status in ["ACQUIRED", "NO_SEATS_AVAILABLE", "LIMIT_REACHED"] {
            let mut h = good();
            h.holds.push(held_by_s(
                vec![2000, 3000],
                HoldEnd::Lost(4000, 4000, status.into()),
            ));
            assert_eq!(found(&h, "fresh_holders").len(), 1, "{status}");
            // Unless an administrator ended the seat meanwhile.
            h.events.push(evicted_s("3500-0", "license_deleted", "3500"));
            assert!(found(&h, "fresh_holders").is_empty(), "{status}");
        }
        // After a silence longer than half the timeout: no finding.
        let mut h = good();
        h.holds.push(held_by_s(
            vec![1500],
            HoldEnd::Lost(6000, 6000, "ACQUIRED".into()),
        ));
        assert!(found(&h, "fresh_holders").is_empty());
    }

    #[test]
    fn an_audit_not_run_or_unclean_is_found() {
        let mut h = good();
        h.audit = None;
        assert_eq!(found(&h, "audit"), vec!["seatgate audit was not run".to_owned()]);
        h.audit = Some(Err("seatgate audit exited Some(1): 1 violation".into()));
        assert_eq!(found(&h, "audit").len(), 1);
    }

    #[test]
    fn a_report_that_disagrees_with_the_history_is_found() {
        let mut h = good();
        h.report = None;
        assert_eq!(found(&h, "report").len(), 1, "not run is no pass");
        // One hold more, a higher peak, a denial the replies never gave.
        let mut r = report_of(2, 2, 1000);
        r.licenses[0].denials.insert("NO_SEATS_AVAILABLE".into(), 1);
        h.report = Some(Ok(r));
        let f = found(&h, "report");
        assert_eq!(f.len(), 3, "{f:?}");
        // Seat time: held from 1001 to the report's end (2001), 1000 ms:
        // with no sample, anything from 0 to the events' most over that.
        h.report = Some(Ok(report_of(1, 1, 1000)));
        assert!(found(&h, "report").is_empty());
        h.report = Some(Ok(report_of(1, 1, 1100)));
        assert_eq!(found(&h, "report").len(), 1, "more seat time than possible");
        // Samples pin it: one holder from 1500 on (the 720-hour bug would
        // be far out, and so is half the time).
        h.samples = [1500, 1800, 2001]
            .into_iter()
            .map(|at_ms| Sample {
                license: "L".into(),
                at_ms,
                holders: 1,
                seats_total: Some(2),
            })
            .collect();
        h.report = Some(Ok(report_of(1, 1, 1000)));
        assert!(found(&h, "report").is_empty());
        h.report = Some(Ok(report_of(1, 1, 400)));
        assert_eq!(
            found(&h, "report").len(),
            1,
            "less seat time than the samples show"
        );
    }

    /// Denial `id` of session `session` on `L`: its reply, and its event
    /// when `folded` is given (the denials folded into it).
    fn denial(h: &mut History, id: &str, session: &str, at: u64, folded: Option<&str>) {
        let entry = format!("{at}-0");
        h.received.push(reply(
            &entry,
            &[
                ("id", id),
                ("op", "acquire"),
                ("status", "NO_SEATS_AVAILABLE"),
                ("license", "L"),
                ("session", session),
                ("seats_used", "2"),
                ("seats_total", "2"),
            ],
        ));
        if let Some(folded) = folded {
            h.events.push(event(
                &format!("{at}-1"),
                &[
                    ("type", "denied"),
                    ("license", "L"),
                    ("session", session),
                    ("reason", "NO_SEATS_AVAILABLE"),
                    ("seats_used", "2"),
                    ("seats_total", "2"),
                    ("at_ms", &at.to_string()),
                    ("folded", folded),
                ],
            ));
        }
    }

    #[test]
    fn folded_denials_count_as_denials_and_seat_changes_stay_one_to_one() {
        // Without folding, a denial with no event of its own is a lost event.
        let mut h = good();
        denial(&mut h, "d1", "s2", 1100, Some("0"));
        denial(&mut h, "d2", "s3", 1200, None);
        assert_eq!(found(&h, "replies_events").len(), 1);
        // Folded into the next recorded denial (another session's): fine.
        let mut h = good();
        denial(&mut h, "d1", "s2", 1100, Some("0"));
        denial(&mut h, "d2", "s3", 1200, None);
        denial(&mut h, "d3", "s4", 1300, Some("1"));
        let f = found(&h, "replies_events");
        assert!(f.is_empty(), "{f:?}");
        // Or into the reaper's aggregate after the window.
        let mut h = good();
        denial(&mut h, "d1", "s2", 1100, None);
        denial(&mut h, "d2", "s3", 1200, None);
        h.events.push(event(
            "5000-0",
            &[
                ("type", "denied"),
                ("license", "L"),
                ("at_ms", "5000"),
                ("folded", "2"),
            ],
        ));
        let f = found(&h, "replies_events");
        assert!(f.is_empty(), "{f:?}");
        // A count that does not add up: one folded too many.
        if let Some(e) = h.events.last_mut() {
            e.fields.insert("folded".into(), "3".into());
        }
        let f = found(&h, "replies_events");
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("2 denial replies but 3 denials"), "{f:?}");
        // Folding excuses no seat change: the acquire's event lost is found.
        h.events.retain(|e| e.get("type") != "acquired");
        assert_eq!(found(&h, "replies_events").len(), 2);
    }

    #[test]
    fn a_grant_then_taken_back_by_a_revoke_is_the_one_repeat_that_may_differ() {
        // s was granted at 1001 (GRANTED delivered), revoked at 1500, and the
        // reaper's re-delivery found the seat gone: SESSION_NOT_ACTIVE.
        let base = |revoked_at: Option<&str>, error: &str| {
            let mut h = good();
            let granted = [
                ("id", "a1"),
                ("op", "acquire"),
                ("status", "GRANTED"),
                ("license", "L"),
                ("session", "s"),
                ("seats_used", "1"),
                ("seats_total", "2"),
            ];
            h.received = vec![reply("1001-0", &granted)];
            h.events[0].fields.insert("type".into(), "granted".into());
            let mut again = reply("2000-0", &granted);
            again.fields.insert("status".into(), "SESSION_NOT_ACTIVE".into());
            again.fields.insert("seats_used".into(), "0".into());
            again.fields.insert("error".into(), error.into());
            h.received.push(again);
            if let Some(at) = revoked_at {
                h.events.push(event(
                    "1500-0",
                    &[
                        ("type", "revoked"),
                        ("license", "L"),
                        ("session", "s"),
                        ("held", "1"),
                        ("at_ms", at),
                    ],
                ));
            }
            h
        };
        const TAKEN_BACK: &str =
            "the seat granted to this waiter was taken back before the grant was delivered; acquire again";
        let f = found(&base(Some("1500"), TAKEN_BACK), "duplicates");
        assert!(f.is_empty(), "{f:?}");
        // Nothing broader: no revoke, a revoke after the reply, another error,
        // a GRANTED again after it, or ACQUIRED then SESSION_NOT_ACTIVE.
        assert_eq!(found(&base(None, TAKEN_BACK), "duplicates").len(), 1);
        assert_eq!(found(&base(Some("2500"), TAKEN_BACK), "duplicates").len(), 1);
        assert_eq!(found(&base(Some("1500"), "no seat"), "duplicates").len(), 1);
        let mut h = base(Some("1500"), TAKEN_BACK);
        let mut third = h.received[0].clone();
        third.entry = "2100-0".into();
        h.received.push(third);
        assert_eq!(found(&h, "duplicates").len(), 1);
        let mut h = base(Some("1500"), TAKEN_BACK);
        h.received[0].fields.insert("status".into(), "ACQUIRED".into());
        assert_eq!(found(&h, "duplicates").len(), 1);
    }
}
