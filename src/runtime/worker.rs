//! The stream consumer: reads requests with XREADGROUP, decides each with a
//! seat script, replies on the caller's stream, then acknowledges.
//!
//! Order per entry: decide (script) → reply (to `reply_to`) → XACK. An entry is
//! acknowledged only once its effect is in Redis and its reply is written, so
//! a crash in between leaves it pending. Pending entries come back three ways:
//! this worker re-reads its own after a transient failure; any worker claims
//! (XAUTOCLAIM) those another consumer has held for `stream.claim_idle_ms`;
//! and one delivered more than `stream.max_deliveries` times goes to the
//! dead-letter stream. A redelivered entry has the effect of one delivery:
//! the scripts remember each entry's reply (lua/includes/common.lua).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::Settings;
use crate::db::{is_transient, Db};
use crate::engine::keys::Keys;
use crate::engine::protocol::{self, Op, Reply, Request};
use crate::engine::scripts::{Guard, Outcome, Scripts};
use crate::engine::status::Status;
use crate::error::Error;
use crate::runtime::health::Readiness;
use crate::runtime::metrics;
use crate::runtime::publish::{Event, EventType, Publisher};

/// A worker: one consumer in the group of every requests stream shard, a
/// read loop per shard (a blocking read names one stream, and on a cluster
/// the shards live on different masters), all sharing one [`Decider`].
pub struct Worker {
    /// One reader per shard.
    shards: Vec<ShardWorker>,
    /// This process's consumer name.
    consumer: String,
}

