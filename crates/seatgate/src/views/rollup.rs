//! Daily usage rollups: once a UTC day is over, each license's figures of
//! that day (a [`LicenseUsage`](crate::views::usage::LicenseUsage), what `seatgate report` shows) are stored in
//! the license's rollup HASH (`keys::rollup`, under its hash tag), with what
//! was held at the day's end (the carry the next day starts from, so a hold
//! across midnight keeps its user and a day without events still counts
//! its held seats and capacity; kept as long as the raw events, for the
//! reports whose raw events start the day after it). Rollups are kept `report.rollup_retention`
//! (400 days by default), raw events `events.retention`: a yearly report
//! reads rollups for the days whose raw events are gone
//! ([`super::usage::usage`]).
//!
//! One process rolls up at a time (a `SET NX PX` lock); rolling a day up
//! again writes the same figures, so a pass that dies half way is simply
//! done again. The service schedules [`roll_up_retrying`] (service::run).

use std::collections::HashMap;

use redis::aio::ConnectionLike;

use super::usage::{carry_field, date, Aggregate, CarryRecord, CARRY_PREFIX, DAY, DONE_DAY};
use crate::config::Settings;
use crate::error::Error;
use seatgate_core::keys::Keys;

/// Most days one pass rolls up: a service back after a long stop catches
/// up over a few passes, each of bounded length.
const DAYS_PER_PASS: i64 = 7;
/// A day is rolled up only this long after it ended: its last events
/// (appended up to a minute late, `usage::ID_SLACK_MS`) are in by then.
const SETTLE_MS: i64 = 5 * 60_000;
/// How long the roll-up lock is held at most (a pass renews nothing: it
/// ends well within this, and rolling a day twice does no harm).
const LOCK_MS: u64 = 10 * 60_000;

/// What one roll-up pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollupPass {
    /// The UTC days rolled up (`2026-11-01`).
    pub days: Vec<String>,
    /// Rollups written (a license and a day each).
    pub written: usize,
    /// Rollups dropped past `report.rollup_retention`.
    pub trimmed: usize,
}

/// Rolls up every finished UTC day not rolled up yet (at most
/// `DAYS_PER_PASS` of them), unless another process is doing so. The first
/// pass ever starts with the oldest whole day the raw events still cover.
pub async fn roll_up<C: ConnectionLike>(con: &mut C, settings: &Settings) -> Result<RollupPass, Error> {
    let keys = Keys::new(settings.keys.prefix.clone());
    let locked: Option<String> = redis::cmd("SET")
        .arg(keys.rollup_lock())
        .arg("1")
        .arg("NX")
        .arg("PX")
        .arg(LOCK_MS)
        .query_async(con)
        .await?;
    if locked.is_none() {
        return Ok(RollupPass::default());
    }
    let result = roll_up_locked(con, settings, &keys).await;
    let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(keys.rollup_lock()).query_async(con).await;
    result
}

/// [`roll_up`], made once more when the connection broke under the first
/// try ([`Error::is_broken_connection`]): the first command after Redis
/// restarted meets the dead connection, and a managed connection has
/// reconnected by the next. What the service schedules.
pub async fn roll_up_retrying<C: ConnectionLike>(
    con: &mut C,
    settings: &Settings,
) -> Result<RollupPass, Error> {
    match roll_up(con, settings).await {
        Err(e) if e.is_broken_connection() => {
            tracing::debug!(error = %e, "usage rollup: Redis connection broken; trying once more");
            roll_up(con, settings).await
        }
        pass => pass,
    }
}

async fn roll_up_locked<C: ConnectionLike>(
    con: &mut C,
    settings: &Settings,
    keys: &Keys,
) -> Result<RollupPass, Error> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
    let now_ms = secs * 1000 + micros / 1000;
    let done: Option<i64> = redis::cmd("HGET")
        .arg(keys.rollup_done())
        .arg(DONE_DAY)
        .query_async(con)
        .await?;
    let retention = i64::try_from(settings.events.retention.as_millis()).unwrap_or(i64::MAX);
    let first = match done {
        Some(day) => day + DAY,
        // The first whole day the raw events cover.
        None => (now_ms.saturating_sub(retention) + DAY - 1).div_euclid(DAY) * DAY,
    };
    let mut pass = RollupPass::default();
    let mut day = first;
    while day + DAY + SETTLE_MS <= now_ms && pass.days.len() < DAYS_PER_PASS as usize {
        let (written, trimmed) = roll_day(con, settings, keys, day).await?;
        let _: i64 = redis::cmd("HSET")
            .arg(keys.rollup_done())
            .arg(DONE_DAY)
            .arg(day)
            .query_async(con)
            .await?;
        pass.days.push(date(day));
        pass.written += written;
        pass.trimmed += trimmed;
        day += DAY;
    }
    Ok(pass)
}

