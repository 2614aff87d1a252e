//! The reaper: evicts sessions whose heartbeat is stale, times out waiters,
//! and hands free seats to the queue, on a schedule, for the licenses due.
//!
//! A pass reaps only the licenses the due index (runtime::due) says have
//! work by now, so it costs Redis what there is to do, not one script call
//! per license; a bounded sweep per pass finds what the index lacks and
//! counts the seats of every license for the metrics.
//! Each license is handled by lua/reap.lua, atomically and in bounded steps,
//! so a session is evicted (and its event published) exactly once even when
//! several processes reap at the same moment. Scheduled passes run in the
//! process holding the reaper lock, the leader: it takes the lock when nobody
//! holds it and renews it on every scheduled pass (lua/renew.lua), so it keeps
//! it until it stops or dies, and then another process takes over once the
//! lock expires. The leader alone exports the shared-state metrics (seats,
//! queues, stream backlog), so they are right however many processes are
//! scraped. Correctness never depends on that lock.
//!
//! The outage rule: time the service was away is not counted against
//! heartbeats. Each pass finds the read watermark (the oldest request not yet
//! decided in any requests stream) and whether service just resumed after a
//! gap (its previous pass, kept in `seat:reaper:clock`, older than two
//! periods), and lua/reap.lua evicts by them (its header, and
//! docs/failure-modes.md, "The outage rule").

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::Value;
use tokio_cron_scheduler::{Job, JobScheduler};
use tracing::{debug, info, warn};

use crate::config::Settings;
use crate::error::Error;
use crate::runtime::due::{DueIndex, Sweep};
use crate::runtime::metrics::{self, Expiry, LicenseSeats, SeatCensus, StreamHealth};
use crate::runtime::publish::Publisher;
use seatgate_core::db::Db;
use seatgate_core::keys::DueKeys;
use seatgate_core::keys::Keys;
use seatgate_core::scripts::{Outage, OutboxCursor, ReapArgs, Scripts};
use seatgate_core::status::Status;

/// Licenses a pass claims from a due index shard at a time: one
/// lua/due_claim.lua and one lua/due_settle.lua call per page, each well
/// under a millisecond of Redis time (256 took 1.8 ms for a page of stale
/// licenses on a 2-core machine under load, and 128 up to 3 ms on a slower
/// one: the claim marks each license in both halves of a 1,000,000-entry
/// index).
const DUE_PAGE: usize = 64;

/// The `reason` of the `evicted` event that ends a seat of a deleted license.
pub const LICENSE_DELETED: &str = "license_deleted";

/// What one pass did, summed over licenses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Licenses reaped: those the due index said were due.
    pub licenses: usize,
    /// Sessions evicted (stale heartbeat).
    pub evicted: usize,
    /// Sessions stale by the plain heartbeat timeout that the outage rule,
    /// or a grant not yet delivered, kept from eviction.
    pub held: usize,
    /// What the pass allowed for under the outage rule.
    pub outage: Outage,
    /// Lingering and borrowed seats freed because their linger or borrow ended.
    pub ended: usize,
    /// Waiters granted a seat.
    pub granted: usize,
    /// Waiters timed out.
    pub timed_out: usize,
    /// Seats and waits ended because the license record was gone (deleted
    /// behind seatgate's back).
    pub deleted: usize,
    /// Sessions waiting after the pass, per license with a non-empty queue.
    pub queues: Vec<(String, i64)>,
    /// Seats and queue of every license reaped, as the pass left them.
    pub seats: Vec<LicenseSeats>,
    /// Licenses the sweep looked at (runtime::due).
    pub swept: usize,
    /// Licenses with seats, waiters or replies the sweep found missing from
    /// the due index, and filed (and reaped in this pass).
    pub filed: Vec<String>,
    /// The seats of every license of the license index, when this pass
    /// ended a round of the sweep over it (every pass, with fewer licenses
    /// than `reaper.sweep`).
    pub census: Option<SeatCensus>,
}

/// What `seatgate license delete` ended ([`Reaper::delete_license`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LicenseDeleted {
    /// The license record existed (and is now deleted).
    pub existed: bool,
    /// Seats ended.
    pub seats: usize,
    /// Waits ended, each waiter told LICENSE_NOT_FOUND.
    pub waits: usize,
}

