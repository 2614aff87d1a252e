//! The stream consumer: reads requests (lua/read.lua), decides each with a
//! seat script, replies on the caller's stream, then acknowledges.
//!
//! Order per entry: decide (script) → reply (to `reply_to`) → XACK. An entry is
//! acknowledged only once its effect is in Redis and its reply is written, so
//! a crash in between leaves it pending. Pending entries come back three ways:
//! this worker re-reads its own after a transient failure; any worker claims
//! (XAUTOCLAIM) those another consumer has held for `stream.claim_idle_ms`;
//! and one delivered more than `stream.max_deliveries` times goes to the
//! dead-letter stream. A redelivered entry has the effect of one delivery:
//! the scripts remember each entry's reply (lua/includes/dedupe.lua).
//!
//! The admin stream (`stream.admin_requests`, administrators' `revoke`s) is
//! read the same way by one more loop, in the same group; the parser is told
//! which stream an entry came from ([`Lane`]) and takes on each only its ops.
//!
//! Each read loop also keeps a liveness key for its consumer
//! ([`consumer_alive`]), so the reaper's consumer cleanup never removes the
//! consumer of a live worker: on Redis 7.0 a read that finds nothing does not
//! reset the consumer's idle time, so a quiet stream alone cannot tell.
//!
//! This file sets up the consumer of every shard and runs its read loop;
//! `read` reads through lua/read.lua (new, own pending and claimed entries),
//! `doorbell` wakes an idle loop when its stream is written, `schedule`
//! decides what to read when, `decide` runs a batch's scripts and `settle`
//! answers, dead-letters and acknowledges it.

mod decide;
mod doorbell;
mod library;
mod read;
mod schedule;
mod settle;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use self::decide::Decider;
use self::doorbell::{Bell, Doorbell};
use self::library::LibraryWatch;
use self::read::{Entry, Source, FIRST_POLL, SWEEP_START};
use self::schedule::Schedule;
use crate::config::Settings;
use crate::error::Error;
use crate::runtime::health::Readiness;
use crate::runtime::metrics;
use seatgate_core::db::{is_out_of_memory, is_transient, Db};
use seatgate_core::keys::{consumer_alive, EVENTS_SHARDS};
use seatgate_core::request::Lane;
use seatgate_core::scripts::Scripts;

/// A worker: one consumer in the group of every requests stream shard and
/// of the admin stream, a read loop per stream (a blocking read names one
/// stream, and on a cluster the shards live on different masters), all
/// sharing one decider (`decide.rs`).
pub struct Worker {
    /// One reader per shard, then the admin stream's.
    shards: Vec<ShardWorker>,
    /// This process's consumer name.
    consumer: String,
    /// Whether the function library on Redis is this build's, checked on a timer.
    library: Arc<LibraryWatch>,
    /// The connection the library is checked on.
    con: Db,
    /// What wakes the read loops when their streams are written.
    doorbell: Arc<Doorbell>,
    /// Where the doorbell connects.
    redis: seatgate_core::db::RedisSettings,
}

impl Worker {
    /// Connects to Redis, checks (or records) the deployment's shard count,
    /// creates the consumer group of every requests stream if needed and
    /// loads the scripts.
    pub async fn connect(settings: Settings, ready: Readiness) -> Result<Worker, Error> {
        let mut con = crate::connect(&settings).await?;
        check_shards(&mut con, &settings).await?;
        record_topology(&mut con, &settings).await?;
        let decider = Arc::new(Decider::new(settings.clone(), con.clone(), ready.clone()));
        let library = Arc::new(LibraryWatch::default());
        library.check(&mut con).await;
        let mut shards = Vec::new();
        // A read loop per shard, one for the base stream when sharded, and
        // one for the admin stream.
        let streams = settings.read_streams().into_iter().map(|s| (s, Lane::Requests));
        let admin = (settings.stream.admin_requests.clone(), Lane::Admin);
        let streams: Vec<(String, Lane)> = streams.chain([admin]).collect();
        let names: Vec<String> = streams.iter().map(|(s, _)| s.clone()).collect();
        let doorbell = Doorbell::new(&names);
        let shared = Shared {
            settings: settings.clone(),
            ready: ready.clone(),
            con: con.clone(),
            decider,
            library: library.clone(),
        };
        for (stream, lane) in streams {
            let bell = doorbell.bell(&stream);
            shards.push(ShardWorker::connect(&shared, bell, stream, lane).await?);
        }
        shards
            .first_mut()
            .ok_or_else(|| Error::Config("stream.shards must be at least 1".into()))?
            .check_eviction_policy()
            .await;
        Ok(Worker {
            consumer: settings.consumer_name(),
            shards,
            library,
            con,
            doorbell,
            redis: settings.redis.clone(),
        })
    }

