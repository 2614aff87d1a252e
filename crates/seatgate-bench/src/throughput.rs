//! Throughput, closed loop: the seed design's scripts (pipelined and
//! direct), the ceiling (seatgate's seat scripts pipelined, no stream), the
//! direct script path (FCALL), and seatgate end to end through its streams. Every
//! row carries what it cost Redis (`cost`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::cost::costed;
use super::harness::{bench_err, cycle_call, hist, row, session_of, Fleet, Window, META};
use super::seat::{Seat, Step};
use super::seed::{self, SeedSeat, SeedStep};
use super::{Bench, Row};
use crate::Error;
use seatgate::config::Settings;
use seatgate_client::Client;
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;

/// Client counts of the closed-loop scenarios.
pub(super) const CLIENTS: [usize; 3] = [1, 16, 64];

/// `a` as a percentage of `b`, for the notes comparing paths; nothing when
/// `b` was not measured in this run.
fn percent_of(a: f64, b: Option<f64>, what: &str) -> Option<String> {
    b.filter(|b| *b > 0.0)
        .map(|b| format!("{:.0}% of {what}", 100.0 * a / b))
}

/// `seed`: the seed design's acquire/release scripts, pipelined as the
/// ceiling is and called directly as the direct path is: the least Redis
/// work a correct seat decision needs.
pub(super) async fn seed(b: &mut Bench<'_>) -> Result<(), Error> {
    b.reset().await?;
    seed::load(&mut b.con).await?;
    let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
    let r = costed(&b.settings, w, pipelined(&b.settings, &b.keys, w, Scripts::Seed)).await?;
    b.seed_pipelined = r.ops_per_sec;
    b.emit(r);
    for clients in CLIENTS {
        b.reset().await?;
        let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
        let mut r = costed(&b.settings, w, closed_loop(&b.settings, clients, w, Path::Seed)).await?;
        r.note = "the seed's acquire_seat/release_seat, keys in KEYS".into();
        b.seed_direct.insert(clients, r.ops_per_sec);
        b.emit(r);
    }
    Ok(())
}

/// `ceiling`: what Redis does with the seat scripts alone.
pub(super) async fn ceiling(b: &mut Bench<'_>) -> Result<(), Error> {
    b.reset().await?;
    let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
    let mut r = costed(
        &b.settings,
        w,
        pipelined(&b.settings, &b.keys, w, Scripts::Seatgate),
    )
    .await?;
    let seed = (b.seed_pipelined > 0.0).then_some(b.seed_pipelined);
    if let Some(ratio) = percent_of(r.ops_per_sec, seed, "seed pipelined") {
        r.note = format!("{}; {ratio}", r.note);
    }
    b.ceiling = r.ops_per_sec;
    b.emit(r);
    Ok(())
}

/// `direct`: one script call per request, answered straight back.
pub(super) async fn direct(b: &mut Bench<'_>) -> Result<(), Error> {
    for clients in CLIENTS {
        b.reset().await?;
        let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
        let mut r = costed(&b.settings, w, closed_loop(&b.settings, clients, w, Path::Direct)).await?;
        if let Some(ratio) = percent_of(r.ops_per_sec, b.seed_direct.get(&clients).copied(), "seed") {
            r.note = ratio;
        }
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
            let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
            let r = costed(
                &b.settings,
                w,
                closed_loop(&b.settings, clients, w, Path::Seatgate),
            )
            .await;
            fleet.stop().await;
            let mut r = r?;
            r.variant = format!("clients={clients} workers={workers}");
            let ceiling = (b.ceiling > 0.0).then_some(b.ceiling);
            r.note = [
                percent_of(r.ops_per_sec, b.direct_best.get(&clients).copied(), "direct"),
                percent_of(r.ops_per_sec, ceiling, "ceiling"),
                percent_of(r.ops_per_sec, b.seed_direct.get(&clients).copied(), "seed"),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
            b.emit(r);
        }
    }
    Ok(())
}

/// Whose seat scripts a pipelined run sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scripts {
    /// seatgate's lua/acquire.lua and lua/release.lua.
    Seatgate,
    /// The seed design's acquire_seat.lua and release_seat.lua.
    Seed,
}

