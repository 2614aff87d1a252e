//! The stream consumer: reads requests with XREADGROUP, decides each with a
//! seat script, replies on the caller's stream, then acknowledges.
//!
//! Order per entry: decide (script) → reply (XADD to `reply_to`) → XACK. An
//! entry is acknowledged only once its effect is in Redis and its reply is
//! written, so a crash in between leaves it pending to be decided again,
//! which the scripts' per-session idempotency makes harmless.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Settings;
use crate::error::Error;
use crate::events::{Event, EventType, Publisher};
use crate::http::Readiness;
use crate::keys::Keys;
use crate::protocol::{self, Op, Reply, Request};
use crate::scripts::{Outcome, Scripts};
use crate::status::Status;
use crate::telemetry;

/// One consumer of the requests stream.
pub struct Worker {
    /// Settings the worker was started with.
    settings: Settings,
    /// Key names.
    keys: Keys,
    /// This process's consumer name in the group.
    consumer: String,
    /// Scripts and replies go over a managed, multiplexed connection: many
    /// requests of one batch share it concurrently (implicit pipelining), it
    /// reconnects by itself, and its response timeout bounds a stuck call.
    con: ConnectionManager,
    /// XREADGROUP BLOCK gets its own connection without a response timeout:
    /// redis-rs's timeout would fire while the server still blocks, and the
    /// entry it then delivers would sit pending with nobody reading it.
    /// It is also never shared, so a blocked read cannot delay a script.
    reader: Option<MultiplexedConnection>,
    /// Redis client, for reconnecting the reader.
    client: redis::Client,
    /// Health flag for `/ready`.
    ready: Readiness,
    /// Events and waiter replies.
    publisher: Publisher,
}

/// What happened to one entry of a batch.
enum Handled {
    /// Answered (or unanswerable, such as a deleted entry): acknowledge it.
    Done,
    /// A transient Redis failure: leave it pending and try again.
    Retry(Error),
}

impl Worker {
    /// Connects to Redis, creates the consumer group if needed and loads the scripts.
    pub async fn connect(settings: Settings, ready: Readiness) -> Result<Worker, Error> {
        let client = redis::Client::open(settings.redis.url.as_str())?;
        let con = crate::connect_managed(&client, &settings).await?;
        let mut worker = Worker {
            keys: Keys::new(settings.keys.prefix.clone()),
            consumer: settings.consumer_name(),
            con,
            reader: None,
            client,
            ready,
            publisher: Publisher::new(&settings),
            settings,
        };
        worker.prepare().await?;
        Ok(worker)
    }

