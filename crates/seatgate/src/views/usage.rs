//! `seatgate report`: what each license was used for over a period, read
//! from the events stream (every shard) and, for whole days the events no
//! longer cover, from the daily rollups (`views::rollup`): seat time (exact,
//! from the seats each event shows in use), capacity and utilisation, time
//! at 100 %, the high-water mark of each hour and day, denials and queue
//! waits (the unmet demand), and seat time and denials per user and group.
//!
//! The events are read in `XRANGE` pages of bounded size over the period's
//! id range, so months of events cost bounded memory: what is kept is one
//! aggregate per license (its hours' peaks, its users and groups), the
//! sessions holding a seat or waiting, and a short reorder buffer (events
//! are appended in roughly, not exactly, the order they were decided;
//! `at_ms`, then the license's `seq`, is that order). How each figure is
//! computed is in docs/reports.md ("Usage reports").

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::fmt::Write as _;
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::Value;
use serde::{Deserialize, Serialize};
use sketches_ddsketch::{Config as SketchConfig, DDSketch};

use super::printable;
use crate::config::Settings;
use crate::error::Error;
use seatgate_core::events::{field, EventRecord, EventType, SeatChange};
use seatgate_core::keys::{shard_name, shard_names, Keys};

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
/// The denial "reason" of denials folded into a count past
/// `events.denials_per_window` (the `folded` field of a `denied` event).
const FOLDED: &str = "folded";

/// Most distinct denial reasons per license (the denial statuses are a
/// handful); any beyond are counted as `OTHER`.
const MAX_REASONS: usize = 32;
/// The per-license sequence number of the events contract (issue 22):
/// consecutive events of a license differ by exactly 1. Read here, beside
/// [`EventRecord`], so the report works on events with and without it.
const SEQ_FIELD: &str = "seq";
/// The user's group, on every event of a session whose license maps it
/// (the events contract); absent on older events.
const GROUP_FIELD: &str = "group";

/// The field of the `rollup_done` HASH (`keys::rollup_done`) holding the
/// last UTC day rolled up for every license (views::rollup writes it).
pub(crate) const DONE_DAY: &str = "day";

const HOUR_MS: f64 = 3_600_000.0;
/// An hour and a day, ms: the buckets of the peaks.
pub const HOUR: i64 = 3_600_000;
/// A UTC day, ms.
pub const DAY: i64 = 24 * HOUR;

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Where the figures come from.
    pub sources: Sources,
    /// Every license with an event (or a rollup) in the period, by id.
    pub licenses: Vec<LicenseUsage>,
}

/// Which part of the period the raw events cover and which the daily
/// rollups: the report says so, since a rollup's day has no queue wait
/// quantiles of its own (see [`Waits`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sources {
    /// The raw events cover the period from here on (the period's start
    /// when no rollup was used).
    pub events_from_ms: i64,
    /// UTC days (`2026-11-01`) taken from rollups, oldest first.
    pub rollup_days: Vec<String>,
}

/// One license's usage over the period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LicenseUsage {
    /// License id.
    pub license: String,
    /// Its seats, as of its last event in the period (before a deletion).
    pub seats_total: i64,
    /// Most seats in use at once, as the events' `seats_used` show.
    pub peak_seats: i64,
    /// When that peak was first reached, unix ms.
    pub peak_at_ms: Option<i64>,
    /// Seats in use integrated over the period, seat-ms: each event's
    /// `seats_used` until the license's next event (exact).
    pub seat_ms: i64,
    /// The same in seat-hours, rounded to 3 decimals.
    pub seat_hours: f64,
    /// The license's seats (`seats_total`) integrated over the period, seat-ms.
    pub capacity_ms: i64,
    /// `seat_ms` / `capacity_ms` in percent, 2 decimals; `None` without capacity.
    pub utilisation_pct: Option<f64>,
    /// Time with every seat in use (`seats_used` >= `seats_total` > 0), ms.
    pub full_ms: i64,
    /// The high-water mark of each UTC hour of the period with a seat in
    /// use, oldest first (an hour not listed had none).
    pub peaks_hourly: Vec<Peak>,
    /// The same per UTC day.
    pub peaks_daily: Vec<Peak>,
    /// Refusals by reason (wire status): `denied` events and waits that ran
    /// out (`QUEUE_TIMEOUT`).
    pub denials: BTreeMap<String, u64>,
    /// All of them.
    pub denials_total: u64,
    /// How long sessions waited in the queue, granted or timed out.
    pub queue_waits: Waits,
    /// Time spent waiting in the queue within the period, summed over the
    /// waiters, ms.
    pub queue_wait_ms: i64,
    /// Of that, the time while every seat was in use, ms.
    pub queue_wait_full_ms: i64,
    /// Seat time and denials per user (the events' `user`), most seat time first.
    pub users: Vec<Share>,
    /// The same per group (the events' `group`).
    pub groups: Vec<Share>,
    /// Seat time the events show in use but not whose: seats held through
    /// the whole period's first part with no event of their own in the
    /// period. `seat_ms` = the users' seat time + this; negative only when
    /// events were lost or duplicated.
    pub unattributed_ms: i64,
    /// Events of the license missing by its `seq` (a gap between two events
    /// read); 0 when the events carry no `seq`.
    pub missing_events: u64,
}

/// The most seats in use within an hour or a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peak {
    /// Start of the hour or day, unix ms.
    pub start_ms: i64,
    /// The high-water mark.
    pub seats: i64,
}

/// Queue wait figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waits {
    /// Waits that ended (a grant or a timeout).
    pub count: u64,
    /// Median wait, ms (of the waits in the raw events only: a rollup keeps
    /// no quantiles).
    pub p50_ms: Option<i64>,
    /// 95th percentile wait, ms (likewise).
    pub p95_ms: Option<i64>,
    /// Longest wait, ms.
    pub max_ms: Option<i64>,
}

/// One user's or group's part of a license.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Share {
    /// The user or group; `None` for sessions without one.
    pub name: Option<String>,
    /// Seats held (each acquire or grant; a hold running into the period
    /// counts too; a lingering seat taken back does not count again).
    pub holds: u64,
    /// Seat time within the period, ms (a lingering seat's linger included).
    pub seat_ms: i64,
    /// The same in hours, rounded to 3 decimals.
    pub seat_hours: f64,
    /// Refusals (`denied`, `queue_timeout`).
    pub denials: u64,
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
    let license = query.license.as_deref();
    let keys = Keys::new(settings.keys.prefix.clone());
    // Whole days of the period that the raw events no longer cover from
    // their start and that have been rolled up: from their rollups.
    let raw_from = oldest_event_ms(con, settings, license).await?.unwrap_or(until_ms);
    let done = done_day(con, &keys).await?;
    let mut days = Vec::new();
    let mut day = (since_ms + DAY - 1).div_euclid(DAY) * DAY;
    while day + DAY <= until_ms && day < raw_from && done.is_some_and(|d| day <= d) {
        days.push(day);
        day += DAY;
    }
    let (Some(&first_day), Some(&last_day)) = (days.first(), days.last()) else {
        return events_report(con, settings, license, (since_ms, until_ms), Vec::new()).await;
    };
    let rolled = read_days(con, &keys, license, &days).await?;
    let before = match since_ms < first_day {
        true => Some(events_report(con, settings, license, (since_ms, first_day), Vec::new()).await?),
        false => None,
    };
    let raw_since = last_day + DAY;
    let after = match raw_since < until_ms {
        true => {
            // What was held as the last rolled-up day ended: the raw events
            // go on from there (their own look-back finds nothing older).
            let mut seeds = Vec::new();
            for (id, _) in &rolled {
                // HMGET: the read-only dashboard user has it, not HGET.
                let raw: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(keys.rollup(id))
                    .arg(carry_field(last_day))
                    .query_async(con)
                    .await?;
                let record = raw.into_iter().flatten().next();
                if let Some(record) = record.and_then(|r| serde_json::from_str::<CarryRecord>(&r).ok()) {
                    seeds.push((id.clone(), record.carry));
                }
            }
            Some(events_report(con, settings, license, (raw_since, until_ms), seeds).await?)
        }
        false => None,
    };
    let sources = Sources {
        events_from_ms: raw_since,
        rollup_days: days.iter().map(|d| date(*d)).collect(),
    };
    Ok(merge(since_ms, until_ms, sources, [before, after], rolled))
}

/// The rollups of `days` (unix ms of their starts) of `license`, or of every
/// license with rollups, by license: each day's figures, oldest first.
async fn read_days<C: ConnectionLike>(
    con: &mut C,
    keys: &Keys,
    license: Option<&str>,
    days: &[i64],
) -> Result<Vec<(String, Vec<LicenseUsage>)>, Error> {
    let licenses: Vec<String> = match license {
        Some(l) => vec![l.to_owned()],
        None => {
            let index: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(keys.rollup_index())
                .query_async(con)
                .await?;
            let mut ids: Vec<String> = index.into_keys().collect();
            ids.sort();
            ids
        }
    };
    let fields: Vec<String> = days.iter().map(|d| date(*d)).collect();
    let mut out = Vec::new();
    if fields.is_empty() {
        return Ok(out);
    }
    for license in licenses {
        let raw: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(keys.rollup(&license))
            .arg(&fields)
            .query_async(con)
            .await?;
        let parts: Vec<LicenseUsage> = raw
            .into_iter()
            .flatten()
            .filter_map(|r| serde_json::from_str(&r).ok())
            .collect();
        if !parts.is_empty() {
            out.push((license, parts));
        }
    }
    Ok(out)
}

