//! The read schedule of one shard: what to read next (own pending entries,
//! a claim, new entries), how long a read may block, and the backoffs.
//!
//! Pure: it does no I/O and reads no clock; every method is given the time,
//! so the rules below are unit-tested with made-up instants.

use std::time::{Duration, Instant};

use super::read::Source;

/// The decision state of one shard's read loop.
///
/// Own pending entries are read first (a previous life under the same
/// consumer name may have left some), and afterwards only when a retry is
/// due, so new requests keep flowing meanwhile: a failing entry delays
/// nobody. Entries other consumers left pending are claimed every
/// `claim_every`, and at once again after a full page.
#[derive(Debug)]
pub(super) struct Schedule {
    /// When to re-read our own pending entries. `None` while none is known
    /// to wait, including while a batch of them is in flight: its outcome
    /// sets it again.
    retry_at: Option<Instant>,
    /// When to next claim entries that other consumers left pending.
    next_claim: Instant,
    /// Half of `stream.claim_idle_ms`, within 100 ms..5 s: an entry left
    /// pending is claimed within about 1.5 × claim_idle_ms, without claims
    /// hammering Redis when the idle time is short.
    claim_every: Duration,
    /// `stream.batch_size`: a claim page this long may have left more behind.
    page_size: usize,
    /// Pause before re-reading entries that must be retried; it grows while
    /// they keep failing and is reset once our pending list is drained.
    retry_backoff: Backoff,
    /// Pause after a failed read; it grows while Redis stays unreachable.
    read_backoff: Backoff,
    /// Reads fail (or setup failed at startup): the worker is not ready.
    failing: bool,
}

/// What the loop does after a failed read.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ReadFailed {
    /// The first failure after serving: log it once and report not ready.
    pub(super) outage_began: bool,
    /// How long to pause before reading again.
    pub(super) pause: Duration,
}

impl Schedule {
    /// The schedule of a loop starting at `now`; `failing` when its setup
    /// has not succeeded yet.
    pub(super) fn new(now: Instant, claim_idle_ms: u64, page_size: usize, failing: bool) -> Schedule {
        Schedule {
            retry_at: Some(now),
            next_claim: now,
            claim_every: Duration::from_millis((claim_idle_ms / 2).clamp(100, 5_000)),
            page_size,
            retry_backoff: Backoff::default(),
            read_backoff: Backoff::default(),
            failing,
        }
    }

    /// Whether reads fail (or setup has not succeeded yet).
    pub(super) fn is_failing(&self) -> bool {
        self.failing
    }

    /// What to read at `now`: a due retry first, then a due claim, else new entries.
    pub(super) fn next_source(&self, now: Instant) -> Source {
        if self.retry_at.is_some_and(|at| at <= now) {
            Source::OwnPending
        } else if now >= self.next_claim {
            Source::Claimed
        } else {
            Source::New
        }
    }

    /// How long a read started at `now` may block: a blocking read must not
    /// sleep through a due retry or claim. At least 1 ms, as `BLOCK 0` would
    /// block forever.
    pub(super) fn block_for(&self, now: Instant) -> Duration {
        let wake = self
            .retry_at
            .map_or(self.next_claim, |at| at.min(self.next_claim));
        wake.saturating_duration_since(now).max(Duration::from_millis(1))
    }

    /// A batch read from `source` was settled at `now`; `retry` when some of
    /// its entries were left pending.
    pub(super) fn batch_done(&mut self, retry: bool, source: Source, now: Instant) {
        if retry {
            // Something must be retried: re-read our pending entries after a pause.
            self.retry_at = Some(now + self.retry_backoff.next_delay());
        } else if source == Source::OwnPending {
            // Drained a page of pending entries; look for more right away.
            self.retry_at = Some(now);
        }
    }

    /// A claim at `now` returned `page_len` entries.
    pub(super) fn claimed(&mut self, page_len: usize, now: Instant) {
        // A full page means more may wait: claim again right away.
        self.next_claim = if page_len >= self.page_size {
            now
        } else {
            now + self.claim_every
        };
    }

    /// A read of our own pending entries returned `page_len` entries. The
    /// retry is off until that batch is settled; an empty page means none is
    /// left, so the retry backoff starts over.
    pub(super) fn pending_read(&mut self, page_len: usize) {
        self.retry_at = None;
        if page_len == 0 {
            self.retry_backoff.reset();
        }
    }

    /// A read succeeded. Returns whether it ends an outage, so the caller
    /// reports ready again and repeats the setup.
    pub(super) fn read_ok(&mut self) -> bool {
        let recovered = self.failing;
        self.failing = false;
        self.read_backoff.reset();
        recovered
    }

    /// A read failed at `now`. Entries may have been delivered without
    /// reaching us, so our pending list is re-read first once Redis answers.
    pub(super) fn read_failed(&mut self, now: Instant) -> ReadFailed {
        let outage_began = !self.failing;
        self.failing = true;
        self.retry_at = Some(now);
        ReadFailed {
            outage_began,
            pause: self.read_backoff.next_delay(),
        }
    }
}

/// Capped exponential backoff: 50 ms doubling to 1 s, so service resumes
/// within about a second of Redis answering again.
#[derive(Debug, Default)]
struct Backoff {
    /// Delays handed out since the last reset.
    attempt: u32,
}

impl Backoff {
    fn reset(&mut self) {
        self.attempt = 0;
    }

    fn next_delay(&mut self) -> Duration {
        let ms = (50u64 << self.attempt.min(5)).min(1000);
        self.attempt += 1;
        Duration::from_millis(ms)
    }
}