    /// Group creation and script loading: safe to repeat after Redis comes back.
    async fn prepare(&mut self) -> Result<(), Error> {
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.settings.stream.requests)
            .arg(&self.settings.stream.group)
            // From the start: requests written before any worker existed are served too.
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.con)
            .await;
        match created {
            Ok(()) => {
                info!(stream = %self.settings.stream.requests, group = %self.settings.stream.group, "created consumer group")
            }
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
        Scripts::get().load_all(&mut self.con).await?;
        Ok(())
    }

    /// This worker's consumer name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Serves requests until `shutdown` is cancelled, then finishes the batch
    /// in hand and returns. A blocked read ends within `stream.block_ms`.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), Error> {
        info!(consumer = %self.consumer, stream = %self.settings.stream.requests, group = %self.settings.stream.group, "worker started");
        // Start with our own pending entries (a previous life under the same name).
        let mut from_pending = true;
        let mut failing = false;
        let mut backoff = Backoff::default();
        self.ready.set(true);
        while !shutdown.is_cancelled() {
            let batch = match self.read(from_pending).await {
                Ok(batch) => {
                    if failing {
                        info!("redis reachable again; serving requests");
                        failing = false;
                        self.ready.set(true);
                        if let Err(e) = self.prepare().await {
                            debug!(error = %e, "re-preparing after an outage failed");
                        }
                    }
                    backoff.reset();
                    batch
                }
                Err(e) => {
                    telemetry::redis_error("read");
                    if !failing {
                        warn!(error = %e, "cannot read requests from redis; retrying with backoff");
                        failing = true;
                        self.ready.set(false);
                    }
                    self.reader = None;
                    from_pending = true;
                    backoff.sleep(&shutdown).await;
                    continue;
                }
            };
            if from_pending && batch.is_empty() {
                from_pending = false;
                continue;
            }
            if self.process(batch).await {
                // Something must be retried: come back to our pending entries after a pause.
                from_pending = true;
                backoff.sleep(&shutdown).await;
            }
        }
        self.ready.set(false);
        info!(consumer = %self.consumer, "worker stopped");
        Ok(())
    }

    /// One XREADGROUP: new entries (`>`), or our own pending ones (`0`).
    async fn read(&mut self, from_pending: bool) -> Result<Vec<Entry>, Error> {
        if self.reader.is_none() {
            let cfg = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(
                    self.settings.redis.connect_timeout_ms,
                )))
                .set_response_timeout(None);
            self.reader = Some(
                self.client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await?,
            );
        }
        let Some(reader) = self.reader.as_mut() else {
            unreachable!("reader connected above")
        };
        let s = &self.settings.stream;
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&s.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(s.batch_size);
        if !from_pending {
            cmd.arg("BLOCK").arg(s.block_ms);
        }
        cmd.arg("STREAMS")
            .arg(&s.requests)
            .arg(if from_pending { "0" } else { ">" });
        let reply: Value = match cmd.query_async(reader).await {
            // The group vanished (stream deleted): recreate it and read again next time.
            Err(e) if e.code() == Some("NOGROUP") => {
                self.prepare().await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        Ok(parse_read_reply(reply))
    }

    /// Decides and answers one batch concurrently, then acknowledges what was
    /// answered. Returns whether some entries must be retried.
    async fn process(&mut self, batch: Vec<Entry>) -> bool {
        let this = &*self;
        let handled = futures_util::future::join_all(batch.iter().map(|entry| {
            let mut con = this.con.clone();
            async move { this.handle(&mut con, entry).await }
        }))
        .await;
        let mut done = Vec::with_capacity(batch.len());
        let mut retry = false;
        for (entry, result) in batch.iter().zip(handled) {
            match result {
                Handled::Done => done.push(entry.id.as_str()),
                Handled::Retry(e) => {
                    debug!(entry = %entry.id, error = %e, "left pending for retry");
                    retry = true;
                }
            }
        }
        if !done.is_empty() {
            let acked: redis::RedisResult<i64> = redis::cmd("XACK")
                .arg(&self.settings.stream.requests)
                .arg(&self.settings.stream.group)
                .arg(&done)
                .query_async(&mut self.con)
                .await;
            if let Err(e) = acked {
                telemetry::redis_error("ack");
                warn!(error = %e, count = done.len(), "acknowledging answered requests failed; they will be answered again");
                retry = true;
            }
        }
        retry
    }

    async fn handle(&self, con: &mut ConnectionManager, entry: &Entry) -> Handled {
        let Some(fields) = &entry.fields else {
            // Deleted or trimmed while pending: nothing to answer.
            return Handled::Done;
        };
        let reply = match protocol::parse_request(&entry.id, fields, |k| self.keys.is_reserved(k)) {
            Err(bad) => {
                telemetry::invalid_request(bad.field);
                warn!(entry = %entry.id, field = bad.field, reason = %bad.reason, "invalid request");
                if bad.echo.reply_to.is_none() {
                    telemetry::request_answered("invalid", Status::InvalidRequest.as_str(), entry.age());
                    return Handled::Done;
                }
                (Reply::invalid(&bad), bad.echo.reply_to.clone())
            }
            Ok(req) => match self.decide(con, &req).await {
                Ok(outcome) => {
                    // The requester first, then the waiters and dashboards.
                    let reply = reply_for(&req, &outcome, None);
                    if let Some(stream) = &req.reply_to {
                        if let Err(e) = self.publisher.reply(con, stream, &reply).await {
                            if is_transient(&e) {
                                telemetry::redis_error("reply");
                                return Handled::Retry(e.into());
                            }
                            telemetry::reply_error();
                            warn!(entry = %entry.id, reply_to = %stream, error = %e, "cannot write reply");
                        }
                    }
                    telemetry::request_answered(&reply.op, reply.status.as_str(), entry.age());
                    self.publish(con, &req, &outcome).await;
                    return Handled::Done;
                }
                Err(Error::Redis(e)) if is_transient(&e) => {
                    telemetry::redis_error("script");
                    return Handled::Retry(e.into());
                }
                Err(e) => {
                    // Not going to get better by retrying (e.g. WRONGTYPE on a
                    // hand-edited key): answer with the reason rather than wedge.
                    warn!(entry = %entry.id, license = %req.license, error = %e, "request failed");
                    let failed = Outcome {
                        status: Status::Error,
                        seats_used: 0,
                        seats_total: 0,
                        heartbeats: None,
                        position: None,
                        queue_full: false,
                        changed: false,
                        now_ms: 0,
                        notes: Vec::new(),
                    };
                    (
                        reply_for(&req, &failed, Some(e.to_string())),
                        req.reply_to.clone(),
                    )
                }
            },
        };
        let (reply, reply_to) = reply;
        if let Some(stream) = reply_to {
            if let Err(e) = self.publisher.reply(con, &stream, &reply).await {
                if is_transient(&e) {
                    telemetry::redis_error("reply");
                    return Handled::Retry(e.into());
                }
                telemetry::reply_error();
                warn!(entry = %entry.id, reply_to = %stream, error = %e, "cannot write reply");
            }
        }
        telemetry::request_answered(&reply.op, reply.status.as_str(), entry.age());
        Handled::Done
    }

    async fn decide(&self, con: &mut ConnectionManager, req: &Request) -> Result<Outcome, Error> {
        let keys = self.keys.license(&req.license);
        let scripts = Scripts::get();
        match req.op {
            Op::Acquire => {
                scripts
                    .acquire(
                        con,
                        &keys,
                        &req.session,
                        &req.meta,
                        req.wait_ms,
                        &req.id,
                        req.reply_to.as_deref().unwrap_or(""),
                        self.settings.queue.max_length,
                    )
                    .await
            }
            Op::Release => scripts.release(con, &keys, &req.session).await,
            Op::Heartbeat => scripts.heartbeat(con, &keys, &req.session).await,
        }
    }

    /// Publishes the request's event and delivers the notes its script returned.
    async fn publish(&self, con: &mut ConnectionManager, req: &Request, outcome: &Outcome) {
        let kind = EventType::for_status(outcome.status).filter(|_| outcome.changed);
        if let Some(kind) = kind {
            let event = Event {
                kind,
                license: &req.license,
                session: &req.session,
                seats_used: outcome.seats_used,
                seats_total: outcome.seats_total,
                at_ms: outcome.now_ms,
                reason: None,
            };
            self.publisher.event(con, &event).await;
        }
        for note in &outcome.notes {
            // A failed grant reply is logged and counted by deliver(); the
            // waiter still holds its seat and sees it with its next heartbeat.
            let _ = self
                .publisher
                .deliver(
                    con,
                    &req.license,
                    note,
                    outcome.seats_used,
                    outcome.seats_total,
                    outcome.now_ms,
                )
                .await;
        }
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

/// Errors worth retrying: the connection, a timeout, or a server that is
/// loading, failing over or out of memory. Everything else is permanent.
pub fn is_transient(e: &redis::RedisError) -> bool {
    e.is_timeout()
        || !matches!(e.retry_method(), redis::RetryMethod::NoRetry)
        || matches!(
            e.code(),
            Some("OOM" | "BUSY" | "LOADING" | "READONLY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
        )
}

/// One stream entry; `fields` is `None` when the entry was deleted while pending.
#[derive(Debug)]
struct Entry {
    id: String,
    fields: Option<Vec<(String, Vec<u8>)>>,
}

impl Entry {
    /// Time since the entry was added, from its id's millisecond part.
    fn age(&self) -> Option<Duration> {
        let ms: u64 = self.id.split('-').next()?.parse().ok()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(ms)))
    }
}

/// Parses an XREADGROUP reply without assuming UTF-8 values: bad bytes must
/// reach the validator (and be answered), not fail the whole batch.
fn parse_read_reply(reply: Value) -> Vec<Entry> {
    let mut out = Vec::new();
    let streams = match reply {
        Value::Array(streams) => streams,
        Value::Map(pairs) => pairs.into_iter().map(|(k, v)| Value::Array(vec![k, v])).collect(),
        _ => return out,
    };
    for stream in streams {
        let Value::Array(mut parts) = stream else { continue };
        let Some(Value::Array(entries)) = parts.pop() else {
            continue;
        };
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
            out.push(Entry { id, fields });
        }
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

    async fn sleep(&mut self, shutdown: &CancellationToken) {
        let ms = (50u64 << self.attempt.min(5)).min(1000);
        self.attempt += 1;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            _ = shutdown.cancelled() => {}
        }
    }
}