/// Runs reaper passes.
#[derive(Clone)]
pub struct Reaper {
    /// Managed connection shared with nothing blocking.
    con: Db,
    /// Key names.
    keys: Keys,
    /// Events and waiter replies.
    publisher: Publisher,
    /// Heartbeat timeout for licenses without their own.
    default_timeout_ms: u64,
    /// Claim window of a grant (`queue.claim_ms`).
    default_claim_ms: u64,
    /// Most removals per script call.
    batch: usize,
    /// Licenses reaped concurrently (pipelined on the one connection).
    concurrency: usize,
    /// Age after which an undelivered outbox note is delivered again, ms.
    redeliver_after_ms: u64,
    /// Held while a pass runs: tokio-cron-scheduler starts a job again on
    /// schedule even when the previous run has not finished.
    running: Arc<tokio::sync::Mutex<()>>,
    /// This reaper's token in the pass lock: unique per instance, even
    /// within one process (tests run several).
    token: String,
    /// The requests stream and its group, for trimming and consumer cleanup.
    stream: crate::config::StreamSettings,
    /// Every requests stream the workers read (each shard, and the base
    /// stream when sharded).
    request_streams: Vec<String>,
    /// The due index.
    due: DueIndex,
    /// Moves the events of the licenses it reaps or deletes to their shards,
    /// before their queue replies go out (a cluster; `None` on one node).
    relay: Option<crate::runtime::relay::Relay>,
    /// Licenses of the license index the sweep looks at per pass.
    sweep_budget: usize,
    /// Where the sweep stands; held for the whole of a pass.
    sweep: Arc<tokio::sync::Mutex<Sweep>>,
    /// How long a pass's claim on a license lasts, ms: a pass that dies
    /// leaves its licenses to the passes after this (the reaper lock's lifetime).
    claim_ms: u64,
    /// The admin stream, trimmed and cleaned like a shard.
    admin_stream: String,
    /// The schedule's period, ms (its longest gap between two ticks; 0
    /// when it cannot be read). A pass writes it next to its own time, so
    /// that any reaper can tell a gap between passes from the normal beat.
    period_ms: u64,
}

impl Reaper {
    /// A reaper for `settings` on `con`.
    pub fn new(con: Db, settings: &Settings) -> Reaper {
        Reaper {
            con,
            keys: settings.seat_keys(),
            publisher: Publisher::new(settings),
            default_timeout_ms: settings.sessions.heartbeat_timeout_ms,
            default_claim_ms: settings.queue.claim_ms,
            batch: settings.reaper.batch,
            concurrency: settings.reaper.concurrency,
            redeliver_after_ms: settings.reaper.redeliver_after_ms,
            running: Arc::new(tokio::sync::Mutex::new(())),
            token: {
                static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("{}:{}:{n}", settings.consumer_name(), std::process::id())
            },
            stream: settings.stream.clone(),
            request_streams: settings.read_streams(),
            due: DueIndex::new(settings),
            relay: crate::runtime::relay::Relay::new(&settings.seat_keys()),
            sweep_budget: settings.reaper.sweep,
            sweep: Arc::default(),
            claim_ms: settings.reaper.lock_ms,
            admin_stream: settings.stream.admin_requests.clone(),
            period_ms: schedule_period_ms(&settings.reaper.schedule).unwrap_or(0),
        }
    }

    /// What the next reap may allow for under the outage rule, at Redis
    /// time `now_ms`: the read watermark, and when service last resumed. A
    /// previous pass (`last_pass` in `seat:reaper:clock`) older than two
    /// periods (or than `reaper.lock_ms` while no period is known) means
    /// nobody could reap for a while: Redis was away or restarted, or no
    /// reaper ran; service resumed now, and that is recorded.
    async fn outage(&self, con: &mut Db, now_ms: i64) -> Result<(Outage, Option<i64>), Error> {
        let clock = self.keys.reaper_clock();
        let (last, period, resumed, gap): (Option<i64>, Option<i64>, Option<i64>, Option<i64>) =
            redis::cmd("HMGET")
                .arg(&clock)
                .arg("last_pass")
                .arg("period_ms")
                .arg("resumed_at")
                .arg("gap_ms")
                .query_async(con)
                .await?;
        let threshold = match period {
            Some(p) if p > 0 => 2 * p,
            _ => i64::try_from(self.claim_ms).unwrap_or(i64::MAX),
        };
        let (mut resumed_at, mut gap_ms) = (resumed, gap);
        if let Some(last) = last.filter(|last| now_ms - last > threshold) {
            let gap = now_ms - last;
            warn!(
                gap_ms = gap,
                "no reaper pass for longer than two periods (Redis away or restarted, or no reaper): every holder gets a whole heartbeat timeout from now before it is evicted"
            );
            let _: () = redis::cmd("HSET")
                .arg(&clock)
                .arg("resumed_at")
                .arg(now_ms)
                .arg("gap_ms")
                .arg(gap)
                .query_async(con)
                .await?;
            resumed_at = Some(now_ms);
            gap_ms = Some(gap);
        }
        let watermark_ms = self.read_watermark(con).await;
        let outage = Outage {
            watermark_ms,
            resumed_at_ms: resumed_at.filter(|ms| *ms > 0),
        };
        // The gap allowed for now: the read lag, or the last gap while the
        // holders' grace after it lasts (a default timeout).
        let lag = watermark_ms.map_or(0, |w| (now_ms - w).max(0));
        let default_timeout = i64::try_from(self.default_timeout_ms).unwrap_or(i64::MAX);
        let resumed_gap = match (resumed_at, gap_ms) {
            (Some(at), Some(gap)) if now_ms < at.saturating_add(default_timeout) => gap,
            _ => 0,
        };
        Ok((outage, Some(lag.max(resumed_gap))))
    }

