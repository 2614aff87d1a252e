//! The doorbell: what tells an idle read loop that its stream has new
//! entries, without reading them.
//!
//! A worker reads through lua/read.lua, so that no entry over the limits
//! reaches it whole, and a script cannot block as `XREADGROUP BLOCK` did. So
//! one connection per worker process asks Redis to tell it of every write to
//! the streams it reads (`CLIENT TRACKING ON BCAST`, RESP3 pushes naming the
//! keys written; [`Db::connect_tracking`]), and rings the bell of the loop
//! whose stream was written. A loop with nothing to read waits for its bell
//! (at most until its read would have ended). Missing a ring costs latency,
//! never a request: while the doorbell is down (connecting, Redis away, a
//! cluster, an ACL without `CLIENT TRACKING`) loops look again after 1 ms,
//! doubling up to `stream.poll_ms`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{PushKind, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use seatgate_core::db::{Db, RedisSettings};

/// How long the doorbell waits before connecting again.
const RECONNECT: Duration = Duration::from_secs(1);

/// The bells of one worker process's read loops, by stream.
pub(super) struct Doorbell {
    /// Whether Redis is telling us of writes now.
    up: AtomicBool,
    /// Each stream's bell.
    bells: HashMap<String, Arc<Notify>>,
}

/// One read loop's bell.
pub(super) struct Bell {
    doorbell: Arc<Doorbell>,
    notify: Arc<Notify>,
}

impl Bell {
    /// Whether a write to the stream rings this bell now; if not, poll.
    pub(super) fn is_up(&self) -> bool {
        self.doorbell.up.load(Ordering::Acquire)
    }

    /// Waits up to `most` for a ring. A ring that came while nobody waited
    /// is kept, so one between a read that found nothing and this wait is
    /// not lost.
    pub(super) async fn wait(&self, most: Duration) {
        let _ = tokio::time::timeout(most, self.notify.notified()).await;
    }
}

impl Doorbell {
    /// The doorbell of `streams`.
    pub(super) fn new(streams: &[String]) -> Arc<Doorbell> {
        Arc::new(Doorbell {
            up: AtomicBool::new(false),
            bells: streams
                .iter()
                .map(|s| (s.clone(), Arc::new(Notify::new())))
                .collect(),
        })
    }

    /// The bell of `stream`'s read loop.
    pub(super) fn bell(self: &Arc<Doorbell>, stream: &str) -> Bell {
        let notify = self.bells.get(stream).cloned().unwrap_or_default();
        Bell {
            doorbell: self.clone(),
            notify,
        }
    }

    /// The prefixes to track: the streams, less any that another one starts
    /// with (Redis refuses overlapping prefixes; a shard or an application's
    /// stream starts with the base stream's name).
    fn prefixes(&self) -> Vec<String> {
        let mut streams: Vec<&String> = self.bells.keys().collect();
        streams.sort();
        let mut kept: Vec<String> = Vec::new();
        for stream in streams {
            if !kept.iter().any(|k| stream.starts_with(k.as_str())) {
                kept.push(stream.clone());
            }
        }
        kept
    }

    fn ring_all(&self) {
        for bell in self.bells.values() {
            bell.notify_one();
        }
    }

    /// Rings the bells of the keys of an `invalidate` push (every bell for
    /// a flush, which names none).
    fn ring(&self, data: &[Value]) {
        for item in data {
            match item {
                Value::Array(keys) => {
                    for key in keys {
                        if let Value::BulkString(key) = key {
                            if let Some(bell) = std::str::from_utf8(key).ok().and_then(|k| self.bells.get(k))
                            {
                                bell.notify_one();
                            }
                        }
                    }
                }
                _ => self.ring_all(),
            }
        }
    }

    /// Keeps the doorbell connected until `stop`: connects, rings every
    /// bell (writes while it was down went unheard), rings on each write,
    /// and connects again when the connection drops.
    pub(super) async fn run(self: Arc<Doorbell>, redis: RedisSettings, stop: CancellationToken) {
        let prefixes = self.prefixes();
        let prefixes: Vec<&str> = prefixes.iter().map(String::as_str).collect();
        let mut warned = false;
        while !stop.is_cancelled() {
            match Db::connect_tracking(&redis, &prefixes).await {
                Ok(None) => {
                    debug!("no doorbell on a cluster: idle read loops poll (stream.poll_ms)");
                    return;
                }
                Ok(Some((con, mut pushes))) => {
                    self.up.store(true, Ordering::Release);
                    self.ring_all();
                    if std::mem::take(&mut warned) {
                        info!("doorbell connected: idle read loops wait for writes again");
                    }
                    loop {
                        tokio::select! {
                            push = pushes.recv() => match push {
                                Some(push) if push.kind == PushKind::Invalidate => self.ring(&push.data),
                                Some(push) if push.kind == PushKind::Disconnection => break,
                                Some(_) => {}
                                None => break,
                            },
                            _ = stop.cancelled() => break,
                        }
                    }
                    drop(con);
                    self.up.store(false, Ordering::Release);
                    self.ring_all();
                    debug!("doorbell disconnected: idle read loops poll until it is back");
                }
                // Redis away: the read loops report the outage; the
                // doorbell connects again with them.
                Err(seatgate_core::Error::Redis(e)) if e.is_io_error() => {
                    debug!(error = %e, "cannot connect the doorbell yet: Redis is away");
                }
                // Behind Sentinel while it fails over: no master to name yet.
                Err(seatgate_core::Error::Redis(e))
                    if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel =>
                {
                    debug!(error = %e, "cannot connect the doorbell yet: the Sentinels name no master");
                }
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        warn!(error = %e, "cannot connect the doorbell (CLIENT TRACKING over RESP3; the worker's ACL user needs HELLO and CLIENT TRACKING); idle read loops poll every stream.poll_ms until it connects");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(RECONNECT) => {}
                _ = stop.cancelled() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracked_prefixes_do_not_overlap() {
        let streams = [
            "seat:requests",
            "seat:requests:1",
            "seat:requests:app:cad",
            "seat:admin:requests",
        ]
        .map(String::from);
        let doorbell = Doorbell::new(&streams);
        assert_eq!(doorbell.prefixes(), ["seat:admin:requests", "seat:requests"]);
    }

    #[tokio::test]
    async fn a_ring_while_nobody_waits_is_kept_for_the_next_wait() {
        let doorbell = Doorbell::new(&["s".to_owned(), "t".to_owned()]);
        let bell = doorbell.bell("s");
        doorbell.ring(&[Value::Array(vec![Value::BulkString(b"s".to_vec())])]);
        let started = std::time::Instant::now();
        bell.wait(Duration::from_secs(5)).await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the kept ring ends the wait"
        );
        // Another stream's write does not ring it.
        doorbell.ring(&[Value::Array(vec![Value::BulkString(b"t".to_vec())])]);
        let started = std::time::Instant::now();
        bell.wait(Duration::from_millis(50)).await;
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