/// The last day rolled up for every license (unix ms of its start), if any.
async fn done_day<C: ConnectionLike>(con: &mut C, keys: &Keys) -> Result<Option<i64>, Error> {
    let done: Vec<Option<i64>> = redis::cmd("HMGET")
        .arg(keys.rollup_done())
        .arg(DONE_DAY)
        .query_async(con)
        .await?;
    Ok(done.into_iter().next().flatten())
}

/// The time of the oldest event kept on the shards a report reads (the raw
/// events cover the time from there on), if any.
async fn oldest_event_ms<C: ConnectionLike>(
    con: &mut C,
    settings: &Settings,
    license: Option<&str>,
) -> Result<Option<i64>, Error> {
    let base = &settings.events.stream;
    let streams = match license {
        Some(l) => vec![shard_name(base, settings.events_shards(), l)],
        None => shard_names(base, settings.events_shards()),
    };
    let mut oldest: Option<i64> = None;
    for stream in streams {
        let first: Vec<(String, Vec<(String, Value)>)> = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query_async(con)
            .await?;
        if let Some(ms) = first.first().and_then(|(id, _)| id_ms(id)) {
            oldest = Some(oldest.map_or(ms, |o| o.min(ms)));
        }
    }
    Ok(oldest)
}

/// One report of the period from reports of its raw-event parts and the
/// rollups of its whole days (per license, a day's figures each). Sums add
/// up, peaks are the highest, shares merge by name; the queue wait
/// quantiles are the raw events' (a rollup keeps its day's, which do not
/// combine), the count and the longest wait cover every part.
fn merge(
    since_ms: i64,
    until_ms: i64,
    sources: Sources,
    [before, after]: [Option<UsageReport>; 2],
    rolled: Vec<(String, Vec<LicenseUsage>)>,
) -> UsageReport {
    let mut out = UsageReport {
        since_ms,
        until_ms,
        events: 0,
        first_event_ms: None,
        last_event_ms: None,
        sources,
        licenses: Vec::new(),
    };
    let mut by_license: BTreeMap<String, LicenseUsage> = BTreeMap::new();
    let mut add = |mut part: LicenseUsage, from_events: bool| match by_license.get_mut(&part.license) {
        Some(into) => add_usage(into, part, from_events),
        None => {
            if !from_events {
                part.queue_waits.p50_ms = None;
                part.queue_waits.p95_ms = None;
            }
            by_license.insert(part.license.clone(), part);
        }
    };
    // Oldest first: the time before the rollups' days, the days, the rest.
    let mut raw_part = |r: Option<UsageReport>, add: &mut dyn FnMut(LicenseUsage, bool)| {
        let Some(r) = r else { return };
        out.events += r.events;
        out.first_event_ms = min_some(out.first_event_ms, r.first_event_ms);
        out.last_event_ms = out.last_event_ms.max(r.last_event_ms);
        for l in r.licenses {
            add(l, true);
        }
    };
    raw_part(before, &mut add);
    for (_, days) in rolled {
        for l in days {
            add(l, false);
        }
    }
    raw_part(after, &mut add);
    out.licenses = by_license.into_values().collect();
    out
}

fn min_some(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Adds the figures of `part`, which follows `into` in time.
fn add_usage(into: &mut LicenseUsage, part: LicenseUsage, from_events: bool) {
    if part.seats_total > 0 {
        into.seats_total = part.seats_total;
    }
    if part.peak_seats > into.peak_seats || into.peak_at_ms.is_none() {
        into.peak_seats = part.peak_seats;
        into.peak_at_ms = part.peak_at_ms;
    }
    into.seat_ms += part.seat_ms;
    into.seat_hours = hours(into.seat_ms);
    into.capacity_ms += part.capacity_ms;
    into.utilisation_pct = utilisation(into.seat_ms, into.capacity_ms);
    into.full_ms += part.full_ms;
    let mut hourly: BTreeMap<i64, i64> = into.peaks_hourly.iter().map(|p| (p.start_ms, p.seats)).collect();
    for p in part.peaks_hourly {
        let peak = hourly.entry(p.start_ms).or_insert(p.seats);
        *peak = (*peak).max(p.seats);
    }
    into.peaks_hourly = hourly
        .into_iter()
        .map(|(start_ms, seats)| Peak { start_ms, seats })
        .collect();
    into.peaks_daily = daily(&into.peaks_hourly);
    for (reason, n) in part.denials {
        *into.denials.entry(reason).or_default() += n;
    }
    into.denials_total += part.denials_total;
    let (w, p) = (&mut into.queue_waits, part.queue_waits);
    if from_events && p.count > 0 {
        w.p50_ms = p.p50_ms;
        w.p95_ms = p.p95_ms;
    }
    w.count += p.count;
    w.max_ms = w.max_ms.max(p.max_ms);
    into.queue_wait_ms += part.queue_wait_ms;
    into.queue_wait_full_ms += part.queue_wait_full_ms;
    into.users = merge_shares(std::mem::take(&mut into.users), part.users);
    into.groups = merge_shares(std::mem::take(&mut into.groups), part.groups);
    into.unattributed_ms += part.unattributed_ms;
    into.missing_events += part.missing_events;
}

fn merge_shares(a: Vec<Share>, b: Vec<Share>) -> Vec<Share> {
    let mut tallies: HashMap<Option<String>, Tally> = HashMap::new();
    for s in a.into_iter().chain(b) {
        let t = tallies.entry(s.name).or_default();
        t.holds += s.holds;
        t.seat_ms += s.seat_ms;
        t.denials += s.denials;
    }
    shares(tallies)
}

/// The report of [`since_ms`, `until_ms`) from the raw events alone.
pub(crate) async fn events_report<C: ConnectionLike>(
    con: &mut C,
    settings: &Settings,
    license: Option<&str>,
    (since_ms, until_ms): (i64, i64),
    seeds: Vec<(String, Carry)>,
) -> Result<UsageReport, Error> {
    let base = &settings.events.stream;
    let shards = settings.events_shards();
    let streams = match license {
        Some(l) => vec![shard_name(base, shards, l)],
        None => shard_names(base, shards),
    };
    let mut agg = Aggregate::new(since_ms, until_ms, license.map(str::to_owned));
    for (license, carry) in seeds {
        agg.seed(&license, carry);
    }
    for stream in &streams {
        agg.read_shard(con, stream).await?;
    }
    agg.end_period();
    agg.settle_leading(con, settings).await?;
    Ok(agg.finish())
}

/// One event as the report reads it: the record, and what the events
/// contract adds to it.
#[derive(Debug, Clone)]
struct Read {
    record: EventRecord,
    /// The license's sequence number, when the event carries one.
    seq: Option<u64>,
    /// The session's group, when the event carries one.
    group: Option<String>,
    /// A `released` seat lingers this long (0: it was freed).
    linger_ms: i64,
}

impl Read {
    fn parse(fields: &[(String, Value)]) -> Option<Read> {
        let get = |name: &str| {
            fields.iter().find(|(k, _)| k == name).and_then(|(_, v)| match v {
                Value::BulkString(b) => std::str::from_utf8(b).ok(),
                Value::SimpleString(s) => Some(s.as_str()),
                _ => None,
            })
        };
        let record = EventRecord::parse(get)?;
        Some(Read {
            record,
            seq: get(SEQ_FIELD).and_then(|s| s.parse().ok()),
            group: get(GROUP_FIELD).filter(|g| !g.is_empty()).map(str::to_owned),
            linger_ms: get(field::LINGER_MS).and_then(|s| s.parse().ok()).unwrap_or(0),
        })
    }

    /// What the event did to its session's seat, given whether the session
    /// holds one (`open`): a release under linger keeps the seat in use
    /// (it ends with the `linger_ended` eviction); a lingering seat taken
    /// back stays the same hold.
    fn change(&self) -> Option<SeatChange> {
        match self.record.seat_change()? {
            SeatChange::Freed if self.record.kind == Some(EventType::Released) && self.linger_ms > 0 => {
                Some(SeatChange::Unchanged)
            }
            change => Some(change),
        }
    }

    /// Whether this event ends the session's wait in the queue.
    fn ends_wait(&self) -> bool {
        match self.record.kind {
            Some(EventType::Granted | EventType::QueueTimeout | EventType::LeftQueue) => true,
            Some(EventType::Revoked) => self.record.held == Some(false),
            // A waiter's final refusal (its license deleted) carries its wait.
            Some(EventType::Denied) => self.record.waited_ms.is_some(),
            _ => false,
        }
    }

    /// Seats in use just before this event, as far as the event alone tells
    /// (the first event of a license in the period: no session state yet).
    fn seats_before(&self) -> i64 {
        let e = &self.record;
        let delta = match (self.change(), e.kind) {
            // Every seat of a deleted license ends at once, each event
            // showing none left: one of them at least was held before.
            (_, Some(EventType::Evicted)) if e.seats_used == 0 => 1,
            (Some(SeatChange::Taken), _) => 1,
            (Some(SeatChange::Freed), _) => -1,
            _ => 0,
        };
        (e.seats_used - delta).max(0)
    }
}

/// One event in the reorder buffer, ordered by its decision time, then by
/// its license's sequence number, then by the order it was read.
struct Pending {
    at_ms: i64,
    seq: u64,
    read_order: u64,
    read: Read,
}

impl Pending {
    fn key(&self) -> (i64, u64, u64) {
        (self.at_ms, self.seq, self.read_order)
    }
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
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
        self.key().cmp(&other.key())
    }
}

