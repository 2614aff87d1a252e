//! Latency under load: requests at a fixed rate (open loop, so queueing
//! shows), and many users contending for a few seats through the queue.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::cost::costed;
use super::harness::{bench_err, cycle_call, hist, meta, row, session_of, Fleet, Window};
use super::throughput::{closed_loop, Path};
use super::{Bench, Row};
use crate::Error;
use seatgate::config::Settings;
use seatgate_client::{Call, SeatOp};
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;
use seatgate_core::license::{self, LicenseSpec};
use seatgate_core::status::Status;

/// Clients of the fixed-rate scenario, its maximum included.
const FIXED_CLIENTS: usize = 64;
/// Workers of the fixed-rate scenario, its maximum included.
const FIXED_WORKERS: usize = 2;

/// `fixed-rate`: first this machine's end-to-end maximum at the scenario's
/// own setup (64 clients, 2 workers, closed loop), then 1000/s and 50% and
/// 80% of that maximum, open loop. The maximum is measured here, whatever
/// else ran: an assumed or borrowed one can put "80%" over capacity, where
/// the queue only grows and the latencies say nothing of the service.
pub(super) async fn fixed_rate(b: &mut Bench<'_>) -> Result<(), Error> {
    b.reset().await?;
    let fleet = Fleet::start(&b.settings, FIXED_WORKERS).await?;
    let w = Window::new(
        Instant::now(),
        b.opts.warmup.min(MAX_PROBE_WARMUP),
        b.opts.duration.min(MAX_PROBE),
    );
    let max = costed(
        &b.settings,
        w,
        closed_loop(&b.settings, FIXED_CLIENTS, w, Path::Seatgate),
    )
    .await;
    fleet.stop().await;
    let mut max = max?;
    max.scenario = "fixed-rate".into();
    max.variant = "max".into();
    max.note = format!(
        "closed loop, clients={FIXED_CLIENTS} workers={FIXED_WORKERS}: the rate the percentages are of"
    );
    let top = max.ops_per_sec;
    b.emit(max);
    if top <= 0.0 {
        return Err(bench_err("fixed-rate: the closed-loop maximum measured 0/s"));
    }
    for (label, rate) in [
        ("1000/s", 1000.0),
        ("50% of max", 0.5 * top),
        ("80% of max", 0.8 * top),
    ] {
        b.reset().await?;
        let fleet = Fleet::start(&b.settings, FIXED_WORKERS).await?;
        let start = Instant::now() + SCHEDULE_LEAD;
        let w = Window::new(start, b.opts.warmup, b.opts.duration);
        let r = costed(&b.settings, w, open_loop(&b.settings, rate, start, w, label)).await;
        fleet.stop().await;
        let mut r = r?;
        r.note = format!("target {rate:.0}/s of max {top:.0}/s; {}", r.note);
        b.emit(r);
    }
    Ok(())
}

/// Longest measurement of the fixed-rate maximum: a short run is enough
/// for a closed-loop rate, and the open-loop runs are what the scenario is for.
const MAX_PROBE: Duration = Duration::from_secs(2);
/// Longest warm-up of the fixed-rate maximum.
const MAX_PROBE_WARMUP: Duration = Duration::from_secs(1);
/// Time for the open loop's clients to connect before the first scheduled send.
const SCHEDULE_LEAD: Duration = Duration::from_millis(200);

/// `contention`: queueing for a seat, on 2 workers.
pub(super) async fn contention(b: &mut Bench<'_>) -> Result<(), Error> {
    b.reset().await?;
    let fleet = Fleet::start(&b.settings, 2).await?;
    let r = contention_run(&b.settings, &mut b.con, &b.keys, b.opts.warmup, b.opts.duration).await?;
    fleet.stop().await;
    b.emit(r);
    Ok(())
}

