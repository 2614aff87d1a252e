//! Settling a decided batch: replies in one pipeline, queue notes, dead
//! letters, one XACK. The events were recorded by the scripts themselves
//! (lua/includes/events.lua).

use std::collections::BTreeMap;

use redis::Value;
use tracing::{debug, info, warn};

use super::decide::{Cause, Decider, Handled, Item};
use super::read::{Entry, Source};
use crate::runtime::{fault, metrics};
use seatgate_core::db::{is_transient, Db};
use seatgate_core::policy::{PolicyRefusal, RequestPolicy};
use seatgate_core::protocol::Reply;
use seatgate_core::request::{parse_entry, Action, Lane, Request};
use seatgate_core::scripts::{Decision, NoSeats, Outcome};
use seatgate_core::status::Status;

impl Decider {
    /// Answers the decided items, dead-letters the exhausted ones and
    /// acknowledges what is done. Returns whether some entries must be retried.
    pub(super) async fn settle(
        &self,
        con: &mut Db,
        stream: &str,
        items: &mut [Item],
        source: Source,
    ) -> bool {
        for item in items.iter_mut() {
            item.triage();
            if let Some(Ok(outcome)) = &item.outcome {
                self.check_clock(&item.entry, outcome.now_ms);
            }
            if let (Some(Err(bad)), None) = (&item.request, &item.handled) {
                crate::limited!(
                    self.logs,
                    "invalid_request",
                    warn!(entry = %item.entry.id, field = bad.field, reason = %bad.reason, "invalid request")
                );
            }
        }
        self.ration_invalid(con, stream, items).await;
        self.relay(con, items).await;
        fault::pass(fault::Point::AfterRelay);
        self.write_replies(con, items).await;
        fault::pass(fault::Point::AfterReply);
        self.answered(con, items).await;
        self.acknowledge(con, stream, items, source).await
    }

    /// On a cluster, moves the events the batch's scripts recorded in their
    /// licenses' logs to the events shards, before any reply goes out: an
    /// event is visible no later than its reply. Every license of the batch
    /// is relayed, replays too, so a redelivered request relays what a
    /// worker that died after its script left. A license whose relay failed
    /// is filed due at once, for the reaper to relay.
    async fn relay(&self, con: &mut Db, items: &[Item]) {
        let Some(relay) = &self.relay else {
            return;
        };
        let mut licenses: Vec<&str> = items
            .iter()
            .filter_map(|item| match (&item.request, &item.outcome) {
                (Some(Ok(req)), Some(_)) => Some(req.license.as_str()),
                _ => None,
            })
            .collect();
        licenses.sort_unstable();
        licenses.dedup();
        let failed = relay.licenses(con, licenses).await;
        if failed.is_empty() {
            return;
        }
        let Some(now_ms) = items
            .iter()
            .filter_map(|item| item.outcome.as_ref()?.as_ref().ok())
            .map(|o| o.now_ms)
            .max()
        else {
            return;
        };
        let due = crate::runtime::due::DueIndex::new(&self.settings);
        let filed: Vec<redis::Cmd> = failed.iter().map(|l| due.file_due(l, now_ms)).collect();
        if let Err(e) = con.query_all(filed).await {
            debug!(error = %e, "cannot file unrelayed licenses as due; the reaper's sweep finds them");
        }
    }