    /// This worker's consumer name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Serves every shard until `shutdown` is cancelled; each finishes the
    /// batches in hand before returning.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let mut loops = JoinSet::new();
        for shard in self.shards {
            loops.spawn(shard.run(shutdown.clone()));
        }
        let (library, con, stop) = (self.library, self.con, shutdown.clone());
        loops.spawn(async move {
            library.watch(con, stop).await;
            Ok(())
        });
        let (doorbell, redis, stop) = (self.doorbell, self.redis, shutdown.clone());
        loops.spawn(async move {
            doorbell.run(redis, stop).await;
            Ok(())
        });
        let mut result = Ok(());
        while let Some(done) = loops.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(e) => result = Err(Error::Task(e)),
            }
        }
        result
    }
}

/// Records `stream.shards` and the events shard count in the deployment's
/// settings HASH (`<prefix>:config`, fields `shards` and `events_shards`),
/// where clients and readers of the events find them, or refuses to start
/// when this worker would not read every stream the clients may write to,
/// or would record events elsewhere than the rest.
///
/// The requests shard count may grow online: a worker with more shards than
/// recorded reads every old stream too (shards `{0}`…`{n-1}` are among its
/// own, and a sharded worker reads the unsharded stream as well), so it
/// records its count, and clients that read it from then on spread over the
/// new shards while those still on the old count are served as before.
/// The events must stay where they are meanwhile: such a worker needs
/// `events.shards` set to the recorded events count. Fewer shards than
/// recorded would leave streams unread: that needs the streams drained
/// first (docs/running.md, "Changing the topology"). A Redis refusing
/// writes for now (out of memory) leaves the counts unrecorded, with a warning.
async fn check_shards(con: &mut Db, settings: &Settings) -> Result<(), Error> {
    let key = seatgate_core::keys::Keys::new(settings.keys.prefix.clone()).deployment();
    let ours = settings.stream.shards;
    let our_events = settings.events_shards();
    let (shards, events): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(&key)
        .arg("shards")
        .arg(EVENTS_SHARDS)
        .query_async(con)
        .await?;
    let count = |raw: &Option<String>| raw.as_deref().and_then(|r| r.parse::<usize>().ok());
    let recorded = count(&shards);
    // Before events_shards was recorded, the events were sharded as the
    // requests stream was.
    let recorded_events = count(&events).or(recorded);
    let guide = "docs/running.md, \"Changing the topology\"";
    match recorded {
        Some(n) if n == ours => {}
        Some(n) if n > ours => {
            return Err(Error::Config(format!(
                "stream.shards is {ours}, but this deployment runs with {n} ({key}, field shards): \
                 fewer shards would leave streams unread; shrinking needs every worker stopped and the \
                 streams drained first, then HSET {key} shards {ours} ({guide})"
            )))
        }
        Some(n) => {
            info!(from = n, to = ours, key = %key, "growing the deployment's requests shards; clients that read the count from now on use the new shards");
        }
        None if shards.is_some() => {
            return Err(Error::Config(format!(
                "{key} field shards is {:?}, not a number: set it to the deployment's shard count",
                shards.unwrap_or_default()
            )))
        }
        None => {}
    }
    if let Some(n) = recorded_events.filter(|n| *n != our_events) {
        let how = if settings.events.shards == 0 {
            format!("set events.shards = {n} to keep them there")
        } else {
            format!("events.shards must stay {n}")
        };
        return Err(Error::Config(format!(
            "this worker would record events on {our_events} shard(s), but this deployment's are on {n} \
             ({key}, field {EVENTS_SHARDS}): {how} ({guide})"
        )));
    }
    // Record what is not recorded yet with HSETNX (a worker starting at the
    // same time may record first: this one is then checked against it),
    // and a grown count with HSET.
    let writes = [
        ("shards", ours, recorded.is_none()),
        (EVENTS_SHARDS, our_events, count(&events).is_none()),
    ];
    let mut raced = false;
    for (field, value, unrecorded) in writes {
        let grown = field == "shards" && recorded.is_some_and(|n| n < ours);
        if !unrecorded && !grown {
            continue;
        }
        let command = if grown { "HSET" } else { "HSETNX" };
        let written: redis::RedisResult<bool> = redis::cmd(command)
            .arg(&key)
            .arg(field)
            .arg(value)
            .query_async(con)
            .await;
        match written {
            Ok(written) => raced |= unrecorded && !written,
            Err(e) if is_transient(&e) && !e.is_io_error() => {
                warn!(error = %e, key = %key, "cannot record the shard count yet; clients reading it find none");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
    if raced {
        return Box::pin(check_shards(con, settings)).await;
    }
    if recorded.is_none() {
        info!(shards = ours, key = %key, "recorded the deployment's shard count");
    }
    Ok(())
}

/// Records the rest of the deployment's [`Topology`](seatgate_core::keys::Topology)
/// beside its shard count (the requests stream, the applications with
/// streams of their own, the admin stream, the reply namespace), where a
/// client built with `Client::builder()` finds them: a program names only
/// its Redis and its application. Every worker writes what its settings
/// say, so the last one started wins; workers of one deployment share
/// their settings. A Redis refusing writes for now leaves it as it was,
/// with a warning.
async fn record_topology(con: &mut Db, settings: &Settings) -> Result<(), Error> {
    let key = seatgate_core::keys::Keys::new(settings.keys.prefix.clone()).deployment();
    let mut hset = redis::cmd("HSET");
    hset.arg(&key);
    for (field, value) in settings.topology().recorded_fields() {
        hset.arg(field).arg(value);
    }
    match hset.query_async::<i64>(con).await {
        Ok(_) => Ok(()),
        Err(e) if is_transient(&e) && !e.is_io_error() => {
            warn!(error = %e, key = %key, "cannot record the deployment's streams yet; clients reading them find the defaults");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// What every read loop of a worker shares.
#[derive(Clone)]
struct Shared {
    settings: Settings,
    ready: Readiness,
    con: Db,
    decider: Arc<Decider>,
    library: Arc<LibraryWatch>,
}

/// The read loop of one requests stream shard (or of the admin stream).
struct ShardWorker {
    /// The requests stream (shard) this loop reads.
    stream: String,
    /// Which ops that stream takes.
    lane: Lane,
    /// Settings the worker was started with.
    settings: Settings,
    /// This process's consumer name in the group.
    consumer: String,
    /// Scripts and replies go over a managed, multiplexed connection: many
    /// requests of one batch share it concurrently (implicit pipelining), it
    /// reconnects by itself, and its response timeout bounds a stuck call.
    con: Db,
    /// How long the next read with nothing new waits before looking again
    /// while the doorbell is down (read.rs).
    idle_poll: Duration,
    /// Rung when this loop's stream is written (doorbell.rs).
    bell: Bell,
    /// Where the next XAUTOCLAIM continues its sweep of the pending list.
    claim_cursor: String,
    /// Setup (group, scripts) failed at startup: not ready until it succeeds.
    unprepared: bool,
    /// This consumer's liveness key on this shard.
    alive_key: String,
    /// When the liveness key was last set (or tried); `None` before the first time.
    alive_set_at: Option<Instant>,
    /// Health flag for `/ready`.
    ready: Readiness,
    /// Decides batches; shared by the batches in flight.
    decider: Arc<Decider>,
    /// Whether the library on Redis is this build's: no read while it is not.
    library: Arc<LibraryWatch>,
}

impl ShardWorker {
    /// Sets up the loop of shard `stream`; a Redis that refuses writes for
    /// now (OOM, loading) leaves it unprepared rather than failing.
    async fn connect(shared: &Shared, bell: Bell, stream: String, lane: Lane) -> Result<ShardWorker, Error> {
        let Shared {
            settings,
            ready,
            con,
            decider,
            library,
        } = shared.clone();
        let consumer = settings.consumer_name();
        let mut worker = ShardWorker {
            alive_key: consumer_alive(&stream, &settings.stream.group, &consumer),
            alive_set_at: None,
            stream,
            lane,
            consumer,
            con,
            idle_poll: FIRST_POLL,
            bell,
            ready,
            decider,
            library,
            settings,
            claim_cursor: SWEEP_START.to_owned(),
            unprepared: false,
        };
        match worker.prepare().await {
            Ok(()) => {}
            // Redis is up but refusing writes (OOM, loading): start anyway, not
            // ready, and let the read loop retry the setup.
            Err(e) if e.redis().is_some_and(|r| is_transient(r) && !r.is_io_error()) => {
                warn!(error = %e, "cannot prepare the consumer group yet; retrying while serving");
                worker.unprepared = true;
            }
            Err(e) => return Err(e),
        }
        Ok(worker)
    }

    /// Group creation and script loading: safe to repeat after Redis comes back.
    async fn prepare(&mut self) -> Result<(), Error> {
        // A group created again has a pending list of its own.
        self.claim_cursor = SWEEP_START.to_owned();
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.settings.stream.group)
            // From the start: requests written before any worker existed are served too.
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.con)
            .await;
        match created {
            Ok(()) => {
                info!(stream = %self.stream, group = %self.settings.stream.group, "created consumer group")
            }
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
        Scripts::get().load_all(&mut self.con).await?;
        Ok(())
    }

    /// Warns loudly when Redis may evict seat records under memory pressure.
    async fn check_eviction_policy(&mut self) {
        let policy: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut self.con)
            .await;
        match policy.as_deref() {
            Ok([_, policy]) if policy.starts_with("allkeys-") => error!(
                %policy,
                "Redis may EVICT SEAT RECORDS under memory pressure, and licenses would overbook: set maxmemory-policy noeviction (see ops/redis.conf)"
            ),
            Ok([_, policy]) if policy.starts_with("volatile-") => warn!(
                %policy,
                "Redis may evict expiring keys (dedupe records, rate windows, reply streams) under memory pressure; noeviction is safer (see ops/redis.conf)"
            ),
            Ok(_) => {}
            Err(e) => debug!(error = %e, "cannot read maxmemory-policy (CONFIG may be disabled)"),
        }
    }

    /// Serves requests until `shutdown` is cancelled, then finishes the batch
    /// in hand and returns. A blocked read ends within `stream.block_ms`.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        info!(consumer = %self.consumer, stream = %self.stream, group = %self.settings.stream.group, "worker started");
        let s = &self.settings.stream;
        let mut schedule = Schedule::new(Instant::now(), s.claim_idle_ms, s.batch_size, self.unprepared);
        let max_in_flight = s.max_in_flight;
        // Batches decided concurrently: while one waits on Redis, the next is
        // read and sent, so a worker keeps Redis busy instead of taking turns.
        let mut in_flight: JoinSet<(bool, Source)> = JoinSet::new();
        self.ready
            .set(!schedule.is_failing() && !self.library.is_foreign());
        let mut paused = false;
        while !shutdown.is_cancelled() {
            while let Some(done) = in_flight.try_join_next() {
                settled(&mut schedule, done);
            }
            // Another library's code under this build's name: read nothing
            // (and decide nothing) until it is this build's again.
            if self.library.is_foreign() {
                paused = true;
                self.ready.set(false);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = shutdown.cancelled() => {}
                }
                continue;
            }
            if std::mem::take(&mut paused) && !schedule.is_failing() {
                self.ready.set(true);
            }
            let now = Instant::now();
            self.keep_alive(now).await;
            let source = schedule.next_source(now);
            // Re-reading our own pending entries would return those in flight:
            // let them finish first. Otherwise just respect the in-flight cap.
            let cap = if source == Source::OwnPending {
                1
            } else {
                max_in_flight
            };
            while in_flight.len() >= cap {
                if let Some(done) = in_flight.join_next().await {
                    settled(&mut schedule, done);
                }
            }
            // Measured after waiting for in-flight batches: a blocking read
            // must not sleep through a retry or claim that fell due meanwhile.
            let block = schedule.block_for(Instant::now());
            let Some(batch) = self.read_batch(&mut schedule, source, block, &shutdown).await else {
                continue;
            };
            if batch.is_empty() {
                continue;
            }
            let decider = self.decider.clone();
            let stream = self.stream.clone();
            let lane = self.lane;
            in_flight.spawn(async move { (decider.process(&stream, lane, batch, source).await, source) });
        }
        // Finish and acknowledge what is in hand before leaving.
        while in_flight.join_next().await.is_some() {}
        self.leave_group().await;
        self.ready.set(false);
        info!(consumer = %self.consumer, "worker stopped");
        Ok(())
    }

    /// One read and its bookkeeping: readiness, the setup again after an
    /// outage, the schedule. `None` when the read failed; the backoff pause
    /// (cut short by `shutdown`) is then already over.
    async fn read_batch(
        &mut self,
        schedule: &mut Schedule,
        source: Source,
        block: Duration,
        shutdown: &CancellationToken,
    ) -> Option<Vec<Entry>> {
        let batch = match self.read(source, block).await {
            Ok(batch) => batch,
            Err(e) => {
                metrics::redis_error("read");
                let failed = schedule.read_failed(Instant::now());
                // Reads go through a script, which Redis refuses under OOM:
                // the readiness names that (and logs it) instead.
                let oom = e.redis().is_some_and(is_out_of_memory);
                if oom {
                    self.ready.out_of_memory(true);
                }
                if failed.outage_began {
                    if !oom {
                        warn!(error = %e, "cannot read requests from redis; retrying with backoff");
                    }
                    self.ready.set(false);
                }
                tokio::select! {
                    _ = tokio::time::sleep(failed.pause) => {}
                    _ = shutdown.cancelled() => {}
                }
                return None;
            }
        };
        if schedule.read_ok() {
            info!("redis reachable again; serving requests");
            self.ready.set(true);
            if let Err(e) = self.prepare().await {
                debug!(error = %e, "re-preparing after an outage failed");
            }
        }
        match source {
            Source::Claimed => {
                schedule.claimed(batch.len(), self.sweep_done(), Instant::now());
                if !batch.is_empty() {
                    info!(
                        count = batch.len(),
                        "claimed requests left pending by another consumer"
                    );
                    metrics::claimed(batch.len());
                }
            }
            Source::OwnPending => schedule.pending_read(batch.len()),
            Source::New => {}
        }
        Some(batch)
    }

    /// Sets this consumer's liveness key when it is due: every third of its
    /// lifetime, which is three times the longest a read may block (at least
    /// 3 s), so it outlives any pause of a loop that still runs. A loop stuck
    /// longer has entries in flight, so its consumer holds pending entries,
    /// which the cleanup never removes either. A failed SET (Redis down or
    /// out of memory) is retried at the next period: the key is a courtesy,
    /// the atomic check in lua/remove_consumer.lua is what keeps entries safe.
    async fn keep_alive(&mut self, now: Instant) {
        let ttl_ms = self.settings.stream.block_ms.saturating_mul(3).max(3_000);
        if self
            .alive_set_at
            .is_some_and(|at| now < at + Duration::from_millis(ttl_ms / 3))
        {
            return;
        }
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&self.alive_key)
            .arg(1)
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut self.con)
            .await;
        // Tried again a period later even when it failed: during an outage
        // the read loop must not wait on one more call per turn.
        self.alive_set_at = Some(now);
        // A write every period, requests or not: an idle worker notices too
        // when Redis runs out of memory, and when it accepts writes again.
        match set {
            Ok(()) => self.ready.out_of_memory(false),
            Err(e) if is_out_of_memory(&e) => self.ready.out_of_memory(true),
            Err(e) => debug!(error = %e, key = %self.alive_key, "cannot set the liveness key"),
        }
    }

    /// On shutdown: leave the group if nothing is pending for us, so restarts
    /// (each with a new default consumer name) do not grow the group, and
    /// drop the liveness key. Checked and removed in one script, like the
    /// reaper's cleanup.
    async fn leave_group(&mut self) {
        let group = &self.settings.stream.group;
        let left = Scripts::get()
            .remove_consumer(&mut self.con, &self.stream, group, &self.consumer)
            .await;
        if let Err(e) = left {
            debug!(error = %e, "cannot leave the consumer group; the reaper removes the consumer later");
        }
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(&self.alive_key)
            .query_async(&mut self.con)
            .await;
    }
}

/// A batch task ended: tells the schedule whether its entries need a retry.
/// A task that panicked answered nothing it can vouch for, so it counts as
/// needing one.
fn settled(schedule: &mut Schedule, done: Result<(bool, Source), JoinError>) {
    let (retry, source) = done.unwrap_or((true, Source::New));
    schedule.batch_done(retry, source, Instant::now());
}
