//! Replies sent after the fact.
//!
//! Scripts decide, and record their seat events themselves
//! (lua/includes/events.lua); this module tells the callers. It writes the
//! replies of a batch and delivers the notes scripts return:
//! GRANTED to a waiter that now holds a seat, QUEUE_TIMEOUT to one whose wait
//! ran out, each on the reply stream the waiter queued with and carrying its
//! original request id. The worker and the reaper share it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tracing::{debug, warn};

use crate::config::Settings;
use crate::runtime::metrics;
pub use seatgate_core::events::{Event, EventType, SeatsAt};
use seatgate_core::protocol::Reply;
use seatgate_core::scripts::{Delivery, Note, Scripts};
use seatgate_core::status::Status;

/// The error of a QUEUE_TIMEOUT whose waiter showed no sign of life for a
/// heartbeat timeout (lua/includes/outbox.lua says the same on one node).
const WAITER_STALE_ERROR: &str =
    "the waiting session sent no heartbeat for a heartbeat timeout and gave up its place";

/// Writes replies, deferred ones too.
#[derive(Debug, Clone)]
pub struct Publisher {
    /// The namespace every reply stream lies in (`replies.prefix`): nothing
    /// outside it is ever written, trimmed or given an expiry.
    reply_prefix: String,
    /// How long a reply stays readable at least, ms (`replies.ttl_ms`).
    reply_ttl_ms: u64,
    /// The idle expiry a reply stream gets ([`crate::config::ReplySettings::expiry_ms`]).
    reply_expiry_ms: u64,
    /// One Redis node: every key shares one clock, so a time read by any
    /// script may set the fast path's trim point. On a cluster another
    /// master's clock may run ahead, so the fast path does not trim there.
    single_clock: bool,
    /// Key names (the outbox of a license).
    keys: seatgate_core::keys::Keys,
    /// Where the licenses' next due times are filed for the reaper.
    due: crate::runtime::due::DueIndex,
    /// Reply streams this process set the expiry of recently, and when.
    fresh: Arc<Mutex<HashMap<String, Instant>>>,
}

impl Publisher {
    /// A publisher for `settings`.
    pub fn new(settings: &Settings) -> Publisher {
        Publisher {
            reply_prefix: settings.replies.prefix.clone(),
            reply_ttl_ms: settings.replies.ttl_ms,
            reply_expiry_ms: settings.replies.expiry_ms(),
            single_clock: !settings.redis.is_cluster(),
            keys: settings.seat_keys(),
            due: crate::runtime::due::DueIndex::new(settings),
            fresh: Default::default(),
        }
    }

    /// Appends `reply` to the caller's `stream`.
    ///
    /// The first reply to a stream (and one every quarter of `replies.ttl_ms`)
    /// goes through lua/reply.lua, which refuses non-stream keys, trims
    /// replies older than the ttl and sets the expiry atomically. In between,
    /// a plain `XADD ... NOMKSTREAM` is enough and costs Redis a fraction of a
    /// script call: the key is known to be a stream with an expiry, and
    /// NOMKSTREAM never re-creates a stream its owner deleted (it would have
    /// no expiry); that case falls back to the script.
    ///
    /// A `stream` outside `replies.prefix` is refused before anything is sent.
    pub async fn reply<C: ConnectionLike>(
        &self,
        con: &mut C,
        stream: &str,
        reply: &Reply,
    ) -> redis::RedisResult<()> {
        self.reply_at(con, stream, reply, None).await
    }

    /// [`Publisher::reply`], trimming on the fast path too when `clock` (ms)
    /// is a time some script read from the Redis clock before this call.
    async fn reply_at<C: ConnectionLike>(
        &self,
        con: &mut C,
        stream: &str,
        reply: &Reply,
        clock: Option<i64>,
    ) -> redis::RedisResult<()> {
        self.check_namespace(stream)?;
        let fields = reply.fields();
        if self.is_fresh(stream) {
            match self
                .fast_xadd(stream, &fields, clock)
                .query_async::<Option<String>>(con)
                .await
            {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => {} // deleted meanwhile: the script re-creates it with an expiry
                Err(e) if e.code() == Some("WRONGTYPE") => {} // replaced: let the script refuse it
                Err(e) => return Err(e),
            }
        }
        // Taken before the script runs, so the fast path's window ends no
        // later than a quarter ttl after the expiry the script sets.
        let started = Instant::now();
        Scripts::get()
            .reply(con, stream, self.reply_ttl_ms, self.reply_expiry_ms, &fields)
            .await?;
        if let Ok(mut f) = self.fresh.lock() {
            // Bounded: forgetting costs only one script call per stream.
            if f.len() >= 100_000 {
                f.clear();
            }
            f.insert(stream.to_owned(), started);
        }
        Ok(())
    }