impl Worker {
    /// Connects to Redis, creates the consumer group of every shard if needed
    /// and loads the scripts.
    pub async fn connect(settings: Settings, ready: Readiness) -> Result<Worker, Error> {
        let con = crate::connect(&settings).await?;
        let decider = Arc::new(Decider {
            settings: settings.clone(),
            keys: Keys::new(settings.keys.prefix.clone()),
            con: con.clone(),
            publisher: Publisher::new(&settings),
            ready: ready.clone(),
            degraded: Default::default(),
        });
        let mut shards = Vec::new();
        for stream in settings.request_streams() {
            shards.push(
                ShardWorker::connect(
                    settings.clone(),
                    ready.clone(),
                    con.clone(),
                    decider.clone(),
                    stream,
                )
                .await?,
            );
        }
        shards
            .first_mut()
            .ok_or_else(|| Error::Config("stream.shards must be at least 1".into()))?
            .check_eviction_policy()
            .await;
        Ok(Worker {
            consumer: settings.consumer_name(),
            shards,
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

/// The read loop of one requests stream shard.
struct ShardWorker {
    /// The requests stream (shard) this loop reads.
    stream: String,
    /// Settings the worker was started with.
    settings: Settings,
    /// This process's consumer name in the group.
    consumer: String,
    /// Scripts and replies go over a managed, multiplexed connection: many
    /// requests of one batch share it concurrently (implicit pipelining), it
    /// reconnects by itself, and its response timeout bounds a stuck call.
    con: Db,
    /// XREADGROUP BLOCK gets its own connection, with a response timeout
    /// longer than the block: redis-rs's default timeout would fire while the
    /// server still blocks, and the entry it then delivers would sit pending
    /// with nobody reading it. It is also never shared, so a blocked read
    /// cannot delay a script.
    reader: Option<Db>,
    /// Setup (group, scripts) failed at startup: not ready until it succeeds.
    unprepared: bool,
    /// Health flag for `/ready`.
    ready: Readiness,
    /// Decides batches; shared by the batches in flight.
    decider: Arc<Decider>,
}

/// What happened to one entry of a batch.
enum Handled {
    /// Answered (or unanswerable, such as a deleted entry): acknowledge it.
    Done,
    /// Not answered: leave it pending and try again. `permanent` errors count
    /// towards dead-lettering; transient ones (Redis down) are simply retried.
    Retry { error: String, permanent: bool },
    /// Not decided and not answerable (its `reply_to` lies outside the reply
    /// namespace): dead-letter it with `reason`, then acknowledge it.
    DeadLetter { reason: String },
}

/// Where a batch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// New entries (`>`): first delivery.
    New,
    /// This consumer's own pending entries (`0`): redeliveries.
    OwnPending,
    /// Entries claimed from another consumer: redeliveries.
    Claimed,
}

impl ShardWorker {
    async fn connect(
        settings: Settings,
        ready: Readiness,
        con: Db,
        decider: Arc<Decider>,
        stream: String,
    ) -> Result<ShardWorker, Error> {
        let mut worker = ShardWorker {
            stream,
            consumer: settings.consumer_name(),
            con,
            reader: None,
            ready,
            decider,
            settings,
            unprepared: false,
        };
        match worker.prepare().await {
            Ok(()) => {}
            // Redis is up but refusing writes (OOM, loading): start anyway, not
            // ready, and let the read loop retry the setup.
            Err(Error::Redis(e)) if is_transient(&e) && !e.is_io_error() => {
                warn!(error = %e, "cannot prepare the consumer group yet; retrying while serving");
                worker.unprepared = true;
            }
            Err(e) => return Err(e),
        }
        Ok(worker)
    }

    /// Group creation and script loading: safe to repeat after Redis comes back.
    async fn prepare(&mut self) -> Result<(), Error> {
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
        // Start with our own pending entries (a previous life under the same name).
        // Afterwards they are re-read only when a retry is due, and new
        // requests keep flowing meanwhile: a failing entry delays nobody.
        let mut retry_at = Some(Instant::now());
        let mut failing = self.unprepared;
        let mut read_backoff = Backoff::default();
        let mut retry_backoff = Backoff::default();
        let claim_every = Duration::from_millis((self.settings.stream.claim_idle_ms / 2).clamp(100, 5_000));
        let mut next_claim = Instant::now();
        // Batches decided concurrently: while one waits on Redis, the next is
        // read and sent, so a worker keeps Redis busy instead of taking turns.
        let mut in_flight: JoinSet<(bool, Source)> = JoinSet::new();
        let max_in_flight = self.settings.stream.max_in_flight;
        let outcome = |done: (bool, Source), retry_at: &mut Option<Instant>, retry_backoff: &mut Backoff| {
            let (retry, source) = done;
            if retry {
                // Something must be retried: re-read our pending entries after a pause.
                *retry_at = Some(Instant::now() + retry_backoff.next_delay());
            } else if source == Source::OwnPending {
                // Drained a page of pending entries; look for more right away.
                *retry_at = Some(Instant::now());
            }
        };
        self.ready.set(!failing);
        while !shutdown.is_cancelled() {
            while let Some(done) = in_flight.try_join_next() {
                outcome(
                    done.unwrap_or((true, Source::New)),
                    &mut retry_at,
                    &mut retry_backoff,
                );
            }
            let now = Instant::now();
            let source = if retry_at.is_some_and(|at| at <= now) {
                Source::OwnPending
            } else if now >= next_claim {
                Source::Claimed
            } else {
                Source::New
            };
            // Re-reading our own pending entries would return those in flight:
            // let them finish first. Otherwise just respect the in-flight cap.
            let cap = if source == Source::OwnPending {
                1
            } else {
                max_in_flight
            };
            while in_flight.len() >= cap {
                if let Some(done) = in_flight.join_next().await {
                    outcome(
                        done.unwrap_or((true, Source::New)),
                        &mut retry_at,
                        &mut retry_backoff,
                    );
                }
            }
            // A blocking read must not sleep through a due retry or claim.
            let wake = retry_at.map_or(next_claim, |at| at.min(next_claim));
            let block = wake.saturating_duration_since(now).max(Duration::from_millis(1));
            let batch = match self.read(source, block).await {
                Ok(batch) => {
                    if failing {
                        info!("redis reachable again; serving requests");
                        failing = false;
                        self.ready.set(true);
                        if let Err(e) = self.prepare().await {
                            debug!(error = %e, "re-preparing after an outage failed");
                        }
                    }
                    read_backoff.reset();
                    batch
                }
                Err(e) => {
                    metrics::redis_error("read");
                    if !failing {
                        warn!(error = %e, "cannot read requests from redis; retrying with backoff");
                        failing = true;
                        self.ready.set(false);
                    }
                    self.reader = None;
                    retry_at = Some(Instant::now());
                    read_backoff.sleep(&shutdown).await;
                    continue;
                }
            };
            match source {
                Source::Claimed => {
                    // A full page means more may wait: claim again right away.
                    next_claim = if batch.len() >= self.settings.stream.batch_size {
                        Instant::now()
                    } else {
                        Instant::now() + claim_every
                    };
                    if !batch.is_empty() {
                        info!(
                            count = batch.len(),
                            "claimed requests left pending by another consumer"
                        );
                        metrics::claimed(batch.len());
                    }
                }
                Source::OwnPending if batch.is_empty() => {
                    retry_at = None;
                    retry_backoff.reset();
                }
                _ => {}
            }
            if batch.is_empty() {
                continue;
            }
            let decider = self.decider.clone();
            if source == Source::OwnPending {
                retry_at = None; // set again by the outcome
            }
            let stream = self.stream.clone();
            in_flight.spawn(async move { (decider.process(&stream, batch, source).await, source) });
        }
        // Finish and acknowledge what is in hand before leaving.
        while in_flight.join_next().await.is_some() {}
        self.leave_group().await;
        self.ready.set(false);
        info!(consumer = %self.consumer, "worker stopped");
        Ok(())
    }

    /// On shutdown: leave the group if nothing is pending for us, so restarts
    /// (each with a new default consumer name) do not grow the group.
    async fn leave_group(&mut self) {
        let s = &self.settings.stream;
        let pending: redis::RedisResult<Vec<Value>> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&s.group)
            .arg("-")
            .arg("+")
            .arg(1)
            .arg(&self.consumer)
            .query_async(&mut self.con)
            .await;
        if matches!(pending.as_deref(), Ok([])) {
            let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
                .arg("DELCONSUMER")
                .arg(&self.stream)
                .arg(&s.group)
                .arg(&self.consumer)
                .query_async(&mut self.con)
                .await;
        }
    }

    /// One read: new entries (`>`), our own pending ones (`0`), or entries
    /// claimed from consumers idle for `claim_idle_ms`.
    async fn read(&mut self, source: Source, block: Duration) -> Result<Vec<Entry>, Error> {
        let s = &self.settings.stream;
        if source == Source::Claimed {
            let reply: Value = redis::cmd("XAUTOCLAIM")
                .arg(&self.stream)
                .arg(&s.group)
                .arg(&self.consumer)
                .arg(s.claim_idle_ms)
                .arg("0-0")
                .arg("COUNT")
                .arg(s.batch_size)
                .query_async(&mut self.con)
                .await?;
            let entries = match reply {
                Value::Array(mut parts) if parts.len() >= 2 => parse_entries(parts.swap_remove(1)),
                _ => Vec::new(),
            };
            return self.with_delivery_counts(entries).await;
        }
        if self.reader.is_none() {
            let block = Duration::from_millis(self.settings.stream.block_ms);
            self.reader = Some(Db::connect_blocking(&self.settings.redis, block).await?);
        }
        let Some(reader) = self.reader.as_mut() else {
            unreachable!("reader connected above")
        };
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&s.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(s.batch_size);
        if source == Source::New {
            let block_ms = (block.as_millis() as u64).clamp(1, s.block_ms.max(1));
            cmd.arg("BLOCK").arg(block_ms);
        }
        cmd.arg("STREAMS")
            .arg(&self.stream)
            .arg(if source == Source::New { ">" } else { "0" });
        let reply: Value = match cmd.query_async(reader).await {
            // The group vanished (stream deleted): recreate it and read again next time.
            Err(e) if e.code() == Some("NOGROUP") => {
                self.prepare().await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        let entries = parse_read_reply(reply);
        if source == Source::New {
            Ok(entries)
        } else {
            self.with_delivery_counts(entries).await
        }
    }

    /// Fills in how often each (redelivered) entry has been delivered.
    async fn with_delivery_counts(&mut self, mut entries: Vec<Entry>) -> Result<Vec<Entry>, Error> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(entries);
        };
        let s = &self.settings.stream;
        let pending: Vec<(String, String, i64, u64)> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&s.group)
            .arg(&first.id)
            .arg(&last.id)
            .arg(entries.len())
            .arg(&self.consumer)
            .query_async(&mut self.con)
            .await?;
        let counts: HashMap<String, u64> = pending.into_iter().map(|(id, _, _, n)| (id, n)).collect();
        for entry in &mut entries {
            // Read from a pending list, so delivered before even if XPENDING lost track.
            entry.deliveries = counts.get(&entry.id).copied().unwrap_or(2);
        }
        Ok(entries)
    }
}

/// Decides batches: shared by the batches a worker has in flight at once.
struct Decider {
    /// Settings the worker was started with.
    settings: Settings,
    /// Key names.
    keys: Keys,
    /// The managed, multiplexed connection for scripts, replies and acks.
    con: Db,
    /// Events and replies.
    publisher: Publisher,
    /// Health flag for `/ready`: cleared while Redis refuses our writes.
    ready: Readiness,
    /// Whether the last batch met transient Redis errors (OOM, LOADING, ...),
    /// so the state change is logged once rather than once per batch.
    degraded: std::sync::atomic::AtomicBool,
}

impl Decider {
    /// Logs and reports a change between healthy and refused-by-Redis.
    fn note_health(&self, transient: Option<&str>, answered: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        match transient {
            Some(error) if !self.degraded.swap(true, Relaxed) => {
                warn!(%error, "redis refuses to decide requests; they stay pending and are retried (is it out of memory?)");
                self.ready.set(false);
            }
            None if answered > 0 && self.degraded.swap(false, Relaxed) => {
                info!("redis decides requests again");
                self.ready.set(true);
            }
            _ => {}
        }
    }