    /// Replies, in one pipeline. A reply that failed for a transient reason
    /// leaves its entry pending for a retry.
    async fn write_replies(&self, con: &mut Db, items: &mut [Item]) {
        let to_send: Vec<(&str, &Reply)> = items
            .iter()
            .filter_map(|item| item.reply.as_ref().map(|(s, r)| (s.as_str(), r)))
            .collect();
        // The batch's earliest Redis-clock time: replies older than the
        // reply TTL before it may be trimmed, never a newer one.
        let clock = items
            .iter()
            .filter_map(|item| item.outcome.as_ref()?.as_ref().ok())
            .map(|o| o.now_ms)
            .filter(|ms| *ms > 0)
            .min();
        // The times the scripts reported for the reaper, filed as they left them.
        let dues: Vec<(&str, Option<i64>, Option<i64>)> = items
            .iter()
            .filter_map(|item| {
                let (Some(Ok(req)), Some(Ok(outcome))) = (&item.request, &item.outcome) else {
                    return None;
                };
                let due = (req.license.as_str(), outcome.stale_ms, outcome.due_ms);
                (due.1.is_some() || due.2.is_some()).then_some(due)
            })
            .collect();
        let sent = self.publisher.reply_many(con, &to_send, &dues, clock).await;
        let with_reply = items.iter_mut().filter(|item| item.reply.is_some());
        for (item, result) in with_reply.zip(sent) {
            let (Err(e), Some((reply_to, _))) = (result, &item.reply) else {
                continue;
            };
            if is_transient(&e) {
                metrics::redis_error("reply");
                let e = seatgate_core::Error::from(e);
                item.handled = Some(Handled::Retry {
                    error: e.to_string(),
                    cause: Cause::of(&e),
                });
            } else {
                metrics::reply_error();
                crate::limited!(
                    self.logs,
                    "reply_error",
                    warn!(entry = %item.entry.id, reply_to = %reply_to, error = %e, "cannot write reply")
                );
            }
        }
    }

    /// Holds invalid requests to their application's budget,
    /// `limits.invalid_requests` per `limits.window_ms`, counted in Redis
    /// (one key per application, keys::invalid_budget), so every worker
    /// shares it. Within the budget an invalid request is answered as ever.
    /// Past it, it is answered only when its reply stream exists already (one
    /// more entry in a stream that is trimmed and expires anyway); one whose
    /// reply stream does not exist is not answered, so that it creates no
    /// key, but dead-lettered (bounded by `stream.dead_letter_maxlen` and
    /// `stream.dead_letter_max_bytes`) and counted. A flood of invalid
    /// requests, each naming a reply stream of its own, then costs Redis a
    /// bounded number of reply streams per window instead of one each.
    ///
    /// Should the count fail (Redis refuses for now), the batch's invalid
    /// requests are answered as ever: their replies would meet the same refusal.
    async fn ration_invalid(&self, con: &mut Db, stream: &str, items: &mut [Item]) {
        let budget = self.settings.limits.invalid_requests;
        if budget == 0 {
            return;
        }
        let mut invalid: Vec<&mut Item> = items
            .iter_mut()
            .filter(|item| {
                item.handled.is_none() && item.reply.is_some() && matches!(item.request, Some(Err(_)))
            })
            .collect();
        if invalid.is_empty() {
            return;
        }
        let key = self
            .keys
            .invalid_budget(self.settings.application_of(stream).as_deref());
        // Not a transaction (MULTI does not route on a cluster connection):
        // should the expiry not follow its INCR (a lost connection), the
        // next batch's PEXPIRE NX gives the key one, as NX sets an expiry
        // only where there is none, so a window never lasts for good.
        let mut count = redis::pipe();
        for _ in &invalid {
            count.cmd("INCR").arg(&key);
        }
        // The window starts with its first invalid request and ends with the key.
        count
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(self.settings.limits.window_ms)
            .arg("NX")
            .ignore();
        let counts: Vec<u64> = match count.query_async(con).await {
            Ok(counts) => counts,
            Err(e) => {
                debug!(error = %e, "cannot count invalid requests; answering them all");
                return;
            }
        };
        let mut over: Vec<&mut Item> = invalid
            .drain(..)
            .zip(counts)
            .filter(|(_, n)| *n > budget)
            .map(|(item, _)| item)
            .collect();
        if over.is_empty() {
            return;
        }
        // One EXISTS each, sent together: a pipeline may not cross slots on
        // a cluster, and reply streams lie in any slot. One that cannot be
        // looked up is answered.
        let found = futures_util::future::join_all(over.iter().map(|item| {
            let mut con = con.clone();
            let reply_to = item.reply.as_ref().map(|(s, _)| s.clone()).unwrap_or_default();
            async move {
                let exists: redis::RedisResult<bool> =
                    redis::cmd("EXISTS").arg(&reply_to).query_async(&mut con).await;
                exists.unwrap_or_else(|e| {
                    debug!(error = %e, "cannot look up a reply stream; answering the invalid request past the budget");
                    true
                })
            }
        }))
        .await;
        for (item, found) in over.iter_mut().zip(found) {
            if found {
                continue;
            }
            let Some(Err(bad)) = &item.request else { continue };
            // Short: a flood makes many of these.
            let reason = format!(
                "not answered: past limits.invalid_requests and its reply_to does not exist; {}",
                bad.reason
            );
            item.reply = None;
            item.handled = Some(Handled::Shed { reason });
        }
    }

