//! A fault hook for tests: with the `tools` feature, `SEATGATE_FAULT=<point>[:<n>]`
//! (read once, when the first point is passed) makes the process abort the
//! n-th time (default the first) a worker passes `<point>` of a batch's
//! handling, as a `kill -9` there would: nothing after it runs, nothing is
//! flushed. tests/it/events_once.rs kills workers at every point and checks
//! that each seat change still has exactly one event. Without the feature,
//! or without the variable, passing a point costs nothing.

use strum::{EnumString, IntoStaticStr, VariantArray};

/// Where in a batch's handling the process may be made to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Point {
    /// The batch was read (its entries pending with this consumer), nothing decided.
    AfterRead,
    /// The batch's seat scripts ran (their events recorded), nothing relayed or answered.
    AfterScript,
    /// On a cluster, the batch's licenses' events were relayed to the shards; nothing answered.
    AfterRelay,
    /// The replies were written; queue notes not yet delivered, nothing acknowledged.
    AfterReply,
    /// Everything answered and delivered; the XACK not yet sent.
    BeforeAck,
}

impl Point {
    /// Every point, for tests.
    pub const ALL: &'static [Point] = <Point as VariantArray>::VARIANTS;

    /// The name `SEATGATE_FAULT` gives it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The process passes `point`: with the `tools` feature and
/// `SEATGATE_FAULT` naming it, the n-th time aborts the process.
#[inline]
pub fn pass(point: Point) {
    #[cfg(feature = "fault-injection")]
    armed::pass(point);
    #[cfg(not(feature = "fault-injection"))]
    let _ = point;
}

#[cfg(feature = "fault-injection")]
mod armed {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::LazyLock;

    use super::Point;

    /// The armed point and at which pass it fires, from `SEATGATE_FAULT`.
    static FAULT: LazyLock<Option<(Point, u64)>> = LazyLock::new(|| {
        let spec = std::env::var("SEATGATE_FAULT").ok()?;
        parse(&spec)
    });

    /// Passes of the armed point so far.
    static PASSED: AtomicU64 = AtomicU64::new(0);

    /// `<point>[:<n>]`; `None` when it names no point or n is not a number above 0.
    pub(super) fn parse(spec: &str) -> Option<(Point, u64)> {
        let (name, n) = match spec.split_once(':') {
            Some((name, n)) => (name, n.parse().ok().filter(|n| *n > 0)?),
            None => (spec, 1),
        };
        Some((name.parse().ok()?, n))
    }

    pub(super) fn pass(point: Point) {
        let Some((armed, n)) = *FAULT else { return };
        if armed == point && PASSED.fetch_add(1, Ordering::SeqCst) + 1 == n {
            eprintln!("seatgate: SEATGATE_FAULT: aborting at {}", point.as_str());
            std::process::abort();
        }
    }
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;

    #[test]
    fn a_fault_names_a_point_and_which_pass() {
        assert_eq!(armed::parse("after_script"), Some((Point::AfterScript, 1)));
        assert_eq!(armed::parse("before_ack:3"), Some((Point::BeforeAck, 3)));
        for bad in ["", "after_script:0", "after_script:x", "nowhere", "after_relay:"] {
            assert_eq!(armed::parse(bad), None, "{bad}");
        }
        for &point in Point::ALL {
            assert_eq!(armed::parse(point.as_str()), Some((point, 1)));
        }
    }
}
