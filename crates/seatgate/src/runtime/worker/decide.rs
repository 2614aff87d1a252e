//! Deciding a batch: the [`Decider`] parses each entry (plan), runs every seat
//! script in one pipeline (send), then settles the batch (settle.rs).

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Instant;

use tracing::warn;

use super::read::{Entry, Source};
use crate::config::Settings;
use crate::runtime::health::Readiness;
use crate::runtime::log_limit::LogLimit;
use crate::runtime::publish::Publisher;
use crate::runtime::{fault, metrics};
use seatgate_core::db::{is_out_of_memory, is_transient, Db};
use seatgate_core::keys::Keys;
use seatgate_core::protocol::{self, Reply};
use seatgate_core::request::{EntryAt, Lane, Request};
use seatgate_core::scripts::{Outcome, Scripts, SeatCall};
use seatgate_core::Error;

/// Decides batches: shared by the batches a worker has in flight at once.
pub(super) struct Decider {
    /// Settings the worker was started with.
    pub(super) settings: Settings,
    /// Key names.
    pub(super) keys: Keys,
    /// The managed, multiplexed connection for scripts, replies and acks.
    pub(super) con: Db,
    /// This process's consumer name, which owns every entry it decides.
    pub(super) consumer: String,
    /// Replies.
    pub(super) publisher: Publisher,
    /// Moves the batch's events to their shards before the replies go out
    /// (a cluster; `None` on one node, where the scripts append to the shards).
    pub(super) relay: Option<crate::runtime::relay::Relay>,
    /// Health flag for `/ready`: cleared while Redis refuses our writes.
    pub(super) ready: Readiness,
    /// Whether the last batch met transient Redis errors (OOM, LOADING, ...),
    /// so the state change is logged once rather than once per batch.
    pub(super) degraded: AtomicBool,
    /// Entry ids ahead of the Redis clock are counted each, but logged at
    /// most once a minute: a caller choosing such ids must not flood the log.
    pub(super) future_ids: LogLimit,
    /// Log lines a client can repeat at will (dead letters, invalid
    /// requests, unwritable replies): at most `log.repeats_per_minute` a
    /// minute per kind.
    pub(super) logs: LogLimit,
    /// The Redis clock as the scripts last reported it, to place entries
    /// whose ids lie far ahead of it in a dedupe bucket of the clock's.
    pub(super) clock: RedisClock,
}

/// The Redis server's clock as seen in the scripts' outcomes (`now_ms`),
/// carried forward on this host's monotonic clock. Only dedupe placement
/// and the cap on a chosen entry id's deadline use it
/// (engine::scripts::Guard::for_entry_at, Guard::for_request, deadline);
/// decisions, expiry included, read `TIME` inside the scripts.
#[derive(Debug, Default)]
pub(super) struct RedisClock {
    /// The latest Redis time seen, ms, and when it was seen here.
    seen: Mutex<Option<(u64, Instant)>>,
}

impl RedisClock {
    /// Redis read `now_ms` a moment ago; kept when it is later than the
    /// current estimate (concurrent batches report a few ms out of order),
    /// or far earlier (the Redis clock was set back, or another master's
    /// answers).
    pub(super) fn observe(&self, now_ms: i64) {
        /// An estimate this far ahead of what Redis says is wrong, not late news.
        const STEPPED_BACK_MS: u64 = 1_000;
        let Ok(now_ms) = u64::try_from(now_ms) else { return };
        if now_ms == 0 {
            return;
        }
        if let Ok(mut seen) = self.seen.lock() {
            let newer = |est: u64| now_ms > est || est - now_ms > STEPPED_BACK_MS;
            if self.estimate(seen.as_ref()).is_none_or(newer) {
                *seen = Some((now_ms, Instant::now()));
            }
        }
    }

    /// The Redis clock now, ms, if it was ever seen.
    pub(super) fn now_ms(&self) -> Option<u64> {
        self.seen
            .lock()
            .ok()
            .and_then(|seen| self.estimate(seen.as_ref()))
    }

    fn estimate(&self, seen: Option<&(u64, Instant)>) -> Option<u64> {
        seen.map(|(ms, at)| ms.saturating_add(at.elapsed().as_millis() as u64))
    }
}

/// One entry of a batch on its way from the stream to its acknowledgement:
/// each step of [`Decider::process`] fills in a little more.
pub(super) struct Item {
    /// The stream entry as read.
    pub(super) entry: Entry,
    /// Which stream it was read from, so a dead letter's answer is parsed
    /// as its request was.
    pub(super) lane: Lane,
    /// The request, or why it is invalid; `None` when the entry was deleted
    /// while pending (nothing to answer).
    pub(super) request: Option<Result<Request, protocol::Invalid>>,
    /// The seat script's outcome; `None` when no script ran for it (an
    /// invalid request, or a pipeline that answered the wrong number of calls).
    pub(super) outcome: Option<Result<Outcome, Error>>,
    /// The reply and the stream it goes to, when the caller gave one.
    pub(super) reply: Option<(String, Reply)>,
    /// What becomes of the entry; `None` while its reply is still to be written.
    pub(super) handled: Option<Handled>,
}

