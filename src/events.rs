//! Seat events and replies sent after the fact.
//!
//! Scripts decide; this module tells the world. It appends seat events to the
//! events stream (for dashboards) and delivers the notes scripts return:
//! GRANTED to a waiter that now holds a seat, QUEUE_TIMEOUT to one whose wait
//! ran out, each on the reply stream the waiter queued with and carrying its
//! original request id. The worker and the reaper share it.

use redis::aio::ConnectionLike;
use tracing::warn;

use crate::config::Settings;
use crate::protocol::Reply;
use crate::scripts::{Note, Scripts};
use crate::status::Status;
use crate::telemetry;

/// Event types on the events stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// A session took a seat directly.
    Acquired,
    /// A session gave its seat back (a seat-freed event).
    Released,
    /// A session was evicted for a stale heartbeat (a seat-freed event).
    Evicted,
    /// A session joined a wait queue.
    Queued,
    /// A waiting session got a seat.
    Granted,
    /// A waiting session's wait ran out.
    QueueTimeout,
    /// A waiting session left the queue by releasing.
    LeftQueue,
}

impl EventType {
    /// The `type` field on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Acquired => "acquired",
            EventType::Released => "released",
            EventType::Evicted => "evicted",
            EventType::Queued => "queued",
            EventType::Granted => "granted",
            EventType::QueueTimeout => "queue_timeout",
            EventType::LeftQueue => "left_queue",
        }
    }

    /// The event a request's outcome publishes, if any.
    pub fn for_status(status: Status) -> Option<EventType> {
        Some(match status {
            Status::Acquired => EventType::Acquired,
            Status::Released => EventType::Released,
            Status::Queued => EventType::Queued,
            Status::LeftQueue => EventType::LeftQueue,
            Status::Granted => EventType::Granted,
            Status::QueueTimeout => EventType::QueueTimeout,
            _ => return None,
        })
    }
}

/// One seat event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    /// What happened.
    pub kind: EventType,
    /// License id.
    pub license: &'a str,
    /// Session id.
    pub session: &'a str,
    /// Seats held afterwards.
    pub seats_used: i64,
    /// The license's seats.
    pub seats_total: i64,
    /// When, on the Redis server's clock (ms).
    pub at_ms: i64,
    /// Why, where it applies (`heartbeat_timeout` for evictions).
    pub reason: Option<&'a str>,
}

/// Writes events and deferred replies.
#[derive(Debug, Clone)]
pub struct Publisher {
    /// Events stream key.
    events: String,
    /// Approximate cap of the events stream.
    events_maxlen: usize,
    /// Approximate cap of each reply stream.
    reply_maxlen: usize,
    /// Idle expiry of each reply stream, ms.
    reply_ttl_ms: u64,
    /// Key names (the outbox of a license).
    keys: crate::keys::Keys,
}

impl Publisher {
    /// A publisher for `settings`.
    pub fn new(settings: &Settings) -> Publisher {
        Publisher {
            events: settings.events.stream.clone(),
            events_maxlen: settings.events.maxlen,
            reply_maxlen: settings.replies.maxlen,
            reply_ttl_ms: settings.replies.ttl_ms,
            keys: crate::keys::Keys::new(settings.keys.prefix.clone()),
        }
    }

    /// XADDs `reply` to `stream` (see lua/reply.lua).
    pub async fn reply<C: ConnectionLike>(
        &self,
        con: &mut C,
        stream: &str,
        reply: &Reply,
    ) -> redis::RedisResult<()> {
        Scripts::get()
            .reply(con, stream, self.reply_maxlen, self.reply_ttl_ms, &reply.fields())
            .await
    }

    /// Appends `event` to the events stream. Failures are logged and counted:
    /// an event is information, never a reason to hold back a reply.
    pub async fn event<C: ConnectionLike>(&self, con: &mut C, event: &Event<'_>) {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&self.events)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.events_maxlen)
            .arg("*")
            .arg("type")
            .arg(event.kind.as_str())
            .arg("license")
            .arg(event.license)
            .arg("session")
            .arg(event.session)
            .arg("seats_used")
            .arg(event.seats_used)
            .arg("seats_total")
            .arg(event.seats_total)
            .arg("at_ms")
            .arg(event.at_ms);
        if let Some(reason) = event.reason {
            xadd.arg("reason").arg(reason);
        }
        if let Err(e) = xadd.query_async::<redis::Value>(con).await {
            telemetry::event_error();
            warn!(error = %e, kind = event.kind.as_str(), "cannot publish event");
        }
    }

    /// Tells a waiter what became of it (GRANTED / QUEUE_TIMEOUT) and, when
    /// `first_time`, publishes the matching event and counts it (a replayed
    /// note is only re-delivered). Returns the reply error, if any.
    #[allow(clippy::too_many_arguments)]
    pub async fn deliver<C: ConnectionLike>(
        &self,
        con: &mut C,
        license: &str,
        note: &Note,
        seats_used: i64,
        seats_total: i64,
        at_ms: i64,
        first_time: bool,
    ) -> redis::RedisResult<()> {
        if first_time {
            telemetry::queue_outcome(note.status, note.waited_ms);
        }
        let mut result = Ok(());
        if !note.reply_to.is_empty() {
            let reply = Reply {
                id: note.request_id.clone(),
                op: "acquire".to_owned(),
                status: note.status,
                license: license.to_owned(),
                session: note.session.clone(),
                seats_used,
                seats_total,
                heartbeats: None,
                position: None,
                waited_ms: Some(note.waited_ms),
                error: (note.status == Status::QueueTimeout)
                    .then(|| format!("waited {} ms without a seat", note.waited_ms)),
            };
            result = self.reply(con, &note.reply_to, &reply).await;
            match &result {
                // Delivered: out of the outbox, so the reaper does not send it again.
                Ok(()) => {
                    let outbox = self.keys.license(license).outbox;
                    let _: redis::RedisResult<i64> = redis::cmd("HDEL")
                        .arg(outbox)
                        .arg(&note.note_id)
                        .query_async(con)
                        .await;
                }
                Err(e) => {
                    telemetry::reply_error();
                    warn!(error = %e, license, session = %note.session, status = %note.status, "cannot deliver queue reply; the reaper retries it");
                }
            }
        }
        if let Some(kind) = EventType::for_status(note.status).filter(|_| first_time) {
            let event = Event {
                kind,
                license,
                session: &note.session,
                seats_used,
                seats_total,
                at_ms,
                reason: None,
            };
            self.event(con, &event).await;
        }
        result
    }
}