    /// The read watermark: the Redis time (ms) of the oldest request not yet
    /// decided in any requests stream, `None` when none waits. Per stream,
    /// the oldest entry pending in the group (`XPENDING`'s summary), and the
    /// first entry after the group's last-delivered-id, when `XINFO GROUPS`
    /// does not say `lag` 0 ([`first_undelivered`]: `lag` alone can name
    /// entries that were delivered long ago). A stream that cannot be read
    /// counts as none.
    async fn read_watermark(&self, con: &mut Db) -> Option<i64> {
        let mut oldest: Option<StreamId> = None;
        for stream in &self.request_streams {
            let groups: redis::RedisResult<Vec<HashMap<String, Value>>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(stream)
                .query_async(con)
                .await;
            let Ok(groups) = groups else { continue };
            let field = |g: &HashMap<String, Value>, k: &str| g.get(k).cloned();
            let Some(ours) = groups.iter().find(|g| {
                field(g, "name")
                    .and_then(|v| redis::from_redis_value::<String>(v).ok())
                    .is_some_and(|n| n == self.stream.group)
            }) else {
                continue;
            };
            let int = |k: &str| {
                field(ours, k)
                    .and_then(|v| redis::from_redis_value::<Option<i64>>(v).ok())
                    .flatten()
            };
            let mut candidates = Vec::new();
            if int("pending").unwrap_or(0) > 0 {
                let summary: redis::RedisResult<Value> = redis::cmd("XPENDING")
                    .arg(stream)
                    .arg(&self.stream.group)
                    .query_async(con)
                    .await;
                if let Ok(Value::Array(parts)) = summary {
                    candidates.extend(
                        parts
                            .get(1)
                            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                            .and_then(|id| StreamId::parse(&id)),
                    );
                }
            }
            if int("lag") != Some(0) {
                let last = field(ours, "last-delivered-id")
                    .and_then(|v| redis::from_redis_value::<String>(v).ok())
                    .unwrap_or_else(|| "0-0".to_owned());
                candidates.extend(first_undelivered(con, stream, &last).await);
            }
            for id in candidates {
                oldest = Some(oldest.map_or(id, |o| o.min(id)));
            }
        }
        // 0 would read as "none waits": an undelivered entry after 0-0 is
        // as old as can be.
        oldest.map(|id| i64::try_from(id.0).unwrap_or(i64::MAX).max(1))
    }