    /// Decides and answers one batch, then acknowledges what was answered.
    /// Returns whether some entries must be retried.
    ///
    /// A batch costs three round trips however large it is: one pipeline of
    /// seat scripts, one of replies and events, one XACK. Per request that
    /// is far fewer reads and writes for Redis and for this process than
    /// sending each command on its own.
    async fn process(&self, stream: &str, batch: Vec<Entry>, source: Source) -> bool {
        let parsed: Vec<Option<Result<Request, protocol::Invalid>>> = batch
            .iter()
            .map(|e| {
                e.fields
                    .as_ref()
                    .map(|f| protocol::parse_request(&e.id, f, &self.settings.replies.prefix))
            })
            .collect();
        let mut con = self.con.clone();
        let decided = self.decide_batch(&mut con, &batch, &parsed).await;

        // What each entry gets: a reply to send (if it has an address), or a retry.
        let mut handled: Vec<Option<Handled>> = Vec::with_capacity(batch.len());
        let mut replies: Vec<(usize, String, Reply)> = Vec::new();
        for (i, (entry, req)) in batch.iter().zip(&parsed).enumerate() {
            let outcome = decided.get(i).and_then(|d| d.as_ref());
            match (req, outcome) {
                // Deleted or trimmed while pending: nothing to answer.
                (None, _) => handled.push(Some(Handled::Done)),
                (Some(Err(bad)), _) if bad.field == "reply_to" => handled.push(Some(Handled::DeadLetter {
                    reason: bad.reason.clone(),
                })),
                (Some(Err(bad)), _) => {
                    metrics::invalid_request(bad.field);
                    warn!(entry = %entry.id, field = bad.field, reason = %bad.reason, "invalid request");
                    if let Some(stream) = &bad.echo.reply_to {
                        replies.push((i, stream.clone(), Reply::invalid(bad)));
                    }
                    handled.push(None);
                }
                (Some(Ok(req)), Some(Ok(outcome))) => {
                    if let Some(stream) = &req.reply_to {
                        replies.push((i, stream.clone(), reply_for(req, outcome, None)));
                    }
                    handled.push(None);
                }
                (Some(Ok(req)), Some(Err(e))) => {
                    let permanent = !matches!(e, Error::Redis(r) if is_transient(r));
                    if permanent {
                        warn!(entry = %entry.id, license = %req.license, deliveries = entry.deliveries, error = %e, "request failed");
                    } else {
                        metrics::redis_error("script");
                    }
                    handled.push(Some(Handled::Retry {
                        error: e.to_string(),
                        permanent,
                    }));
                }
                (Some(Ok(_)), None) => handled.push(Some(Handled::Retry {
                    error: "not decided".to_owned(),
                    permanent: false,
                })),
            }
        }

        // Replies and the requests' own events, in one pipeline.
        let mut events = Vec::new();
        for (i, req) in parsed.iter().enumerate() {
            if let (Some(Ok(req)), Some(Some(Ok(outcome)))) = (req, decided.get(i)) {
                if let Some(kind) =
                    EventType::for_status(outcome.status).filter(|_| outcome.changed && !outcome.replayed)
                {
                    events.push(Event {
                        kind,
                        license: &req.license,
                        session: &req.session,
                        seats_used: outcome.seats_used,
                        seats_total: outcome.seats_total,
                        at_ms: outcome.now_ms,
                        reason: None,
                    });
                }
            }
        }
        let to_send: Vec<(&str, &Reply)> = replies.iter().map(|(_, s, r)| (s.as_str(), r)).collect();
        // The batch's earliest script time: the fast path trims reply streams by age from it.
        let clock = decided
            .iter()
            .flatten()
            .filter_map(|d| d.as_ref().ok())
            .map(|o| o.now_ms)
            .filter(|ms| *ms > 0)
            .min();
        let sent = self
            .publisher
            .reply_many(&mut con, &to_send, &events, clock)
            .await;
        let mut reply_failed = vec![None; batch.len()];
        for ((i, stream, _), result) in replies.iter().zip(sent) {
            if let Err(e) = result {
                if is_transient(&e) {
                    metrics::redis_error("reply");
                    reply_failed[*i] = Some(e);
                } else {
                    metrics::reply_error();
                    warn!(entry = %batch[*i].id, reply_to = %stream, error = %e, "cannot write reply");
                }
            }
        }
        for (i, entry) in batch.iter().enumerate() {
            if handled[i].is_some() {
                continue;
            }
            if let Some(e) = reply_failed[i].take() {
                handled[i] = Some(Handled::Retry {
                    error: Error::from(e).to_string(),
                    permanent: false,
                });
                continue;
            }
            match &parsed[i] {
                Some(Ok(req)) => {
                    if let Some(Some(Ok(outcome))) = decided.get(i) {
                        if outcome.replayed {
                            metrics::replayed();
                        }
                        metrics::request_answered(req.op.as_str(), outcome.status.as_str(), entry.age());
                        // Queue replies (GRANTED / QUEUE_TIMEOUT) are rare: one by one.
                        // A replayed outcome's notes wait in the outbox for the reaper.
                        if !outcome.replayed {
                            for note in &outcome.notes {
                                let _ = self
                                    .publisher
                                    .deliver(
                                        &mut con,
                                        &req.license,
                                        note,
                                        outcome.seats_used,
                                        outcome.seats_total,
                                        outcome.now_ms,
                                        true,
                                    )
                                    .await;
                            }
                        }
                    }
                }
                _ => metrics::request_answered("invalid", Status::InvalidRequest.as_str(), entry.age()),
            }
            handled[i] = Some(Handled::Done);
        }

        let mut done = Vec::with_capacity(batch.len());
        let mut retry = false;
        let mut transient = None;
        for (entry, result) in batch.iter().zip(handled) {
            match result {
                Some(Handled::Done) | None => done.push(entry.id.as_str()),
                Some(Handled::DeadLetter { reason }) => {
                    if self.dead_letter(entry, &reason).await {
                        metrics::refused_reply_to();
                        done.push(entry.id.as_str());
                    } else {
                        retry = true;
                    }
                }
                Some(Handled::Retry { error, permanent }) => {
                    if !permanent {
                        transient.get_or_insert_with(|| error.clone());
                    }
                    let exhausted = permanent && entry.deliveries >= self.settings.stream.max_deliveries;
                    if exhausted && self.dead_letter(entry, &error).await {
                        done.push(entry.id.as_str());
                        continue;
                    }
                    debug!(entry = %entry.id, deliveries = entry.deliveries, ?source, error = %error, "left pending for retry");
                    retry = true;
                }
            }
        }
        self.note_health(transient.as_deref(), done.len());
        if !done.is_empty() {
            let acked: redis::RedisResult<i64> = redis::cmd("XACK")
                .arg(stream)
                .arg(&self.settings.stream.group)
                .arg(&done)
                .query_async(&mut con)
                .await;
            if let Err(e) = acked {
                metrics::redis_error("ack");
                warn!(error = %e, count = done.len(), "acknowledging answered requests failed; they will be answered again");
                retry = true;
            }
        }
        retry
    }

