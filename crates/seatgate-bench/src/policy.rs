//! `policy`: what the license policies cost the acquire script in Redis
//! time (docs/performance.md, "License policies").
//!
//! Each variant provisions a license of its own, sends pipelined acquires of
//! new sessions (each takes a free seat: the whole decision runs, no queue)
//! for the measured window, and reads the acquire script's own Redis time
//! from `INFO commandstats` (`evalsha`, µs per call) at the window's two
//! ends. The variants differ only in the license's policy fields and in
//! what the acquire carries, so their difference is the policies' cost.

use std::time::Instant;

use super::cost::{cost, Snapshot};
use super::harness::{bench_err, Window, META};
use super::seat::{Seat, Step};
use super::{Bench, Row};
use crate::Error;
use seatgate_core::license::{self, LicenseSpec};
use seatgate_core::policy::{LicensePolicy, RequestPolicy};
use seatgate_core::scripts::Scripts;

/// Acquires per pipeline.
const BATCH: usize = 200;
/// Users and groups the acquires are spread over.
const USERS: usize = 10;
const GROUPS: usize = 4;

/// Every policy set, none of them in the way of the measured acquires: the
/// limits are far above what a run takes, and the two reservations are
/// used up early, so each acquire does every check and takes its seat.
fn every_policy() -> LicensePolicy {
    LicensePolicy {
        max_per_user: Some(1_000_000),
        group_max: (0..GROUPS).map(|g| (format!("g{g}"), 1_000_000)).collect(),
        group_reserve: [("g1".to_owned(), 50), ("g2".to_owned(), 50)].into(),
        max_priority: Some(5),
        linger_ms: Some(60_000),
        max_borrow_ms: Some(86_400_000),
        require_user: None,
        queue_max_per_user: Some(1_000_000),
        queue_max_per_group: Some(1_000_000),
        // Bench sessions are no application's: no allow-list.
        applications: Default::default(),
    }
}

/// Who sends acquire `i`: a user and group of the spread, at priority 3.
fn asker(i: usize) -> RequestPolicy {
    RequestPolicy {
        user: Some(format!("user{}@example.com", i % USERS)),
        group: Some(format!("g{}", i % GROUPS)),
        priority: 3,
        borrow_ms: 0,
    }
}

/// The variants: the license's policy, and whether the acquires say who asks.
const VARIANTS: [(&str, bool, bool); 3] = [
    ("acquire, no policy set", false, false),
    ("acquire, no policy set, user and group sent", false, true),
    (
        "acquire, every policy set, user, group and priority sent",
        true,
        true,
    ),
];

/// `policy`: one row per variant, the acquire script's Redis time in the
/// note beside the first variant's.
pub(super) async fn run(b: &mut Bench<'_>) -> Result<(), Error> {
    Scripts::get().load_all(&mut b.con).await?;
    let mut base_us = None;
    for (n, (variant, with_policy, with_asker)) in VARIANTS.into_iter().enumerate() {
        let license = format!("bench-policy-{n}");
        license::delete(&mut b.con, &b.keys, &license).await?;
        let spec = LicenseSpec {
            seats_total: 1_000_000,
            expires_at_ms: 0,
            active: true,
            heartbeat_timeout_ms: None,
        };
        license::put(&mut b.con, &b.keys, &license, &spec).await?;
        let policy = if with_policy {
            every_policy()
        } else {
            LicensePolicy::default()
        };
        license::put_policy(&mut b.con, &b.keys, &license, &policy).await?;

        let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
        let mut sent = 0usize;
        let mut before = None;
        let mut measured = 0u64;
        while Instant::now() < w.stop_at {
            let measuring = Instant::now() >= w.measure_from;
            if measuring && before.is_none() {
                before = Some(Snapshot::take(&mut b.con).await?);
            }
            let mut pipe = redis::pipe();
            for i in sent..sent + BATCH {
                let who = if with_asker { asker(i) } else { RequestPolicy::NONE };
                let seat = Seat::new(&b.keys, &license, &format!("s{i}"));
                pipe.add_command(seat.cmd(Step::AcquireAs {
                    meta: META,
                    who: &who,
                }));
            }
            let answers: Vec<redis::Value> = pipe.query_async(&mut b.con).await?;
            if answers.len() != BATCH {
                return Err(bench_err(format!(
                    "policy: {} answers for {BATCH} acquires",
                    answers.len()
                )));
            }
            sent += BATCH;
            if measuring {
                measured += BATCH as u64;
            }
        }
        let after = Snapshot::take(&mut b.con).await?;
        let spent = cost(&before.unwrap_or_default(), &after, measured);
        let us = spent
            .as_ref()
            .and_then(|c| c.commands.iter().find(|c| c.command == "fcall"))
            .map(|c| c.usec_per_call);
        let held: u64 = redis::cmd("ZCARD")
            .arg(b.keys.license(&license).holders)
            .query_async(&mut b.con)
            .await?;
        if held != sent as u64 {
            return Err(bench_err(format!(
                "policy: {held} seats held after {sent} acquires"
            )));
        }
        let note = match (us, base_us) {
            (Some(us), None) => format!("acquire script: {us:.1} µs of Redis time per call"),
            (Some(us), Some(base)) => format!(
                "acquire script: {us:.1} µs of Redis time per call, {:+.0}% against no policy",
                (us / base - 1.0) * 100.0
            ),
            (None, _) => "acquire script time not measured".to_owned(),
        };
        base_us = base_us.or(us);
        b.emit(Row {
            scenario: "policy".into(),
            variant: variant.into(),
            ops_per_sec: measured as f64 / b.opts.duration.as_secs_f64(),
            p50_us: None,
            p90_us: None,
            p99_us: None,
            p999_us: None,
            redis: spent,
            note,
        });
        license::delete(&mut b.con, &b.keys, &license).await?;
    }
    Ok(())
}
