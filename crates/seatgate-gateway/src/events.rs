//! What a seat or a wait hears over server-sent events, from the license's
//! events stream: the one record every worker writes and every gateway can
//! read, so that a client reconnecting to any gateway with `Last-Event-ID`
//! (an events stream entry id) misses nothing.
//!
//! Each gateway reads each events stream it has followers on with one
//! blocking `XREAD` and hands every entry to the followers of its session;
//! a follower first reads what it missed with `XRANGE` from its cursor, then
//! takes the live entries after the last id it sent.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::streams::{StreamRangeReply, StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;
use seatgate_core::db::{Db, RedisSettings};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Entries read per `XRANGE` of a catch-up.
const CATCH_UP_PAGE: usize = 500;
/// How long the hub's `XREAD` blocks.
const BLOCK: Duration = Duration::from_secs(5);

/// One entry of an events stream, as a follower gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeatEvent {
    /// The entry id (the SSE `id:`).
    pub id: String,
    /// The event's fields (`type`, `license`, `session`, `seq`, …).
    pub fields: HashMap<String, String>,
}

impl SeatEvent {
    /// The event's `type` (`granted`, `queue_timeout`, …).
    pub fn kind(&self) -> &str {
        self.fields.get("type").map(String::as_str).unwrap_or("")
    }

    /// Whether nothing more can happen to the session after it: the seat
    /// or the wait is over.
    pub fn is_final(&self) -> bool {
        matches!(
            self.kind(),
            "released" | "evicted" | "queue_timeout" | "left_queue" | "revoked"
        ) || (self.kind() == "denied" && self.fields.contains_key("waited_ms"))
    }
}

/// What one follower is owed: the events it missed, then the live ones
/// after the last it got.
pub struct Follow {
    missed: std::collections::VecDeque<SeatEvent>,
    live: mpsc::UnboundedReceiver<SeatEvent>,
    last: String,
    done: bool,
    /// Where it is registered, to leave when it ends.
    hub: Arc<EventHub>,
    key: Key,
}

impl Drop for Follow {
    /// Leaves the hub: a stream whose session never gets another event
    /// would otherwise stay registered.
    fn drop(&mut self) {
        self.live.close();
        self.hub.open.fetch_sub(1, Ordering::Relaxed);
        let mut followers = self.hub.followers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = followers.get_mut(&self.key) {
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                followers.remove(&self.key);
            }
        }
    }
}

impl Follow {
    /// The next event; `None` after the one that ends the seat or the wait.
    pub async fn next(&mut self) -> Option<SeatEvent> {
        if self.done {
            return None;
        }
        let event = match self.missed.pop_front() {
            Some(event) => event,
            None => loop {
                let event = self.live.recv().await?;
                if id_after(&event.id, &self.last) {
                    break event;
                }
            },
        };
        self.last.clone_from(&event.id);
        self.done = event.is_final();
        Some(event)
    }
}

/// (license, session as the events name it).
type Key = (String, String);

/// The followers of one gateway.
pub struct EventHub {
    redis: RedisSettings,
    db: Db,
    followers: Mutex<HashMap<Key, Vec<mpsc::UnboundedSender<SeatEvent>>>>,
    /// Follows open now.
    open: AtomicUsize,
    /// The events streams read, each by its own task.
    readers: Mutex<HashSet<String>>,
}

/// The ids of two stream entries compared as ids (`<ms>-<seq>`).
pub(crate) fn id_after(a: &str, b: &str) -> bool {
    fn parts(id: &str) -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    }
    parts(a) > parts(b)
}

impl EventHub {
    /// A hub reading through `db`, with blocking reads of its own made from `redis`.
    pub fn new(redis: RedisSettings, db: Db) -> Arc<EventHub> {
        Arc::new(EventHub {
            redis,
            db,
            followers: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            readers: Mutex::new(HashSet::new()),
        })
    }

    /// The id of the last entry of `stream` now ("0-0" when it has none):
    /// a cursor from which a follower misses nothing that happens next.
    pub async fn cursor(&self, stream: &str) -> Result<String, redis::RedisError> {
        let last: StreamRangeReply = self.db.clone().xrevrange_count(stream, "+", "-", 1).await?;
        Ok(last
            .ids
            .first()
            .map(|e| e.id.clone())
            .unwrap_or_else(|| "0-0".into()))
    }