/// Rolls up UTC day `day` (unix ms of its start) for every license with an
/// event that day or something held at its start. Returns the rollups
/// written and those trimmed.
pub async fn roll_day<C: ConnectionLike>(
    con: &mut C,
    settings: &Settings,
    keys: &Keys,
    day: i64,
) -> Result<(usize, usize), Error> {
    let mut agg = Aggregate::new(day, day + DAY, None);
    let index: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(keys.rollup_index())
        .query_async(con)
        .await?;
    let yesterday = date(day - DAY);
    for (license, last) in &index {
        if *last != yesterday {
            continue;
        }
        let raw: Option<String> = redis::cmd("HGET")
            .arg(keys.rollup(license))
            .arg(carry_field(day - DAY))
            .query_async(con)
            .await?;
        let Some(record) = raw.and_then(|r| serde_json::from_str::<CarryRecord>(&r).ok()) else {
            continue;
        };
        let c = &record.carry;
        // A deleted license (no seats, nothing held) is carried no further.
        let idle = c.total == 0 && c.level == 0 && c.open.is_empty() && c.waiting.is_empty();
        if record.day_ms == day - DAY && !idle {
            agg.seed(license, record.carry);
        }
    }
    for stream in settings.events_streams() {
        agg.read_shard(con, &stream).await?;
    }
    let mut carries = agg.end_period_carry();
    agg.settle_leading(con, settings).await?;
    let report = agg.finish();
    let today = date(day);
    let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4);
    let cutoff = Cutoff {
        day: date(day - ms(settings.report.rollup_retention)),
        // A carry is read for the day after it, and by a report whose raw
        // events start the day after it: kept as long as the events are.
        carry: date(day - ms(settings.events.retention) - 2 * DAY),
    };
    let mut trimmed = 0;
    for usage in &report.licenses {
        let carry = CarryRecord {
            day_ms: day,
            carry: carries.remove(&usage.license).unwrap_or_default(),
        };
        let _: i64 = redis::cmd("HSET")
            .arg(keys.rollup(&usage.license))
            .arg(&today)
            .arg(serde_json::to_string(usage).map_err(to_error)?)
            .arg(carry_field(day))
            .arg(serde_json::to_string(&carry).map_err(to_error)?)
            .query_async(con)
            .await?;
        let _: i64 = redis::cmd("HSET")
            .arg(keys.rollup_index())
            .arg(&usage.license)
            .arg(&today)
            .query_async(con)
            .await?;
        trimmed += trim(con, &keys.rollup(&usage.license), &cutoff).await?;
    }
    Ok((report.licenses.len(), trimmed))
}

/// The oldest UTC day (`2026-11-01`; dates order as text) whose figures,
/// and whose carry, a rollup HASH keeps.
struct Cutoff {
    day: String,
    carry: String,
}

/// Drops the days and carries of rollup HASH `key` before their cutoff.
/// Returns how many.
async fn trim<C: ConnectionLike>(con: &mut C, key: &str, cutoff: &Cutoff) -> Result<usize, Error> {
    let mut cursor = "0".to_owned();
    let mut old = Vec::new();
    loop {
        let (next, page): (String, Vec<String>) = redis::cmd("HSCAN")
            .arg(key)
            .arg(&cursor)
            .arg("COUNT")
            .arg(500)
            .query_async(con)
            .await?;
        // Field, value, field, value: the fields are the even ones.
        old.extend(
            page.into_iter()
                .step_by(2)
                .filter(|f| match f.strip_prefix(CARRY_PREFIX) {
                    Some(day) => day < cutoff.carry.as_str(),
                    None => f.as_str() < cutoff.day.as_str(),
                }),
        );
        if next == "0" {
            break;
        }
        cursor = next;
    }
    if !old.is_empty() {
        let _: i64 = redis::cmd("HDEL").arg(key).arg(&old).query_async(con).await?;
    }
    Ok(old.len())
}

fn to_error(e: serde_json::Error) -> Error {
    Error::Io(std::io::Error::other(e))
}
