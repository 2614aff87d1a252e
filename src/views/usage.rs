//! `seatgate report`: what each license was used for over a period, read
//! from the events stream (every shard): the peak of seats in use and when,
//! seat-hours, denials by reason, queue waits, and seat-hours per user.
//!
//! The events are read in `XRANGE` pages of bounded size over the period's
//! id range, so months of events cost bounded memory: what is kept is one
//! aggregate per license and per user of a license, the sessions holding a
//! seat, and a short reorder buffer (events are appended in roughly, not
//! exactly, the order they were decided; `at_ms` is that order). What the
//! events can and cannot tell is in docs/operations.md ("Usage reports").

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::Value;
use serde::Serialize;
use sketches_ddsketch::{Config as SketchConfig, DDSketch};

use super::printable;
use crate::config::Settings;
use crate::engine::events::{EventRecord, EventType, SeatChange};
use crate::engine::keys::{shard_name, shard_names};
use crate::error::Error;

/// Entries per `XRANGE` page: bounds what one reply holds in memory.
const PAGE: usize = 1000;
/// How far an event's stream id (the time it was appended) may lie from its
/// `at_ms` (the time it was decided): the id range read is widened by this,
/// and events are then kept or left by `at_ms`. On one node an id is never
/// earlier than its `at_ms`; on a cluster the events shard's clock may differ
/// a little from the license's.
const ID_SLACK_MS: i64 = 60_000;
/// Events are aggregated in `at_ms` order once the stream has been read this
/// far past them: a worker appends a decision's event within milliseconds,
/// a stalled one within seconds.
const REORDER_MS: i64 = 30_000;
/// Most events held for reordering; past it the oldest go on regardless.
const REORDER_CAP: usize = 100_000;
/// Queue waits kept exactly per license; past this many, a DDSketch (1%
/// relative error) takes over, so a license with millions of waits still
/// costs a few KiB.
const EXACT_WAITS: usize = 1024;
/// Most distinct denial reasons per license (the denial statuses are a
/// handful); any beyond are counted as `OTHER`.
const MAX_REASONS: usize = 32;

const HOUR_MS: f64 = 3_600_000.0;

/// A moment given on the command line: some time ago, or a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// This long before now (`7d`, `12h`), on the Redis clock.
    Ago(Duration),
    /// This time, unix ms (`2026-11-01`, `2026-11-01T08:00:00Z`, `1793491200000`).
    At(i64),
}

impl FromStr for When {
    type Err = String;

    fn from_str(s: &str) -> Result<When, String> {
        let s = s.trim();
        if let Ok(d) = humantime::parse_duration(s) {
            return Ok(When::Ago(d));
        }
        if let Ok(ms) = s.parse::<i64>() {
            return Ok(When::At(ms));
        }
        let text = if s.len() == 10 {
            format!("{s}T00:00:00Z")
        } else {
            s.to_owned()
        };
        humantime::parse_rfc3339_weak(&text)
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .map(When::At)
            .ok_or_else(|| {
                format!(
                    "{s:?}: use a duration ago (7d, 12h), a UTC date or time (2026-11-01, 2026-11-01T08:00:00Z) or unix ms"
                )
            })
    }
}

impl When {
    fn resolve(self, now_ms: i64) -> i64 {
        match self {
            When::Ago(d) => now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            When::At(ms) => ms,
        }
    }
}

/// What to report on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Only this license (only its events shard is read).
    pub license: Option<String>,
    /// Start of the period; `None` = `events.retention` ago, all there is.
    pub since: Option<When>,
    /// End of the period (exclusive); `None` = now. A later end is cut to now.
    pub until: Option<When>,
}

/// Usage over one period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageReport {
    /// Start of the period, unix ms (Redis clock).
    pub since_ms: i64,
    /// End of the period (exclusive), unix ms.
    pub until_ms: i64,
    /// Events of the period read.
    pub events: u64,
    /// The first event's time, if any: before it the period has no events
    /// (none happened, or they were trimmed by `events.retention`).
    pub first_event_ms: Option<i64>,
    /// The last event's time, if any.
    pub last_event_ms: Option<i64>,
    /// Every license with an event in the period, by id.
    pub licenses: Vec<LicenseUsage>,
}

/// One license's usage over the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LicenseUsage {
    /// License id.
    pub license: String,
    /// Its seats, as of its last event in the period.
    pub seats_total: i64,
    /// Most seats in use at once, as the events' `seats_used` show.
    pub peak_seats: i64,
    /// When that peak was first reached, unix ms.
    pub peak_at_ms: Option<i64>,
    /// Seats in use integrated over the period, seat-milliseconds (exact).
    pub seat_ms: i64,
    /// The same in seat-hours, rounded to 3 decimals.
    pub seat_hours: f64,
    /// Refusals by reason (wire status): `denied` events and waits that ran
    /// out (`QUEUE_TIMEOUT`).
    pub denials: BTreeMap<String, u64>,
    /// All of them.
    pub denials_total: u64,
    /// How long sessions waited in the queue, granted or timed out.
    pub queue_waits: Waits,
    /// Seat time per user (`meta.user_email`), most first.
    pub users: Vec<UserUsage>,
}

