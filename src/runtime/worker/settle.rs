//! Settling a decided batch: replies and events in one pipeline, queue
//! notes, dead letters, one XACK.

use redis::Value;
use tracing::{debug, error, info, warn};

use super::decide::{Decider, Handled, Item};
use super::read::{Entry, Source};
use crate::db::{is_transient, Db};
use crate::engine::protocol::{Reply, Request};
use crate::engine::scripts::Outcome;
use crate::engine::status::Status;
use crate::error::Error;
use crate::runtime::metrics;
use crate::runtime::publish::{Event, EventType};

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
        }
        self.write_replies(con, items).await;
        self.answered(con, items).await;
        self.acknowledge(con, stream, items, source).await
    }

    /// Replies and the requests' own events, in one pipeline. A reply that
    /// failed for a transient reason leaves its entry pending for a retry.
    async fn write_replies(&self, con: &mut Db, items: &mut [Item]) {
        let events: Vec<Event<'_>> = items.iter().filter_map(Item::event).collect();
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
        let sent = self.publisher.reply_many(con, &to_send, &events, clock).await;
        let with_reply = items.iter_mut().filter(|item| item.reply.is_some());
        for (item, result) in with_reply.zip(sent) {
            let (Err(e), Some((reply_to, _))) = (result, &item.reply) else {
                continue;
            };
            if is_transient(&e) {
                metrics::redis_error("reply");
                item.handled = Some(Handled::Retry {
                    error: Error::from(e).to_string(),
                    permanent: false,
                });
            } else {
                metrics::reply_error();
                warn!(entry = %item.entry.id, reply_to = %reply_to, error = %e, "cannot write reply");
            }
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
                    } else if outcome.status == Status::Revoked {
                        metrics::revoked();
                    }
                    metrics::request_answered(req.op.as_str(), outcome.status.as_str(), item.entry.age());
                    // Queue replies (GRANTED / QUEUE_TIMEOUT) are rare: one by one.
                    // A replayed outcome's notes wait in the outbox for the reaper.
                    if !outcome.replayed {
                        for note in &outcome.notes {
                            let _ = self
                                .publisher
                                .deliver(
                                    con,
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
                (Some(Ok(_)), _) => {}
                _ => metrics::request_answered("invalid", Status::InvalidRequest.as_str(), item.entry.age()),
            }
            item.handled = Some(Handled::Done);
        }
    }

    /// Dead-letters the entries that failed too often, then acknowledges
    /// every entry that is done in one XACK. Returns whether some entries
    /// must be retried.
    async fn acknowledge(&self, con: &mut Db, stream: &str, items: &[Item], source: Source) -> bool {
        let mut done = Vec::with_capacity(items.len());
        let mut retry = false;
        let mut transient = None;
        for Item {
            entry,
            request,
            handled,
            ..
        } in items
        {
            let request = request.as_ref().and_then(|r| r.as_ref().ok());
            match handled {
                Some(Handled::Done) | None => done.push(entry.id.as_str()),
                Some(Handled::DeadLetter { reason }) => {
                    if self.dead_letter(entry, request, reason).await {
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
                    let exhausted = *permanent && entry.deliveries >= self.settings.stream.max_deliveries;
                    if exhausted && self.dead_letter(entry, request, error).await {
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
                .query_async(con)
                .await;
            if let Err(e) = acked {
                metrics::redis_error("ack");
                warn!(error = %e, count = done.len(), "acknowledging answered requests failed; they will be answered again");
                retry = true;
            }
        }
        retry
    }

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

    /// Moves a poison entry to the dead-letter stream and answers it ERROR
    /// when it is a valid `request` with a `reply_to`. Returns whether it may
    /// now be acknowledged.
    async fn dead_letter(&self, entry: &Entry, request: Option<&Request>, reason: &str) -> bool {
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
        if let Some(req) = request {
            if let Some(stream) = &req.reply_to {
                let failed = Outcome::failed(Status::Error);
                let msg = format!(
                    "request failed {} times and was dead-lettered: {reason}",
                    entry.deliveries
                );
                let reply = reply_for(req, &failed, Some(msg));
                if let Err(e) = self.publisher.reply(&mut con, stream, &reply).await {
                    warn!(entry = %entry.id, error = %e, "cannot answer a dead-lettered request");
                }
                metrics::request_answered(&reply.op, reply.status.as_str(), entry.age());
            }
        }
        true
    }
}

impl Item {
    /// Decides what the entry gets: a reply to write (when the caller gave
    /// an address), a retry, or nothing more (a deleted entry).
    fn triage(&mut self) {
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
                metrics::invalid_request(bad.field);
                warn!(entry = %entry.id, field = bad.field, reason = %bad.reason, "invalid request");
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
                let permanent = !matches!(e, Error::Redis(r) if is_transient(r));
                if permanent {
                    warn!(entry = %entry.id, license = %req.license, deliveries = entry.deliveries, error = %e, "request failed");
                } else {
                    metrics::redis_error("script");
                }
                self.handled = Some(Handled::Retry {
                    error: e.to_string(),
                    permanent,
                });
            }
            (Some(Ok(_)), None) => {
                self.handled = Some(Handled::Retry {
                    error: "not decided".to_owned(),
                    permanent: false,
                })
            }
        }
    }

    /// The event this request's own decision emits: only a decision that
    /// changed something, and only the first time it is made.
    fn event(&self) -> Option<Event<'_>> {
        let (Some(Ok(req)), Some(Ok(outcome))) = (&self.request, &self.outcome) else {
            return None;
        };
        let kind = EventType::for_status(outcome.status).filter(|_| outcome.changed && !outcome.replayed)?;
        // A revocation's audit trail: who and why, as the admin sent them.
        let revoke = req.revoke.as_ref().filter(|_| kind == EventType::Revoked);
        Some(Event {
            kind,
            license: &req.license,
            session: &req.session,
            seats_used: outcome.seats_used,
            seats_total: outcome.seats_total,
            at_ms: outcome.now_ms,
            reason: revoke.map(|r| r.reason.as_str()),
            actor: revoke.map(|r| r.actor.as_str()),
        })
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
            } else if let Some(revocation) = &outcome.revocation {
                Some(revocation.describe(outcome.now_ms))
            } else {
                outcome.status.refusal_reason().map(str::to_owned)
            }
        }),
    }
}