/// A session holding a seat, from `start_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Open {
    /// Since when (the period's start for a hold running into it).
    pub start_ms: i64,
    /// Its user, when known.
    pub user: Option<String>,
    /// Its group, when known.
    pub group: Option<String>,
    /// Released under linger: still held until the linger ends.
    pub lingering: bool,
    /// Held since before the period: its start is not in it.
    pub from_before: bool,
}

/// A hold that ran into the period, ended in it, whose user the events of
/// the period do not name: the events before the period do.
struct Leading {
    ms: i64,
    group: Option<String>,
}

/// A user's or group's running figures.
#[derive(Default, Clone, Copy)]
struct Tally {
    holds: u64,
    seat_ms: i64,
    denials: u64,
}

/// One license's running figures.
#[derive(Default)]
struct LicenseAgg {
    /// Last non-zero `seats_total` (a deletion's events carry 0).
    seats_total: i64,
    /// `seats_total` after the last event (the capacity from then on).
    total: i64,
    peak: i64,
    peak_at: Option<i64>,
    /// Seats in use after the last event, and the time integrated up to.
    level: i64,
    last_at: Option<i64>,
    /// The first event's time, and the seats in use before it.
    first_at: Option<i64>,
    level_before: i64,
    seat_ms: i64,
    capacity_ms: i64,
    full_ms: i64,
    /// High-water mark per hour start.
    hourly: BTreeMap<i64, i64>,
    /// Sessions waiting (queued in the period), and the time integrated.
    waiting: i64,
    wait_ms: i64,
    wait_full_ms: i64,
    /// Holds that ran into the period (ended or still held at its end).
    leading_holds: i64,
    last_seq: Option<u64>,
    missing: u64,
    denials: BTreeMap<String, u64>,
    waits: Quantiles,
    users: HashMap<Option<String>, Tally>,
    groups: HashMap<Option<String>, Tally>,
}

impl LicenseAgg {
    /// Integrates the seats in use, the capacity and the waiters from the
    /// last event up to `to`, and raises the high-water marks of the hours
    /// on the way.
    fn advance(&mut self, to: i64) {
        let Some(from) = self.last_at else { return };
        if to <= from {
            return;
        }
        let dt = to - from;
        self.seat_ms += self.level * dt;
        self.capacity_ms += self.total * dt;
        let full = self.total > 0 && self.level >= self.total;
        if full {
            self.full_ms += dt;
            self.wait_full_ms += self.waiting * dt;
        }
        self.wait_ms += self.waiting * dt;
        let mut hour = from.div_euclid(HOUR) * HOUR;
        while hour < to && self.level > 0 {
            self.mark_hour(hour, self.level);
            hour += HOUR;
        }
        self.last_at = Some(to);
    }

    /// Raises hour `hour`'s high-water mark to `seats`. Hours with no seat
    /// in use are left out (their mark is 0): a period of years over an idle
    /// license costs nothing.
    fn mark_hour(&mut self, hour: i64, seats: i64) {
        if seats <= 0 {
            return;
        }
        let peak = self.hourly.entry(hour).or_insert(seats);
        *peak = (*peak).max(seats);
    }

    fn mark_peak(&mut self, at: i64, seats: i64) {
        if self.peak_at.is_none() || seats > self.peak {
            self.peak = seats;
            self.peak_at = Some(at);
        }
        self.mark_hour(at.div_euclid(HOUR) * HOUR, seats);
    }

    /// Credits `ms` of seat time of one hold to its user and group.
    fn credit(&mut self, user: Option<String>, group: Option<String>, ms: i64) {
        let ms = ms.max(0);
        let u = self.users.entry(user).or_default();
        u.holds += 1;
        u.seat_ms += ms;
        let g = self.groups.entry(group).or_default();
        g.holds += 1;
        g.seat_ms += ms;
    }

    fn deny(&mut self, user: Option<String>, group: Option<String>, n: u64) {
        self.users.entry(user).or_default().denials += n;
        self.groups.entry(group).or_default().denials += n;
    }
}

/// Everything kept while the streams are read.
pub(crate) struct Aggregate {
    since_ms: i64,
    until_ms: i64,
    only: Option<String>,
    events: u64,
    first_ms: Option<i64>,
    last_ms: Option<i64>,
    licenses: HashMap<String, LicenseAgg>,
    /// Sessions holding a seat, by (license, session).
    open: HashMap<(String, String), Open>,
    /// Sessions waiting in a queue, by (license, session).
    waiting: HashSet<(String, String)>,
    /// Holds that ran into the period and ended in it, their user to be
    /// found in the events before it (`look_back`).
    leading: HashMap<(String, String), Leading>,
    reorder: BinaryHeap<Reverse<Pending>>,
    read_order: u64,
}

impl Aggregate {
    pub(crate) fn new(since_ms: i64, until_ms: i64, only: Option<String>) -> Aggregate {
        Aggregate {
            since_ms,
            until_ms,
            only,
            events: 0,
            first_ms: None,
            last_ms: None,
            licenses: HashMap::new(),
            open: HashMap::new(),
            waiting: HashSet::new(),
            leading: HashMap::new(),
            reorder: BinaryHeap::new(),
            read_order: 0,
        }
    }