/// Open loop: 64 users send requests on a fixed schedule, `rate`/s in all,
/// from `start` (the warm-up of `w` starts there), through one multiplexed
/// [`Client`] (one connection, one reply stream), as the users of one
/// service process would and as the closed-loop maximum is measured: a
/// client per user would cost Redis a reader per user (~30 µs a request
/// more) and put "80%" over the capacity of that setup. Latency counts from
/// the scheduled time, so queueing shows.
async fn open_loop(
    settings: &Settings,
    rate: f64,
    start: Instant,
    w: Window,
    label: &str,
) -> Result<Row, Error> {
    const USERS: usize = FIXED_CLIENTS;
    let (measure_from, stop_at) = (w.measure_from, w.stop_at);
    let interval = Duration::from_secs_f64(USERS as f64 / rate.max(1.0));
    let shared = Arc::new(Mutex::new(hist()));
    let one_client = settings.client().connect().await?;
    let mut tasks = Vec::new();
    for c in 0..USERS {
        let shared = shared.clone();
        let client = one_client.clone();
        tasks.push(tokio::spawn(async move {
            let (license, session) = session_of(c);
            let mut h = hist();
            let mut ops = 0u64;
            let mut due = start + interval.mul_f64(c as f64 / USERS as f64);
            let mut acquire = true;
            while due < stop_at {
                // Late because the previous request was slow: that delay is the
                // system's and counts (no coordinated omission). Late only
                // because the timer woke us late (tokio's timer has 1 ms
                // granularity): that is the load generator's error, not counted.
                let busy_past_due = Instant::now() > due;
                tokio::time::sleep_until(due.into()).await;
                let start = if busy_past_due { due } else { Instant::now() };
                client
                    .call(&cycle_call(acquire, &license, &session), Duration::from_secs(10))
                    .await?;
                if due >= measure_from {
                    let _ = h.record(start.elapsed().as_micros() as u64);
                    ops += 1;
                }
                acquire = !acquire;
                due += interval;
            }
            if !acquire {
                // Leave nothing held for the next row (see closed_loop).
                client
                    .call(&cycle_call(false, &license, &session), Duration::from_secs(10))
                    .await?;
            }
            shared.lock().await.add(&h).map_err(bench_err)?;
            Ok::<u64, Error>(ops)
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.map_err(bench_err)??;
    }
    let _ = one_client.close().await;
    let h = shared.lock().await;
    Ok(row(
        "fixed-rate",
        label.into(),
        ops,
        w.length(),
        Some(&h),
        "open loop, 64 users on one multiplexed client, latency from the scheduled send time (timer lateness of an idle user excluded)".into(),
    ))
}

/// How long a user of the contention row holds its seat.
const HOLD: Duration = Duration::from_millis(2);

/// Holds the seat [`HOLD`], as precisely as the OS sleeps a thread: tokio's
/// timer has 1 ms granularity, and its 2 ms sleep lasted 2.71 ms on
/// average in this row (3.1 ms on an idle machine), which made the row
/// measure the timer as much as the hand-over.
async fn hold_seat() {
    let _ = tokio::task::spawn_blocking(|| std::thread::sleep(HOLD)).await;
}

/// One license, 10 seats, 120 users who queue, hold a seat 2 ms and release.
async fn contention_run(
    settings: &Settings,
    con: &mut Db,
    keys: &Keys,
    warmup: Duration,
    d: Duration,
) -> Result<Row, Error> {
    const USERS: usize = 120;
    const SEATS: u64 = 10;
    let spec = LicenseSpec {
        seats_total: SEATS,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms: None,
    };
    license::put(con, keys, "contended", &spec).await?;
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + d;
    let shared = Arc::new(Mutex::new(hist()));
    let mut tasks = Vec::new();
    for u in 0..USERS {
        let settings = settings.clone();
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let client = settings.client().connect().await?;
            let session = format!("user-{u}");
            let mut h = hist();
            let (mut grants, mut queued) = (0u64, 0u64);
            let mut held = Duration::ZERO;
            while Instant::now() < stop_at {
                let asked = Instant::now();
                let call = Call::acquire("contended", session.as_str())
                    .with_meta(meta())
                    .with_wait(Duration::from_secs(30));
                let id = client.send(&call).await?;
                let mut r = client.wait_for(&id, Duration::from_secs(30)).await?;
                if r.status() == Status::Queued {
                    queued += 1;
                    r = client.wait_for(&id, Duration::from_secs(35)).await?;
                }
                if !r.ok() {
                    return Err(bench_err(format!("contention: unexpected {}", r.status())));
                }
                let granted = Instant::now();
                hold_seat().await;
                if asked >= measure_from {
                    let _ = h.record((granted - asked).as_micros() as u64);
                    grants += 1;
                    held += granted.elapsed();
                }
                let release = Call {
                    op: SeatOp::Release,
                    meta: None,
                    wait_ms: 0,
                    ..call
                };
                client.call(&release, Duration::from_secs(10)).await?;
            }
            let _ = client.close().await;
            shared.lock().await.add(&h).map_err(bench_err)?;
            Ok::<(u64, u64, Duration), Error>((grants, queued, held))
        }));
    }
    let (mut grants, mut queued, mut held) = (0, 0, Duration::ZERO);
    for t in tasks {
        let (g, q, h) = t.await.map_err(bench_err)??;
        grants += g;
        queued += q;
        held += h;
    }
    // The hold as it was, and the rest of a seat's cycle: with every seat
    // wanted all the time, a seat changes hands every seats / (grants/s),
    // its hold and then the hand-over (the release's way to the worker, its
    // script, the grant's way to the waiter), the part seatgate decides.
    let mean_hold_ms = held.as_secs_f64() * 1e3 / grants.max(1) as f64;
    let cycle_ms = SEATS as f64 * d.as_secs_f64() * 1e3 / grants.max(1) as f64;
    let hand_over_ms = cycle_ms - mean_hold_ms;
    let h = shared.lock().await;
    Ok(row(
        "contention",
        format!("1 license, {SEATS} seats, {USERS} users"),
        grants,
        d,
        Some(&h),
        format!("seats granted/s; latency = wait for a seat; {queued} waits were queued; a hold lasted {mean_hold_ms:.2} ms on average, the hand-over after it {hand_over_ms:.2} ms"),
    ))
}