/// Queue wait figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waits {
    /// Waits that ended (a grant or a timeout).
    pub count: u64,
    /// Median wait, ms.
    pub p50_ms: Option<i64>,
    /// 95th percentile wait, ms.
    pub p95_ms: Option<i64>,
    /// Longest wait, ms.
    pub max_ms: Option<i64>,
}

/// One user's seat time on one license.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserUsage {
    /// `meta.user_email` of the sessions; `None` for sessions without one
    /// (or whose start the events do not show).
    pub user: Option<String>,
    /// Seats held (each acquire or grant; a hold running into the period counts too).
    pub sessions: u64,
    /// Seat time within the period, ms.
    pub seat_ms: i64,
    /// The same in hours, rounded to 3 decimals.
    pub seat_hours: f64,
}

/// Reads the events of the period and aggregates them.
pub async fn usage<C: ConnectionLike>(
    con: &mut C,
    settings: &Settings,
    query: &Query,
) -> Result<UsageReport, Error> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
    let now_ms = secs * 1000 + micros / 1000;
    let retention = i64::try_from(settings.events.retention.as_millis()).unwrap_or(i64::MAX);
    let since_ms = query
        .since
        .map_or(now_ms.saturating_sub(retention), |w| w.resolve(now_ms));
    let until_ms = query.until.map_or(now_ms, |w| w.resolve(now_ms)).min(now_ms);
    if since_ms >= until_ms {
        return Err(Error::Usage(format!(
            "the period is empty: --since ({}) is not before --until ({})",
            rfc3339(since_ms),
            rfc3339(until_ms)
        )));
    }
    let base = &settings.events.stream;
    let shards = settings.stream.shards;
    let streams = match &query.license {
        Some(l) => vec![shard_name(base, shards, l)],
        None => shard_names(base, shards),
    };
    let mut agg = Aggregate::new(since_ms, until_ms, query.license.clone());
    for stream in &streams {
        agg.read_shard(con, stream).await?;
    }
    let mut wanted: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for (license, session) in agg.leading.keys() {
        wanted
            .entry(shard_name(base, shards, license))
            .or_default()
            .push((license.clone(), session.clone()));
    }
    for (stream, sessions) in wanted {
        let found = look_back(con, &stream, since_ms, sessions).await?;
        agg.name_leading(found);
    }
    Ok(agg.finish())
}

/// One event in the reorder buffer, ordered by its decision time, then by
/// the order it was read.
struct Pending {
    at_ms: i64,
    seq: u64,
    record: EventRecord,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.seq) == (other.at_ms, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ms, self.seq).cmp(&(other.at_ms, other.seq))
    }
}

/// A session holding a seat, from `start_ms`.
struct Open {
    start_ms: i64,
    user: Option<String>,
}

/// One license's running figures.
#[derive(Default)]
struct LicenseAgg {
    seats_total: i64,
    peak: i64,
    peak_at: Option<i64>,
    /// Seats in use after the last event, and that event's time.
    level: i64,
    last_at: Option<i64>,
    first_at: Option<i64>,
    seat_ms: i64,
    /// Holds that an end event shows were held at the period's start.
    leading: i64,
    denials: BTreeMap<String, u64>,
    waits: Quantiles,
    users: HashMap<Option<String>, (u64, i64)>,
}

impl LicenseAgg {
    fn credit(&mut self, user: Option<String>, ms: i64) {
        let entry = self.users.entry(user).or_default();
        entry.0 += 1;
        entry.1 += ms.max(0);
    }
}

/// Everything kept while the streams are read.
struct Aggregate {
    since_ms: i64,
    until_ms: i64,
    only: Option<String>,
    events: u64,
    first_ms: Option<i64>,
    last_ms: Option<i64>,
    licenses: HashMap<String, LicenseAgg>,
    /// Sessions holding a seat, by (license, session).
    open: HashMap<(String, String), Open>,
    /// Holds whose end is in the period but whose start is not: counted from
    /// `since_ms`, their user looked up in the events before the period.
    leading: HashMap<(String, String), i64>,
    reorder: BinaryHeap<Reverse<Pending>>,
    seq: u64,
}