/// What happened to one entry of a batch.
pub(super) enum Handled {
    /// Answered (or unanswerable, such as a deleted entry): acknowledge it.
    Done,
    /// Not answered: leave it pending and try again.
    Retry {
        /// Why it was not answered: logged, and the reason a dead letter carries.
        error: String,
        /// What the failed delivery counts for.
        cause: Cause,
    },
    /// Not decided and not answerable (its `reply_to` lies outside the reply
    /// namespace): move it to the dead-letter stream, then acknowledge it.
    DeadLetter {
        /// Why: the dead letter carries it.
        reason: String,
    },
    /// An invalid request past its application's budget
    /// (`limits.invalid_requests`) whose reply stream does not exist: not
    /// answered, so that it creates none; dead-lettered, then acknowledged.
    Shed {
        /// Why: the dead letter carries it.
        reason: String,
    },
    /// Delivered more than `stream.max_deliveries` times without an answer:
    /// dead-letter it and answer ERROR, without deciding it again.
    Exhausted {
        /// The reason the dead letter carries.
        reason: String,
    },
}

/// Why an entry was left pending, which decides what its delivery counts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// A retry would fail the same way (the script failed): the delivery
    /// counts, and the failure on the `stream.max_deliveries`-th delivery
    /// dead-letters the entry.
    Permanent,
    /// Redis answered with a refusal for now (`OOM`, `LOADING`, `BUSY`, ...):
    /// not the entry's fault, so the delivery is handed back (its count set
    /// one lower again) and the entry waits as long as the refusal lasts.
    Refused,
    /// Redis refused for lack of memory (`OOM`): a refusal like
    /// [`Cause::Refused`], and what `/ready` and the log then name.
    OutOfMemory,
    /// The connection failed or timed out, so the entry may be what stalls
    /// Redis or the worker: the delivery counts.
    Lost,
}

impl Cause {
    /// The cause of a failed script or reply call.
    pub(super) fn of(e: &Error) -> Cause {
        match e {
            Error::Redis(r) if is_out_of_memory(r) => Cause::OutOfMemory,
            Error::Redis(r) if !is_transient(r) => Cause::Permanent,
            // A server error reply has a code; a lost connection or a timeout has none.
            Error::Redis(r) if r.code().is_some() && !r.is_timeout() => Cause::Refused,
            Error::Redis(_) => Cause::Lost,
            _ => Cause::Permanent,
        }
    }
}

impl Decider {
    /// A decider over the managed connection `con`.
    pub(super) fn new(settings: Settings, con: Db, ready: Readiness) -> Decider {
        Decider {
            logs: crate::runtime::log_limit::LogLimit::per_minute(settings.log.repeats_per_minute),
            consumer: settings.consumer_name(),
            keys: settings.seat_keys(),
            relay: crate::runtime::relay::Relay::new(&settings.seat_keys()),
            publisher: Publisher::new(&settings),
            settings,
            con,
            ready,
            degraded: AtomicBool::default(),
            future_ids: LogLimit::per_minute(1),
            clock: RedisClock::default(),
        }
    }

    /// Decides and answers one batch, then acknowledges what was answered.
    /// Returns whether some entries must be retried.
    ///
    /// A batch costs three round trips however large it is: one pipeline of
    /// seat scripts, one of replies and events, one XACK. Per request that
    /// is far fewer reads and writes for Redis and for this process than
    /// sending each command on its own.
    pub(super) async fn process(&self, stream: &str, lane: Lane, batch: Vec<Entry>, source: Source) -> bool {
        let mut con = self.con.clone();
        if self.clock.now_ms().is_none() {
            // Once per process: the first batch is placed by the clock too.
            // Should TIME fail, entries are placed by their ids, and every
            // bucket's expiry is still capped by the scripts.
            if let Ok((secs, micros)) = redis::cmd("TIME").query_async::<(i64, i64)>(&mut con).await {
                self.clock
                    .observe(secs.saturating_mul(1000).saturating_add(micros / 1000));
            }
        }
        fault::pass(fault::Point::AfterRead);
        let mut items = self.plan(lane, stream, batch);
        let tag = match lane {
            Lane::Requests => self.settings.stream_tag(stream),
            Lane::Admin => None,
        };
        self.send(&mut con, &mut items, tag.as_deref()).await;
        fault::pass(fault::Point::AfterScript);
        self.settle(&mut con, stream, &mut items, source).await
    }

