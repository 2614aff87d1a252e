//! Rate limits for log lines that a client can repeat at will (a dead
//! letter, an invalid request): at most `log.repeats_per_minute` lines of
//! one kind per minute, then one "suppressed N similar" line when the next
//! minute's first line of that kind goes out. Every occurrence is still
//! counted in its metric; only the log lines are held back, so a flood of
//! bad requests cannot fill a disk or a log shipper's quota.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::runtime::metrics;

/// What to do with one line of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it. `suppressed` lines of its kind were held back in the window
    /// before: say so in one line first.
    Log {
        /// Lines of this kind held back since the last one logged.
        suppressed: u64,
    },
    /// Hold it back (counted, reported with the next line logged).
    Suppress,
}

/// The window of one kind.
#[derive(Debug)]
struct Window {
    /// When the window began (its first line).
    started: Instant,
    /// Lines logged in it.
    logged: u32,
    /// Lines held back in it (and not yet reported).
    suppressed: u64,
}

/// Per-kind line budget over fixed windows, shared by a process's tasks.
#[derive(Debug)]
pub struct LogLimit {
    /// Most lines of one kind per window; 0 = no limit.
    per_window: u32,
    /// The window's length.
    window: Duration,
    /// Windows by kind; the kinds are a closed set of `&'static str`, so
    /// the map stays small.
    kinds: Mutex<HashMap<&'static str, Window>>,
}

impl LogLimit {
    /// At most `per_minute` lines of each kind a minute (0 = every line).
    pub fn per_minute(per_minute: u32) -> LogLimit {
        LogLimit::new(per_minute, Duration::from_secs(60))
    }

    /// At most `per_window` lines of each kind per `window`.
    pub fn new(per_window: u32, window: Duration) -> LogLimit {
        LogLimit {
            per_window,
            window,
            kinds: Mutex::default(),
        }
    }

    /// One line of `kind` at `now`.
    pub fn check(&self, kind: &'static str, now: Instant) -> Verdict {
        if self.per_window == 0 {
            return Verdict::Log { suppressed: 0 };
        }
        // A poisoned lock (a panic elsewhere while holding it) lets lines through.
        let Ok(mut kinds) = self.kinds.lock() else {
            return Verdict::Log { suppressed: 0 };
        };
        let w = kinds.entry(kind).or_insert(Window {
            started: now,
            logged: 0,
            suppressed: 0,
        });
        let mut suppressed = 0;
        if now.saturating_duration_since(w.started) >= self.window {
            suppressed = std::mem::take(&mut w.suppressed);
            w.started = now;
            w.logged = 0;
        }
        if w.logged < self.per_window {
            w.logged += 1;
            // Held back in an earlier window, but not yet reported: report now.
            suppressed += std::mem::take(&mut w.suppressed);
            Verdict::Log { suppressed }
        } else {
            w.suppressed += 1;
            metrics::log_suppressed(kind);
            Verdict::Suppress
        }
    }
}

/// Logs `$($line)*` at `$level` through `$limit` under `$kind`, preceded by
/// one "suppressed N similar" line at the same level when lines of the kind
/// were held back before it.
#[macro_export]
#[doc(hidden)]
macro_rules! limited {
    ($limit:expr, $kind:expr, $level:ident!($($line:tt)*)) => {
        match $limit.check($kind, std::time::Instant::now()) {
            $crate::runtime::log_limit::Verdict::Log { suppressed } => {
                if suppressed > 0 {
                    tracing::$level!(kind = $kind, suppressed, "suppressed {suppressed} similar log lines (log.repeats_per_minute)");
                }
                tracing::$level!($($line)*);
            }
            $crate::runtime::log_limit::Verdict::Suppress => {}
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_minute_lets_one_through_and_counts_the_rest() {
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let limit = LogLimit::per_minute(1);
        let log = |suppressed| Verdict::Log { suppressed };
        assert_eq!(
            limit.check("future_entry_id", t0),
            log(0),
            "the first line goes through"
        );
        assert_eq!(
            limit.check("future_entry_id", t0 + Duration::from_secs(1)),
            Verdict::Suppress
        );
        assert_eq!(
            limit.check("future_entry_id", t0 + Duration::from_secs(59)),
            Verdict::Suppress
        );
        assert_eq!(
            limit.check("future_entry_id", t0 + minute),
            log(2),
            "a minute later, with the two held back"
        );
        assert_eq!(limit.check("future_entry_id", t0 + minute), Verdict::Suppress);
        assert_eq!(limit.check("future_entry_id", t0 + 3 * minute), log(1));
    }

    #[test]
    fn n_lines_per_window_per_kind_then_the_count_of_those_held_back() {
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let limit = LogLimit::new(3, minute);
        let log = |suppressed| Verdict::Log { suppressed };
        for _ in 0..3 {
            assert_eq!(limit.check("dead_letter", t0), log(0));
        }
        for i in 0..100 {
            assert_eq!(
                limit.check("dead_letter", t0 + Duration::from_millis(i)),
                Verdict::Suppress
            );
        }
        // Another kind has a budget of its own.
        assert_eq!(limit.check("invalid", t0), log(0));
        // The next window's first line reports the 100 held back, once.
        assert_eq!(limit.check("dead_letter", t0 + minute), log(100));
        assert_eq!(limit.check("dead_letter", t0 + minute), log(0));
        assert_eq!(limit.check("dead_letter", t0 + minute), log(0));
        assert_eq!(limit.check("dead_letter", t0 + minute), Verdict::Suppress);
        // A quiet window in between: the one held back is still reported.
        assert_eq!(limit.check("dead_letter", t0 + 5 * minute), log(1));
    }

    #[test]
    fn zero_means_no_limit() {
        let limit = LogLimit::per_minute(0);
        let t0 = Instant::now();
        for _ in 0..1000 {
            assert_eq!(limit.check("k", t0), Verdict::Log { suppressed: 0 });
        }
    }
}