    /// Records the end of a pass (Redis clock) and the period this process
    /// sees, for the next pass's look at the gap.
    async fn record_pass(&self, con: &mut Db) -> Result<(), Error> {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.reaper_clock())
            .arg("last_pass")
            .arg(secs * 1000 + micros / 1000);
        let period = self.period_ms;
        if period > 0 {
            cmd.arg("period_ms").arg(period);
        }
        let _: () = cmd.query_async(con).await?;
        Ok(())
    }

    /// Stream upkeep: trims the requests stream (and the admin stream) of
    /// entries every group has acknowledged (never of pending or undelivered
    /// ones), and removes consumers idle for `stream.consumer_idle_ms` with
    /// nothing pending.
    pub async fn maintain_stream(&self) -> Result<(), Error> {
        for stream in self.request_streams.iter().chain([&self.admin_stream]) {
            self.maintain_shard(stream).await?;
        }
        Ok(())
    }

    async fn maintain_shard(&self, requests: &str) -> Result<(), Error> {
        let mut con = self.con.clone();
        // A stream no worker has created yet (XINFO would fail on it) has nothing to trim.
        let kind: String = redis::cmd("TYPE").arg(requests).query_async(&mut con).await?;
        if kind == "none" {
            return Ok(());
        }
        // The oldest entry still needed: the oldest pending one of any group,
        // or (when nothing is pending) the last one delivered to the group.
        let groups: Vec<HashMap<String, Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(requests)
            .query_async(&mut con)
            .await?;
        let mut keep_from: Option<StreamId> = None;
        for group in &groups {
            let name = group
                .get("name")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
            let Some(name) = name else { continue };
            let summary: Value = redis::cmd("XPENDING")
                .arg(requests)
                .arg(&name)
                .query_async(&mut con)
                .await?;
            let oldest_pending = match &summary {
                Value::Array(parts) => parts
                    .get(1)
                    .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok()),
                _ => None,
            };
            let last_delivered = group
                .get("last-delivered-id")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
            let needed = oldest_pending
                .or(last_delivered)
                .and_then(|id| StreamId::parse(&id));
            keep_from = match (keep_from, needed) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        if let (Some(min), false) = (keep_from, groups.is_empty()) {
            let trimmed: i64 = redis::cmd("XTRIM")
                .arg(requests)
                .arg("MINID")
                .arg(min.to_string())
                .query_async(&mut con)
                .await?;
            if trimmed > 0 {
                debug!(trimmed, "trimmed acknowledged requests");
            }
        }
        self.remove_idle_consumers(&mut con, requests).await
    }

    /// Removes the consumers of `requests` left over by workers that are
    /// gone: idle for `stream.consumer_idle_ms`, nothing pending, and no
    /// liveness key. Idle time alone cannot tell: on Redis 7.0 a read that
    /// finds nothing does not reset it, so a live worker on a quiet stream
    /// looks idle. Its read loop keeps its liveness key
    /// ([`seatgate_core::keys::consumer_alive`]), and that is checked first.
    /// The removal itself (lua/remove_consumer.lua) checks the pending list
    /// again in the same step, so a read that lands after XINFO CONSUMERS
    /// cannot have its entries dropped from the pending list.
    async fn remove_idle_consumers(&self, con: &mut Db, requests: &str) -> Result<(), Error> {
        let group = &self.stream.group;
        let consumers: Vec<HashMap<String, Value>> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(requests)
            .arg(group)
            .query_async(con)
            .await?;
        for c in consumers {
            let int = |k: &str| {
                c.get(k)
                    .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok())
                    .unwrap_or(0)
            };
            let name = c
                .get("name")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
            let (Some(name), 0, true) = (name, int("pending"), int("idle") > self.stream.consumer_idle_ms)
            else {
                continue;
            };
            let alive = seatgate_core::keys::consumer_alive(requests, group, &name);
            let alive: bool = redis::cmd("EXISTS").arg(&alive).query_async(con).await?;
            if alive {
                debug!(consumer = %name, "idle consumer of a live worker kept");
                continue;
            }
            if Scripts::get()
                .remove_consumer(con, requests, group, &name)
                .await?
            {
                info!(consumer = %name, "removed idle consumer from the group");
            } else {
                debug!(consumer = %name, "idle consumer took entries meanwhile; kept");
            }
        }
        Ok(())
    }

    /// One pass, without the cross-process lock: a step of the sweep (which
    /// files what the due index lacks), then every license due by the
    /// Redis clock at the pass's start, a page at a time per shard.
    pub async fn pass(&self) -> Result<PassReport, Error> {
        let started = Instant::now();
        let mut sweep = self.sweep.lock().await;
        let mut con = self.con.clone();
        // A library of this build's name with other code would run in
        // place of reap.lua: no pass until it is this build's again (the
        // worker's library check says so too).
        let scripts = seatgate_core::scripts::Scripts::get();
        if scripts.library_state(&mut con).await? == seatgate_core::scripts::LibraryState::Foreign {
            return Err(Error::ForeignLibrary(scripts.library_name().to_owned()));
        }
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await?;
        let now_ms = secs * 1000 + micros / 1000;
        // Filed just before the pass's clock, so this pass reaps them.
        let step = sweep
            .step(&mut con, &self.keys, &self.due, self.sweep_budget, now_ms - 1)
            .await?;
        if !step.filed.is_empty() {
            info!(count = step.filed.len(), licenses = ?step.filed.iter().take(10).collect::<Vec<_>>(), "filed licenses the due index lacked");
        }
        let (outage, grace_ms) = self.outage(&mut con, now_ms).await?;
        let mut report = PassReport {
            swept: step.looked_at,
            filed: step.filed,
            outage,
            ..PassReport::default()
        };
        let mut first_error = None;
        for shard in self.due.shards() {
            if let Err(e) = self
                .reap_shard(&mut con, &shard, now_ms, outage, &mut report)
                .await
            {
                warn!(shard = %shard.due, error = %e, "reaping a due index shard failed; the next pass retries");
                first_error.get_or_insert(e);
            }
        }
        // The census counts each license as the pass left it.
        let reaped: HashMap<&str, &LicenseSeats> =
            report.seats.iter().map(|s| (s.license.as_str(), s)).collect();
        let seats = step
            .seats
            .into_iter()
            .map(|s| {
                let expiry = s.expiry; // the census read it; reap.lua does not
                reaped
                    .get(s.license.as_str())
                    .map_or(s, |&r| LicenseSeats { expiry, ..r.clone() })
            })
            .collect();
        report.census = sweep.count(seats, step.round_done, now_ms);
        drop(sweep);
        if let Err(e) = self.record_pass(&mut con).await {
            first_error.get_or_insert(e);
        }
        metrics::reaper_pass(started.elapsed());
        metrics::reaper_grace(grace_ms.unwrap_or(0), report.held);
        if report.held > 0 {
            info!(
                held = report.held,
                watermark_ms = ?outage.watermark_ms,
                resumed_at_ms = ?outage.resumed_at_ms,
                "outage rule: stale sessions kept for now"
            );
        }
        match first_error {
            Some(e)
                if report.evicted + report.ended + report.granted + report.timed_out + report.deleted
                    == 0 =>
            {
                Err(e)
            }
            _ => Ok(report),
        }
    }

    /// Reaps the licenses of due index shard `shard` due before `now_ms`, a
    /// page at a time: claim, reap concurrently, file the times they are due
    /// next. A license whose reap failed is filed due at `now_ms` (the next
    /// pass retries it). Each pass takes at most as many licenses as the
    /// shard held when it began, so a Redis clock stepped back cannot keep a
    /// pass going round.
    async fn reap_shard(
        &self,
        con: &mut Db,
        shard: &DueKeys,
        now_ms: i64,
        outage: Outage,
        report: &mut PassReport,
    ) -> Result<(), Error> {
        let (stale, due): (usize, usize) = redis::pipe()
            .zcard(&shard.stale)
            .zcard(&shard.due)
            .query_async(con)
            .await?;
        let most = stale + due;
        let mut taken = 0;
        while taken < most {
            let claim_end = now_ms.saturating_add(i64::try_from(self.claim_ms).unwrap_or(i64::MAX));
            let (marker, licenses) = Scripts::get()
                .due_claim(con, shard, now_ms, DUE_PAGE.min(most - taken), claim_end)
                .await?;
            if licenses.is_empty() {
                break;
            }
            taken += licenses.len();
            let page = licenses.len();
            let mut results = futures_util::stream::iter(licenses)
                .map(|license| async move {
                    let r = self.reap_one(&license, outage).await;
                    (license, r)
                })
                .buffer_unordered(self.concurrency);
            let mut dues = Vec::with_capacity(page);
            while let Some((license, result)) = results.next().await {
                match result {
                    Ok((one, (stale, due))) => {
                        report.licenses += 1;
                        report.evicted += one.evicted;
                        report.held += one.held;
                        report.ended += one.ended;
                        report.granted += one.granted;
                        report.timed_out += one.timed_out;
                        report.deleted += one.deleted;
                        if one.queues.first().is_some_and(|(_, d)| *d > 0) {
                            report.queues.extend(one.queues);
                        }
                        report.seats.extend(one.seats);
                        dues.push((license, stale.unwrap_or(0), due.unwrap_or(0)));
                    }
                    Err(e) => {
                        warn!(%license, error = %e, "reaping a license failed; the next pass retries");
                        dues.push((license, 0, now_ms));
                    }
                }
            }
            drop(results);
            let dues: Vec<(&str, i64, i64)> = dues.iter().map(|(l, s, d)| (l.as_str(), *s, *d)).collect();
            // Should this fail, the claims run out and a later pass takes them.
            Scripts::get().due_settle(con, shard, marker, &dues).await?;
            if page < DUE_PAGE {
                break;
            }
        }
        Ok(())
    }

    /// Reaps one license until it reports no more work, publishing what
    /// happened, under the outage rule as it stands now.
    pub async fn reap_license(&self, license: &str) -> Result<PassReport, Error> {
        let mut con = self.con.clone();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await?;
        let (outage, _) = self.outage(&mut con, secs * 1000 + micros / 1000).await?;
        self.reap_one(license, outage).await.map(|(report, _)| report)
    }

    /// [`Reaper::reap_license`], and the license's times for the due index
    /// after it (stale, due; `None`: none).
    async fn reap_one(
        &self,
        license: &str,
        outage: Outage,
    ) -> Result<(PassReport, (Option<i64>, Option<i64>)), Error> {
        let keys = self.keys.license(license);
        let mut con = self.con.clone();
        let mut report = PassReport::default();
        let mut outbox = OutboxCursor::start();
        loop {
            let started = Instant::now();
            let args = ReapArgs {
                default_timeout_ms: self.default_timeout_ms,
                default_claim_ms: self.default_claim_ms,
                limit: self.batch,
                redeliver_after_ms: self.redeliver_after_ms,
                outbox: &outbox,
                outage,
            };
            let step = Scripts::get().reap(&keys, &args).run(&mut con).await;
            metrics::script_call(
                "reap",
                step.as_ref().map(|_| None).map_err(|_| ()),
                started.elapsed(),
            );
            let step = step?;
            // Its events (and any a worker that died left) on the shard
            // before its queue replies go out.
            if let Some(relay) = &self.relay {
                relay.licenses(&con, [license]).await;
            }
            // Seats freed: stale sessions, then seats whose borrow or linger
            // ended (counted apart: nobody stopped heartbeating). Their
            // `evicted` events were recorded by the script.
            let freed = [
                ("heartbeat_timeout", &step.evicted),
                ("borrow_ended", &step.borrow_ended),
                ("linger_ended", &step.linger_ended),
            ];
            for (reason, sessions) in freed {
                for session in sessions {
                    if reason == "heartbeat_timeout" {
                        metrics::evicted();
                        info!(%license, %session, "evicted stale session");
                    } else {
                        metrics::policy_seat_freed(reason);
                        info!(%license, %session, reason, "freed a seat held without heartbeats");
                    }
                }
            }
            report.ended += step.borrow_ended.len() + step.linger_ended.len();
            if !step.deleted.is_empty() {
                warn!(%license, seats = step.deleted.len(), "the license record is gone: ending its seats");
                report.deleted += step.deleted.len();
            }
            // New notes count once; redelivered ones (left in the outbox by a
            // deliverer that died) are only delivered again.
            let redelivered = step.redeliver.iter().map(|n| (n, false));
            for (note, first_time) in step.notes.iter().map(|n| (n, true)).chain(redelivered) {
                if !first_time {
                    info!(%license, session = %note.session, status = %note.status, "re-delivering an undelivered queue reply");
                }
                let _ = self
                    .publisher
                    .deliver(&mut con, license, note, step.seats_at(), first_time)
                    .await;
                if !first_time {
                    continue;
                }
                match note.status {
                    Status::Granted => report.granted += 1,
                    Status::LicenseNotFound => report.deleted += 1,
                    _ => report.timed_out += 1,
                }
            }
            report.evicted += step.evicted.len();
            outbox = step.outbox;
            if !step.more {
                report.held = usize::try_from(step.held).unwrap_or(0);
                report.queues = vec![(license.to_owned(), step.queue_depth)];
                report.seats = vec![LicenseSeats {
                    license: license.to_owned(),
                    used: step.seats_used,
                    total: step.seats_total,
                    queued: step.queue_depth,
                    lingering: step.seats_lingering,
                    borrowed: step.seats_borrowed,
                    expiry: Expiry::Never,
                }];
                return Ok((report, (step.stale_ms, step.due_ms)));
            }
        }
    }

    /// `seatgate license delete`: deletes `license`'s record and ends
    /// everything on it, in steps of lua/delete_license.lua (the first
    /// deletes the record, so from then on no request gets a seat), each
    /// publishing the end of the seats it ended (`evicted`, reason
    /// `license_deleted`) and delivering its waiters' final LICENSE_NOT_FOUND
    /// replies. Those are in the outbox until delivered: should this
    /// process die first, the reaper delivers them (the license stays in
    /// the due index while its outbox holds any). The first step records
    /// the `license_deleted` event by `actor` (the admin trail).
    pub async fn delete_license(&self, license: &str, actor: &str) -> Result<LicenseDeleted, Error> {
        let keys = self.keys.license(license);
        let mut con = self.con.clone();
        let mut report = LicenseDeleted::default();
        loop {
            let started = Instant::now();
            let step = Scripts::get()
                .delete_license(&keys, self.batch.max(1), actor)
                .run(&mut con)
                .await;
            metrics::script_call(
                "delete_license",
                step.as_ref().map(|_| None).map_err(|_| ()),
                started.elapsed(),
            );
            let step = step?;
            if let Some(relay) = &self.relay {
                relay.licenses(&con, [license]).await;
            }
            report.existed |= step.existed;
            report.seats += step.ended.len();
            let seats = seatgate_core::events::SeatsAt {
                used: 0,
                total: 0,
                at_ms: step.now_ms,
            };
            for note in &step.notes {
                let _ = self.publisher.deliver(&mut con, license, note, seats, true).await;
                report.waits += 1;
            }
            if !step.more {
                break;
            }
        }
        // The group map is provisioning, like the record: it goes with the
        // license (acquire alone reads it, and nobody acquires any more).
        let _: i64 = redis::cmd("DEL").arg(&keys.groups).query_async(&mut con).await?;
        // The index is another slot: a separate command, after the record.
        let _: i64 = redis::cmd("SREM")
            .arg(self.keys.license_index())
            .arg(license)
            .query_async(&mut con)
            .await?;
        // A reply whose delivery failed waits in the outbox for the reaper,
        // and so do events not relayed (a cluster): the license is no longer
        // in the index the sweep walks.
        let undelivered: i64 = redis::cmd("EXISTS")
            .arg(&keys.outbox)
            .arg(&keys.events.log)
            .query_async(&mut con)
            .await?;
        if undelivered > 0 {
            let now_ms = self.redis_ms(&mut con).await?;
            let _: i64 = self.due.file_due(license, now_ms).query_async(&mut con).await?;
        }
        Ok(report)
    }

    /// The Redis clock, ms.
    async fn redis_ms(&self, con: &mut Db) -> Result<i64, Error> {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// A scheduled pass. Takes or renews the reaper lock first: a process
    /// that does not hold it skips the pass and exports no shared state. The
    /// leader renews it even while its previous pass still runs (that pass
    /// is then not overlapped: this one is skipped), so a long pass never
    /// loses it.
    pub async fn scheduled_pass(&self, lock_ms: u64) {
        let mut con = self.con.clone();
        let lock = self.keys.reaper_lock();
        let leader = match Scripts::get().renew(&mut con, &lock, &self.token, lock_ms).await {
            Ok(held) => held,
            Err(e) => {
                debug!(error = %e, "reaper lock unavailable; skipping this pass");
                false
            }
        };
        metrics::reaper_leader(leader);
        if !leader {
            return;
        }
        let Ok(_running) = self.running.try_lock() else {
            debug!("previous reaper pass still running; skipping this one");
            metrics::shared_state_extend(Duration::from_millis(lock_ms));
            return;
        };
        let seats = match self.pass().await {
            Ok(r) => {
                metrics::reaper_succeeded();
                if r.evicted + r.ended + r.granted + r.timed_out + r.deleted > 0 {
                    info!(
                        licenses = r.licenses,
                        evicted = r.evicted,
                        ended = r.ended,
                        granted = r.granted,
                        timed_out = r.timed_out,
                        deleted = r.deleted,
                        "reaper pass"
                    );
                }
                Some(r.census)
            }
            Err(e) => {
                warn!(error = %e, "reaper pass failed");
                None
            }
        };
        if let Err(e) = self.maintain_stream().await {
            debug!(error = %e, "requests stream upkeep failed; the next pass retries");
        }
        if let Some(census) = seats {
            let (streams, dead_letters) = self.stream_health().await;
            metrics::shared_state(census, streams, dead_letters, Duration::from_millis(lock_ms));
        }
    }

    /// Gives the lock up (when this process holds it), so that another
    /// process leads from its next scheduled pass instead of after the lock
    /// expires. Called on shutdown, once the last pass has finished.
    pub async fn resign(&self) {
        let mut con = self.con.clone();
        let lock = self.keys.reaper_lock();
        // Release only what we own: the lock may have expired and been taken by another.
        let _: redis::RedisResult<i64> = Scripts::get().unlock(&mut con, &lock, &self.token).await;
        metrics::reaper_leader(false);
    }

    /// The requests backlog of every shard (`XINFO GROUPS`: `pending`, and
    /// `lag`, which Redis 7.0 and later report) and the dead-letter stream's
    /// length. A shard whose stream or group does not exist yet, or that
    /// cannot be read, is left out.
    pub async fn stream_health(&self) -> (Vec<StreamHealth>, Option<i64>) {
        let mut con = self.con.clone();
        let mut out = Vec::with_capacity(self.request_streams.len());
        for stream in &self.request_streams {
            let groups: redis::RedisResult<Vec<HashMap<String, Value>>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(stream)
                .query_async(&mut con)
                .await;
            let Ok(groups) = groups else { continue };
            let int = |g: &HashMap<String, Value>, k: &str| {
                g.get(k)
                    .and_then(|v| redis::from_redis_value::<Option<i64>>(v.clone()).ok())
                    .flatten()
            };
            let ours = groups.iter().find(|g| {
                g.get("name")
                    .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                    .is_some_and(|n| n == self.stream.group)
            });
            if let Some(g) = ours {
                let mut lag = int(g, "lag");
                if lag.is_some_and(|n| n > 0) {
                    // Nothing after the last delivered entry: nothing waits,
                    // whatever Redis's counter says (see first_undelivered).
                    let last = g
                        .get("last-delivered-id")
                        .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                        .unwrap_or_else(|| "0-0".to_owned());
                    if first_undelivered(&mut con, stream, &last).await.is_none() {
                        lag = Some(0);
                    }
                }
                out.push(StreamHealth {
                    stream: stream.clone(),
                    pending: int(g, "pending").unwrap_or(0),
                    lag,
                });
            }
        }
        let dead: Option<i64> = redis::cmd("XLEN")
            .arg(&self.stream.dead_letter)
            .query_async(&mut con)
            .await
            .ok();
        (out, dead)
    }
}

