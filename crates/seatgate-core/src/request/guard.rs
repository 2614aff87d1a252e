//! The guard every seat request is decided under: where its reply is kept
//! for redelivery dedupe, when it expires (`ttl_ms`), and the rate limits
//! it counts against. Built from the request (`Request::guard`) and handed
//! to its script call (`KEYS[3..4]`, `ARGV[1..3]`, `ARGV[6]`, part of
//! `ARGV[7]`; lua/includes/request.lua decides with it).

/// Redelivery dedupe, expiry and rate limiting for one request:
/// `KEYS[3..4]`, `ARGV[1..3]`, `ARGV[6]` and part of `ARGV[7]` of the request scripts
/// (lua/includes/request.lua; revoke reads the dedupe and expiry parts only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// `ARGV[1]`: the request's key, the field of its dedupe record ("" = no
    /// dedupe, for direct calls): the stream entry id, with its stream's tag
    /// ([`Guard::for_entry`] and `request`), or the caller's request id
    /// ([`Guard::for_request`]).
    pub entry_id: String,
    /// `KEYS[3]`: the dedupe bucket the entry's reply is stored in.
    pub done_key: String,
    /// `KEYS[4]`: the bucket before it, where an earlier delivery may have
    /// stored the reply when the entry's placement moves with the clock
    /// ([`Guard::for_entry_at`]); `done_key` again when it cannot have.
    pub done_before_key: String,
    /// When the bucket may expire, unix ms (the script caps it at its own
    /// clock plus two windows).
    pub done_until_ms: u64,
    /// The dedupe window, ms: the cap above.
    pub dedupe_window_ms: u64,
    /// Most requests per session per window (0 = no limit).
    pub session_limit: u64,
    /// Most requests per license per window (0 = no limit).
    pub license_limit: u64,
    /// The rate window, ms.
    pub window_ms: u64,
    /// What the request's application may use of the license (when the
    /// session is an application's, crate::tenancy).
    pub application: ApplicationLimits,
    /// The entry is a redelivery: look up the reply it may have got before.
    pub redelivery: bool,
    /// The key is the caller's request id ([`Guard::for_request`]): the
    /// script prefixes the lease hash to it, and always looks in both buckets.
    pub by_request: bool,
    /// `ARGV[6]`: the Redis time (unix ms) after which the request is no
    /// longer decided but answered REQUEST_EXPIRED ([`deadline`]); 0 = none.
    pub deadline_ms: u64,
}

/// How requests are guarded: the dedupe window and the rate limits, as the
/// settings (`dedupe`, `limits`) give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardPolicy {
    /// Guaranteed redelivery dedupe window, ms.
    pub dedupe_window_ms: u64,
    /// Most requests per session per rate window (0 = no limit).
    pub session_limit: u64,
    /// Most requests per license per rate window (0 = no limit).
    pub license_limit: u64,
    /// The rate window, ms.
    pub rate_window_ms: u64,
    /// What one application may use of one license.
    pub application: ApplicationLimits,
}

/// What one application may use of one license (`[tenancy]`): the limits
/// the scripts apply to a session that is an application's
/// (`<application>/<session>`, crate::tenancy), counted per application by
/// that prefix (lua/includes/owners.lua, rate_limit.lua). 0 = no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplicationLimits {
    /// Requests per rate window.
    pub requests: u64,
    /// Seats held.
    pub sessions: u64,
    /// Sessions waiting.
    pub waiters: u64,
}

/// Where the reply of an entry added at `added_ms` is stored, `window` ms
/// buckets, when the Redis clock reads `now_ms` (if known): the bucket to
/// write and look in, and the one before it to look in too (the same bucket
/// when no earlier delivery can have written elsewhere).
///
/// The entry's time is capped at one window ahead of the clock: an entry
/// whose id lies further ahead (a caller chose it, or the stream's last id is
/// stuck in the future so that every later `XADD *` reuses its millisecond)
/// is placed in the bucket one window ahead of the clock instead, so no
/// bucket keeps growing while the ids stay stuck. The capped time only grows
/// with the clock, and by at most a window within one, so a delivery within a
/// window of an earlier one finds its reply in its own bucket or the one
/// before. An entry that is not ahead of the clock is placed by its own time,
/// the same for every delivery, and looks in one bucket only.
fn placement(added_ms: u64, window: u64, now_ms: Option<u64>) -> (u64, u64) {
    let window = window.max(1);
    match now_ms {
        Some(now) if added_ms > now => {
            let capped = added_ms.min(now.saturating_add(window));
            let bucket = capped / window;
            (bucket, bucket.saturating_sub(1))
        }
        _ => (added_ms / window, added_ms / window),
    }
}