    /// Counts what was answered and sends its queue notes; the items are
    /// then done.
    async fn answered(&self, con: &mut Db, items: &mut [Item]) {
        for item in items.iter_mut().filter(|item| item.handled.is_none()) {
            match (&item.request, &item.outcome) {
                (Some(Ok(req)), Some(Ok(outcome))) => {
                    if outcome.replayed {
                        metrics::replayed();
                    } else if outcome.status() == Status::Revoked {
                        metrics::revoked();
                    }
                    metrics::request_answered(
                        req.op().as_str(),
                        outcome.status().as_str(),
                        item.entry.age(self.clock.now_ms()),
                    );
                    // Queue replies (GRANTED / QUEUE_TIMEOUT) are rare: one by one.
                    // A replayed outcome's notes wait in the outbox for the reaper.
                    if !outcome.replayed {
                        for note in &outcome.notes {
                            let _ = self
                                .publisher
                                .deliver(con, &req.license, note, outcome.seats_at(), true)
                                .await;
                        }
                    }
                }
                (Some(Ok(_)), _) => {}
                _ => metrics::request_answered(
                    "invalid",
                    Status::InvalidRequest.as_str(),
                    item.entry.age(self.clock.now_ms()),
                ),
            }
            item.handled = Some(Handled::Done);
        }
    }

    /// Dead-letters the entries that failed too often, then acknowledges
    /// every entry that is done in one XACK, and hands back the deliveries
    /// Redis refused. Returns whether some entries must be retried.
    async fn acknowledge(&self, con: &mut Db, stream: &str, items: &[Item], source: Source) -> bool {
        let mut done = Vec::with_capacity(items.len());
        let mut refused = Vec::new();
        let mut retry = false;
        let mut transient = None;
        let mut out_of_memory = false;
        for Item {
            entry, lane, handled, ..
        } in items
        {
            let lane = *lane;
            match handled {
                Some(Handled::Done) | None => done.push(entry.id.as_str()),
                Some(Handled::DeadLetter { reason }) => {
                    if self
                        .dead_letter(entry, stream, lane, reason, None, "refused_reply_to")
                        .await
                    {
                        metrics::refused_reply_to();
                        done.push(entry.id.as_str());
                    } else {
                        retry = true;
                    }
                }
                Some(Handled::Shed { reason }) => {
                    if self.dead_letter(entry, stream, lane, reason, None, "shed").await {
                        metrics::invalid_shed();
                        done.push(entry.id.as_str());
                    } else {
                        retry = true;
                    }
                }
                Some(Handled::Exhausted { reason }) => {
                    let answer = format!("request was dead-lettered: {reason}");
                    if self
                        .dead_letter(entry, stream, lane, reason, Some(&answer), "dead_letter")
                        .await
                    {
                        done.push(entry.id.as_str());
                    } else {
                        retry = true;
                    }
                }
                Some(Handled::Retry { error, cause }) => {
                    match cause {
                        Cause::Permanent if entry.deliveries >= self.settings.stream.max_deliveries => {
                            let answer = format!(
                                "request failed {} times and was dead-lettered: {error}",
                                entry.deliveries
                            );
                            if self
                                .dead_letter(entry, stream, lane, error, Some(&answer), "dead_letter")
                                .await
                            {
                                done.push(entry.id.as_str());
                                continue;
                            }
                        }
                        Cause::Permanent => {}
                        Cause::Refused | Cause::OutOfMemory => {
                            transient.get_or_insert_with(|| error.clone());
                            out_of_memory |= *cause == Cause::OutOfMemory;
                            refused.push(entry);
                        }
                        Cause::Lost => {
                            transient.get_or_insert_with(|| error.clone());
                        }
                    }
                    debug!(entry = %entry.id, deliveries = entry.deliveries, ?source, ?cause, error = %error, "left pending for retry");
                    retry = true;
                }
            }
        }
        self.note_health(transient.as_deref(), out_of_memory, done.len());
        if !done.is_empty() {
            fault::pass(fault::Point::BeforeAck);
            let acked: redis::RedisResult<i64> = redis::cmd("XACK")
                .arg(stream)
                .arg(&self.settings.stream.group)
                .arg(&done)
                .query_async(con)
                .await;
            if let Err(e) = acked {
                metrics::redis_error("ack");
                warn!(error = %e, count = done.len(), "acknowledging answered requests failed; they will be answered again");
                retry = true;
            }
        }
        self.hand_back(con, stream, &refused).await;
        retry
    }