    /// Runs the seat script of every valid request in one pipeline. Scripts
    /// that Redis no longer knows (NOSCRIPT after a restart or SCRIPT FLUSH)
    /// did not run, so they are re-run one by one, which re-loads them.
    async fn decide_batch(
        &self,
        con: &mut Db,
        batch: &[Entry],
        parsed: &[Option<Result<Request, protocol::Invalid>>],
    ) -> Vec<Option<Result<Outcome, Error>>> {
        let scripts = Scripts::get();
        let mut calls = Vec::new();
        for (i, (entry, req)) in batch.iter().zip(parsed).enumerate() {
            let Some(Ok(req)) = req else { continue };
            let keys = self.keys.license(&req.license);
            let mut guard = Guard::for_entry(
                &self.settings.guard_policy(),
                &self.keys,
                &entry.id,
                &req.license,
                &req.session,
            );
            // Even a first delivery may have been decided before: a worker that
            // stalled past claim_idle_ms had its batch claimed by another.
            guard.redelivery = true;
            let call = match req.op {
                Op::Acquire => scripts.acquire_call(
                    &keys,
                    &guard,
                    &req.session,
                    &req.meta,
                    req.wait_ms,
                    &req.id,
                    req.reply_to.as_deref().unwrap_or(""),
                    self.settings.queue.max_length,
                ),
                Op::Release => scripts.release_call(&keys, &guard, &req.session),
                Op::Heartbeat => scripts.heartbeat_call(&keys, &guard, &req.session),
            };
            calls.push((i, call));
        }
        let mut out: Vec<Option<Result<Outcome, Error>>> = (0..batch.len()).map(|_| None).collect();
        if calls.is_empty() {
            return out;
        }
        let started = Instant::now();
        let answers = con
            .query_all(calls.iter().map(|(_, call)| call.cmd()).collect())
            .await;
        let elapsed = started.elapsed();
        let answers = match answers {
            Ok(a) if a.len() == calls.len() => a,
            Ok(a) => {
                let e = Error::ScriptReply {
                    script: "pipeline",
                    detail: format!("{} answers for {} calls", a.len(), calls.len()),
                };
                warn!(error = %e, "unexpected pipeline reply");
                return out;
            }
            Err(e) => {
                for (i, _) in &calls {
                    out[*i] = Some(Err(Error::Redis(e.clone())));
                }
                return out;
            }
        };
        for ((i, call), answer) in calls.iter().zip(answers) {
            let (result, elapsed) = match answer {
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                    let started = Instant::now();
                    let result = call.run(con).await;
                    (result, started.elapsed())
                }
                other => (call.decode(other), elapsed),
            };
            metrics::script_call(
                call.name(),
                result.as_ref().map(|o| Some(o.status)).map_err(|_| ()),
                elapsed,
            );
            out[*i] = Some(result);
        }
        out
    }

