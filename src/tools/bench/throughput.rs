//! Throughput, closed loop: the ceiling (seat scripts pipelined, no stream),
//! the direct EVALSHA path, and seatgate end to end through its streams.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::harness::{bench_err, cycle_call, hist, row, session_of, Fleet, META};
use super::seat::{Seat, Step};
use super::{Bench, Row};
use crate::client::Client;
use crate::config::Settings;
use crate::db::Db;
use crate::engine::keys::Keys;
use crate::error::Error;

/// Client counts of the closed-loop scenarios.
const CLIENTS: [usize; 3] = [1, 16, 64];

/// `ceiling`: what Redis does with the seat scripts alone.
pub(super) async fn ceiling(b: &mut Bench<'_>) -> Result<(), Error> {
    b.reset().await?;
    let r = ceiling_run(&b.settings, &b.keys, b.opts.warmup, b.opts.duration).await?;
    b.ceiling = r.ops_per_sec;
    b.emit(r);
    Ok(())
}

/// `direct`: one script call per request, answered straight back.
pub(super) async fn direct(b: &mut Bench<'_>) -> Result<(), Error> {
    for clients in CLIENTS {
        b.reset().await?;
        let r = closed_loop(&b.settings, clients, b.opts.warmup, b.opts.duration, Path::Direct).await?;
        b.direct_best.insert(clients, r.ops_per_sec);
        b.emit(r);
    }
    Ok(())
}

/// `seatgate`: requests and replies over the streams, with 1 and 2 workers.
pub(super) async fn seatgate(b: &mut Bench<'_>) -> Result<(), Error> {
    for workers in [1, 2] {
        for clients in CLIENTS {
            b.reset().await?;
            let fleet = Fleet::start(&b.settings, workers).await?;
            let mut r = closed_loop(
                &b.settings,
                clients,
                b.opts.warmup,
                b.opts.duration,
                Path::Seatgate,
            )
            .await?;
            fleet.stop().await;
            r.variant = format!("clients={clients} workers={workers}");
            let mut ratios = Vec::new();
            if let Some(direct) = b.direct_best.get(&clients) {
                ratios.push(format!("{:.0}% of direct", 100.0 * r.ops_per_sec / direct));
            }
            if b.ceiling > 0.0 {
                ratios.push(format!("{:.0}% of ceiling", 100.0 * r.ops_per_sec / b.ceiling));
            }
            r.note = ratios.join(", ");
            b.seatgate_max = b.seatgate_max.max(r.ops_per_sec);
            b.emit(r);
        }
    }
    Ok(())
}

/// The ceiling: acquire/release scripts pipelined 128 deep on 4 connections.
async fn ceiling_run(settings: &Settings, keys: &Keys, warmup: Duration, d: Duration) -> Result<Row, Error> {
    const DEPTH: usize = 128;
    const CONNECTIONS: usize = 4;
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + d;
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let settings = settings.clone();
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            let mut con = Db::connect(&settings.redis).await?;
            let mut ops = 0u64;
            let mut round = 0usize;
            while Instant::now() < stop_at {
                let mut pipe = redis::pipe();
                for k in 0..DEPTH / 2 {
                    let (license, session) = session_of(c * 10_000 + (round * DEPTH + k) % 5_000);
                    let seat = Seat::new(&keys, &license, &session);
                    pipe.add_command(seat.cmd(Step::Acquire { meta: META }));
                    pipe.add_command(seat.cmd(Step::Release));
                }
                let _: Vec<redis::Value> = pipe.query_async(&mut con).await?;
                if Instant::now() >= measure_from {
                    ops += DEPTH as u64;
                }
                round += 1;
            }
            Ok::<u64, Error>(ops)
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.map_err(bench_err)??;
    }
    Ok(row(
        "ceiling",
        format!("EVALSHA pipelined {DEPTH} deep x{CONNECTIONS} conns"),
        ops,
        d,
        None,
        "acquire+release scripts, no stream".into(),
    ))
}

/// Which way a closed-loop client sends its requests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// The seat scripts straight on Redis.
    Direct,
    /// Through seatgate's streams and workers.
    Seatgate,
}

/// A closed-loop client on its path.
enum Caller {
    /// Its own connection and session (boxed: the session's keys and guard
    /// would make every caller as large).
    Direct(Db, Box<Seat>),
    /// A request/reply client.
    Seatgate(Client),
}

/// Closed loop: `clients` each run acquire → release as fast as answers come.
pub(super) async fn closed_loop(
    settings: &Settings,
    clients: usize,
    warmup: Duration,
    d: Duration,
    path: Path,
) -> Result<Row, Error> {
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + d;
    let shared = Arc::new(Mutex::new(hist()));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let settings = settings.clone();
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = hist();
            let mut ops = 0u64;
            let (license, session) = session_of(c);
            let mut caller = match path {
                Path::Direct => {
                    let keys = Keys::new(settings.keys.prefix.clone());
                    Caller::Direct(
                        Db::connect(&settings.redis).await?,
                        Box::new(Seat::new(&keys, &license, &session)),
                    )
                }
                Path::Seatgate => Caller::Seatgate(Client::connect_with(&settings).await?),
            };
            let mut acquire = true;
            while Instant::now() < stop_at {
                let sent = Instant::now();
                let status = match &mut caller {
                    Caller::Direct(con, seat) => {
                        let step = if acquire {
                            Step::Acquire { meta: META }
                        } else {
                            Step::Release
                        };
                        seat.run(con, step).await?.status
                    }
                    Caller::Seatgate(cl) => cl
                        .call(&cycle_call(acquire, &license, &session), Duration::from_secs(10))
                        .await?
                        .status(),
                };
                if !status.is_ok() {
                    return Err(bench_err(format!("unexpected {status} in the benchmark loop")));
                }
                if sent >= measure_from {
                    let _ = h.record(sent.elapsed().as_micros() as u64);
                    ops += 1;
                }
                acquire = !acquire;
            }
            if let Caller::Seatgate(cl) = caller {
                let _ = cl.close().await;
            }
            shared.lock().await.add(&h).map_err(bench_err)?;
            Ok::<u64, Error>(ops)
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.map_err(bench_err)??;
    }
    let h = shared.lock().await;
    let name = match path {
        Path::Direct => "direct",
        Path::Seatgate => "seatgate",
    };
    Ok(row(
        name,
        format!("clients={clients}"),
        ops,
        d,
        Some(&h),
        String::new(),
    ))
}