/// The milliseconds part of stream entry id `entry_id` (0 when it has none).
fn entry_ms(entry_id: &str) -> u64 {
    entry_id
        .split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

/// The deadline (`ARGV[6]`) of a request read from stream entry `entry_id`
/// with `ttl_ms` (0 = no deadline: 0), `window` the dedupe window, when the
/// Redis clock reads about `redis_now_ms` (if known).
///
/// The entry id is the Redis clock at its XADD, so no client clock is
/// trusted and an entry delivered again (redelivered, claimed from a dead
/// worker) keeps its deadline. An id further ahead of the clock than a
/// window (a caller chose it) counts as added one window ahead of the clock,
/// as its dedupe placement does (`placement`): a chosen id buys no more
/// than that.
pub fn deadline(entry_id: &str, ttl_ms: u64, window: u64, redis_now_ms: Option<u64>) -> u64 {
    if ttl_ms == 0 {
        return 0;
    }
    let added = entry_ms(entry_id);
    let from = match redis_now_ms {
        Some(now) => added.min(now.saturating_add(window)),
        None => added,
    };
    from.saturating_add(ttl_ms)
}

impl Guard {
    /// The guard of stream entry `entry_id` under `policy`, the Redis clock
    /// unknown: the dedupe bucket comes from the entry id's time (the Redis
    /// clock at XADD), so every delivery of the entry looks in the same key;
    /// it lives until two windows after the bucket starts, so the guaranteed
    /// window is one. See [`Guard::for_entry_at`] for ids ahead of the clock.
    pub fn for_entry(
        policy: &GuardPolicy,
        keys: &crate::keys::Keys,
        entry_id: &str,
        license: &str,
        session: &str,
    ) -> Guard {
        Guard::for_entry_at(policy, keys, entry_id, license, session, None)
    }

    /// [`Guard::for_entry`] with the Redis clock known to read about
    /// `redis_now_ms`: an entry id far ahead of it (chosen by a caller) is
    /// placed by the clock instead (`placement`), so nothing derived from
    /// the id lives far beyond the dedupe window. (`_session` is no longer
    /// bound: the script derives the session's rate key itself.)
    pub fn for_entry_at(
        policy: &GuardPolicy,
        keys: &crate::keys::Keys,
        entry_id: &str,
        license: &str,
        _session: &str,
        redis_now_ms: Option<u64>,
    ) -> Guard {
        let window = policy.dedupe_window_ms.max(1);
        let (bucket, before) = placement(entry_ms(entry_id), window, redis_now_ms);
        Guard {
            entry_id: entry_id.to_owned(),
            done_key: keys.dedupe(license, bucket),
            done_before_key: keys.dedupe(license, before),
            done_until_ms: bucket.saturating_add(2).saturating_mul(window),
            dedupe_window_ms: window,
            session_limit: policy.session_limit,
            license_limit: policy.license_limit,
            window_ms: policy.rate_window_ms,
            application: policy.application,
            redelivery: false,
            by_request: false,
            deadline_ms: 0,
        }
    }

    /// The guard of a request the caller gave an id, keyed by `key`
    /// (`<op>|<session>|<id>`, `request`; the script prefixes the lease
    /// hash) and read from stream entry `entry_id`.
    ///
    /// Its record is placed by the Redis clock (`redis_now_ms`), not by the
    /// entry: the same request may arrive as two entries (an XADD whose
    /// acknowledgement was lost, sent again), and whichever is decided
    /// second, within a window of the first, must find the first's answer.
    /// A decision a window later falls in the next bucket at most, and the
    /// script always looks in the bucket before too. While the clock is not
    /// known (a direct call), the entry's time stands in for it; the script
    /// caps the bucket's expiry by its own clock either way.
    pub fn for_request(
        policy: &GuardPolicy,
        keys: &crate::keys::Keys,
        key: &str,
        entry_id: &str,
        license: &str,
        session: &str,
        redis_now_ms: Option<u64>,
    ) -> Guard {
        let window = policy.dedupe_window_ms.max(1);
        let bucket = redis_now_ms.unwrap_or_else(|| entry_ms(entry_id)) / window;
        let mut guard = Guard::for_entry_at(policy, keys, entry_id, license, session, redis_now_ms);
        guard.entry_id = key.to_owned();
        guard.done_key = keys.dedupe(license, bucket);
        guard.done_before_key = keys.dedupe(license, bucket.saturating_sub(1));
        guard.done_until_ms = bucket.saturating_add(2).saturating_mul(window);
        guard.by_request = true;
        guard
    }

    /// No dedupe and no limits: the seed's direct script path.
    /// (`_session` as in [`Guard::for_entry_at`].)
    pub fn none(keys: &crate::keys::Keys, license: &str, _session: &str) -> Guard {
        let done_key = keys.dedupe(license, 0);
        Guard {
            entry_id: String::new(),
            done_before_key: done_key.clone(),
            done_key,
            done_until_ms: 0,
            dedupe_window_ms: 1,
            session_limit: 0,
            license_limit: 0,
            window_ms: 1,
            application: ApplicationLimits::default(),
            redelivery: false,
            by_request: false,
            deadline_ms: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_ahead_of_the_clock_are_placed_by_the_clock() {
        const W: u64 = 60_000;
        // Not ahead, or the clock unknown: by the id, one bucket.
        assert_eq!(placement(5 * W + 7, W, Some(9 * W)), (5, 5));
        assert_eq!(placement(5 * W + 7, W, None), (5, 5));
        assert_eq!(placement(u64::MAX, W, None), (u64::MAX / W, u64::MAX / W));
        // A little ahead: still by the id, and the bucket before may hold a
        // delivery made while it was further ahead.
        assert_eq!(placement(5 * W + 7, W, Some(5 * W)), (5, 4));
        // Far ahead: one window ahead of the clock, whatever the id says.
        let now = 1_796_013_949_007;
        let (bucket, before) = placement(9_999_999_999_999, W, Some(now));
        assert_eq!((bucket, before), ((now + W) / W, (now + W) / W - 1));
        assert_eq!(placement(u64::MAX, W, Some(u64::MAX - 1)).0, u64::MAX / W);
        // A delivery within a window of another finds its bucket.
        for delay in [0, 1, W / 2, W - 1, W] {
            let first = placement(9_999_999_999_999, W, Some(now)).0;
            let (b, before) = placement(9_999_999_999_999, W, Some(now + delay));
            assert!(first == b || first == before, "{delay}");
        }
    }

    #[test]
    fn a_guard_never_keeps_a_bucket_past_two_windows_of_the_clock() {
        let policy = GuardPolicy {
            dedupe_window_ms: 60_000,
            session_limit: 0,
            license_limit: 0,
            rate_window_ms: 1,
            application: ApplicationLimits::default(),
        };
        let keys = crate::keys::Keys::new("seat");
        let now = 1_796_013_949_007;
        let g = Guard::for_entry_at(&policy, &keys, "9999999999999-0", "l", "s", Some(now));
        assert!(g.done_until_ms <= now + 3 * 60_000, "{}", g.done_until_ms);
        assert_ne!(g.done_key, g.done_before_key);
        let normal = Guard::for_entry_at(&policy, &keys, &format!("{}-0", now - 5), "l", "s", Some(now));
        assert_eq!(normal.done_key, normal.done_before_key);
        // An id no u64 holds counts as 0, as before.
        let odd = Guard::for_entry(&policy, &keys, "99999999999999999999999-0", "l", "s");
        assert_eq!(odd.done_key, keys.dedupe("l", 0));
    }

    #[test]
    fn a_deadline_counts_from_the_entry_and_a_chosen_id_buys_at_most_a_window() {
        const W: u64 = 60_000;
        let now = 1_796_013_949_007;
        assert_eq!(
            deadline("1796013949000-0", 0, W, Some(now)),
            0,
            "no ttl, no deadline"
        );
        // A redelivery, a claim: whenever it is read, the entry's own time counts.
        assert_eq!(
            deadline("1796013949000-0", 5_000, W, Some(now)),
            1_796_013_954_000
        );
        assert_eq!(
            deadline("1796013949000-0", 5_000, W, Some(now + 3_600_000)),
            1_796_013_954_000
        );
        assert_eq!(deadline("1796013949000-0", 5_000, W, None), 1_796_013_954_000);
        // Far ahead of the clock: as if added a window ahead of it.
        assert_eq!(deadline("9999999999999-0", 5_000, W, Some(now)), now + W + 5_000);
        assert_eq!(deadline("18446744073709551615-0", 5_000, W, None), u64::MAX);
    }

    #[test]
    fn a_request_keyed_by_its_id_is_placed_by_the_clock() {
        let policy = GuardPolicy {
            dedupe_window_ms: 60_000,
            session_limit: 0,
            license_limit: 0,
            rate_window_ms: 1,
            application: ApplicationLimits::default(),
        };
        let keys = crate::keys::Keys::new("seat");
        let now = 1_796_013_949_007;
        // Two entries of one request, decided within a window of each other,
        // whichever first: the later decision looks where the earlier wrote.
        for (first, second) in [(now, now + 59_999), (now + 59_999, now + 60_000)] {
            let a = Guard::for_request(&policy, &keys, "A|s|r", "1796013940000-0", "l", "s", Some(first));
            let b = Guard::for_request(&policy, &keys, "A|s|r", "1796013990000-0", "l", "s", Some(second));
            assert!(b.done_key == a.done_key || b.done_before_key == a.done_key);
            assert!(a.by_request && a.done_key != a.done_before_key);
            assert!(a.done_until_ms >= first + 60_000);
        }
        // The clock unknown: the entry's time.
        let blind = Guard::for_request(&policy, &keys, "A|s|r", "1796013940000-0", "l", "s", None);
        assert_eq!(blind.done_key, keys.dedupe("l", 1_796_013_940_000 / 60_000));
    }
}