    /// Moves a poison entry to the dead-letter stream and answers it ERROR.
    /// Returns whether it may now be acknowledged.
    async fn dead_letter(&self, entry: &Entry, reason: &str) -> bool {
        let s = &self.settings.stream;
        let mut con = self.con.clone();
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&s.dead_letter)
            .arg("MAXLEN")
            .arg("~")
            .arg(s.dead_letter_maxlen)
            .arg("*")
            .arg("dead_entry_id")
            .arg(&entry.id)
            .arg("dead_deliveries")
            .arg(entry.deliveries)
            .arg("dead_reason")
            .arg(reason);
        for (k, v) in entry.fields.iter().flatten() {
            xadd.arg(k.as_str()).arg(v.as_slice());
        }
        if let Err(e) = xadd.query_async::<Value>(&mut con).await {
            metrics::redis_error("dead_letter");
            warn!(entry = %entry.id, error = %e, "cannot dead-letter a request; it stays pending");
            return false;
        }
        metrics::dead_lettered();
        error!(entry = %entry.id, deliveries = entry.deliveries, %reason, stream = %s.dead_letter, "request moved to the dead-letter stream");
        if let Some(fields) = &entry.fields {
            if let Ok(req) = protocol::parse_request(&entry.id, fields, &self.settings.replies.prefix) {
                if let Some(stream) = &req.reply_to {
                    let failed = Outcome::failed(Status::Error);
                    let msg = format!(
                        "request failed {} times and was dead-lettered: {reason}",
                        entry.deliveries
                    );
                    let reply = reply_for(&req, &failed, Some(msg));
                    if let Err(e) = self.publisher.reply(&mut con, stream, &reply).await {
                        warn!(entry = %entry.id, error = %e, "cannot answer a dead-lettered request");
                    }
                    metrics::request_answered(&reply.op, reply.status.as_str(), entry.age());
                }
            }
        }
        true
    }
}