    /// Refuses a reply stream outside `replies.prefix`: requests naming one
    /// are dead-lettered before they get here, and a queue reply stored
    /// before the namespace existed is dropped rather than written.
    fn check_namespace(&self, stream: &str) -> redis::RedisResult<()> {
        if stream.len() > self.reply_prefix.len() && stream.starts_with(&self.reply_prefix) {
            return Ok(());
        }
        Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "reply_to lies outside replies.prefix; nothing written",
            format!("{stream} (replies.prefix is {})", self.reply_prefix),
        )))
    }

    fn is_fresh(&self, stream: &str) -> bool {
        let refresh_after = Duration::from_millis(self.reply_ttl_ms / 4);
        self.fresh
            .lock()
            .ok()
            .and_then(|f| f.get(stream).map(|at| at.elapsed() < refresh_after))
            .unwrap_or(false)
    }

    /// `XADD <stream> NOMKSTREAM [MINID ~ <clock - ttl>] * ...`. The trim
    /// point comes from `clock`, a time a script read on the same server
    /// before this XADD runs: never later than the XADD's own time, so no
    /// reply younger than the ttl is ever trimmed. Without one it only appends
    /// (the script trims on its next run).
    fn fast_xadd(&self, stream: &str, fields: &[(&str, String)], clock: Option<i64>) -> redis::Cmd {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(stream).arg("NOMKSTREAM");
        let oldest = clock
            .filter(|ms| self.single_clock && *ms > 0)
            .map(|ms| ms.saturating_sub(i64::try_from(self.reply_ttl_ms).unwrap_or(i64::MAX)));
        if let Some(oldest) = oldest.filter(|ms| *ms > 0) {
            xadd.arg("MINID").arg("~").arg(oldest);
        }
        xadd.arg("*");
        for (field, value) in fields {
            xadd.arg(*field).arg(value);
        }
        xadd
    }

    /// The fast-path XADDs of `replies` (those to streams known fresh), the
    /// first to each stream trimming from `clock`, and which replies they
    /// are; a reply to a stream outside the namespace gets its error in
    /// `results` instead.
    fn fast_replies(
        &self,
        replies: &[(&str, &Reply)],
        clock: Option<i64>,
        results: &mut [Option<redis::RedisResult<()>>],
    ) -> (Vec<redis::Cmd>, Vec<bool>) {
        let mut cmds = Vec::with_capacity(replies.len());
        let mut fast = Vec::with_capacity(replies.len());
        let mut trimmed = HashSet::new();
        for ((stream, reply), result) in replies.iter().zip(results.iter_mut()) {
            if let Err(e) = self.check_namespace(stream) {
                *result = Some(Err(e));
                fast.push(false);
                continue;
            }
            let is_fast = self.is_fresh(stream);
            if is_fast {
                let trim = trimmed.insert(*stream);
                cmds.push(self.fast_xadd(stream, &reply.fields(), clock.filter(|_| trim)));
            }
            fast.push(is_fast);
        }
        (cmds, fast)
    }

    /// Writes many replies with one pipeline: the replies to streams known
    /// fresh as plain `XADD NOMKSTREAM`, and the times the scripts reported for the reaper's due index
    /// (license, stale, due; runtime::due). Replies that need the script (first reply
    /// to a stream, or the fast path found the stream gone) follow one by
    /// one. Returns one result per reply, in order; a due time not filed is
    /// found by the reaper's sweep.
    ///
    /// `clock` is the earliest Redis time (ms) the batch's scripts read, if
    /// any ran: the fast path trims reply streams by age from it.
    ///
    /// Only the first XADD of the pipeline to each stream trims (`MINID ~`):
    /// a trim costs Redis about 40% of an XADD even when it finds nothing to
    /// drop, and a batch's replies to one caller (a multiplexed client gets
    /// all of its own on one stream) all share the same trim point, give or
    /// take the batch's milliseconds.
    pub async fn reply_many(
        &self,
        con: &mut seatgate_core::db::Db,
        replies: &[(&str, &Reply)],
        dues: &[(&str, Option<i64>, Option<i64>)],
        clock: Option<i64>,
    ) -> Vec<redis::RedisResult<()>> {
        let mut results: Vec<Option<redis::RedisResult<()>>> = vec![None; replies.len()];
        let (mut cmds, fast) = self.fast_replies(replies, clock, &mut results);
        cmds.reserve(2 * dues.len());
        let mut filed = Vec::with_capacity(2 * dues.len());
        for (license, stale_ms, due_ms) in dues {
            if let Some(ms) = stale_ms {
                cmds.push(self.due.file_stale(license, *ms));
                filed.push(*license);
            }
            if let Some(ms) = due_ms {
                cmds.push(self.due.file_due(license, *ms));
                filed.push(*license);
            }
        }
        if !cmds.is_empty() {
            match con.query_all(cmds).await {
                Ok(answers) => {
                    let mut answers = answers.into_iter().map(|a| {
                        a.and_then(|v| {
                            redis::from_redis_value::<Option<String>>(v).map_err(redis::RedisError::from)
                        })
                    });
                    for (slot, is_fast) in results.iter_mut().zip(&fast) {
                        if !is_fast {
                            continue;
                        }
                        match answers.next() {
                            Some(Ok(Some(_))) => *slot = Some(Ok(())),
                            // Gone or replaced: the script path below decides.
                            Some(Ok(None)) => {}
                            Some(Err(e)) if e.code() == Some("WRONGTYPE") => {}
                            Some(Err(e)) => *slot = Some(Err(e)),
                            None => {}
                        }
                    }
                    for (license, answer) in filed.iter().zip(answers) {
                        if let Err(e) = answer {
                            debug!(%license, error = %e, "cannot file a license's due time; the reaper's sweep finds it");
                        }
                    }
                }
                Err(e) => {
                    // The connection failed: nothing is known to be written.
                    return replies.iter().map(|_| Err(e.clone())).collect();
                }
            }
        }
        let pending: Vec<usize> = (0..replies.len()).filter(|i| results[*i].is_none()).collect();
        let slow = futures_util::future::join_all(pending.iter().map(|&i| {
            let mut con = con.clone();
            let (stream, reply) = replies[i];
            async move { self.reply_at(&mut con, stream, reply, clock).await }
        }))
        .await;
        for (i, result) in pending.into_iter().zip(slow) {
            results[i] = Some(result);
        }
        let results: Vec<redis::RedisResult<()>> = results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect();
        // A refusal counts once answered; a transient failure is retried and counted then.
        for ((_, reply), result) in replies.iter().zip(&results) {
            if !matches!(result, Err(e) if seatgate_core::db::is_transient(e)) {
                metrics::denial(&reply.license, reply.status);
            }
        }
        results
    }

    /// Tells a waiter what became of it (GRANTED / QUEUE_TIMEOUT /
    /// SESSION_REVOKED) and, when `first_time`, counts it (a replayed note
    /// is only re-delivered). Its event was recorded with the change, by the
    /// script that made the note; on one node that script wrote its reply
    /// too ([`Delivery::Sent`]), and only the count is left. Returns the
    /// reply error, if any.
    pub async fn deliver<C: ConnectionLike>(
        &self,
        con: &mut C,
        license: &str,
        note: &Note,
        seats: SeatsAt,
        first_time: bool,
    ) -> redis::RedisResult<()> {
        if first_time {
            metrics::queue_outcome(note.status, note.waited_ms);
            metrics::denial(license, note.status);
        }
        match note.delivery {
            // The script wrote it, in the step that made it (one node).
            Delivery::Sent => return Ok(()),
            Delivery::Undeliverable => {
                metrics::reply_error();
                warn!(license, session = %note.session, status = %note.status, reply_to = %note.reply_to,
                    "dropped an undeliverable queue reply: its reply_to is no stream, or lies outside replies.prefix");
                return Ok(());
            }
            Delivery::Caller => {}
        }
        let mut result = Ok(());
        if !note.reply_to.is_empty() {
            let reply = Reply {
                id: note.request_id.clone(),
                op: seatgate_core::request::Op::Acquire.as_str().to_owned(),
                status: note.status,
                license: license.to_owned(),
                // As its caller sent it (an application's session is kept
                // as `<application>/<session>`, seatgate_core::tenancy).
                session: seatgate_core::tenancy::unqualified(&note.session).to_owned(),
                seats_used: seats.used,
                seats_total: seats.total,
                heartbeats: None,
                position: None,
                waited_ms: Some(note.waited_ms),
                heartbeat_timeout_ms: note.heartbeat_timeout_ms,
                held_since_ms: note.held_since_ms,
                priority: None,
                linger_ms: None,
                borrowed_until_ms: None,
                error: match note.status {
                    Status::QueueTimeout if note.reason.as_deref() == Some("waiter_stale") => {
                        Some(WAITER_STALE_ERROR.to_owned())
                    }
                    Status::QueueTimeout => Some(format!("waited {} ms without a seat", note.waited_ms)),
                    // The only note of this kind (lua/includes/deleted.lua).
                    Status::LicenseNotFound => Some(format!(
                        "the license was deleted while the session waited ({} ms)",
                        note.waited_ms
                    )),
                    // A GRANTED the reaper found undelivered, its seat gone
                    // meanwhile (lua/reap.lua): the final answer.
                    Status::SessionNotActive => Some(
                        "the seat granted to this waiter was taken back before the grant was delivered; acquire again"
                            .to_owned(),
                    ),
                    other => other.refusal_reason().map(str::to_owned),
                },
            };
            result = self
                .reply_at(con, &note.reply_to, &reply, Some(seats.at_ms))
                .await;
            match &result {
                // Delivered: out of the outbox, so the reaper does not send it again.
                Ok(()) => self.forget_note(con, license, note).await,
                Err(e) if seatgate_core::db::is_transient(e) => {
                    metrics::reply_error();
                    warn!(error = %e, license, session = %note.session, status = %note.status, "cannot deliver queue reply; the reaper retries it");
                }
                Err(e) => {
                    // Its reply stream became something else: it will never be deliverable.
                    metrics::reply_error();
                    warn!(error = %e, license, session = %note.session, status = %note.status, "dropping an undeliverable queue reply");
                    self.forget_note(con, license, note).await;
                }
            }
        }
        result
    }

    /// Takes `note` out of `license`'s outbox, so the reaper does not send
    /// it again. Not done (a failed HDEL), the note stays for the reaper's
    /// next pass to handle.
    async fn forget_note<C: ConnectionLike>(&self, con: &mut C, license: &str, note: &Note) {
        let outbox = self.keys.license(license).outbox;
        let _: redis::RedisResult<i64> = redis::cmd("HDEL")
            .arg(outbox)
            .arg(&note.note_id)
            .query_async(con)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not simple>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn only_the_first_fast_reply_to_a_stream_trims() {
        let settings = Settings::load(None).unwrap();
        let publisher = Publisher::new(&settings);
        let (a, b) = ("seat:reply:app:a", "seat:reply:app:b");
        for stream in [a, b] {
            publisher
                .fresh
                .lock()
                .unwrap()
                .insert(stream.to_owned(), Instant::now());
        }
        let reply = Reply {
            id: "r-1".into(),
            op: "acquire".into(),
            status: Status::Acquired,
            license: "acme".into(),
            session: "s1".into(),
            seats_used: 1,
            seats_total: 2,
            heartbeats: None,
            position: None,
            waited_ms: None,
            error: None,
            borrowed_until_ms: None,
            linger_ms: None,
            priority: None,
            heartbeat_timeout_ms: None,
            held_since_ms: None,
        };
        let replies = [(a, &reply), (a, &reply), (b, &reply), ("elsewhere", &reply)];
        let mut results = vec![None; replies.len()];
        let (cmds, fast) = publisher.fast_replies(&replies, Some(1_796_000_000_000), &mut results);
        assert_eq!(fast, [true, true, true, false]);
        assert!(
            results[3].as_ref().is_some_and(|r| r.is_err()),
            "outside the namespace"
        );
        let trims: Vec<(String, bool)> = cmds
            .iter()
            .map(|cmd| {
                let a = args(cmd);
                (a[1].clone(), a.contains(&"MINID".to_owned()))
            })
            .collect();
        assert_eq!(
            trims,
            [(a.to_owned(), true), (a.to_owned(), false), (b.to_owned(), true)]
        );
    }
}