impl Aggregate {
    fn new(since_ms: i64, until_ms: i64, only: Option<String>) -> Aggregate {
        Aggregate {
            since_ms,
            until_ms,
            only,
            events: 0,
            first_ms: None,
            last_ms: None,
            licenses: HashMap::new(),
            open: HashMap::new(),
            leading: HashMap::new(),
            reorder: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Reads one events shard over the period, page by page.
    async fn read_shard<C: ConnectionLike>(&mut self, con: &mut C, stream: &str) -> Result<(), Error> {
        let mut start = self.since_ms.saturating_sub(ID_SLACK_MS).max(0).to_string();
        let end = self.until_ms.saturating_add(ID_SLACK_MS).to_string();
        loop {
            let page: Vec<(String, Vec<(String, Value)>)> = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&start)
                .arg(&end)
                .arg("COUNT")
                .arg(PAGE)
                .query_async(con)
                .await?;
            let Some((last_id, _)) = page.last() else { break };
            let last_id = last_id.clone();
            let read_to_ms = id_ms(&last_id);
            let full = page.len() == PAGE;
            for (_, fields) in &page {
                self.push(fields);
            }
            if let Some(ms) = read_to_ms {
                self.drain(Some(ms - REORDER_MS));
            }
            if !full {
                break;
            }
            start = format!("({last_id}");
        }
        self.drain(None);
        Ok(())
    }

    /// Takes an entry into the reorder buffer, if it belongs to the report.
    fn push(&mut self, fields: &[(String, Value)]) {
        let get = |name: &str| {
            fields.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
                Value::BulkString(b) => std::str::from_utf8(b).ok(),
                Value::SimpleString(s) => Some(s.as_str()),
                _ => None,
            })
        };
        let Some(record) = EventRecord::parse(get) else {
            return;
        };
        if record.at_ms < self.since_ms || record.at_ms >= self.until_ms {
            return;
        }
        if self.only.as_ref().is_some_and(|l| *l != record.license) {
            return;
        }
        self.seq += 1;
        self.reorder.push(Reverse(Pending {
            at_ms: record.at_ms,
            seq: self.seq,
            record,
        }));
    }

    /// Aggregates the buffered events decided before `horizon` (all of them
    /// when `None`), oldest first.
    fn drain(&mut self, horizon: Option<i64>) {
        while let Some(Reverse(top)) = self.reorder.peek() {
            let due = horizon.is_none_or(|h| top.at_ms < h) || self.reorder.len() > REORDER_CAP;
            if !due {
                break;
            }
            if let Some(Reverse(p)) = self.reorder.pop() {
                self.apply(p.record);
            }
        }
    }

    /// Aggregates one event, in `at_ms` order.
    fn apply(&mut self, e: EventRecord) {
        self.events += 1;
        self.first_ms = Some(self.first_ms.map_or(e.at_ms, |f| f.min(e.at_ms)));
        self.last_ms = Some(self.last_ms.map_or(e.at_ms, |l| l.max(e.at_ms)));
        let since = self.since_ms;
        // Looked up before inserting: no copy of the id per event.
        if !self.licenses.contains_key(&e.license) {
            self.licenses.insert(e.license.clone(), LicenseAgg::default());
        }
        let Some(lic) = self.licenses.get_mut(&e.license) else {
            return;
        };
        if e.seats_total > 0 {
            lic.seats_total = e.seats_total;
        }
        match lic.last_at {
            Some(last) => lic.seat_ms += lic.level * (e.at_ms - last).max(0),
            None => lic.first_at = Some(e.at_ms),
        }
        lic.level = e.seats_used;
        lic.last_at = Some(e.at_ms);
        if lic.peak_at.is_none() || e.seats_used > lic.peak {
            lic.peak = e.seats_used;
            lic.peak_at = Some(e.at_ms);
        }
        if let Some(reason) = e.denial() {
            let reason = if lic.denials.len() < MAX_REASONS || lic.denials.contains_key(reason) {
                reason
            } else {
                "OTHER"
            };
            *lic.denials.entry(reason.to_owned()).or_default() += 1;
        }
        if let (Some(EventType::Granted | EventType::QueueTimeout), Some(waited)) = (e.kind, e.waited_ms) {
            lic.waits.add(waited);
        }
        let change = e.seat_change();
        let key = (e.license, e.session);
        match change {
            Some(SeatChange::Taken) => {
                let start = Open {
                    start_ms: e.at_ms,
                    user: e.user,
                };
                // Its previous hold's end was lost (events are at most
                // once): that hold lasted until this one began at most.
                if let Some(prev) = self.open.insert(key, start) {
                    lic.credit(prev.user, e.at_ms - prev.start_ms);
                }
            }
            Some(SeatChange::Freed) => match self.open.remove(&key) {
                Some(open) => lic.credit(open.user, e.at_ms - open.start_ms),
                // Held since before the period, or its start event was
                // lost: the events before the period tell (`look_back`).
                None if !self.leading.contains_key(&key) => {
                    lic.leading += 1;
                    self.leading.insert(key, e.at_ms - since);
                }
                // A second end without a start: its start was lost too.
                None => {}
            },
            Some(SeatChange::Unchanged) | None => {}
        }
    }

    /// Settles the holds that seemed to run into the period with what the
    /// events before it show: a start credits the hold to its user; an end
    /// means the seat was free at the period's start and this hold's start
    /// event was lost, so it is not counted (its length is unknown).
    fn name_leading(&mut self, found: HashMap<(String, String), Before>) {
        for (key, before) in found {
            let (Some(ms), Some(lic)) = (self.leading.remove(&key), self.licenses.get_mut(&key.0)) else {
                continue;
            };
            match before {
                Before::Started(user) => lic.credit(user, ms),
                Before::Ended => lic.leading -= 1,
            }
        }
    }

    fn finish(mut self) -> UsageReport {
        let (since, until) = (self.since_ms, self.until_ms);
        // Holds whose start the look-back did not find.
        for ((license, _), ms) in self.leading.drain() {
            if let Some(lic) = self.licenses.get_mut(&license) {
                lic.credit(None, ms);
            }
        }
        // Still held at the end of the period.
        for ((license, _), open) in self.open.drain() {
            if let Some(lic) = self.licenses.get_mut(&license) {
                lic.credit(open.user, until - open.start_ms);
            }
        }
        let mut licenses: Vec<LicenseUsage> = self
            .licenses
            .into_iter()
            .map(|(license, mut lic)| {
                if let Some(last) = lic.last_at {
                    lic.seat_ms += lic.level * (until - last);
                }
                // Before its first event, the license held at least the seats
                // whose end events show they were held since the start.
                if let Some(first) = lic.first_at {
                    lic.seat_ms += lic.leading * (first - since);
                }
                let mut users: Vec<UserUsage> = lic
                    .users
                    .into_iter()
                    .map(|(user, (sessions, seat_ms))| UserUsage {
                        user,
                        sessions,
                        seat_ms,
                        seat_hours: hours(seat_ms),
                    })
                    .collect();
                users.sort_by(|a, b| b.seat_ms.cmp(&a.seat_ms).then_with(|| a.user.cmp(&b.user)));
                LicenseUsage {
                    license,
                    seats_total: lic.seats_total,
                    peak_seats: lic.peak,
                    peak_at_ms: lic.peak_at,
                    seat_ms: lic.seat_ms,
                    seat_hours: hours(lic.seat_ms),
                    denials_total: lic.denials.values().sum(),
                    denials: lic.denials,
                    queue_waits: lic.waits.summary(),
                    users,
                }
            })
            .collect();
        licenses.sort_by(|a, b| a.license.cmp(&b.license));
        UsageReport {
            since_ms: since,
            until_ms: until,
            events: self.events,
            first_event_ms: self.first_ms,
            last_event_ms: self.last_ms,
            licenses,
        }
    }
}

