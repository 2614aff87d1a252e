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
/// `claim_every`, one sweep of the pending list at a time: page after page
/// at once while a page comes back full or the sweep has not reached the
/// end, then not before `claim_every` has passed again.
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

    /// A claim at `now` returned `page_len` entries; `swept` when its page
    /// reached the end of the pending list.
    pub(super) fn claimed(&mut self, page_len: usize, swept: bool, now: Instant) {
        // A full page, or a sweep cut short by XAUTOCLAIM's scan limit, means
        // more may wait further on: claim again right away.
        self.next_claim = if page_len >= self.page_size || !swept {
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// claim_idle_ms 1000 (a claim every 500 ms), pages of 10, set up fine.
    fn schedule(t0: Instant) -> Schedule {
        Schedule::new(t0, 1_000, 10, false)
    }

    /// A schedule past its startup: own pending list drained, one claim
    /// done at `t0` that found nothing.
    fn serving(t0: Instant) -> Schedule {
        let mut s = schedule(t0);
        s.pending_read(0);
        s.claimed(0, true, t0);
        s
    }

    #[test]
    fn own_pending_entries_are_read_first_at_startup() {
        let t0 = Instant::now();
        let s = schedule(t0);
        assert_eq!(s.next_source(t0), Source::OwnPending);
        assert!(!s.is_failing());
    }

    #[test]
    fn a_failed_setup_starts_not_ready_and_the_first_good_read_recovers() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, 1_000, 10, true);
        assert!(s.is_failing());
        assert!(s.read_ok());
        assert!(!s.is_failing());
        assert!(!s.read_ok(), "only the first good read ends the outage");
    }

    #[test]
    fn a_claim_follows_the_startup_drain_at_once() {
        let t0 = Instant::now();
        let mut s = schedule(t0);
        s.pending_read(0);
        assert_eq!(s.next_source(t0), Source::Claimed);
    }

    #[test]
    fn a_claim_is_due_every_claim_every() {
        let t0 = Instant::now();
        let s = serving(t0);
        assert_eq!(s.next_source(t0), Source::New);
        assert_eq!(s.next_source(t0 + 499 * MS), Source::New);
        assert_eq!(s.next_source(t0 + 500 * MS), Source::Claimed);
    }

    #[test]
    fn claim_every_is_half_the_idle_time_within_bounds() {
        let t0 = Instant::now();
        for (claim_idle_ms, every_ms) in [(1_000, 500), (50, 100), (60_000, 5_000)] {
            let mut s = Schedule::new(t0, claim_idle_ms, 10, false);
            s.pending_read(0);
            s.claimed(0, true, t0);
            let every = every_ms * MS;
            assert_eq!(
                s.next_source(t0 + every - MS),
                Source::New,
                "claim_idle_ms {claim_idle_ms}"
            );
            assert_eq!(
                s.next_source(t0 + every),
                Source::Claimed,
                "claim_idle_ms {claim_idle_ms}"
            );
        }
    }

    #[test]
    fn a_full_claim_page_claims_again_at_once() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        let t1 = t0 + 500 * MS;
        s.claimed(10, true, t1);
        assert_eq!(s.next_source(t1), Source::Claimed);
        s.claimed(9, true, t1);
        assert_eq!(s.next_source(t1), Source::New);
        assert_eq!(s.next_source(t1 + 500 * MS), Source::Claimed);
    }

    #[test]
    fn an_unfinished_sweep_claims_again_at_once_even_from_an_empty_page() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        let t1 = t0 + 500 * MS;
        s.claimed(0, false, t1);
        assert_eq!(s.next_source(t1), Source::Claimed, "the sweep goes on");
        assert_eq!(s.block_for(t1), MS);
        s.claimed(3, true, t1);
        assert_eq!(s.next_source(t1), Source::New, "swept: wait for the next period");
        assert_eq!(s.next_source(t1 + 500 * MS), Source::Claimed);
    }

    #[test]
    fn a_due_retry_wins_over_a_due_claim() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.batch_done(true, Source::New, t0);
        let late = t0 + 2_000 * MS; // both the retry and a claim are due
        assert_eq!(s.next_source(late), Source::OwnPending);
    }

    #[test]
    fn a_batch_that_needs_a_retry_rereads_after_the_backoff() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.batch_done(true, Source::New, t0);
        assert_eq!(s.next_source(t0 + 49 * MS), Source::New);
        assert_eq!(s.next_source(t0 + 50 * MS), Source::OwnPending);
    }

    #[test]
    fn the_retry_backoff_doubles_to_a_second_while_retries_keep_failing() {
        let t0 = Instant::now();
        // Claims every 5 s, out of the way of the retries.
        let mut s = Schedule::new(t0, 60_000, 10, false);
        s.pending_read(0);
        s.claimed(0, true, t0);
        let mut waits = Vec::new();
        let mut now = t0;
        for _ in 0..7 {
            s.batch_done(true, Source::OwnPending, now);
            assert_eq!(s.next_source(now), Source::New);
            let wait = s.block_for(now);
            waits.push(wait.as_millis());
            now += wait;
            assert_eq!(s.next_source(now), Source::OwnPending);
            s.pending_read(1); // the same entry again, and it fails again
        }
        assert_eq!(waits, [50, 100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn draining_own_pending_resets_the_retry_backoff() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.batch_done(true, Source::New, t0);
        s.batch_done(true, Source::New, t0);
        s.batch_done(true, Source::New, t0);
        assert_eq!(s.next_source(t0 + 199 * MS), Source::New, "backoff at 200 ms");
        s.pending_read(0);
        assert_eq!(
            s.next_source(t0 + 10_000 * MS),
            Source::Claimed,
            "no retry once drained"
        );
        s.batch_done(true, Source::New, t0);
        assert_eq!(
            s.next_source(t0 + 50 * MS),
            Source::OwnPending,
            "backoff back at 50 ms"
        );
    }

    #[test]
    fn a_nonempty_pending_page_keeps_the_backoff() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.batch_done(true, Source::New, t0); // 50 ms
        s.pending_read(3);
        s.batch_done(true, Source::OwnPending, t0);
        assert_eq!(s.next_source(t0 + 99 * MS), Source::New, "backoff at 100 ms");
        assert_eq!(s.next_source(t0 + 100 * MS), Source::OwnPending);
    }

    #[test]
    fn a_pending_batch_in_flight_holds_the_retry_until_settled() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.batch_done(true, Source::New, t0);
        let t1 = t0 + 50 * MS;
        assert_eq!(s.next_source(t1), Source::OwnPending);
        s.pending_read(5);
        assert_eq!(s.next_source(t1), Source::New, "not re-read while in flight");
        assert_eq!(s.block_for(t1), 450 * MS, "only the claim bounds the block");
    }

    #[test]
    fn a_settled_pending_page_looks_for_more_at_once() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.pending_read(5);
        let t1 = t0 + 10 * MS;
        s.batch_done(false, Source::OwnPending, t1);
        assert_eq!(s.next_source(t1), Source::OwnPending);
    }

    #[test]
    fn a_settled_batch_of_new_or_claimed_entries_changes_nothing() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.batch_done(false, Source::New, t0);
        s.batch_done(false, Source::Claimed, t0);
        assert_eq!(s.next_source(t0 + 499 * MS), Source::New);
        assert_eq!(s.block_for(t0), 500 * MS);
    }

    #[test]
    fn a_blocking_read_never_sleeps_past_the_next_retry_or_claim() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        assert_eq!(s.block_for(t0), 500 * MS, "until the next claim");
        assert_eq!(s.block_for(t0 + 200 * MS), 300 * MS);
        s.batch_done(true, Source::New, t0);
        assert_eq!(s.block_for(t0), 50 * MS, "until the retry, before the claim");
        s.batch_done(true, Source::New, t0 + 480 * MS);
        assert_eq!(s.block_for(t0), 500 * MS, "until the claim, before the retry");
    }

    #[test]
    fn a_due_wake_still_blocks_one_millisecond() {
        let t0 = Instant::now();
        let s = serving(t0);
        assert_eq!(s.block_for(t0 + 500 * MS), MS);
        assert_eq!(s.block_for(t0 + 900 * MS), MS);
    }

    #[test]
    fn a_failed_read_is_reported_once_and_backs_off() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        let first = s.read_failed(t0);
        assert_eq!(
            first,
            ReadFailed {
                outage_began: true,
                pause: 50 * MS
            }
        );
        assert!(s.is_failing());
        let pauses: Vec<ReadFailed> = (0..6).map(|_| s.read_failed(t0)).collect();
        assert!(pauses.iter().all(|f| !f.outage_began));
        let ms: Vec<u128> = pauses.iter().map(|f| f.pause.as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn after_a_failed_read_own_pending_entries_come_first() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        let t1 = t0 + 800 * MS; // a claim is due as well
        s.read_failed(t1);
        assert_eq!(s.next_source(t1), Source::OwnPending);
    }

    #[test]
    fn a_good_read_ends_the_outage_and_resets_the_read_backoff() {
        let t0 = Instant::now();
        let mut s = serving(t0);
        s.read_failed(t0);
        s.read_failed(t0);
        assert!(s.read_ok());
        assert!(!s.is_failing());
        assert_eq!(s.read_failed(t0).pause, 50 * MS);
    }
}