    /// Follows `session` (its name in the events) of `license` on `stream`
    /// from `cursor` (exclusive; `None`: from now): the events a follower
    /// is owed, in order, none twice ([`Follow::next`]).
    pub async fn follow(
        self: &Arc<EventHub>,
        stream: &str,
        license: &str,
        session: &str,
        cursor: Option<&str>,
    ) -> Result<Follow, redis::RedisError> {
        let key: Key = (license.to_owned(), session.to_owned());
        let (live_tx, live_rx) = mpsc::unbounded_channel();
        self.followers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .push(live_tx);
        self.open.fetch_add(1, Ordering::Relaxed);
        // Built at once: a catch-up that fails drops it, which leaves the hub.
        let mut follow = Follow {
            missed: std::collections::VecDeque::new(),
            live: live_rx,
            last: cursor.map(str::to_owned).unwrap_or_else(|| "0-0".into()),
            done: false,
            hub: Arc::clone(self),
            key,
        };
        self.start_reader(stream);
        if let Some(cursor) = cursor {
            let mut from = format!("({cursor}");
            loop {
                let page: StreamRangeReply = self
                    .db
                    .clone()
                    .xrange_count(stream, &from, "+", CATCH_UP_PAGE)
                    .await?;
                let n = page.ids.len();
                for entry in page.ids {
                    from = format!("({}", entry.id);
                    let event = event_of(&entry);
                    if matches_key(&event, &follow.key) {
                        follow.missed.push_back(event);
                    }
                }
                if n < CATCH_UP_PAGE {
                    break;
                }
            }
        }
        Ok(follow)
    }

    /// Starts the reader of `stream` unless it runs.
    fn start_reader(self: &Arc<EventHub>, stream: &str) {
        if !self
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(stream.to_owned())
        {
            return;
        }
        let hub = Arc::clone(self);
        let stream = stream.to_owned();
        tokio::spawn(async move { hub.read(stream).await });
    }

    /// Reads `stream` from its end on, handing each entry to its followers.
    async fn read(self: Arc<EventHub>, stream: String) {
        let mut last = match self.cursor(&stream).await {
            Ok(id) => id,
            Err(_) => "$".to_owned(),
        };
        let mut con: Option<Db> = None;
        let mut warned = false;
        loop {
            let db = match &con {
                Some(db) => db.clone(),
                None => match Db::connect_blocking(&self.redis, BLOCK).await {
                    Ok(db) => {
                        con = Some(db.clone());
                        db
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut warned, true) {
                            warn!(error = %e, %stream, "cannot read the events stream; retrying (SSE followers hear nothing meanwhile)");
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
            };
            let opts = StreamReadOptions::default()
                .block(BLOCK.as_millis() as usize)
                .count(1000);
            let reply: Result<Option<StreamReadReply>, _> =
                db.clone().xread_options(&[&stream], &[&last], &opts).await;
            match reply {
                Ok(Some(reply)) => {
                    warned = false;
                    for key in reply.keys {
                        for entry in key.ids {
                            last = entry.id.clone();
                            self.dispatch(event_of(&entry));
                        }
                    }
                }
                Ok(None) => warned = false,
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        warn!(error = %e, %stream, "cannot read the events stream; retrying (SSE followers hear nothing meanwhile)");
                    } else {
                        debug!(error = %e, "events stream read failed");
                    }
                    con = None;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    fn dispatch(&self, event: SeatEvent) {
        let (Some(license), Some(session)) = (event.fields.get("license"), event.fields.get("session"))
        else {
            return;
        };
        let key: Key = (license.clone(), session.clone());
        let mut followers = self.followers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = followers.get_mut(&key) {
            list.retain(|tx| tx.send(event.clone()).is_ok());
            if list.is_empty() {
                followers.remove(&key);
            }
        }
    }

    /// Follows open now (each counted from `follow` until it is dropped).
    pub fn followers(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

fn matches_key(event: &SeatEvent, key: &Key) -> bool {
    event.fields.get("license") == Some(&key.0) && event.fields.get("session") == Some(&key.1)
}

fn event_of(entry: &redis::streams::StreamId) -> SeatEvent {
    let fields = entry
        .map
        .iter()
        .filter_map(|(k, v)| {
            redis::from_redis_value::<String>(v.clone())
                .ok()
                .map(|v| (k.clone(), v))
        })
        .collect();
    SeatEvent {
        id: entry.id.clone(),
        fields,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_compare_as_numbers() {
        assert!(id_after("10-0", "9-5"));
        assert!(id_after("10-1", "10-0"));
        assert!(!id_after("10-0", "10-0"));
        assert!(!id_after("0-0", "1-0"));
    }

    #[test]
    fn a_wait_or_a_seat_ends_with_its_last_event() {
        let ev = |kind: &str, waited: bool| {
            let mut fields: HashMap<String, String> = [("type".to_owned(), kind.to_owned())].into();
            if waited {
                fields.insert("waited_ms".into(), "5".into());
            }
            SeatEvent {
                id: "1-0".into(),
                fields,
            }
        };
        for kind in ["released", "evicted", "queue_timeout", "left_queue", "revoked"] {
            assert!(ev(kind, false).is_final(), "{kind}");
        }
        for kind in ["queued", "granted", "acquired"] {
            assert!(!ev(kind, false).is_final(), "{kind}");
        }
        assert!(!ev("denied", false).is_final());
        assert!(ev("denied", true).is_final(), "a wait ended by a deleted license");
    }
}