    /// Sets the delivery count of entries Redis refused to decide (out of
    /// memory, loading, busy, ...) one lower again, so that however long the
    /// refusal lasts, its retries never get an entry dead-lettered by the
    /// check before deciding. `XCLAIM … RETRYCOUNT n JUSTID` to this
    /// consumer, which holds them already; XCLAIM is allowed under `OOM`. If
    /// it fails too, the entry keeps the higher count.
    async fn hand_back(&self, con: &mut Db, stream: &str, refused: &[&Entry]) {
        let mut by_count: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
        for entry in refused {
            by_count
                .entry(entry.deliveries.saturating_sub(1))
                .or_default()
                .push(entry.id.as_str());
        }
        for (count, ids) in by_count {
            let handed: redis::RedisResult<Value> = redis::cmd("XCLAIM")
                .arg(stream)
                .arg(&self.settings.stream.group)
                .arg(&self.consumer)
                .arg(0)
                .arg(&ids)
                .arg("RETRYCOUNT")
                .arg(count)
                .arg("JUSTID")
                .query_async(con)
                .await;
            if let Err(e) = handed {
                debug!(error = %e, count = ids.len(), "cannot hand back refused deliveries");
            }
        }
    }

    /// Counts (and now and then logs) an entry whose id time is ahead of the
    /// Redis clock `now_ms` by more than the dedupe window. Only a caller
    /// choosing its entry ids (`XADD` with an explicit id) makes one; every
    /// later `XADD *` of the stream then gets an id at least as far ahead, so
    /// one is worth an operator's look (docs/failure-modes.md, "Entry ids ahead
    /// of the clock").
    fn check_clock(&self, entry: &Entry, now_ms: i64) {
        let (Some(id_ms), Ok(now_ms)) = (entry.id_ms(), u64::try_from(now_ms)) else {
            return;
        };
        let ahead_ms = id_ms.saturating_sub(now_ms);
        if ahead_ms <= self.settings.dedupe.window_ms {
            return;
        }
        metrics::future_entry_id();
        crate::limited!(
            self.future_ids,
            "future_entry_id",
            warn!(
                entry = %entry.id,
                ahead_ms,
                "a request's stream entry id is ahead of the Redis clock by more than the dedupe window; see docs/failure-modes.md, \"Entry ids ahead of the clock\" (logged at most once a minute)"
            )
        );
    }

    /// Logs and reports a change between healthy and refused-by-Redis;
    /// `out_of_memory` when a refusal was Redis's `OOM`, which the
    /// readiness names (and logs) until a write succeeds again.
    fn note_health(&self, transient: Option<&str>, out_of_memory: bool, answered: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if out_of_memory {
            self.ready.out_of_memory(true);
        } else if answered > 0 {
            self.ready.out_of_memory(false);
        }
        match transient {
            Some(error) if !self.degraded.swap(true, Relaxed) => {
                if !out_of_memory {
                    warn!(%error, "redis refuses to decide requests; they stay pending and are retried");
                }
                self.ready.set(false);
            }
            None if answered > 0 && self.degraded.swap(false, Relaxed) => {
                info!("redis decides requests again");
                self.ready.set(true);
            }
            _ => {}
        }
    }