    /// Reads one events shard over the period, page by page.
    pub(crate) async fn read_shard<C: ConnectionLike>(
        &mut self,
        con: &mut C,
        stream: &str,
    ) -> Result<(), Error> {
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
        let Some(read) = Read::parse(fields) else {
            return;
        };
        let at_ms = read.record.at_ms;
        if at_ms < self.since_ms || at_ms >= self.until_ms {
            return;
        }
        if self.only.as_ref().is_some_and(|l| *l != read.record.license) {
            return;
        }
        self.read_order += 1;
        self.reorder.push(Reverse(Pending {
            at_ms,
            seq: read.seq.unwrap_or(0),
            read_order: self.read_order,
            read,
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
                self.apply(p.read);
            }
        }
    }

    /// Starts a license from what was known at the period's start (a
    /// rollup's carry): its seats in use and capacity, the sessions holding
    /// a seat and those waiting. Called before any event is applied.
    pub(crate) fn seed(&mut self, license: &str, carry: Carry) {
        let lic = self.licenses.entry(license.to_owned()).or_default();
        lic.level = carry.level;
        lic.level_before = carry.level;
        lic.total = carry.total;
        lic.seats_total = carry.total;
        lic.last_seq = carry.seq;
        lic.last_at = Some(self.since_ms);
        lic.first_at = Some(self.since_ms);
        lic.mark_peak(self.since_ms, carry.level);
        lic.waiting = i64::try_from(carry.waiting.len()).unwrap_or(i64::MAX);
        for (session, mut open) in carry.open {
            open.start_ms = self.since_ms;
            open.from_before = true;
            lic.leading_holds += 1;
            self.open.insert((license.to_owned(), session), open);
        }
        for session in carry.waiting {
            self.waiting.insert((license.to_owned(), session));
        }
    }

    /// Aggregates one event, in decision order.
    fn apply(&mut self, r: Read) {
        let at = r.record.at_ms;
        let since = self.since_ms;
        // Looked up before inserting: no copy of the id per event.
        if !self.licenses.contains_key(&r.record.license) {
            self.licenses
                .insert(r.record.license.clone(), LicenseAgg::default());
        }
        let Some(lic) = self.licenses.get_mut(&r.record.license) else {
            return;
        };
        if let (Some(seq), Some(last)) = (r.seq, lic.last_seq) {
            if seq <= last {
                // Read twice (a duplicate): its change counted already.
                return;
            }
            lic.missing += seq - last - 1;
        }
        if r.seq.is_some() {
            lic.last_seq = r.seq;
        }
        self.events += 1;
        self.first_ms = Some(self.first_ms.map_or(at, |f| f.min(at)));
        self.last_ms = Some(self.last_ms.map_or(at, |l| l.max(at)));
        if lic.first_at.is_none() {
            // The license's first event: before it, the seats it shows in
            // use less its own change, at the capacity it shows, or, for
            // an admin change of the record, the one it had before (none
            // before the put that created it: a license made in the
            // period is charged capacity from then on only).
            lic.first_at = Some(at);
            lic.level_before = r.seats_before();
            lic.level = lic.level_before;
            lic.total = r.record.seats_total_before();
            lic.last_at = Some(since);
            lic.mark_peak(since, lic.level);
        }
        lic.advance(at);
        let e = &r.record;
        if e.seats_total > 0 {
            lic.seats_total = e.seats_total;
        }
        lic.total = e.seats_total;
        lic.level = e.seats_used;
        lic.mark_peak(at, e.seats_used);
        if let Some(reason) = e.denial() {
            let reason = if lic.denials.len() < MAX_REASONS || lic.denials.contains_key(reason) {
                reason
            } else {
                "OTHER"
            };
            *lic.denials.entry(reason.to_owned()).or_default() += 1;
            lic.deny(e.user.clone(), r.group.clone(), 1);
        }
        if e.folded > 0 {
            // Denials past events.denials_per_window: counted, not recorded
            // one by one, so their reason, user and group are not known.
            *lic.denials.entry(FOLDED.to_owned()).or_default() += e.folded;
            lic.deny(None, None, e.folded);
        }
        if let (Some(EventType::Granted | EventType::QueueTimeout), Some(waited)) = (e.kind, e.waited_ms) {
            lic.waits.add(waited);
        }
        let key = (r.record.license.clone(), r.record.session.clone());
        if e.kind == Some(EventType::Queued) {
            if self.waiting.insert(key.clone()) {
                lic.waiting += 1;
            }
        } else if r.ends_wait() {
            if self.waiting.remove(&key) {
                lic.waiting -= 1;
            } else {
                // Waiting since before the period: from its start (at most
                // its wait), and at 100 % as long as the license was so far.
                let span = (at - since).min(e.waited_ms.unwrap_or(i64::MAX)).max(0);
                lic.wait_ms += span;
                lic.wait_full_ms += span.min(lic.full_ms);
            }
        }
        match r.change() {
            Some(SeatChange::Taken) => match self.open.get_mut(&key) {
                // A lingering seat taken back: the same hold goes on.
                Some(open) if open.lingering => {
                    open.lingering = false;
                    open.user = open.user.take().or_else(|| e.user.clone());
                    open.group = open.group.take().or_else(|| r.group.clone());
                }
                _ => {
                    let start = Open {
                        start_ms: at,
                        user: e.user.clone(),
                        group: r.group.clone(),
                        lingering: false,
                        from_before: false,
                    };
                    // Its previous hold's end was lost: that hold lasted
                    // until this one began at most.
                    if let Some(prev) = self.open.insert(key.clone(), start) {
                        Self::close(lic, &mut self.leading, key, prev, at);
                    }
                }
            },
            Some(SeatChange::Unchanged) if r.linger_ms > 0 => match self.open.get_mut(&key) {
                Some(open) => open.lingering = true,
                None => {
                    // Held since before the period; lingers now.
                    lic.leading_holds += 1;
                    let open = Open {
                        start_ms: since,
                        user: e.user.clone(),
                        group: r.group.clone(),
                        lingering: true,
                        from_before: true,
                    };
                    self.open.insert(key, open);
                }
            },
            Some(SeatChange::Freed) => match self.open.remove(&key) {
                Some(open) => Self::close(lic, &mut self.leading, key, open, at),
                // A second end without a start (read twice): counted once.
                None if self.leading.contains_key(&key) => {}
                // Held since before the period.
                None => {
                    lic.leading_holds += 1;
                    let open = Open {
                        start_ms: since,
                        user: e.user.clone(),
                        group: r.group.clone(),
                        lingering: false,
                        from_before: true,
                    };
                    Self::close(lic, &mut self.leading, key, open, at);
                }
            },
            Some(SeatChange::Unchanged) | None => {}
        }
    }

    /// Ends a hold at `end`: credits its user and group, or, for a hold
    /// from before the period whose user the period's events do not name,
    /// keeps it for the look-back.
    fn close(
        lic: &mut LicenseAgg,
        leading: &mut HashMap<(String, String), Leading>,
        key: (String, String),
        open: Open,
        end: i64,
    ) {
        let ms = end - open.start_ms;
        if open.from_before && open.user.is_none() {
            leading.insert(
                key,
                Leading {
                    ms,
                    group: open.group,
                },
            );
        } else {
            lic.credit(open.user, open.group, ms);
        }
    }

    /// Ends the period: every hold still open is counted up to its end.
    pub(crate) fn end_period(&mut self) {
        let until = self.until_ms;
        for (key, open) in std::mem::take(&mut self.open) {
            if let Some(lic) = self.licenses.get_mut(&key.0) {
                Self::close(lic, &mut self.leading, key, open, until);
            }
        }
    }

    /// Like [`Aggregate::end_period`], and returns what a rollup carries to
    /// the next day: per license, the seats in use and the sessions holding
    /// and waiting at the period's end.
    pub(crate) fn end_period_carry(&mut self) -> HashMap<String, Carry> {
        let mut carries: HashMap<String, Carry> = HashMap::new();
        for (license, lic) in &self.licenses {
            carries.insert(
                license.clone(),
                Carry {
                    level: lic.level,
                    total: lic.total,
                    seq: lic.last_seq,
                    open: BTreeMap::new(),
                    waiting: Vec::new(),
                },
            );
        }
        for ((license, session), open) in &self.open {
            if let Some(c) = carries.get_mut(license) {
                c.open.insert(session.clone(), open.clone());
            }
        }
        for (license, session) in &self.waiting {
            if let Some(c) = carries.get_mut(license) {
                c.waiting.push(session.clone());
            }
        }
        for c in carries.values_mut() {
            c.waiting.sort();
        }
        self.end_period();
        carries
    }

    /// Names the holds that ran into the period with what the events before
    /// it show: a start credits the hold to its user; an end (the events
    /// disagree: one was lost) leaves it without a user.
    fn name_leading(&mut self, found: HashMap<(String, String), Before>) {
        for (key, before) in found {
            let Some(lead) = self.leading.remove(&key) else {
                continue;
            };
            let Some(lic) = self.licenses.get_mut(&key.0) else {
                continue;
            };
            match before {
                Before::Started(user, group) => lic.credit(user, lead.group.or(group), lead.ms),
                Before::Ended => lic.credit(None, lead.group, lead.ms),
            }
        }
    }

    /// Names the holds that ran into the period from the events before it
    /// (once the period's events are read and the period ended).
    pub(crate) async fn settle_leading<C: ConnectionLike>(
        &mut self,
        con: &mut C,
        settings: &Settings,
    ) -> Result<(), Error> {
        let base = &settings.events.stream;
        let shards = settings.events_shards();
        let mut wanted: HashMap<String, Vec<(String, String)>> = HashMap::new();
        for (license, session) in self.leading.keys() {
            wanted
                .entry(shard_name(base, shards, license))
                .or_default()
                .push((license.clone(), session.clone()));
        }
        for (stream, sessions) in wanted {
            let found = look_back(con, &stream, self.since_ms, sessions).await?;
            self.name_leading(found);
        }
        Ok(())
    }

    pub(crate) fn finish(mut self) -> UsageReport {
        let (since, until) = (self.since_ms, self.until_ms);
        // Holds whose start the look-back did not find.
        for ((license, _), lead) in self.leading.drain() {
            if let Some(lic) = self.licenses.get_mut(&license) {
                lic.credit(None, lead.group, lead.ms);
            }
        }
        let mut licenses: Vec<LicenseUsage> = self
            .licenses
            .into_iter()
            .map(|(license, mut lic)| {
                lic.advance(until);
                // Every hold that ran into the period was in use at its
                // start: when more did than the first event showed, the
                // time before that event had them too.
                if let Some(first) = lic.first_at {
                    let missed = lic.leading_holds - lic.level_before;
                    if missed > 0 {
                        lic.seat_ms += missed * (first - since);
                        let seats = lic.level_before + missed;
                        let mut hour = since.div_euclid(HOUR) * HOUR;
                        while hour < first.max(since + 1) {
                            lic.mark_hour(hour, seats);
                            hour += HOUR;
                        }
                        if seats > lic.peak {
                            lic.peak = seats;
                            lic.peak_at = Some(since);
                        }
                    }
                }
                license_usage(license, lic)
            })
            .collect();
        licenses.sort_by(|a, b| a.license.cmp(&b.license));
        UsageReport {
            since_ms: since,
            until_ms: until,
            events: self.events,
            first_event_ms: self.first_ms,
            last_event_ms: self.last_ms,
            sources: Sources {
                events_from_ms: since,
                rollup_days: Vec::new(),
            },
            licenses,
        }
    }
}

/// The fields of a license's rollup HASH (`keys::rollup`): one per UTC day
/// (`2026-11-01`, a [`LicenseUsage`] as JSON) and one per day's carry
/// (`carry:2026-11-01`, a [`CarryRecord`] as JSON).
pub(crate) const CARRY_PREFIX: &str = "carry:";

/// The rollup HASH field of the carry at the end of `day` (unix ms).
pub(crate) fn carry_field(day: i64) -> String {
    format!("{CARRY_PREFIX}{}", date(day))
}

/// A license's carry at the end of a day, as its rollup stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CarryRecord {
    /// The day it is the end of (unix ms of its start).
    pub day_ms: i64,
    /// What was held then.
    pub carry: Carry,
}

/// What a day's rollup carries into the next day for one license.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Carry {
    /// Seats in use at the day's end.
    pub level: i64,
    /// The license's seats then.
    pub total: i64,
    /// Its last event's `seq`, if the events carry one.
    pub seq: Option<u64>,
    /// Sessions holding a seat then.
    pub open: BTreeMap<String, Open>,
    /// Sessions waiting then.
    pub waiting: Vec<String>,
}