/// Starts the reaper on its cron schedule; returns the scheduler to shut down.
pub async fn start(reaper: Reaper, schedule: &str, lock_ms: u64) -> Result<JobScheduler, Error> {
    let scheduler = JobScheduler::new().await?;
    let job = Job::new_async(schedule, move |_id, _lock| {
        let reaper = reaper.clone();
        Box::pin(async move { reaper.scheduled_pass(lock_ms).await })
    })
    .map_err(|source| Error::Schedule {
        schedule: schedule.to_owned(),
        source,
    })?;
    scheduler.add(job).await?;
    scheduler.start().await?;
    Ok(scheduler)
}

/// Waits for a running pass to finish (after the scheduler was shut down), at most `within`.
pub async fn drain(reaper: &Reaper, within: Duration) {
    let _ = tokio::time::timeout(within, reaper.running.lock()).await;
}

/// The period of cron `schedule` (6 fields, as tokio-cron-scheduler reads
/// it), ms: the longest gap between its next ticks over a day from a fixed
/// time (`None`: it does not parse, or ticks less than twice a day).
fn schedule_period_ms(schedule: &str) -> Option<u64> {
    let cron = croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .build()
        .parse(schedule)
        .ok()?;
    let start = chrono::DateTime::from_timestamp(1_767_225_600, 0)?; // 2026-01-01T00:00:00Z
    let end = start + chrono::TimeDelta::days(1);
    let mut prev = cron.find_next_occurrence(&start, false).ok()?;
    let mut longest = None;
    // At most a tick a second: 86,400 a day.
    for _ in 0..86_400 {
        let Ok(next) = cron.find_next_occurrence(&prev, false) else {
            break;
        };
        if next > end {
            break;
        }
        let gap = u64::try_from((next - prev).num_milliseconds()).ok()?;
        longest = Some(longest.map_or(gap, |l: u64| l.max(gap)));
        prev = next;
    }
    longest
}

