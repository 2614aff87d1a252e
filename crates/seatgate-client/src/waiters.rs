//! Who waits for which reply: the table the reply reader hands replies to.
//!
//! Many requests share one reply stream, so every reply is routed by its `id`
//! field. A waiter is registered under its request id *before* the request is
//! sent (a reply can arrive before XADD returns) and removed when its handle
//! drops. Replies nobody waits for (a GRANTED after its QUEUED was taken and
//! the handle dropped, a reply that came after its caller timed out, the
//! reply to a request sent with `send` and not waited for yet) are kept for a
//! while, bounded, so that `wait_for(id)` can still collect them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::reply::Reply;

/// Most unclaimed replies kept. Past it the oldest is dropped: a caller that
/// sends thousands of requests without ever waiting for them must not make
/// the client grow without end.
pub(crate) const UNCLAIMED_KEPT: usize = 1024;

/// One registered waiter.
struct Waiter {
    /// Where this id's replies go; the receiving end is the waiter's handle.
    tx: mpsc::UnboundedSender<Reply>,
    /// The request's in-flight slot, given back at its first reply: a
    /// request answered QUEUED waits in the license's queue, not in the
    /// pipeline, and must not hold back other requests while it does.
    permit: Option<OwnedSemaphorePermit>,
    /// Which registration this is, so that a stale handle never removes a
    /// later waiter for the same id.
    serial: u64,
}

/// A reply nobody waited for, and when it came.
struct Unclaimed {
    /// When the reader handed it over.
    at: Instant,
    /// The reply.
    reply: Reply,
}

/// The table itself; always behind [`Waiters`]'s lock.
#[derive(Default)]
struct Table {
    /// Registered waiters by request id.
    by_id: HashMap<String, Waiter>,
    /// Replies without a waiter, oldest first.
    unclaimed: VecDeque<Unclaimed>,
    /// Unclaimed replies dropped (too many, or too old).
    dropped: u64,
    /// Registrations made, the source of [`Waiter::serial`].
    serials: u64,
}

/// The waiter table shared by a client's handles and its reply reader.
pub(crate) struct Waiters {
    /// The table. A plain mutex: it is held for a few map operations and
    /// never across an await.
    table: Mutex<Table>,
    /// How long an unclaimed reply is kept: as long as it stays readable on
    /// the reply stream (`replies.ttl_ms`), where the old one-request
    /// client would still have found it.
    keep_for: Duration,
}

/// What happened to a reply handed to [`Waiters::deliver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Its waiter has it.
    Delivered,
    /// Nobody waits for its id; it is kept for a later `wait_for`.
    Kept,
}

/// Counters of a waiter table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Registered waiters.
    pub waiting: usize,
    /// Unclaimed replies kept.
    pub unclaimed: usize,
    /// Unclaimed replies dropped so far.
    pub dropped: u64,
}