/// Acquire/release pairs of `scripts`, pipelined 128 deep on 4 connections.
async fn pipelined(settings: &Settings, keys: &Keys, w: Window, scripts: Scripts) -> Result<Row, Error> {
    const DEPTH: usize = 128;
    const CONNECTIONS: usize = 4;
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let settings = settings.clone();
        let keys = keys.clone();
        tasks.push(tokio::spawn(async move {
            let mut con = Db::connect(&settings.redis).await?;
            let mut ops = 0u64;
            let mut round = 0usize;
            while Instant::now() < w.stop_at {
                let mut pipe = redis::pipe();
                for k in 0..DEPTH / 2 {
                    let (license, session) = session_of(c * 10_000 + (round * DEPTH + k) % 5_000);
                    match scripts {
                        Scripts::Seatgate => {
                            let seat = Seat::new(&keys, &license, &session);
                            pipe.add_command(seat.cmd(Step::Acquire { meta: META }));
                            pipe.add_command(seat.cmd(Step::Release));
                        }
                        Scripts::Seed => {
                            let seat = SeedSeat::new(keys.prefix(), &license, &session);
                            seat.add_to(&mut pipe, SeedStep::Acquire { meta: META });
                            seat.add_to(&mut pipe, SeedStep::Release);
                        }
                    }
                }
                let _: Vec<redis::Value> = pipe.query_async(&mut con).await?;
                if Instant::now() >= w.measure_from {
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
    let (scenario, note, command) = match scripts {
        Scripts::Seatgate => ("ceiling", "acquire+release scripts, no stream", "FCALL"),
        Scripts::Seed => (
            "seed",
            "the seed's acquire_seat+release_seat, keys in KEYS",
            "EVALSHA",
        ),
    };
    Ok(row(
        scenario,
        format!("{command} pipelined {DEPTH} deep x{CONNECTIONS} conns"),
        ops,
        w.length(),
        None,
        note.into(),
    ))
}

/// Which way a closed-loop client sends its requests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// seatgate's seat scripts straight on Redis.
    Direct,
    /// The seed design's seat scripts straight on Redis.
    Seed,
    /// Through seatgate's streams and workers.
    Seatgate,
}

/// A closed-loop client on its path.
enum Caller {
    /// Its own connection and session (boxed: the session's keys and guard
    /// would make every caller as large).
    Direct(Db, Box<Seat>),
    /// Its own connection and session under the seed's data model.
    Seed(Db, Box<SeedSeat>),
    /// A clone of the request/reply client every caller shares.
    Seatgate(Client),
}

impl Caller {
    /// The caller for `path`; on the seatgate path a clone of `shared`, the
    /// client every caller of the run shares (a client of its own without).
    async fn connect(
        settings: &Settings,
        path: Path,
        license: &str,
        session: &str,
        shared: Option<&Client>,
    ) -> Result<Caller, Error> {
        Ok(match path {
            Path::Direct => {
                let keys = settings.seat_keys();
                Caller::Direct(
                    Db::connect(&settings.redis).await?,
                    Box::new(Seat::new(&keys, license, session)),
                )
            }
            Path::Seed => Caller::Seed(
                Db::connect(&settings.redis).await?,
                Box::new(SeedSeat::new(&settings.keys.prefix, license, session)),
            ),
            Path::Seatgate => Caller::Seatgate(match shared {
                Some(client) => client.clone(),
                None => settings.client().connect().await?,
            }),
        })
    }

    /// One step of the acquire → release cycle; an error unless it took or
    /// freed the seat.
    async fn step(&mut self, acquire: bool, license: &str, session: &str) -> Result<(), Error> {
        let status = match self {
            Caller::Direct(con, seat) => {
                let step = if acquire {
                    Step::Acquire { meta: META }
                } else {
                    Step::Release
                };
                seat.run(con, step).await?.status()
            }
            Caller::Seed(con, seat) => {
                let (step, expected) = if acquire {
                    (SeedStep::Acquire { meta: META }, "ACQUIRED")
                } else {
                    (SeedStep::Release, "RELEASED")
                };
                let status = seat.run(con, step).await?;
                if status != expected {
                    return Err(bench_err(format!(
                        "unexpected seed {status} in the benchmark loop"
                    )));
                }
                return Ok(());
            }
            Caller::Seatgate(cl) => cl
                .call(&cycle_call(acquire, license, session), Duration::from_secs(10))
                .await?
                .status(),
        };
        if !status.is_ok() {
            return Err(bench_err(format!("unexpected {status} in the benchmark loop")));
        }
        Ok(())
    }
}

/// Closed loop: `clients` each run acquire → release as fast as answers come.
/// On the seatgate path they share one [`Client`] (one connection, one reply
/// stream), as the callers in one service process would.
pub(super) async fn closed_loop(
    settings: &Settings,
    clients: usize,
    w: Window,
    path: Path,
) -> Result<Row, Error> {
    let shared = Arc::new(Mutex::new(hist()));
    let one_client = match path {
        Path::Seatgate => Some(settings.client().connect().await?),
        Path::Direct | Path::Seed => None,
    };
    let mut tasks = Vec::new();
    for c in 0..clients {
        let settings = settings.clone();
        let shared = shared.clone();
        let client = one_client.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = hist();
            let mut ops = 0u64;
            let (license, session) = session_of(c);
            let mut caller = Caller::connect(&settings, path, &license, &session, client.as_ref()).await?;
            drop(client);
            let mut acquire = true;
            while Instant::now() < w.stop_at {
                let sent = Instant::now();
                caller.step(acquire, &license, &session).await?;
                if sent >= w.measure_from {
                    let _ = h.record(sent.elapsed().as_micros() as u64);
                    ops += 1;
                }
                acquire = !acquire;
            }
            if !acquire {
                // Give the seat back, unmeasured: the next row's callers hold
                // leases of their own, and on a Redis the benchmark may not
                // FLUSHALL (`--bench-redis` without `--flush`) they would
                // meet this row's seats and be refused (LEASE_MISMATCH).
                caller.step(false, &license, &session).await?;
            }
            shared.lock().await.add(&h).map_err(bench_err)?;
            Ok::<u64, Error>(ops)
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.map_err(bench_err)??;
    }
    if let Some(client) = one_client {
        let _ = client.close().await;
    }
    let h = shared.lock().await;
    let name = match path {
        Path::Direct => "direct",
        Path::Seed => "seed",
        Path::Seatgate => "seatgate",
    };
    Ok(row(
        name,
        format!("clients={clients}"),
        ops,
        w.length(),
        Some(&h),
        String::new(),
    ))
}