/// A stream entry id, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct StreamId(u64, u64);

/// The id of `stream`'s first entry after `last` (a group's
/// last-delivered-id): the oldest entry the group has not been delivered,
/// `None` when there is none (or the stream cannot be read).
///
/// Asked of the stream itself because `XINFO GROUPS` `lag` cannot be
/// trusted to say: it is the entries added less Redis's count of those the
/// group read, and a replica promoted by a failover lacks its master's
/// count (Redis 7.0 does not replicate `entries-read` when `XREADGROUP`
/// delivers entries), so its `lag` names, for good, entries that were
/// delivered and decided before the failover (the history checker on a
/// cluster found `lag` 70 with nothing after the last-delivered-id; the
/// read watermark then stayed at that shard's last request, and the reaper
/// evicted no holder whose last heartbeat came after it while the shard was
/// quiet). After an `XDEL` in the middle of the stream `lag` is null.
async fn first_undelivered(con: &mut Db, stream: &str, last: &str) -> Option<StreamId> {
    let next: Vec<(String, Value)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg(format!("({last}"))
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query_async(con)
        .await
        .ok()?;
    StreamId::parse(&next.first()?.0)
}

impl StreamId {
    fn parse(s: &str) -> Option<StreamId> {
        let (ms, seq) = s.split_once('-')?;
        Some(StreamId(ms.parse().ok()?, seq.parse().ok()?))
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_period_is_its_longest_gap() {
        assert_eq!(schedule_period_ms("*/5 * * * * *"), Some(5_000));
        assert_eq!(schedule_period_ms("* * * * * *"), Some(1_000));
        assert_eq!(schedule_period_ms("0,10 * * * * *"), Some(50_000));
        assert_eq!(schedule_period_ms("*/5 * * * *"), None, "no seconds field");
    }

    #[test]
    fn stream_ids_order_numerically() {
        let a = StreamId::parse("99-5").unwrap();
        let b = StreamId::parse("100-0").unwrap();
        assert!(a < b);
        assert_eq!(b.to_string(), "100-0");
        assert_eq!(StreamId::parse("nope"), None);
    }
}
