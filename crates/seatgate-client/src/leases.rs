//! The leases a client's sessions are bound to.
//!
//! A session's lease is its secret: every heartbeat, release and re-sent
//! acquire carries it, and a service with `sessions.require_lease` refuses
//! any of them without one. So a lease is kept not only while its seat or
//! place is held but for a while after it ends (released, left the queue,
//! revoked, never found): a late heartbeat or a second release of that
//! session still carries it and hears what really happened
//! (SESSION_NOT_FOUND, SESSION_REVOKED) instead of "missing field `lease`".
//! Ended sessions are kept up to [`ENDED_KEPT`], oldest forgotten first, so
//! a long-lived client making sessions without end stays bounded.

use std::collections::{HashMap, VecDeque};

use seatgate_core::protocol::Lease;

/// A session of a license: `(license, session)`.
pub(crate) type Key = (String, String);

/// How many ended sessions' leases a client keeps.
pub(crate) const ENDED_KEPT: usize = 4096;

/// Live leases, and the leases of sessions that ended, oldest first.
#[derive(Debug, Default)]
pub(crate) struct LeaseBook {
    live: HashMap<Key, Lease>,
    /// Each ended lease with the number of its ending, so that `order`
    /// can tell its latest ending from one before it was held again.
    ended: HashMap<Key, (Lease, u64)>,
    /// Endings, oldest first.
    order: VecDeque<(Key, u64)>,
    endings: u64,
}

impl LeaseBook {
    /// The lease of `key` while its seat or place is held.
    pub(crate) fn live(&self, key: &Key) -> Option<&Lease> {
        self.live.get(key)
    }

    /// The lease of `key`, live or ended.
    pub(crate) fn get(&self, key: &Key) -> Option<&Lease> {
        self.live
            .get(key)
            .or_else(|| self.ended.get(key).map(|(lease, _)| lease))
    }

    /// Binds `key` to `lease` for as long as its seat or place is held.
    pub(crate) fn hold(&mut self, key: Key, lease: Lease) {
        self.ended.remove(&key);
        self.live.insert(key, lease);
    }

    /// The lease `key` had, kept as ended: its seat or place is given back.
    pub(crate) fn end(&mut self, key: &Key) -> Option<Lease> {
        let Some(lease) = self.live.remove(key) else {
            return self.ended.get(key).map(|(lease, _)| lease.clone());
        };
        self.endings += 1;
        self.ended.insert(key.clone(), (lease.clone(), self.endings));
        self.order.push_back((key.clone(), self.endings));
        // Endings of keys held again since are stale in `order`; the bound
        // on `order` keeps them from piling up.
        while self.ended.len() > ENDED_KEPT || self.order.len() > 2 * ENDED_KEPT {
            let Some((oldest, ending)) = self.order.pop_front() else {
                break;
            };
            if self
                .ended
                .get(&oldest)
                .is_some_and(|(_, latest)| *latest == ending)
            {
                self.ended.remove(&oldest);
            }
        }
        Some(lease)
    }

    /// How many sessions' leases are kept, live and ended.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.live.len() + self.ended.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(session: usize) -> Key {
        ("L".to_owned(), format!("s-{session}"))
    }

    fn lease(n: usize) -> Lease {
        Lease::parse(&format!("lease-{n:016}")).expect("a valid lease")
    }

    #[test]
    fn an_ended_sessions_lease_is_kept_for_its_late_calls() {
        let mut book = LeaseBook::default();
        book.hold(key(1), lease(1));
        assert_eq!(book.end(&key(1)), Some(lease(1)));
        assert_eq!(book.get(&key(1)), Some(&lease(1)));
        // Ending it again (a second release) still names it.
        assert_eq!(book.end(&key(1)), Some(lease(1)));
        // Held again: live once more, and ending it keeps one entry.
        book.hold(key(1), lease(1));
        assert_eq!(book.end(&key(1)), Some(lease(1)));
        assert_eq!(book.len(), 1);
    }

    #[test]
    fn ended_leases_are_bounded_oldest_first_and_live_ones_never_dropped() {
        let mut book = LeaseBook::default();
        book.hold(key(0), lease(0));
        for n in 1..=ENDED_KEPT + 10 {
            book.hold(key(n), lease(n));
            book.end(&key(n));
        }
        assert_eq!(book.len(), ENDED_KEPT + 1);
        assert_eq!(
            book.get(&key(0)),
            Some(&lease(0)),
            "a live lease is never dropped"
        );
        assert_eq!(book.get(&key(1)), None, "the oldest ended lease goes first");
        assert_eq!(book.get(&key(ENDED_KEPT + 10)), Some(&lease(ENDED_KEPT + 10)));
    }
}