/// The shares of `tallies`, most seat time first.
fn shares(tallies: HashMap<Option<String>, Tally>) -> Vec<Share> {
    let mut out: Vec<Share> = tallies
        .into_iter()
        .map(|(name, t)| Share {
            name,
            holds: t.holds,
            seat_ms: t.seat_ms,
            seat_hours: hours(t.seat_ms),
            denials: t.denials,
        })
        .collect();
    out.sort_by(|a, b| b.seat_ms.cmp(&a.seat_ms).then_with(|| a.name.cmp(&b.name)));
    out
}

/// The high-water mark of each day, from those of its hours.
fn daily(hourly: &[Peak]) -> Vec<Peak> {
    let mut days: BTreeMap<i64, i64> = BTreeMap::new();
    for p in hourly {
        let day = days.entry(p.start_ms.div_euclid(DAY) * DAY).or_insert(p.seats);
        *day = (*day).max(p.seats);
    }
    days.into_iter()
        .map(|(start_ms, seats)| Peak { start_ms, seats })
        .collect()
}

fn utilisation(seat_ms: i64, capacity_ms: i64) -> Option<f64> {
    (capacity_ms > 0).then(|| (seat_ms as f64 / capacity_ms as f64 * 10_000.0).round() / 100.0)
}

fn license_usage(license: String, lic: LicenseAgg) -> LicenseUsage {
    let users = shares(lic.users);
    let groups = shares(lic.groups);
    let attributed: i64 = users.iter().map(|u| u.seat_ms).sum();
    let peaks_hourly: Vec<Peak> = lic
        .hourly
        .into_iter()
        .map(|(start_ms, seats)| Peak { start_ms, seats })
        .collect();
    LicenseUsage {
        license,
        seats_total: lic.seats_total,
        peak_seats: lic.peak,
        peak_at_ms: lic.peak_at,
        seat_ms: lic.seat_ms,
        seat_hours: hours(lic.seat_ms),
        capacity_ms: lic.capacity_ms,
        utilisation_pct: utilisation(lic.seat_ms, lic.capacity_ms),
        full_ms: lic.full_ms,
        peaks_daily: daily(&peaks_hourly),
        peaks_hourly,
        denials_total: lic.denials.values().sum(),
        denials: lic.denials,
        queue_waits: lic.waits.summary(),
        queue_wait_ms: lic.wait_ms,
        queue_wait_full_ms: lic.wait_full_ms,
        users,
        groups,
        unattributed_ms: lic.seat_ms - attributed,
        missing_events: lic.missing,
    }
}

/// A session's latest seat event before the period.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Before {
    /// It took a seat (with this user and group): it held it into the period.
    Started(Option<String>, Option<String>),
    /// It gave its seat up: it held none when the period began.
    Ended,
}

