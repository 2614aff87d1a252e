//! The soak scenario: a steady mixed workload under the real maintenance
//! for a long time (30 min by default), Redis memory sampled every minute.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::harness::{bench_err, meta, used_memory, wipe, Fleet};
use super::{Bench, Row};
use crate::Error;
use seatgate::config::{LimitSettings, Settings};
use seatgate::runtime::reaper::Reaper;
use seatgate_client::{Call, SeatOp};
use seatgate_core::db::Db;
use seatgate_core::license::{self, LicenseSpec};

/// `soak`: the minute rows go to stderr as they come, the report gets them
/// all at the end, with the spread after the warm-up.
pub(super) async fn run(b: &mut Bench<'_>) -> Result<(), Error> {
    let limits = b.loaded_limits.clone();
    for r in soak_run(&b.settings, &mut b.con, b.opts.soak, limits).await? {
        b.emit(r);
    }
    Ok(())
}

/// A minute's row on stderr while the soak runs.
fn progress_line(r: &Row) {
    eprintln!("  {:<11} {:<56} {}", r.scenario, r.variant, r.note);
}

/// A steady mixed workload under the real maintenance (reaper, stream
/// trimming, expiring reply streams and dedupe records) for `duration`,
/// sampling Redis memory every minute: it must stay flat.
///
/// 24 users cycle through sessions: acquire, two heartbeats, release; one
/// session in ten is abandoned (never released, reaped after the license's
/// 10 s heartbeat timeout); each session uses a fresh reply stream, like a
/// CLI invocation, deleted when done or, when abandoned, left to expire.
async fn soak_run(
    settings: &Settings,
    con: &mut Db,
    duration: Duration,
    limits: LimitSettings,
) -> Result<Vec<Row>, Error> {
    const USERS: usize = 24;
    wipe(con).await?;
    let keys = settings.seat_keys();
    for l in 0..20 {
        let spec = LicenseSpec {
            seats_total: 50,
            expires_at_ms: 0,
            active: true,
            heartbeat_timeout_ms: Some(10_000),
        };
        license::put(con, &keys, &format!("soak-{l}"), &spec).await?;
    }
    let mut s = settings.clone();
    s.limits = limits;
    s.reaper.schedule = "*/2 * * * * *".into();
    // Events are kept by age: with the default 30 days they would grow all
    // through the soak. Five minutes, like the reply streams, lets the run
    // show the steady state of trimming by age.
    s.events.retention = Duration::from_secs(300);
    let fleet = Fleet::start(&s, 2).await?;
    let reaper = Reaper::new(con.clone(), &s);
    let mut scheduler =
        seatgate::runtime::reaper::start(reaper.clone(), &s.reaper.schedule, s.reaper.lock_ms).await?;

    let stop = CancellationToken::new();
    let ops = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for u in 0..USERS {
        let settings = settings.clone();
        let stop = stop.clone();
        let ops = ops.clone();
        tasks.push(tokio::spawn(async move {
            let mut cycle = 0u64;
            while !stop.is_cancelled() {
                let license = format!("soak-{}", (u + cycle as usize) % 20);
                let session = format!("u{u}-s{cycle}");
                let client = settings.client().connect().await?;
                let mut call = Call::acquire(license, session).with_meta(meta());
                let got = client.call(&call, Duration::from_secs(10)).await?;
                ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let abandon = cycle % 10 == 9;
                if got.ok() {
                    call.meta = None;
                    for _ in 0..2 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        call.op = SeatOp::Heartbeat;
                        client.call(&call, Duration::from_secs(10)).await?;
                        ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if !abandon {
                        call.op = SeatOp::Release;
                        client.call(&call, Duration::from_secs(10)).await?;
                        ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                if !abandon {
                    let _ = client.close().await;
                }
                cycle += 1;
            }
            Ok::<(), Error>(())
        }));
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut samples = Vec::new();
    let mut last_ops = 0;
    let mut minute = 0;
    while started.elapsed() < duration {
        let next = started + Duration::from_secs(60 * (minute + 1));
        tokio::time::sleep_until(next.min(started + duration).into()).await;
        minute += 1;
        let mem = used_memory(con).await?;
        let dbsize: i64 = redis::cmd("DBSIZE").query_async(con).await?;
        let requests: i64 = redis::cmd("XLEN")
            .arg(&s.stream.requests)
            .query_async(con)
            .await?;
        let total = ops.load(std::sync::atomic::Ordering::Relaxed);
        let rate = (total - last_ops) as f64 / 60.0;
        last_ops = total;
        samples.push(mem);
        let r = Row {
            scenario: "soak".into(),
            variant: format!("minute {minute}"),
            ops_per_sec: rate,
            p50_us: None,
            p90_us: None,
            p99_us: None,
            p999_us: None,
            redis: None,
            note: format!(
                "used_memory {:.2} MB, {dbsize} keys, requests stream {requests} entries",
                mem as f64 / 1e6
            ),
        };
        progress_line(&r);
        rows.push(r);
    }
    stop.cancel();
    for t in tasks {
        t.await.map_err(bench_err)??;
    }
    let _ = scheduler.shutdown().await;
    fleet.stop().await;
    // Flatness after the warm-up (reply streams live 5 min, dedupe records 1-2 min).
    let steady: Vec<i64> = samples.iter().skip(6).copied().collect();
    if let (Some(min), Some(max)) = (steady.iter().min(), steady.iter().max()) {
        rows.push(Row {
            scenario: "soak".into(),
            variant: format!("minutes 7-{minute}"),
            ops_per_sec: ops.load(std::sync::atomic::Ordering::Relaxed) as f64
                / started.elapsed().as_secs_f64(),
            p50_us: None,
            p90_us: None,
            p99_us: None,
            p999_us: None,
            redis: None,
            note: format!(
                "used_memory {:.2}-{:.2} MB (spread {:.2} MB) after warm-up",
                *min as f64 / 1e6,
                *max as f64 / 1e6,
                (max - min) as f64 / 1e6
            ),
        });
    }
    Ok(rows)
}