/// A session's latest seat event before the period.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Before {
    /// It took a seat (with this user): it held it into the period.
    Started(Option<String>),
    /// It gave its seat up: it held none when the period began.
    Ended,
}

/// Finds what each hold that seemed to run into the period was: reading
/// `stream` backwards from the period's start, the latest seat event of
/// each session before it. Stops once every session is found, or at the
/// oldest event kept (the sessions not found stay unknown: counted from the
/// period's start, without a user).
async fn look_back<C: ConnectionLike>(
    con: &mut C,
    stream: &str,
    since_ms: i64,
    sessions: Vec<(String, String)>,
) -> Result<HashMap<(String, String), Before>, Error> {
    let mut wanted: std::collections::HashSet<(String, String)> = sessions.into_iter().collect();
    let mut found = HashMap::new();
    let mut end = since_ms.saturating_add(ID_SLACK_MS).to_string();
    while !wanted.is_empty() {
        let page: Vec<(String, Vec<(String, Value)>)> = redis::cmd("XREVRANGE")
            .arg(stream)
            .arg(&end)
            .arg("-")
            .arg("COUNT")
            .arg(PAGE)
            .query_async(con)
            .await?;
        let Some((last_id, _)) = page.last() else { break };
        end = format!("({last_id}");
        let full = page.len() == PAGE;
        for (_, fields) in &page {
            let get = |name: &str| {
                fields.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
                    Value::BulkString(b) => std::str::from_utf8(b).ok(),
                    _ => None,
                })
            };
            let Some(e) = EventRecord::parse(get) else {
                continue;
            };
            if e.at_ms >= since_ms {
                continue;
            }
            let change = e.seat_change();
            let key = (e.license, e.session);
            let before = match change {
                Some(SeatChange::Taken) => Before::Started(e.user),
                Some(SeatChange::Freed) => Before::Ended,
                Some(SeatChange::Unchanged) | None => continue,
            };
            if wanted.remove(&key) {
                found.insert(key, before);
            }
        }
        if !full {
            break;
        }
    }
    Ok(found)
}