    /// Moves a poison entry to the dead-letter stream with `reason` and,
    /// given an `answer` and a `reply_to` in the reply namespace, answers it
    /// ERROR with that text. `lane` is the stream it was read from, whose
    /// ops its request is parsed by; `kind` (one of metrics::LOG_KINDS) is
    /// whose budget of log lines its ERROR line draws on. Returns whether it
    /// may now be acknowledged.
    async fn dead_letter(
        &self,
        entry: &Entry,
        stream: &str,
        lane: Lane,
        reason: &str,
        answer: Option<&str>,
        kind: &'static str,
    ) -> bool {
        let s = &self.settings.stream;
        let mut con = self.con.clone();
        let copy = DeadCopy::of(
            entry.fields.as_deref().unwrap_or_default(),
            s.dead_letter_max_bytes,
        );
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
            .arg(cut_text(reason, MAX_REASON_BYTES))
            .arg("dead_bytes")
            .arg(copy.bytes);
        if copy.cut {
            xadd.arg("dead_truncated").arg(1);
        }
        for (k, v) in &copy.fields {
            xadd.arg(*k).arg(*v);
        }
        if let Err(e) = xadd.query_async::<Value>(&mut con).await {
            metrics::redis_error("dead_letter");
            warn!(entry = %entry.id, error = %e, "cannot dead-letter a request; it stays pending");
            return false;
        }
        metrics::dead_lettered();
        crate::limited!(
            self.logs,
            kind,
            error!(entry = %entry.id, deliveries = entry.deliveries, %reason, stream = %s.dead_letter, "request moved to the dead-letter stream")
        );
        if let (Some(fields), Some(answer)) = (&entry.fields, answer) {
            let prefix = self.settings.reply_prefix_for(stream);
            let rules = seatgate_core::protocol::Rules {
                reply_prefix: &prefix,
                ..self.settings.parse_rules()
            };
            if let Ok(req) = parse_entry(lane, &entry.id, fields, &rules) {
                if let Some(stream) = &req.reply_to {
                    let failed = Outcome::failed(Status::Error);
                    let reply = reply_for(&req, &failed, Some(answer.to_owned()));
                    if let Err(e) = self.publisher.reply(&mut con, stream, &reply).await {
                        warn!(entry = %entry.id, error = %e, "cannot answer a dead-lettered request");
                    }
                    metrics::request_answered(
                        &reply.op,
                        reply.status.as_str(),
                        entry.age(self.clock.now_ms()),
                    );
                }
            }
        }
        true
    }
}

impl Item {
    /// Decides what the entry gets: a reply to write (when the caller gave
    /// an address), a retry, or nothing more (a deleted entry).
    fn triage(&mut self) {
        if self.handled.is_some() {
            return; // settled before deciding (delivered too often)
        }
        let entry = &self.entry;
        match (&self.request, &self.outcome) {
            // Deleted or trimmed while pending: nothing to answer.
            (None, _) => self.handled = Some(Handled::Done),
            // Nowhere it may be answered: not decided, dead-lettered with the reason.
            (Some(Err(bad)), _) if bad.field == "reply_to" => {
                self.handled = Some(Handled::DeadLetter {
                    reason: bad.reason.clone(),
                })
            }
            (Some(Err(bad)), _) => {
                // Logged by the caller, under log.repeats_per_minute.
                metrics::invalid_request(bad.field);
                if let Some(stream) = &bad.echo.reply_to {
                    self.reply = Some((stream.clone(), Reply::invalid(bad)));
                }
            }
            (Some(Ok(req)), Some(Ok(outcome))) => {
                if let Some(stream) = &req.reply_to {
                    self.reply = Some((stream.clone(), reply_for(req, outcome, None)));
                }
            }
            (Some(Ok(req)), Some(Err(e))) => {
                let cause = Cause::of(e);
                if cause == Cause::Permanent {
                    warn!(entry = %entry.id, license = %req.license, deliveries = entry.deliveries, error = %e, "request failed");
                } else {
                    metrics::redis_error("script");
                }
                self.handled = Some(Handled::Retry {
                    error: e.to_string(),
                    cause,
                });
            }
            (Some(Ok(_)), None) => {
                self.handled = Some(Handled::Retry {
                    error: "not decided".to_owned(),
                    cause: Cause::Lost,
                })
            }
        }
    }
}