/// Finds what each hold that ran into the period was: reading `stream`
/// backwards from the period's start, the latest seat event of each
/// session before it. Stops once every session is found, or at the oldest
/// event kept (the sessions not found stay without a user).
async fn look_back<C: ConnectionLike>(
    con: &mut C,
    stream: &str,
    since_ms: i64,
    sessions: Vec<(String, String)>,
) -> Result<HashMap<(String, String), Before>, Error> {
    let mut wanted: HashSet<(String, String)> = sessions.into_iter().collect();
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
            let Some(r) = Read::parse(fields) else {
                continue;
            };
            if r.record.at_ms >= since_ms {
                continue;
            }
            let before = match r.change() {
                Some(SeatChange::Taken) => Before::Started(r.record.user, r.group),
                Some(SeatChange::Freed) => Before::Ended,
                // A lingering release names the hold's user too.
                Some(SeatChange::Unchanged) if r.linger_ms > 0 && r.record.user.is_some() => {
                    Before::Started(r.record.user, r.group)
                }
                Some(SeatChange::Unchanged) | None => continue,
            };
            let key = (r.record.license, r.record.session);
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

pub(crate) fn hours(ms: i64) -> f64 {
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
pub(crate) fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// The UTC date (`2026-11-01`) of `ms`.
pub(crate) fn date(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(ms.div_euclid(1000)).unwrap_or(0));
    let mut text = humantime::format_rfc3339_seconds(at).to_string();
    text.truncate(10);
    text
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

fn share_rows(out: &mut String, title: &str, shares: &[Share]) {
    if shares.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  {:<40} {:>10} {:>8} {:>8}",
        title, "seat-hours", "holds", "denials"
    );
    for s in shares {
        let name = s.name.as_deref().map_or(Cow::Borrowed("(none)"), printable);
        let _ = writeln!(
            out,
            "  {:<40} {:>10.2} {:>8} {:>8}",
            name,
            s.seat_ms as f64 / HOUR_MS,
            s.holds,
            s.denials
        );
    }
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
    let s = &report.sources;
    if s.rollup_days.is_empty() {
        out.push_str("from the raw events\n");
    } else {
        let _ = writeln!(
            out,
            "from daily rollups for {} day{} ({} .. {}), the raw events from {}",
            s.rollup_days.len(),
            if s.rollup_days.len() == 1 { "" } else { "s" },
            s.rollup_days.first().map_or("", String::as_str),
            s.rollup_days.last().map_or("", String::as_str),
            rfc3339(s.events_from_ms)
        );
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
        let _ = writeln!(out, "  seat time     {}", wait(l.seat_ms));
        let utilisation = l.utilisation_pct.map_or("-".to_owned(), |p| format!("{p:.2} %"));
        let _ = writeln!(
            out,
            "  capacity      {:.2} seat-hours, utilisation {utilisation}",
            l.capacity_ms as f64 / HOUR_MS
        );
        let _ = writeln!(out, "  at 100 %      {}", wait(l.full_ms));
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
            (_, _, Some(max)) => {
                let _ = writeln!(out, "  queue waits   {}  max {}", w.count, wait(max));
            }
            _ => out.push_str("  queue waits   none\n"),
        }
        let _ = writeln!(
            out,
            "  waiting       {}, {} of it at 100 %",
            wait(l.queue_wait_ms),
            wait(l.queue_wait_full_ms)
        );
        if l.missing_events > 0 {
            let _ = writeln!(out, "  missing       {} events (gaps in seq)", l.missing_events);
        }
        share_rows(&mut out, "user", &l.users);
        if l.unattributed_ms != 0 {
            let _ = writeln!(
                out,
                "  {:<40} {:>10.2}",
                "(held, no event in the period)",
                l.unattributed_ms as f64 / HOUR_MS
            );
        }
        if l.groups.iter().any(|g| g.name.is_some()) {
            share_rows(&mut out, "group", &l.groups);
        }
        out.push_str("  peaks by day, and by hour (UTC; days and hours not listed had no seat in use)\n");
        let mut hours_of_day = l.peaks_hourly.iter().peekable();
        for day in &l.peaks_daily {
            let mut line = format!("  {}  {:>4} |", date(day.start_ms), day.seats);
            while let Some(h) = hours_of_day.next_if(|h| h.start_ms < day.start_ms + DAY) {
                let _ = write!(line, " {:02}h {}", h.start_ms.rem_euclid(DAY) / HOUR, h.seats);
            }
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// A CSV cell a spreadsheet will not run: one starting with `=`, `+`, `-`,
/// `@`, a tab or a carriage return gets a leading `'` (OWASP, "CSV
/// Injection"). The figures are never negative, so no number is touched.
fn cell(s: &str) -> Cow<'_, str> {
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        Cow::Owned(format!("'{s}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// One row per figure, `license,metric,key,value`: a long table any
/// spreadsheet pivots. Times are RFC 3339, seat time in hours (3 decimals),
/// other durations in ms; every cell is safe against formula injection.
pub fn render_csv(report: &UsageReport) -> Result<String, Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut row = |license: &str, metric: &str, key: &str, value: String| {
        let cells = [cell(license), cell(metric), cell(key), cell(&value)];
        w.write_record(cells.iter().map(|c| c.as_bytes()))
    };
    // Written to memory: only a bug could make it fail.
    let csv_error = |e: csv::Error| Error::Io(std::io::Error::other(e));
    row("license", "metric", "key", "value".to_owned()).map_err(csv_error)?;
    let s = &report.sources;
    row("", "events_from", "", rfc3339(s.events_from_ms)).map_err(csv_error)?;
    for day in &s.rollup_days {
        row("", "rollup_day", day, "1".to_owned()).map_err(csv_error)?;
    }
    for l in &report.licenses {
        let id = l.license.as_str();
        row(id, "seats_total", "", l.seats_total.to_string()).map_err(csv_error)?;
        row(id, "peak_seats", "", l.peak_seats.to_string()).map_err(csv_error)?;
        row(id, "peak_at", "", l.peak_at_ms.map(rfc3339).unwrap_or_default()).map_err(csv_error)?;
        row(id, "seat_hours", "", format!("{:.3}", l.seat_hours)).map_err(csv_error)?;
        row(id, "capacity_hours", "", format!("{:.3}", hours(l.capacity_ms))).map_err(csv_error)?;
        let utilisation = l.utilisation_pct.map(|p| format!("{p:.2}")).unwrap_or_default();
        row(id, "utilisation_pct", "", utilisation).map_err(csv_error)?;
        row(id, "full_ms", "", l.full_ms.to_string()).map_err(csv_error)?;
        for (reason, n) in &l.denials {
            row(id, "denials", reason, n.to_string()).map_err(csv_error)?;
        }
        let w = &l.queue_waits;
        row(id, "queue_waits", "count", w.count.to_string()).map_err(csv_error)?;
        let quantiles = [("p50_ms", w.p50_ms), ("p95_ms", w.p95_ms), ("max_ms", w.max_ms)];
        for (key, v) in quantiles.into_iter().filter_map(|(k, v)| Some((k, v?))) {
            row(id, "queue_waits", key, v.to_string()).map_err(csv_error)?;
        }
        row(id, "queue_wait_ms", "", l.queue_wait_ms.to_string()).map_err(csv_error)?;
        row(id, "queue_wait_full_ms", "", l.queue_wait_full_ms.to_string()).map_err(csv_error)?;
        for (metric, shares) in [("user", &l.users), ("group", &l.groups)] {
            for s in shares {
                let name = s.name.as_deref().unwrap_or("");
                row(
                    id,
                    &format!("{metric}_seat_hours"),
                    name,
                    format!("{:.3}", s.seat_hours),
                )
                .map_err(csv_error)?;
                row(id, &format!("{metric}_holds"), name, s.holds.to_string()).map_err(csv_error)?;
                row(id, &format!("{metric}_denials"), name, s.denials.to_string()).map_err(csv_error)?;
            }
        }
        row(
            id,
            "unattributed_seat_hours",
            "",
            format!("{:.3}", hours(l.unattributed_ms)),
        )
        .map_err(csv_error)?;
        row(id, "missing_events", "", l.missing_events.to_string()).map_err(csv_error)?;
        for p in &l.peaks_daily {
            row(id, "peak_day", &date(p.start_ms), p.seats.to_string()).map_err(csv_error)?;
        }
        for p in &l.peaks_hourly {
            row(id, "peak_hour", &rfc3339(p.start_ms), p.seats.to_string()).map_err(csv_error)?;
        }
    }
    let bytes = w.into_inner().map_err(|e| Error::Io(e.into_error()))?;
    String::from_utf8(bytes).map_err(|e| Error::Io(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use seatgate_core::events::Event;

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
        agg.end_period();
        agg.finish()
    }

    fn user_ms(l: &LicenseUsage) -> Vec<(Option<&str>, u64, i64)> {
        l.users
            .iter()
            .map(|u| (u.name.as_deref(), u.holds, u.seat_ms))
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
        agg.end_period();
        let key = |s: &str| ("acme".to_owned(), s.to_owned());
        agg.name_leading(HashMap::from([
            (
                key("s-ann"),
                Before::Started(Some("ann@example.com".to_owned()), None),
            ),
            // s-lost gave its seat up before the period: its start in the
            // period was lost, its length unknown.
            (key("s-lost"), Before::Ended),
        ]));
        let report = agg.finish();
        let l = &report.licenses[0];
        // s-lost's hold, by the events before the period, had ended: the
        // events disagree (one was lost), so its seat time has no user.
        assert_eq!(
            user_ms(l),
            [(None, 1, 2 * HOUR), (Some("ann@example.com"), 1, HOUR)]
        );
        // The seats the events show in use: 2 until ann's release at 1h (it
        // left 1), then 1 until 2h; then none.
        assert_eq!(l.seat_ms, 2 * HOUR + HOUR);
        assert_eq!(l.unattributed_ms, 0);
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

    const SEC: i64 = 1000;

    /// An event of `license` with the fields of the events contract
    /// (`seq`, `user`, `group`) and those of the linger and borrow policies.
    #[derive(Clone)]
    struct Ev {
        kind: EventType,
        license: &'static str,
        session: &'static str,
        used: i64,
        total: i64,
        at: i64,
        reason: Option<&'static str>,
        user: Option<&'static str>,
        group: Option<&'static str>,
        seq: Option<u64>,
        linger_ms: Option<i64>,
        waited_ms: Option<i64>,
        held: Option<bool>,
        folded: u64,
        /// An admin event's `before` and `after`.
        admin: Option<(&'static str, &'static str)>,
    }

    fn ev(kind: EventType, session: &'static str, used: i64, total: i64, at: i64) -> Ev {
        Ev {
            kind,
            license: "lic",
            session,
            used,
            total,
            at,
            reason: None,
            user: None,
            group: None,
            seq: None,
            linger_ms: None,
            waited_ms: None,
            held: None,
            admin: None,
            folded: 0,
        }
    }

    impl Ev {
        fn user(self, user: &'static str) -> Ev {
            Ev {
                user: Some(user),
                ..self
            }
        }
        fn group(self, group: &'static str) -> Ev {
            Ev {
                group: Some(group),
                ..self
            }
        }
        fn reason(self, reason: &'static str) -> Ev {
            Ev {
                reason: Some(reason),
                ..self
            }
        }
        fn linger(self, ms: i64) -> Ev {
            Ev {
                linger_ms: Some(ms),
                ..self
            }
        }
        fn waited(self, ms: i64) -> Ev {
            Ev {
                waited_ms: Some(ms),
                ..self
            }
        }
        fn held(self, held: bool) -> Ev {
            Ev {
                held: Some(held),
                ..self
            }
        }
        fn seq(self, seq: u64) -> Ev {
            Ev {
                seq: Some(seq),
                ..self
            }
        }
        fn folded(self, folded: u64) -> Ev {
            Ev { folded, ..self }
        }
        fn admin(self, before: &'static str, after: &'static str) -> Ev {
            Ev {
                admin: Some((before, after)),
                ..self
            }
        }

        fn fields(&self) -> Vec<(String, Value)> {
            let mut e = Event::new(
                self.kind,
                self.license,
                self.session,
                self.used,
                self.total,
                self.at,
            );
            e.reason = self.reason;
            e.user = self.user.map(str::to_owned);
            e.linger_ms = self.linger_ms;
            e.waited_ms = self.waited_ms;
            e.held = self.held;
            let mut fields: Vec<(String, String)> =
                e.fields().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            if let Some(seq) = self.seq {
                fields.push((SEQ_FIELD.to_owned(), seq.to_string()));
            }
            if let Some(group) = self.group {
                fields.push((GROUP_FIELD.to_owned(), group.to_owned()));
            }
            if self.folded > 0 {
                fields.push(("folded".to_owned(), self.folded.to_string()));
            }
            if let Some((before, after)) = self.admin {
                fields.push(("actor".to_owned(), "ada".to_owned()));
                fields.push(("before".to_owned(), before.to_owned()));
                fields.push(("after".to_owned(), after.to_owned()));
            }
            fields
                .into_iter()
                .map(|(k, v)| (k, Value::BulkString(v.into_bytes())))
                .collect()
        }
    }

    fn report_of(since: i64, until: i64, events: &[Ev]) -> UsageReport {
        let mut agg = Aggregate::new(since, until, None);
        for e in events {
            agg.push(&e.fields());
        }
        agg.drain(None);
        agg.end_period();
        agg.finish()
    }

    /// The figures every report must keep: users' seat time plus the
    /// unattributed part is the license's; seat time never exceeds the
    /// capacity when seats_used never exceeds seats_total.
    fn consistent(l: &LicenseUsage) {
        let users: i64 = l.users.iter().map(|u| u.seat_ms).sum();
        let groups: i64 = l.groups.iter().map(|g| g.seat_ms).sum();
        assert_eq!(users + l.unattributed_ms, l.seat_ms, "{l:#?}");
        assert_eq!(groups, users, "{l:#?}");
        assert!(l.seat_ms <= l.capacity_ms, "{l:#?}");
        assert!(l.full_ms <= l.capacity_ms, "{l:#?}");
        let denials: u64 = l.users.iter().map(|u| u.denials).sum();
        assert_eq!(denials, l.denials_total, "{l:#?}");
    }

    #[test]
    fn a_lingering_seat_counts_from_its_acquire_to_the_end_of_its_linger() {
        use EventType::*;
        // issue 22: `license put lingertest --seats 1 --linger 5s`, acquire,
        // release after 3 s; the reaper frees the seat as the linger ends.
        let events = [
            ev(Acquired, "s1", 1, 1, T0).user("ann"),
            ev(Released, "s1", 1, 1, T0 + 3 * SEC).linger(5 * SEC),
            ev(Evicted, "s1", 0, 1, T0 + 8 * SEC).reason("linger_ended"),
        ];
        // The default period (30 days back) used to give 720 seat-hours.
        let report = report_of(T0 - 30 * 24 * HOUR, T0 + HOUR, &events);
        let l = &report.licenses[0];
        assert_eq!(l.seat_ms, 8 * SEC);
        assert_eq!(user_ms(l), [(Some("ann"), 1, 8 * SEC)]);
        assert_eq!((l.unattributed_ms, l.full_ms), (0, 8 * SEC));
        consistent(l);
        // From within the linger: the hold ran into the period.
        let report = report_of(T0 + 5 * SEC, T0 + HOUR, &events);
        let l = &report.licenses[0];
        assert_eq!(l.seat_ms, 3 * SEC);
        assert_eq!(user_ms(l), [(None, 1, 3 * SEC)]);
        consistent(l);
    }

    #[test]
    fn a_lingering_seat_taken_back_is_one_hold_until_its_last_release() {
        use EventType::*;
        let events = [
            ev(Acquired, "s1", 1, 2, T0).user("ann"),
            ev(Released, "s1", 1, 2, T0 + MIN).linger(5 * MIN),
            // Taken back while it lingers: seats_used does not move.
            ev(Acquired, "s1", 1, 2, T0 + 2 * MIN).user("ann"),
            ev(Released, "s1", 0, 2, T0 + 10 * MIN),
        ];
        let report = report_of(T0, T0 + HOUR, &events);
        let l = &report.licenses[0];
        assert_eq!(l.seat_ms, 10 * MIN);
        assert_eq!(user_ms(l), [(Some("ann"), 1, 10 * MIN)]);
        consistent(l);
    }

    #[test]
    fn capacity_counts_from_the_license_s_creation_and_each_seat_change() {
        use EventType::*;
        // Created 30 min into the period with 4 seats, raised to 8 an hour
        // later; one seat held for 20 min from the creation.
        let events = [
            ev(LicensePut, "", 0, 4, T0 + 30 * MIN).admin("{}", r#"{"active":"1","seats_total":"4"}"#),
            ev(Acquired, "s1", 1, 4, T0 + 30 * MIN).user("ann"),
            ev(Released, "s1", 0, 4, T0 + 50 * MIN),
            ev(LicensePut, "", 0, 8, T0 + 90 * MIN).admin(r#"{"seats_total":"4"}"#, r#"{"seats_total":"8"}"#),
        ];
        let report = report_of(T0, T0 + 2 * HOUR, &events);
        let l = &report.licenses[0];
        assert_eq!(l.capacity_ms, 4 * 60 * MIN + 8 * 30 * MIN, "{l:#?}");
        assert_eq!(l.seat_ms, 20 * MIN);
        assert_eq!(l.seats_total, 8);
        consistent(l);
        // A license whose first event in the period changes its seats was
        // there before, with the seats its `before` names.
        let changed =
            [ev(LicensePut, "", 0, 6, T0 + 30 * MIN)
                .admin(r#"{"seats_total":"2"}"#, r#"{"seats_total":"6"}"#)];
        let report = report_of(T0, T0 + HOUR, &changed);
        assert_eq!(report.licenses[0].capacity_ms, 2 * 30 * MIN + 6 * 30 * MIN);
    }

    #[test]
    fn borrowed_revoked_evicted_and_deleted_seats_end_with_their_event() {
        use EventType::*;
        let events = [
            ev(Acquired, "s-borrow", 1, 4, T0).user("bo"),
            ev(Acquired, "s-revoke", 2, 4, T0).user("rev"),
            ev(Acquired, "s-stale", 3, 4, T0).user("sta"),
            ev(Queued, "s-wait", 3, 4, T0 + MIN),
            ev(Evicted, "s-borrow", 2, 4, T0 + 10 * MIN).reason("borrow_ended"),
            // A waiter revoked frees no seat; a holder revoked does.
            ev(Revoked, "s-wait", 2, 4, T0 + 15 * MIN).held(false),
            ev(Revoked, "s-revoke", 1, 4, T0 + 20 * MIN).held(true),
            ev(Evicted, "s-stale", 0, 4, T0 + 30 * MIN).reason("heartbeat_timeout"),
            ev(Acquired, "s-del-1", 1, 4, T0 + 40 * MIN).user("del"),
            ev(Acquired, "s-del-2", 2, 4, T0 + 40 * MIN).user("del"),
            // The license deleted: every seat ends at once, none left, no capacity.
            ev(Evicted, "s-del-1", 0, 0, T0 + 50 * MIN).reason("license_deleted"),
            ev(Evicted, "s-del-2", 0, 0, T0 + 50 * MIN).reason("license_deleted"),
        ];
        let report = report_of(T0, T0 + 4 * HOUR, &events);
        let l = &report.licenses[0];
        assert_eq!(
            user_ms(l),
            [
                (Some("sta"), 1, 30 * MIN),
                (Some("del"), 2, 20 * MIN),
                (Some("rev"), 1, 20 * MIN),
                (Some("bo"), 1, 10 * MIN),
            ]
        );
        // 3 seats 10m, 2 seats 10m, 1 seat 10m, none 10m, 2 seats 10m; none
        // after the deletion, to the end of the period.
        assert_eq!(l.seat_ms, 30 * MIN + 20 * MIN + 10 * MIN + 20 * MIN);
        assert_eq!(l.capacity_ms, 4 * 50 * MIN);
        assert_eq!(l.seats_total, 4, "the seats it had, not the deletion's 0");
        assert_eq!(l.queue_wait_ms, 14 * MIN);
        consistent(l);
    }

    #[test]
    fn a_short_period_on_a_busy_license_never_exceeds_its_capacity() {
        use EventType::*;
        // 8 seats; sessions come and go, some released under linger, holds
        // running into the period from before it. Period: 15 minutes.
        let since = T0 + HOUR;
        let mut events = Vec::new();
        let sessions = ["a", "b", "c", "d", "e", "f", "g", "h"];
        for (i, s) in sessions.iter().enumerate() {
            events.push(ev(Acquired, s, i as i64 + 1, 8, T0 + i as i64 * MIN));
        }
        for (i, s) in sessions.iter().enumerate() {
            let i = i as i64;
            // Seat j's linger ends at j + 2 minutes: before seat i's release
            // for j <= i - 2 (the eviction is read first at a tie).
            let at = since + i * MIN;
            events.push(ev(Released, s, 8 - (i - 1).max(0), 8, at).linger(2 * MIN));
            events.push(ev(Evicted, s, 8 - (i + 1), 8, at + 2 * MIN).reason("linger_ended"));
        }
        events.sort_by_key(|e| e.at);
        let report = report_of(since, since + 15 * MIN, &events);
        let l = &report.licenses[0];
        // Seat i is held from the start until i minutes + 2 in.
        let want: i64 = (0..8).map(|i| (i + 2) * MIN).sum();
        assert_eq!(l.seat_ms, want);
        assert!(l.seat_hours <= 2.0, "{}", l.seat_hours);
        assert_eq!((l.peak_seats, l.peak_at_ms), (8, Some(since)));
        assert_eq!(l.full_ms, 2 * MIN);
        consistent(l);
    }

    #[test]
    fn denials_folded_past_the_rate_count_in_the_totals() {
        use EventType::*;
        // 1 + 5 folded into it, then an aggregate of 3 from the reaper.
        let events = [
            ev(Denied, "s1", 2, 2, T0)
                .user("ann")
                .reason("NO_SEATS_AVAILABLE")
                .folded(5),
            ev(Denied, "", 2, 2, T0 + MIN).folded(3),
        ];
        let report = report_of(T0, T0 + HOUR, &events);
        let l = &report.licenses[0];
        assert_eq!(l.denials_total, 9);
        assert_eq!(l.denials.get("NO_SEATS_AVAILABLE"), Some(&1));
        assert_eq!(l.denials.get("folded"), Some(&8));
        let by_user: Vec<(Option<String>, u64)> =
            l.users.iter().map(|s| (s.name.clone(), s.denials)).collect();
        assert!(by_user.contains(&(Some("ann".to_owned()), 1)), "{by_user:?}");
        assert!(by_user.contains(&(None, 8)), "{by_user:?}");
        consistent(l);
    }

    #[test]
    fn users_and_groups_get_their_seat_time_and_their_denials() {
        use EventType::*;
        let events = [
            ev(Acquired, "s1", 1, 2, T0).user("ann").group("eng"),
            ev(Acquired, "s2", 2, 2, T0 + MIN).user("bob").group("ops"),
            ev(Denied, "s3", 2, 2, T0 + 2 * MIN)
                .user("carl")
                .group("eng")
                .reason("NO_SEATS_AVAILABLE"),
            ev(Queued, "s4", 2, 2, T0 + 3 * MIN).user("dora").group("eng"),
            ev(QueueTimeout, "s4", 2, 2, T0 + 13 * MIN)
                .user("dora")
                .group("eng")
                .waited(10 * MIN),
            ev(Denied, "s5", 2, 2, T0 + 14 * MIN).reason("RATE_LIMITED"),
            ev(Released, "s1", 1, 2, T0 + 20 * MIN).user("ann").group("eng"),
        ];
        let report = report_of(T0, T0 + HOUR, &events);
        let l = &report.licenses[0];
        let shares = |s: &[Share]| -> Vec<(Option<String>, u64, i64, u64)> {
            s.iter()
                .map(|s| (s.name.clone(), s.holds, s.seat_ms, s.denials))
                .collect()
        };
        let name = |s: &str| Some(s.to_owned());
        assert_eq!(
            shares(&l.users),
            [
                (name("bob"), 1, 59 * MIN, 0),
                (name("ann"), 1, 20 * MIN, 0),
                (None, 0, 0, 1),
                (name("carl"), 0, 0, 1),
                (name("dora"), 0, 0, 1),
            ]
        );
        assert_eq!(
            shares(&l.groups),
            [
                (name("ops"), 1, 59 * MIN, 0),
                (name("eng"), 1, 20 * MIN, 2),
                (None, 0, 0, 1)
            ]
        );
        // Both seats in use from 1m to 20m; dora waited 10m of it.
        assert_eq!(l.full_ms, 19 * MIN);
        assert_eq!((l.queue_wait_ms, l.queue_wait_full_ms), (10 * MIN, 10 * MIN));
        assert_eq!(l.capacity_ms, 2 * HOUR);
        assert_eq!(l.utilisation_pct, Some(65.83));
        consistent(l);
    }

    #[test]
    fn peaks_are_kept_per_hour_and_per_day() {
        use EventType::*;
        let day = T0.div_euclid(DAY) * DAY;
        let events = [
            ev(Acquired, "s1", 1, 3, day + 22 * HOUR + 10 * MIN),
            ev(Acquired, "s2", 2, 3, day + 22 * HOUR + 20 * MIN),
            ev(Released, "s2", 1, 3, day + 22 * HOUR + 30 * MIN),
            ev(Acquired, "s3", 2, 3, day + DAY + HOUR + 5 * MIN),
            ev(Acquired, "s4", 3, 3, day + DAY + HOUR + 6 * MIN),
            ev(Released, "s4", 2, 3, day + DAY + HOUR + 7 * MIN),
        ];
        let report = report_of(day + 22 * HOUR, day + DAY + 3 * HOUR, &events);
        let l = &report.licenses[0];
        let hourly: Vec<(i64, i64)> = l.peaks_hourly.iter().map(|p| (p.start_ms, p.seats)).collect();
        assert_eq!(
            hourly,
            [
                (day + 22 * HOUR, 2),
                (day + 23 * HOUR, 1),
                (day + DAY, 1),
                (day + DAY + HOUR, 3),
                (day + DAY + 2 * HOUR, 2),
            ]
        );
        let daily: Vec<(i64, i64)> = l.peaks_daily.iter().map(|p| (p.start_ms, p.seats)).collect();
        assert_eq!(daily, [(day, 2), (day + DAY, 3)]);
        assert_eq!(l.full_ms, MIN);
        consistent(l);
    }

    #[test]
    fn events_read_twice_count_once_and_gaps_in_seq_are_counted() {
        use EventType::*;
        let events = [
            ev(Acquired, "s1", 1, 2, T0).seq(7),
            ev(Acquired, "s1", 1, 2, T0).seq(7),
            ev(Released, "s1", 0, 2, T0 + HOUR).seq(8),
            ev(Released, "s1", 0, 2, T0 + HOUR).seq(8),
            // 9 and 10 lost.
            ev(Acquired, "s2", 1, 2, T0 + 2 * HOUR).seq(11),
            ev(Released, "s2", 0, 2, T0 + 3 * HOUR).seq(12),
        ];
        let report = report_of(T0, T0 + 4 * HOUR, &events);
        assert_eq!(report.events, 4);
        let l = &report.licenses[0];
        assert_eq!(l.seat_ms, 2 * HOUR);
        assert_eq!(user_ms(l), [(None, 2, 2 * HOUR)]);
        assert_eq!(l.missing_events, 2);
        consistent(l);
    }

    /// The value of CSV row `metric,key` of license `lic`.
    fn csv_value(csv: &str, license: &str, metric: &str, key: &str) -> Option<String> {
        let mut r = csv::Reader::from_reader(csv.as_bytes());
        r.records().filter_map(Result::ok).find_map(|row| {
            (row.get(0) == Some(license) && row.get(1) == Some(metric) && row.get(2) == Some(key))
                .then(|| row.get(3).unwrap_or_default().to_owned())
        })
    }

    #[test]
    fn the_table_the_csv_and_the_json_carry_the_same_figures() {
        use EventType::*;
        let events = [
            ev(Acquired, "s1", 1, 2, T0).user("ann").group("eng"),
            ev(Acquired, "s2", 2, 2, T0 + MIN).user("bob"),
            ev(Denied, "s3", 2, 2, T0 + 2 * MIN)
                .user("ann")
                .reason("NO_SEATS_AVAILABLE"),
            ev(Queued, "s4", 2, 2, T0 + 3 * MIN),
            ev(Released, "s1", 2, 2, T0 + 20 * MIN).linger(MIN),
            ev(Evicted, "s1", 1, 2, T0 + 21 * MIN).reason("linger_ended"),
            ev(Granted, "s4", 2, 2, T0 + 21 * MIN).waited(18 * MIN).user("cy"),
        ];
        let report = report_of(T0, T0 + 2 * HOUR, &events);
        let json: UsageReport = serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        assert_eq!(json, report, "JSON carries every figure");
        let csv = render_csv(&report).unwrap();
        let table = render_table(&report);
        let l = &report.licenses[0];
        consistent(l);
        let get = |metric: &str, key: &str| csv_value(&csv, "lic", metric, key).unwrap();
        assert_eq!(get("seat_hours", ""), format!("{:.3}", l.seat_hours));
        assert_eq!(get("capacity_hours", ""), format!("{:.3}", hours(l.capacity_ms)));
        assert_eq!(
            get("utilisation_pct", ""),
            format!("{:.2}", l.utilisation_pct.unwrap())
        );
        assert_eq!(get("full_ms", ""), l.full_ms.to_string());
        assert_eq!(get("queue_wait_ms", ""), l.queue_wait_ms.to_string());
        assert_eq!(get("queue_wait_full_ms", ""), l.queue_wait_full_ms.to_string());
        assert_eq!(get("peak_seats", ""), l.peak_seats.to_string());
        let mut csv_users = 0.0;
        for u in &l.users {
            let name = u.name.as_deref().unwrap_or("");
            let hours_csv: f64 = get("user_seat_hours", name).parse().unwrap();
            assert_eq!(hours_csv, u.seat_hours);
            csv_users += hours_csv;
            assert_eq!(get("user_denials", name), u.denials.to_string());
            assert_eq!(get("user_holds", name), u.holds.to_string());
            let row = format!(
                "  {:<40} {:>10.2} {:>8} {:>8}",
                u.name.as_deref().unwrap_or("(none)"),
                u.seat_ms as f64 / HOUR_MS,
                u.holds,
                u.denials
            );
            assert!(table.lines().any(|line| line == row), "{row:?} not in\n{table}");
        }
        let unattributed: f64 = get("unattributed_seat_hours", "").parse().unwrap();
        assert!((csv_users + unattributed - l.seat_hours).abs() < 0.002, "{csv}");
        for g in &l.groups {
            let name = g.name.as_deref().unwrap_or("");
            assert_eq!(get("group_seat_hours", name), format!("{:.3}", g.seat_hours));
        }
        for p in &l.peaks_hourly {
            assert_eq!(get("peak_hour", &rfc3339(p.start_ms)), p.seats.to_string());
        }
        for p in &l.peaks_daily {
            assert_eq!(get("peak_day", &date(p.start_ms)), p.seats.to_string());
        }
        for line in [
            format!("  seat-hours    {:.2}", l.seat_ms as f64 / HOUR_MS),
            format!(
                "  capacity      {:.2} seat-hours, utilisation {:.2} %",
                l.capacity_ms as f64 / HOUR_MS,
                l.utilisation_pct.unwrap()
            ),
            format!("  at 100 %      {}", wait(l.full_ms)),
            format!(
                "  waiting       {}, {} of it at 100 %",
                wait(l.queue_wait_ms),
                wait(l.queue_wait_full_ms)
            ),
            format!("  {}     2 | 08h 2 09h 2", date(T0)),
            "from the raw events".to_owned(),
        ] {
            assert!(table.lines().any(|l| l == line), "{line:?} not in\n{table}");
        }
    }

    #[test]
    fn csv_cells_that_a_spreadsheet_would_run_get_a_leading_quote() {
        use EventType::*;
        let events = [
            ev(Acquired, "s1", 1, 2, T0).user("=HYPERLINK(\"http://evil.example\",\"x\")"),
            ev(Acquired, "s2", 2, 2, T0).user("+1+1").group("@SUM(A1)"),
            ev(Acquired, "s3", 2, 2, T0).user("-2").group("\tcmd"),
            ev(Denied, "s4", 2, 2, T0)
                .user("\rx")
                .reason("NO_SEATS_AVAILABLE"),
        ];
        let report = report_of(T0, T0 + HOUR, &events);
        let csv = render_csv(&report).unwrap();
        for key in [
            "'=HYPERLINK(\"http://evil.example\",\"x\")",
            "'+1+1",
            "'-2",
            "'\rx",
        ] {
            assert!(
                csv_value(&csv, "lic", "user_seat_hours", key).is_some(),
                "{key:?} not in\n{csv}"
            );
        }
        for key in ["'@SUM(A1)", "'\tcmd"] {
            assert!(
                csv_value(&csv, "lic", "group_seat_hours", key).is_some(),
                "{key:?} not in\n{csv}"
            );
        }
        let mut r = csv::Reader::from_reader(csv.as_bytes());
        for row in r.records() {
            for cell in row.unwrap().iter() {
                assert!(!cell.starts_with(['=', '+', '-', '@', '\t', '\r']), "{cell:?}");
            }
        }
    }
}