/// Builds the reply for a decided request.
fn reply_for(req: &Request, outcome: &Outcome, error: Option<String>) -> Reply {
    Reply {
        id: req.id.clone(),
        op: req.op.as_str().to_owned(),
        status: outcome.status,
        license: req.license.clone(),
        session: req.session.clone(),
        seats_used: outcome.seats_used,
        seats_total: outcome.seats_total,
        heartbeats: outcome.heartbeats,
        position: outcome.position,
        waited_ms: None,
        error: error.or_else(|| {
            if outcome.queue_full {
                Some("every seat is in use and the license's wait queue is full".to_owned())
            } else {
                protocol::refusal_reason(outcome.status).map(str::to_owned)
            }
        }),
    }
}

/// One stream entry; `fields` is `None` when the entry was deleted while pending.
#[derive(Debug)]
struct Entry {
    id: String,
    fields: Option<Vec<(String, Vec<u8>)>>,
    /// Times delivered, this one included (1 for new entries).
    deliveries: u64,
}

impl Entry {
    /// Time since the entry was added (its id's ms part, the Redis clock).
    fn age(&self) -> Option<Duration> {
        let ms: u64 = self.id.split('-').next()?.parse().ok()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(ms)))
    }
}

/// Parses an XREADGROUP reply without assuming UTF-8 values: bad bytes must
/// reach the validator (and be answered), not fail the whole batch.
fn parse_read_reply(reply: Value) -> Vec<Entry> {
    let streams = match reply {
        Value::Array(streams) => streams,
        Value::Map(pairs) => pairs.into_iter().map(|(k, v)| Value::Array(vec![k, v])).collect(),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for stream in streams {
        let Value::Array(mut parts) = stream else { continue };
        if let Some(entries) = parts.pop() {
            out.extend(parse_entries(entries));
        }
    }
    out
}

/// Parses a list of `[id, [field, value, ...]]` entries.
fn parse_entries(entries: Value) -> Vec<Entry> {
    let Value::Array(entries) = entries else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(mut pair) = entry else { continue };
        if pair.len() != 2 {
            continue;
        }
        let fields = pair.pop();
        let Some(id) = pair.pop().and_then(|v| redis::from_redis_value::<String>(v).ok()) else {
            continue;
        };
        let fields = match fields {
            Some(Value::Array(flat)) => {
                let mut pairs = Vec::with_capacity(flat.len() / 2);
                let mut it = flat.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    let key = bytes(k);
                    pairs.push((String::from_utf8_lossy(&key).into_owned(), bytes(v)));
                }
                Some(pairs)
            }
            _ => None,
        };
        out.push(Entry {
            id,
            fields,
            deliveries: 1,
        });
    }
    out
}

fn bytes(v: Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.into_bytes(),
        Value::Int(n) => n.to_string().into_bytes(),
        _ => Vec::new(),
    }
}

/// Capped exponential backoff: 50 ms doubling to 1 s, so service resumes
/// within about a second of Redis answering again.
#[derive(Default)]
struct Backoff {
    attempt: u32,
}

impl Backoff {
    fn reset(&mut self) {
        self.attempt = 0;
    }

    fn next_delay(&mut self) -> Duration {
        let ms = (50u64 << self.attempt.min(5)).min(1000);
        self.attempt += 1;
        Duration::from_millis(ms)
    }

    async fn sleep(&mut self, shutdown: &CancellationToken) {
        let delay = self.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => {}
        }
    }
}