impl Waiters {
    /// An empty table keeping unclaimed replies up to `keep_for`.
    pub(crate) fn new(keep_for: Duration) -> Arc<Waiters> {
        Arc::new(Waiters {
            table: Mutex::new(Table::default()),
            keep_for,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock leaves the table consistent (every
        // operation is a few map calls), so a poisoned lock is used as is.
        self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a waiter for `id`, holding `permit` until the first reply.
    /// With `claim`, a reply already kept for `id` is handed to it first.
    /// None if `id` already has a waiter.
    pub(crate) fn register(
        self: &Arc<Self>,
        id: &str,
        permit: Option<OwnedSemaphorePermit>,
        claim: bool,
    ) -> Option<Waiting> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut table = self.lock();
        if table.by_id.contains_key(id) {
            return None;
        }
        let mut permit = permit;
        if claim {
            if let Some(i) = table.unclaimed.iter().position(|u| u.reply.get("id") == id) {
                if let Some(kept) = table.unclaimed.remove(i) {
                    permit = None;
                    // The receiver is alive (it is in our hands): this cannot fail.
                    let _ = tx.send(kept.reply);
                }
            }
        }
        table.serials += 1;
        let serial = table.serials;
        table.by_id.insert(id.to_owned(), Waiter { tx, permit, serial });
        Some(Waiting {
            waiters: self.clone(),
            id: id.to_owned(),
            serial,
            rx,
        })
    }

    /// Hands `reply` to the waiter of its `id`, or keeps it unclaimed.
    pub(crate) fn deliver(&self, reply: Reply) -> Delivery {
        let mut table = self.lock();
        let reply = match table.by_id.get_mut(reply.get("id")) {
            Some(waiter) => {
                waiter.permit = None;
                match waiter.tx.send(reply) {
                    Ok(()) => return Delivery::Delivered,
                    Err(mpsc::error::SendError(reply)) => reply,
                }
            }
            None => reply,
        };
        self.keep(&mut table, reply);
        Delivery::Kept
    }

    /// Keeps `reply` unclaimed, dropping the oldest past the bounds.
    fn keep(&self, table: &mut Table, reply: Reply) {
        let now = Instant::now();
        while table
            .unclaimed
            .front()
            .is_some_and(|u| now.duration_since(u.at) > self.keep_for)
        {
            table.unclaimed.pop_front();
            table.dropped += 1;
        }
        if table.unclaimed.len() >= UNCLAIMED_KEPT {
            table.unclaimed.pop_front();
            table.dropped += 1;
        }
        table.unclaimed.push_back(Unclaimed { at: now, reply });
    }

    /// Removes waiter `serial` of `id` (if still there) and keeps whatever it
    /// was sent but did not take.
    fn unregister(&self, id: &str, serial: u64, rx: &mut mpsc::UnboundedReceiver<Reply>) {
        let mut table = self.lock();
        if table.by_id.get(id).is_some_and(|w| w.serial == serial) {
            table.by_id.remove(id);
        }
        // Under the lock: the reader cannot send between the removal and this.
        while let Ok(reply) = rx.try_recv() {
            self.keep(&mut table, reply);
        }
    }

    /// Drops every waiter: their handles then learn that no reply will come.
    pub(crate) fn close(&self) {
        self.lock().by_id.clear();
    }

    /// The table's counters.
    pub(crate) fn counts(&self) -> Counts {
        let table = self.lock();
        Counts {
            waiting: table.by_id.len(),
            unclaimed: table.unclaimed.len(),
            dropped: table.dropped,
        }
    }
}

/// A registered waiter's receiving end; unregisters itself on drop.
pub(crate) struct Waiting {
    /// The table it is registered in.
    waiters: Arc<Waiters>,
    /// The request id it waits for.
    id: String,
    /// Its registration, see [`Waiter::serial`].
    serial: u64,
    /// Its replies, in the order the reader read them.
    rx: mpsc::UnboundedReceiver<Reply>,
}

impl Waiting {
    /// The request id waited for.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The next reply; None once the client stopped reading replies.
    pub(crate) async fn next(&mut self) -> Option<Reply> {
        self.rx.recv().await
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.waiters.unregister(&self.id, self.serial, &mut self.rx);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio::sync::Semaphore;

    use super::*;

    fn reply(id: &str, status: &str) -> Reply {
        let mut fields = BTreeMap::new();
        fields.insert("id".to_owned(), id.to_owned());
        fields.insert("status".to_owned(), status.to_owned());
        Reply {
            fields,
            lease: None,
            written_ms: None,
        }
    }

    #[tokio::test]
    async fn a_reply_goes_to_the_waiter_of_its_id_only() {
        let w = Waiters::new(Duration::from_secs(60));
        let mut a = w.register("a", None, false).unwrap();
        let mut b = w.register("b", None, false).unwrap();
        assert_eq!(w.deliver(reply("b", "ACQUIRED")), Delivery::Delivered);
        assert_eq!(w.deliver(reply("a", "RELEASED")), Delivery::Delivered);
        assert_eq!(a.next().await.unwrap().get("status"), "RELEASED");
        assert_eq!(b.next().await.unwrap().get("status"), "ACQUIRED");
    }

    #[tokio::test]
    async fn one_id_has_one_waiter_at_a_time() {
        let w = Waiters::new(Duration::from_secs(60));
        let first = w.register("a", None, false).unwrap();
        assert!(w.register("a", None, false).is_none());
        drop(first);
        assert!(w.register("a", None, false).is_some());
    }

    #[tokio::test]
    async fn the_in_flight_slot_is_given_back_at_the_first_reply() {
        let slots = Arc::new(Semaphore::new(1));
        let w = Waiters::new(Duration::from_secs(60));
        let permit = slots.clone().try_acquire_owned().unwrap();
        let mut queued = w.register("q", Some(permit), false).unwrap();
        assert_eq!(slots.available_permits(), 0);
        w.deliver(reply("q", "QUEUED"));
        assert_eq!(slots.available_permits(), 1, "QUEUED frees the slot");
        w.deliver(reply("q", "GRANTED"));
        assert_eq!(queued.next().await.unwrap().get("status"), "QUEUED");
        assert_eq!(queued.next().await.unwrap().get("status"), "GRANTED");
    }

    #[tokio::test]
    async fn replies_without_a_waiter_are_kept_for_a_later_claim() {
        let w = Waiters::new(Duration::from_secs(60));
        assert_eq!(w.deliver(reply("late", "ACQUIRED")), Delivery::Kept);
        // Not claimed by a registration that does not ask to.
        let fresh = w.register("late", None, false).unwrap();
        drop(fresh);
        let mut claimed = w.register("late", None, true).unwrap();
        assert_eq!(claimed.next().await.unwrap().get("status"), "ACQUIRED");
        assert_eq!(w.counts().unclaimed, 0);
    }

    #[tokio::test]
    async fn replies_a_dropped_waiter_did_not_take_are_kept() {
        let w = Waiters::new(Duration::from_secs(60));
        let mut first = w.register("q", None, false).unwrap();
        w.deliver(reply("q", "QUEUED"));
        w.deliver(reply("q", "GRANTED"));
        assert_eq!(first.next().await.unwrap().get("status"), "QUEUED");
        drop(first);
        assert_eq!(
            w.counts(),
            Counts {
                waiting: 0,
                unclaimed: 1,
                dropped: 0
            }
        );
        let mut again = w.register("q", None, true).unwrap();
        assert_eq!(again.next().await.unwrap().get("status"), "GRANTED");
    }

    #[tokio::test]
    async fn a_stale_handle_does_not_remove_a_later_waiter() {
        let w = Waiters::new(Duration::from_secs(60));
        let old = w.register("a", None, false).unwrap();
        // The old handle's registration is gone (e.g. the client closed)...
        w.close();
        let mut new = w.register("a", None, false).unwrap();
        // ...and its drop leaves the new one alone.
        drop(old);
        assert_eq!(w.deliver(reply("a", "ACQUIRED")), Delivery::Delivered);
        assert_eq!(new.next().await.unwrap().get("status"), "ACQUIRED");
    }

    #[tokio::test]
    async fn closing_ends_every_wait() {
        let w = Waiters::new(Duration::from_secs(60));
        let mut a = w.register("a", None, false).unwrap();
        w.close();
        assert!(a.next().await.is_none());
    }

    #[test]
    fn unclaimed_replies_are_bounded_in_number() {
        let w = Waiters::new(Duration::from_secs(60));
        for i in 0..UNCLAIMED_KEPT + 10 {
            w.deliver(reply(&format!("r{i}"), "RELEASED"));
        }
        let counts = w.counts();
        assert_eq!((counts.unclaimed, counts.dropped), (UNCLAIMED_KEPT, 10));
        // The oldest went first.
        let mut gone = w.register("r0", None, true).unwrap();
        assert!(gone.rx.try_recv().is_err(), "r0 was dropped");
        let mut kept = w.register("r10", None, true).unwrap();
        assert!(kept.rx.try_recv().is_ok(), "r10 was kept");
    }

    #[test]
    fn unclaimed_replies_are_bounded_in_age() {
        let w = Waiters::new(Duration::from_millis(20));
        w.deliver(reply("old", "RELEASED"));
        std::thread::sleep(Duration::from_millis(40));
        w.deliver(reply("new", "RELEASED"));
        assert_eq!(
            w.counts(),
            Counts {
                waiting: 0,
                unclaimed: 1,
                dropped: 1
            }
        );
    }
}