    /// Parses every entry of the batch, read from a stream of `lane`, except
    /// those delivered more than `stream.max_deliveries` times already: every
    /// one of those deliveries ended without an answer, so the entry itself
    /// may be what crashed or stalled the workers (a giant entry, a script
    /// that times out). It is dead-lettered without another attempt at
    /// deciding it.
    fn plan(&self, lane: Lane, stream: &str, batch: Vec<Entry>) -> Vec<Item> {
        // Whose requests these are: the server knows it from the stream,
        // never from a field (seatgate_core::tenancy); an application's are
        // answered in its own reply namespace only.
        let topology = self.settings.topology();
        let application = match lane {
            Lane::Requests => topology.application_of(stream),
            Lane::Admin => None,
        };
        let prefix = topology.reply_prefix_of(application);
        let rules = seatgate_core::protocol::Rules {
            reply_prefix: &prefix,
            ..self.settings.parse_rules()
        };
        let max = self.settings.stream.max_deliveries;
        let shared_identity = application.is_some_and(|a| self.settings.shared_identity(a));
        batch
            .into_iter()
            .map(|entry| {
                let exhausted = entry.deliveries > max && entry.fields.is_some();
                let (request, handled) = if exhausted {
                    let reason = format!("delivered {} times without an answer", entry.deliveries);
                    (None, Some(Handled::Exhausted { reason }))
                } else {
                    let request = entry.fields.as_ref().map(|f| {
                        let mut request = seatgate_core::request::parse_entry(lane, &entry.id, f, &rules);
                        if let (Ok(req), Some(app)) = (&mut request, application) {
                            req.qualify(app, shared_identity);
                        }
                        request
                    });
                    (request, None)
                };
                Item {
                    lane,
                    request,
                    entry,
                    outcome: None,
                    reply: None,
                    handled,
                }
            })
            .collect()
    }

    /// Runs the seat script of every valid request in one pipeline. Calls
    /// of a function Redis no longer has (the library lost in a restart, a
    /// FUNCTION FLUSH, on a new cluster node) did not run, so they are re-run
    /// one by one, which loads the library again.
    async fn send(&self, con: &mut Db, items: &mut [Item], tag: Option<&str>) {
        let scripts = Scripts::get();
        let mut calls: Vec<(&mut Item, SeatCall<'_>)> = items
            .iter_mut()
            .filter_map(|item| {
                let Some(Ok(req)) = &item.request else { return None };
                let at = EntryAt {
                    lane: item.lane,
                    stream: tag,
                    id: &item.entry.id,
                };
                let call = self.seat_call(scripts, at, req);
                Some((item, call))
            })
            .collect();
        if calls.is_empty() {
            return;
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
                return;
            }
            Err(e) => {
                for (item, _) in &mut calls {
                    item.outcome = Some(Err(Error::Redis(e.clone())));
                }
                return;
            }
        };
        for ((item, call), answer) in calls.iter_mut().zip(answers) {
            let (result, elapsed) = match answer {
                Err(e) if seatgate_core::scripts::is_not_loaded(&e) => {
                    let started = Instant::now();
                    let result = call.run(con).await;
                    (result, started.elapsed())
                }
                other => (call.decode(other), elapsed),
            };
            if let Ok(outcome) = &result {
                self.clock.observe(outcome.now_ms);
            }
            metrics::script_call(
                call.name(),
                result.as_ref().map(|o| Some(o.status())).map_err(|_| ()),
                elapsed,
            );
            item.outcome = Some(result);
        }
    }

    /// The seat-script call deciding `req`, read at `entry`.
    fn seat_call<'a>(&self, scripts: &'a Scripts, entry: EntryAt<'_>, req: &Request) -> SeatCall<'a> {
        let keys = self.keys.license(&req.license);
        let guard = req.guard(
            &self.settings.guard_policy(),
            &self.keys,
            entry,
            self.clock.now_ms(),
        );
        let defaults = self.settings.service_defaults();
        if let seatgate_core::request::Action::Acquire(acquire) = &req.action {
            if acquire.wait_ms > defaults.max_wait_ms {
                metrics::wait_capped();
            }
        }
        req.call(scripts, &keys, &guard, &defaults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_handed_back_a_lost_connection_counts_a_script_error_is_permanent() {
        let server = |code: &str| Error::Redis(redis::make_extension_error(code.to_owned(), None));
        for code in ["LOADING", "BUSY", "READONLY", "MASTERDOWN"] {
            assert_eq!(Cause::of(&server(code)), Cause::Refused, "{code}");
        }
        assert_eq!(Cause::of(&server("OOM")), Cause::OutOfMemory);
        assert_eq!(Cause::of(&server("WRONGTYPE")), Cause::Permanent);
        let io = Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        )));
        assert_eq!(Cause::of(&io), Cause::Lost);
        let timeout = Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        )));
        assert_eq!(Cause::of(&timeout), Cause::Lost);
        let reply = Error::ScriptReply {
            script: "acquire",
            detail: "garbage".into(),
        };
        assert_eq!(Cause::of(&reply), Cause::Permanent);
    }
}