/// The millisecond part of a stream id.
fn id_ms(id: &str) -> Option<i64> {
    id.split('-').next()?.parse().ok()
}

fn hours(ms: i64) -> f64 {
    (ms as f64 / HOUR_MS * 1000.0).round() / 1000.0
}

/// Exact values up to [`EXACT_WAITS`], then a DDSketch: bounded memory per license.
#[derive(Default)]
struct Quantiles {
    exact: Vec<i64>,
    sketch: Option<DDSketch>,
    count: u64,
    max: Option<i64>,
}

impl Quantiles {
    fn add(&mut self, ms: i64) {
        let ms = ms.max(0);
        self.count += 1;
        self.max = Some(self.max.map_or(ms, |m| m.max(ms)));
        if let Some(sketch) = &mut self.sketch {
            sketch.add(ms as f64);
            return;
        }
        self.exact.push(ms);
        if self.exact.len() > EXACT_WAITS {
            // 1% relative error over 1 ms .. ~9 days in at most 1024 bins.
            let mut sketch = DDSketch::new(SketchConfig::new(0.01, 1024, 1.0));
            for v in self.exact.drain(..) {
                sketch.add(v as f64);
            }
            self.exact.shrink_to_fit();
            self.sketch = Some(sketch);
        }
    }

    /// The nearest-rank `q` quantile: the smallest value with at least `q`
    /// of all values at or below it.
    fn quantile(&self, sorted: &[i64], q: f64) -> Option<i64> {
        if let Some(sketch) = &self.sketch {
            return sketch.quantile(q).ok().flatten().map(|v| v.round() as i64);
        }
        let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
        sorted.get(rank - 1).copied()
    }

    fn summary(mut self) -> Waits {
        self.exact.sort_unstable();
        let sorted = std::mem::take(&mut self.exact);
        Waits {
            count: self.count,
            p50_ms: self.quantile(&sorted, 0.5),
            p95_ms: self.quantile(&sorted, 0.95),
            max_ms: self.max,
        }
    }
}