/// What a dead letter carries in place of the request's `lease`.
const REDACTED: &[u8] = b"redacted";

/// Most bytes of a dead letter's `dead_reason` (an error's text can quote
/// what the caller sent).
const MAX_REASON_BYTES: usize = 512;

/// What a dead letter keeps of its entry: the first fields, up to a budget
/// of bytes of names and values, the last one cut to fit; and the whole
/// entry's size. A dead letter then costs Redis a bounded number of bytes
/// however big the entry was (a 16 KiB entry does not make a 16 KiB dead
/// letter), and still tells what the request was and how big.
#[derive(Debug, PartialEq, Eq)]
struct DeadCopy<'a> {
    /// Field names and values kept, in order; a lease as [`REDACTED`].
    fields: Vec<(&'a str, &'a [u8])>,
    /// Bytes of every field name and value of the entry as read.
    bytes: usize,
    /// Whether something was left out.
    cut: bool,
}

impl<'a> DeadCopy<'a> {
    /// The copy of `fields` within `max_bytes` of names and values.
    fn of(fields: &'a [(String, Vec<u8>)], max_bytes: usize) -> DeadCopy<'a> {
        let bytes = fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        let mut left = max_bytes;
        let mut kept = Vec::new();
        let mut cut = false;
        for (k, v) in fields {
            // A copy of the request, but never of its lease: a secret that
            // whoever reads dead letters could replay. Re-submitting a dead
            // letter needs its owner's lease again.
            let v = if k == "lease" { REDACTED } else { v.as_slice() };
            if k.len() > left {
                cut = true;
                break;
            }
            left -= k.len();
            let take = v.len().min(left);
            kept.push((k.as_str(), &v[..take]));
            left -= take;
            if take < v.len() {
                cut = true;
                break;
            }
        }
        DeadCopy {
            fields: kept,
            bytes,
            cut,
        }
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut_text(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Builds the reply for a decided request.
/// The `error` of a heartbeat's or release's reply when the license was
/// deleted under the session: its first word, `license_deleted`, is what
/// a program matches (docs/protocol.md, "Statuses").
const LICENSE_DELETED: &str =
    "license_deleted: the license was deleted, and the seat with it; an acquire gets LICENSE_NOT_FOUND until it is made again";

fn reply_for(req: &Request, outcome: &Outcome, error: Option<String>) -> Reply {
    let status = outcome.status();
    let mut reply = Reply {
        id: req.id.clone(),
        op: req.op().as_str().to_owned(),
        status,
        license: req.license.clone(),
        session: req.caller_session().to_owned(),
        seats_used: outcome.seats_used,
        seats_total: outcome.seats_total,
        heartbeats: None,
        position: None,
        waited_ms: None,
        // What the holder needs to keep the seat: on every answer that says
        // it holds one, a heartbeat's included, so a timeout lowered while
        // it holds the seat reaches it with its next heartbeat's reply.
        heartbeat_timeout_ms: outcome.heartbeat_timeout_ms.filter(|_| {
            matches!(
                status,
                Status::Acquired | Status::AlreadyActive | Status::HeartbeatUpdated | Status::Queued
            )
        }),
        held_since_ms: outcome
            .held_since_ms
            .filter(|_| matches!(status, Status::Acquired | Status::AlreadyActive)),
        priority: None,
        linger_ms: None,
        borrowed_until_ms: None,
        error: None,
    };
    let who = match &req.action {
        Action::Acquire(acquire) => &acquire.policy,
        _ => &RequestPolicy::NONE,
    };
    let refusal = match &outcome.decision {
        Decision::Acquired { borrowed_until_ms } => {
            reply.borrowed_until_ms = *borrowed_until_ms;
            None
        }
        Decision::Queued { position, priority } => {
            reply.position = Some(*position);
            reply.priority = Some(*priority).filter(|p| *p > 0);
            None
        }
        Decision::Released { linger_ms } => {
            reply.linger_ms = *linger_ms;
            None
        }
        Decision::HeartbeatUpdated { heartbeats } => {
            reply.heartbeats = Some(*heartbeats);
            None
        }
        Decision::NoSeatsAvailable(NoSeats::QueueFull) => {
            Some("every seat is in use and the license's wait queue is full".to_owned())
        }
        Decision::NoSeatsAvailable(NoSeats::QueueUserFull) => Some(format!(
            "every seat is in use and user {} already has queue_max_per_user sessions waiting for this license",
            who.user.as_deref().unwrap_or_default()
        )),
        Decision::NoSeatsAvailable(NoSeats::QueueGroupFull) => Some(match who.group.as_deref() {
            Some(group) => format!(
                "every seat is in use and group {group} already has queue_max_per_group sessions waiting for this license"
            ),
            None => "every seat is in use and the user's group already has queue_max_per_group sessions waiting for this license".to_owned(),
        }),
        Decision::NoSeatsAvailable(NoSeats::QueueApplicationFull) => Some(
            "every seat is in use and this application already has tenancy.application_waiters sessions waiting for this license"
                .to_owned(),
        ),
        Decision::RateLimited { application: true } => Some(
            "too many requests from this application about this license (tenancy.application_requests); slow down and retry"
                .to_owned(),
        ),
        Decision::NoSeatsAvailable(NoSeats::Reserved) => Some(PolicyRefusal::Reserved.reason(who)),
        Decision::LimitReached(limit) => Some(limit.reason(who)),
        Decision::LicenseInvalid(invalid) => Some(invalid.to_string()),
        Decision::SessionRevoked(Some(revocation)) => Some(revocation.describe(outcome.now_ms)),
        Decision::LicenseDeleted(_) => Some(LICENSE_DELETED.to_owned()),
        _ => None,
    };
    reply.error = error
        .or(refusal)
        .or_else(|| status.refusal_reason().map(str::to_owned));
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect()
    }

    #[test]
    fn a_dead_letter_keeps_the_first_bytes_of_its_entry_and_its_size() {
        let big = vec![b'x'; 16_000];
        let entry = fields(&[
            ("op", b"acquire"),
            ("lease", b"secret-secret-secret"),
            ("meta", &big),
            ("license", b"lic"),
        ]);
        let copy = DeadCopy::of(&entry, 1024);
        assert_eq!(copy.bytes, 2 + 7 + 5 + 20 + 4 + 16_000 + 7 + 3);
        assert!(copy.cut);
        let kept: usize = copy.fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(kept, 1024, "exactly the budget");
        assert_eq!(copy.fields[1], ("lease", REDACTED), "the lease is never copied");
        assert_eq!(copy.fields[2].0, "meta");
        assert_eq!(copy.fields.len(), 3, "the fields after the cut are left out");
        // A small entry is copied whole.
        let small = fields(&[("op", b"acquire"), ("license", b"lic")]);
        let copy = DeadCopy::of(&small, 1024);
        assert_eq!((copy.fields.len(), copy.cut, copy.bytes), (2, false, 19));
        // A name that does not fit is not cut, but left out with the rest.
        let copy = DeadCopy::of(&small, 10);
        assert_eq!((copy.fields, copy.cut), (vec![("op", &b"acquire"[..])], true));
    }

    #[test]
    fn a_reason_is_cut_on_a_character_boundary() {
        assert_eq!(cut_text("abc", 5), "abc");
        assert_eq!(cut_text("aé", 2), "a");
        assert_eq!(cut_text(&"é".repeat(400), 512).len(), 512);
    }
}