/// `ms` as an RFC 3339 UTC time with milliseconds.
fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// `1h02m`, `3m05s`, `42.5s`, `850ms`: a wait for people.
fn wait(ms: i64) -> String {
    let d = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    match ms {
        ..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

fn seats(n: i64) -> String {
    format!("{n} seat{}", if n == 1 { "" } else { "s" })
}

/// The terminal rendering; every value read from Redis goes through [`printable`].
pub fn render_table(report: &UsageReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "usage from {} to {}",
        rfc3339(report.since_ms),
        rfc3339(report.until_ms)
    );
    match (report.first_event_ms, report.last_event_ms) {
        (Some(first), Some(last)) => {
            let _ = writeln!(
                out,
                "{} events, the first at {}, the last at {}",
                report.events,
                rfc3339(first),
                rfc3339(last)
            );
        }
        _ => out.push_str("no events in this period\n"),
    }
    for l in &report.licenses {
        let _ = writeln!(
            out,
            "\nlicense {} ({})",
            printable(&l.license),
            seats(l.seats_total)
        );
        let peak_at = l.peak_at_ms.map(rfc3339).unwrap_or_default();
        let _ = writeln!(out, "  peak          {} at {peak_at}", seats(l.peak_seats));
        let _ = writeln!(out, "  seat-hours    {:.2}", l.seat_ms as f64 / HOUR_MS);
        let denials = if l.denials.is_empty() {
            "none".to_owned()
        } else {
            let each: Vec<String> = l
                .denials
                .iter()
                .map(|(reason, n)| format!("{} {n}", printable(reason)))
                .collect();
            format!("{} ({})", l.denials_total, each.join(", "))
        };
        let _ = writeln!(out, "  denials       {denials}");
        let w = &l.queue_waits;
        match (w.p50_ms, w.p95_ms, w.max_ms) {
            (Some(p50), Some(p95), Some(max)) => {
                let _ = writeln!(
                    out,
                    "  queue waits   {}  p50 {}  p95 {}  max {}",
                    w.count,
                    wait(p50),
                    wait(p95),
                    wait(max)
                );
            }
            _ => out.push_str("  queue waits   none\n"),
        }
        if !l.users.is_empty() {
            let _ = writeln!(out, "  {:<40} {:>10} {:>8}", "user", "seat-hours", "holds");
            for u in &l.users {
                let name = u.user.as_deref().map_or(Cow::Borrowed("(unknown)"), printable);
                let _ = writeln!(
                    out,
                    "  {:<40} {:>10.2} {:>8}",
                    name,
                    u.seat_ms as f64 / HOUR_MS,
                    u.sessions
                );
            }
        }
    }
    out
}

/// One row per figure, `license,metric,key,value`: a long table any
/// spreadsheet pivots. Times are RFC 3339, seat time in hours (3 decimals).
pub fn render_csv(report: &UsageReport) -> Result<String, Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut row = |license: &str, metric: &str, key: &str, value: String| {
        w.write_record([license, metric, key, value.as_str()])
    };
    // Written to memory: only a bug could make it fail.
    let csv_error = |e: csv::Error| Error::Io(std::io::Error::other(e));
    row("license", "metric", "key", "value".to_owned()).map_err(csv_error)?;
    for l in &report.licenses {
        let id = l.license.as_str();
        row(id, "seats_total", "", l.seats_total.to_string()).map_err(csv_error)?;
        row(id, "peak_seats", "", l.peak_seats.to_string()).map_err(csv_error)?;
        row(id, "peak_at", "", l.peak_at_ms.map(rfc3339).unwrap_or_default()).map_err(csv_error)?;
        row(id, "seat_hours", "", format!("{:.3}", l.seat_hours)).map_err(csv_error)?;
        for (reason, n) in &l.denials {
            row(id, "denials", reason, n.to_string()).map_err(csv_error)?;
        }
        let w = &l.queue_waits;
        row(id, "queue_waits", "count", w.count.to_string()).map_err(csv_error)?;
        let quantiles = [("p50_ms", w.p50_ms), ("p95_ms", w.p95_ms), ("max_ms", w.max_ms)];
        for (key, v) in quantiles.into_iter().filter_map(|(k, v)| Some((k, v?))) {
            row(id, "queue_waits", key, v.to_string()).map_err(csv_error)?;
        }
        for u in &l.users {
            let user = u.user.as_deref().unwrap_or("");
            row(id, "user_seat_hours", user, format!("{:.3}", u.seat_hours)).map_err(csv_error)?;
        }
    }
    let bytes = w.into_inner().map_err(|e| Error::Io(e.into_error()))?;
    String::from_utf8(bytes).map_err(|e| Error::Io(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::events::Event;

    const T0: i64 = 1_800_000_000_000;
    const MIN: i64 = 60_000;
    const HOUR: i64 = 60 * MIN;

    /// An event as the runtime writes it.
    fn event(kind: EventType, session: &'static str, seats_used: i64, at_ms: i64) -> Event<'static> {
        Event::new(kind, "acme", session, seats_used, 3, at_ms)
    }

    fn fields(event: &Event<'_>) -> Vec<(String, Value)> {
        event
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Value::BulkString(v.into_bytes())))
            .collect()
    }

    /// A morning of license `acme` (3 seats): three acquires, a denial, a
    /// queued user granted on a release, a wait that ran out, an eviction,
    /// a rate-limited request. Seats in use: 1 for 30m, 2 for 30m, 3 for
    /// 2h, 2 for 1h: 9.5 seat-hours over [T0, T0 + 4h).
    fn morning() -> Vec<Event<'static>> {
        let user = |mut e: Event<'static>, u: &str| {
            e.user = Some(u.to_owned());
            e
        };
        let reason = |mut e: Event<'static>, r: &'static str| {
            e.reason = Some(r);
            e
        };
        let waited = |mut e: Event<'static>, ms: i64| {
            e.waited_ms = Some(ms);
            e
        };
        vec![
            user(event(EventType::Acquired, "s-ann", 1, T0), "ann@example.com"),
            user(
                event(EventType::Acquired, "s-bob", 2, T0 + 30 * MIN),
                "bob@example.com",
            ),
            event(EventType::Acquired, "s-carl", 3, T0 + HOUR),
            reason(
                event(EventType::Denied, "s-dave", 3, T0 + HOUR + MIN),
                "NO_SEATS_AVAILABLE",
            ),
            event(EventType::Queued, "s-erin", 3, T0 + HOUR + 2 * MIN),
            event(EventType::Released, "s-ann", 3, T0 + 2 * HOUR),
            user(
                waited(event(EventType::Granted, "s-erin", 3, T0 + 2 * HOUR), 58 * MIN),
                "erin@example.com",
            ),
            waited(
                event(EventType::QueueTimeout, "s-frank", 3, T0 + 2 * HOUR + 5 * MIN),
                MIN,
            ),
            reason(
                event(EventType::Evicted, "s-bob", 2, T0 + 3 * HOUR),
                "heartbeat_timeout",
            ),
            reason(
                event(EventType::Denied, "s-gina", 2, T0 + 3 * HOUR + 30 * MIN),
                "RATE_LIMITED",
            ),
        ]
    }

    fn aggregate(since: i64, until: i64, events: &[Event<'_>]) -> UsageReport {
        let mut agg = Aggregate::new(since, until, None);
        for e in events {
            agg.push(&fields(e));
        }
        agg.drain(None);
        agg.finish()
    }

    fn user_ms(l: &LicenseUsage) -> Vec<(Option<&str>, u64, i64)> {
        l.users
            .iter()
            .map(|u| (u.user.as_deref(), u.sessions, u.seat_ms))
            .collect()
    }

    #[test]
    fn a_morning_adds_up() {
        let report = aggregate(T0, T0 + 4 * HOUR, &morning());
        assert_eq!(report.events, 10);
        assert_eq!(
            (report.first_event_ms, report.last_event_ms),
            (Some(T0), Some(T0 + 3 * HOUR + 30 * MIN))
        );
        let l = &report.licenses[0];
        assert_eq!((l.license.as_str(), l.seats_total), ("acme", 3));
        assert_eq!((l.peak_seats, l.peak_at_ms), (3, Some(T0 + HOUR)));
        assert_eq!((l.seat_ms, l.seat_hours), (9 * HOUR + 30 * MIN, 9.5));
        let denials: Vec<(&str, u64)> = l.denials.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        assert_eq!(
            denials,
            [
                ("NO_SEATS_AVAILABLE", 1),
                ("QUEUE_TIMEOUT", 1),
                ("RATE_LIMITED", 1)
            ]
        );
        assert_eq!(l.denials_total, 3);
        assert_eq!(
            l.queue_waits,
            Waits {
                count: 2,
                p50_ms: Some(MIN),
                p95_ms: Some(58 * MIN),
                max_ms: Some(58 * MIN),
            }
        );
        assert_eq!(
            user_ms(l),
            [
                (None, 1, 3 * HOUR),
                (Some("bob@example.com"), 1, 2 * HOUR + 30 * MIN),
                (Some("ann@example.com"), 1, 2 * HOUR),
                (Some("erin@example.com"), 1, 2 * HOUR),
            ]
        );
    }

    #[test]
    fn events_appended_out_of_order_count_in_decision_order() {
        let mut events = morning();
        events.swap(5, 6); // the grant appended before the release that freed its seat
        events.swap(2, 3); // carl's acquire appended after the denial decided after it
        let report = aggregate(T0, T0 + 4 * HOUR, &events);
        assert_eq!(report, aggregate(T0, T0 + 4 * HOUR, &morning()));
    }

    #[test]
    fn a_hold_running_into_the_period_counts_from_its_start() {
        // From T0 + 15m: ann's acquire is before the period, her release in it.
        let report = aggregate(T0 + 15 * MIN, T0 + 4 * HOUR, &morning());
        let l = &report.licenses[0];
        // 15m with ann's seat alone before the first event of the period, then
        // as before: 0.25 + 1 + 6 + 2 seat-hours.
        assert_eq!(l.seat_ms, 9 * HOUR + 15 * MIN);
        // Her user is found by the look-back (Redis); without it she is
        // unknown, beside carl, who has no user.
        assert_eq!(
            user_ms(l),
            [
                (None, 2, 3 * HOUR + HOUR + 45 * MIN),
                (Some("bob@example.com"), 1, 2 * HOUR + 30 * MIN),
                (Some("erin@example.com"), 1, 2 * HOUR),
            ]
        );
    }

    #[test]
    fn the_events_before_the_period_settle_the_holds_that_seemed_to_run_into_it() {
        let events = [
            event(EventType::Released, "s-ann", 1, T0 + HOUR),
            event(EventType::Released, "s-lost", 0, T0 + 2 * HOUR),
        ];
        let mut agg = Aggregate::new(T0, T0 + 4 * HOUR, None);
        for e in &events {
            agg.push(&fields(e));
        }
        agg.drain(None);
        let key = |s: &str| ("acme".to_owned(), s.to_owned());
        agg.name_leading(HashMap::from([
            (key("s-ann"), Before::Started(Some("ann@example.com".to_owned()))),
            // s-lost gave its seat up before the period: its start in the
            // period was lost, its length unknown.
            (key("s-lost"), Before::Ended),
        ]));
        let report = agg.finish();
        let l = &report.licenses[0];
        assert_eq!(user_ms(l), [(Some("ann@example.com"), 1, HOUR)]);
        // Ann's seat until her release at 1h; then the 1 seat that release
        // shows (s-lost's, whose start was lost) until 2h; then none.
        assert_eq!(l.seat_ms, HOUR + HOUR);
    }

    #[test]
    fn a_period_ending_early_cuts_the_holds_still_open() {
        let report = aggregate(T0, T0 + 90 * MIN, &morning());
        let l = &report.licenses[0];
        // 1 seat 30m, 2 seats 30m, 3 seats 30m (the denial and the queued at 3).
        assert_eq!(l.seat_ms, 3 * HOUR);
        assert_eq!(l.denials_total, 1);
        assert_eq!(l.queue_waits.count, 0);
        assert_eq!(
            user_ms(l),
            [
                (Some("ann@example.com"), 1, 90 * MIN),
                (Some("bob@example.com"), 1, HOUR),
                (None, 1, 30 * MIN),
            ]
        );
    }

    #[test]
    fn a_lost_release_ends_the_hold_at_the_sessions_next_acquire() {
        let events = [
            event(EventType::Acquired, "s1", 1, T0),
            event(EventType::Acquired, "s1", 1, T0 + HOUR),
            event(EventType::Released, "s1", 0, T0 + 2 * HOUR),
        ];
        let report = aggregate(T0, T0 + 4 * HOUR, &events);
        let l = &report.licenses[0];
        assert_eq!(user_ms(l), [(None, 2, 2 * HOUR)]);
        // The seats the events show: 1 from T0 to 2h.
        assert_eq!(l.seat_ms, 2 * HOUR);
    }

    #[test]
    fn foreign_entries_and_events_outside_the_period_are_left_out() {
        let mut agg = Aggregate::new(T0, T0 + HOUR, Some("acme".to_owned()));
        agg.push(&[("hello".to_owned(), Value::BulkString(b"world".to_vec()))]);
        agg.push(&fields(&event(EventType::Acquired, "early", 1, T0 - 1)));
        agg.push(&fields(&event(EventType::Acquired, "late", 1, T0 + HOUR)));
        agg.push(&fields(&Event::new(EventType::Acquired, "other", "s", 1, 1, T0)));
        agg.drain(None);
        let report = agg.finish();
        assert_eq!((report.events, report.licenses.len()), (0, 0));
    }

    #[test]
    fn waits_are_exact_up_to_a_bound_then_within_one_percent() {
        let mut q = Quantiles::default();
        for ms in [5, 1, 4, 2, 3] {
            q.add(ms);
        }
        assert_eq!(
            q.summary(),
            Waits {
                count: 5,
                p50_ms: Some(3),
                p95_ms: Some(5),
                max_ms: Some(5)
            }
        );
        let mut q = Quantiles::default();
        for ms in 1..=100_000 {
            q.add(ms);
        }
        assert!(q.exact.is_empty() && q.sketch.is_some(), "bounded");
        let w = q.summary();
        let near = |got: Option<i64>, want: f64| (got.unwrap() as f64 - want).abs() <= want * 0.011;
        assert!(near(w.p50_ms, 50_000.0), "{w:?}");
        assert!(near(w.p95_ms, 95_000.0), "{w:?}");
        assert_eq!((w.count, w.max_ms), (100_000, Some(100_000)));
    }

    #[test]
    fn moments_are_durations_ago_dates_times_or_unix_ms() {
        assert_eq!("7d".parse(), Ok(When::Ago(Duration::from_secs(7 * 86_400))));
        assert_eq!("2026-11-01".parse(), Ok(When::At(1_793_491_200_000)));
        assert_eq!("2026-11-01T08:00:00Z".parse(), Ok(When::At(1_793_520_000_000)));
        assert_eq!("1793491200000".parse(), Ok(When::At(1_793_491_200_000)));
        assert!("last tuesday".parse::<When>().is_err());
        assert_eq!(When::Ago(Duration::from_secs(60)).resolve(T0), T0 - MIN);
    }

    #[test]
    fn csv_rows_quote_what_needs_it_and_the_table_escapes_control_characters() {
        let mut events = morning();
        events[0].user = Some("ann, \"the admin\"".to_owned());
        events[1].user = Some("bob\u{1b}[2J".to_owned());
        let report = aggregate(T0, T0 + 4 * HOUR, &events);
        let csv = render_csv(&report).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "license,metric,key,value");
        for row in [
            "acme,seats_total,,3",
            "acme,peak_seats,,3",
            "acme,peak_at,,2027-01-15T09:00:00.000Z",
            "acme,seat_hours,,9.500",
            "acme,denials,NO_SEATS_AVAILABLE,1",
            "acme,queue_waits,count,2",
            "acme,queue_waits,p95_ms,3480000",
            "acme,user_seat_hours,,3.000",
            "acme,user_seat_hours,\"ann, \"\"the admin\"\"\",2.000",
        ] {
            assert!(lines.contains(&row), "{row} not in\n{csv}");
        }
        let table = render_table(&report);
        assert!(!table.contains('\u{1b}'), "{table}");
        assert!(table.contains("bob\\u{1b}[2J"), "{table}");
        assert!(table.contains("seat-hours    9.50"), "{table}");
        assert!(
            table.contains("peak          3 seats at 2027-01-15T09:00:00.000Z"),
            "{table}"
        );
        assert!(table.contains("p50 1m00s  p95 58m00s  max 58m00s"), "{table}");
    }
}
