//! `seatgate bench`: seatgate end to end beside the direct EVALSHA path and
//! beside what one Redis core can do, in one run on one machine.
//!
//! Every scenario runs for a fixed time after a warm-up and reports
//! throughput and latency percentiles from an HDR histogram. Unless given a
//! URL, the benchmark starts its own redis-server on a free loopback port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::client::{Call, Client};
use crate::config::Settings;
use crate::db::Db;
use crate::engine::keys::Keys;
use crate::engine::license::{self, LicenseSpec};
use crate::engine::protocol::Op;
use crate::engine::scripts::{AcquireArgs, Guard, Scripts, SessionArgs};
use crate::engine::status::Status;
use crate::error::Error;
use crate::runtime::health::Readiness;
use crate::runtime::reaper::Reaper;
use crate::runtime::worker::Worker;
use crate::tools::local_redis::LocalRedis;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Use this Redis instead of starting one (its data is FLUSHALLed only
    /// when `flush` is set).
    pub redis_url: Option<String>,
    /// Allow FLUSHALL on `redis_url`.
    pub flush: bool,
    /// Measured time per scenario.
    pub duration: Duration,
    /// Unmeasured time before it.
    pub warmup: Duration,
    /// Scenario names to run (empty = all).
    pub only: Vec<String>,
    /// Sessions in the reaper scenario.
    pub reaper_sessions: usize,
    /// How long the soak scenario runs (it runs only when asked for by name).
    pub soak: Duration,
    /// Master counts of the cluster scenario (it runs only when asked for by name).
    pub cluster_masters: Vec<usize>,
}

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Scenario (ceiling, direct, seatgate, fixed-rate, contention, reaper, memory).
    pub scenario: String,
    /// Its variant (clients, workers, rate, ...).
    pub variant: String,
    /// Operations per second (or the scenario's own unit, see `note`).
    pub ops_per_sec: f64,
    /// Latency percentiles, microseconds (None where not meaningful).
    pub p50_us: Option<u64>,
    /// 90th percentile, µs.
    pub p90_us: Option<u64>,
    /// 99th percentile, µs.
    pub p99_us: Option<u64>,
    /// 99.9th percentile, µs.
    pub p999_us: Option<u64>,
    /// Anything else worth printing.
    pub note: String,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Redis version measured against.
    pub redis_version: String,
    /// CPU cores of this machine.
    pub cores: usize,
    /// Measured time per scenario, seconds.
    pub duration_s: f64,
    /// The rows.
    pub rows: Vec<Row>,
}

const LICENSES: usize = 100;
const META: &str = r#"{"user_email":"user1234@example.com","hardware_id":"hw-5f3a9c"}"#;

/// An acquire that answers at once, with no queue limit of its own.
fn acquire_now<'a>(session: &'a str, meta: &'a str) -> AcquireArgs<'a> {
    AcquireArgs {
        session,
        lease: None,
        meta,
        wait_ms: 0,
        request_id: "",
        reply_to: "",
        default_queue_max: u64::MAX,
    }
}

fn bench_err(e: impl std::fmt::Display) -> Error {
    Error::Bench(e.to_string())
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 60 s, 3 significant figures.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn row(
    scenario: &str,
    variant: String,
    ops: u64,
    elapsed: Duration,
    h: Option<&Histogram<u64>>,
    note: String,
) -> Row {
    let q = |p: f64| h.filter(|h| !h.is_empty()).map(|h| h.value_at_quantile(p));
    Row {
        scenario: scenario.into(),
        variant,
        ops_per_sec: ops as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_us: q(0.5),
        p90_us: q(0.9),
        p99_us: q(0.99),
        p999_us: q(0.999),
        note,
    }
}

/// Runs the benchmark and returns its report; `progress` is told each row as it is measured.
pub async fn run(opts: BenchOptions, mut progress: impl FnMut(&Row)) -> Result<Report, Error> {
    let local = match &opts.redis_url {
        Some(_) => None,
        // The memory settings of ops/redis.conf; persistence stays off so
        // that disk speed does not blur the figures.
        None => Some(LocalRedis::start(&[
            "--hash-max-listpack-value",
            "256",
            "--maxmemory-policy",
            "noeviction",
        ])?),
    };
    let url = opts
        .redis_url
        .clone()
        .or_else(|| local.as_ref().map(LocalRedis::url))
        .unwrap_or_default();
    let may_flush = local.is_some() || opts.flush;
    let mut settings = Settings::load(None)?;
    settings.redis.url = url.clone();
    settings.metrics.listen = String::new();
    settings.stream.block_ms = 100;
    // A benchmark client is a retry loop by design: no per-session limit here.
    settings.limits.session_requests = 0;
    settings.reaper.enabled = false;

    let mut con = crate::connect(&settings).await?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut con).await?;
    let redis_version = info_field(&info, "redis_version").unwrap_or_default();
    let keys = Keys::new(settings.keys.prefix.clone());
    let wanted = |name: &str| opts.only.is_empty() || opts.only.iter().any(|o| o == name);
    let mut rows = Vec::new();
    let mut emit = |r: Row, rows: &mut Vec<Row>| {
        progress(&r);
        rows.push(r);
    };

    let reset = |con: &mut Db| {
        let mut con = con.clone();
        async move {
            if may_flush {
                let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await?;
            }
            Scripts::get().load_all(&mut con).await?;
            for i in 0..LICENSES {
                let spec = LicenseSpec {
                    seats_total: 1_000_000,
                    expires_at_ms: 0,
                    active: true,
                    heartbeat_timeout_ms: None,
                };
                license::put(&mut con, &Keys::new("seat"), &format!("bench-{i}"), &spec).await?;
            }
            Ok::<_, Error>(())
        }
    };
    let d = opts.duration;
    let w = opts.warmup;

    let mut ceiling = 0.0;
    if wanted("ceiling") {
        reset(&mut con).await?;
        let r = ceiling_run(&settings, &keys, w, d).await?;
        ceiling = r.ops_per_sec;
        emit(r, &mut rows);
    }
    let mut direct_best = std::collections::HashMap::new();
    if wanted("direct") {
        for clients in [1, 16, 64] {
            reset(&mut con).await?;
            let r = closed_loop(&settings, clients, w, d, Path::Direct).await?;
            direct_best.insert(clients, r.ops_per_sec);
            emit(r, &mut rows);
        }
    }
    let mut seatgate_max: f64 = 0.0;
    if wanted("seatgate") {
        for workers in [1, 2] {
            for clients in [1, 16, 64] {
                reset(&mut con).await?;
                let fleet = Fleet::start(&settings, workers).await?;
                let mut r = closed_loop(&settings, clients, w, d, Path::Seatgate).await?;
                fleet.stop().await;
                r.variant = format!("clients={clients} workers={workers}");
                let mut ratios = Vec::new();
                if let Some(direct) = direct_best.get(&clients) {
                    ratios.push(format!("{:.0}% of direct", 100.0 * r.ops_per_sec / direct));
                }
                if ceiling > 0.0 {
                    ratios.push(format!("{:.0}% of ceiling", 100.0 * r.ops_per_sec / ceiling));
                }
                r.note = ratios.join(", ");
                seatgate_max = seatgate_max.max(r.ops_per_sec);
                emit(r, &mut rows);
            }
        }
    }
    if wanted("fixed-rate") {
        let max = if seatgate_max > 0.0 {
            seatgate_max
        } else {
            10_000.0
        };
        for (label, rate) in [
            ("1000/s", 1000.0),
            ("50% of max", 0.5 * max),
            ("80% of max", 0.8 * max),
        ] {
            reset(&mut con).await?;
            let fleet = Fleet::start(&settings, 2).await?;
            let r = open_loop(&settings, rate, w, d, label).await?;
            fleet.stop().await;
            emit(r, &mut rows);
        }
    }
    if wanted("contention") {
        reset(&mut con).await?;
        let fleet = Fleet::start(&settings, 2).await?;
        let r = contention(&settings, &mut con, w, d).await?;
        fleet.stop().await;
        emit(r, &mut rows);
    }
    if wanted("reaper") {
        if !may_flush {
            return Err(bench_err(
                "the reaper and memory scenarios need a Redis they may FLUSHALL (--flush)",
            ));
        }
        for r in reaper_run(&settings, &mut con, opts.reaper_sessions).await? {
            emit(r, &mut rows);
        }
    }
    if opts.only.iter().any(|o| o == "cluster") {
        for r in cluster_run(&opts.cluster_masters, w, d).await? {
            emit(r, &mut rows);
        }
    }
    if opts.only.iter().any(|o| o == "soak") {
        if !may_flush {
            return Err(bench_err(
                "the soak scenario needs a Redis it may FLUSHALL (--flush)",
            ));
        }
        for r in soak_run(&settings, &mut con, opts.soak, &mut |r: &Row| progress_line(r)).await? {
            emit(r, &mut rows);
        }
    }
    if wanted("memory") {
        if !may_flush {
            return Err(bench_err(
                "the reaper and memory scenarios need a Redis they may FLUSHALL (--flush)",
            ));
        }
        for r in memory_run(&settings, &mut con).await? {
            emit(r, &mut rows);
        }
    }
    drop(local);
    Ok(Report {
        redis_version,
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        duration_s: d.as_secs_f64(),
        rows,
    })
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_owned())
}

/// In-process workers for the seatgate scenarios.
struct Fleet {
    token: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<Result<(), Error>>>,
}

impl Fleet {
    async fn start(settings: &Settings, workers: usize) -> Result<Fleet, Error> {
        let token = CancellationToken::new();
        let mut tasks = Vec::new();
        for i in 0..workers {
            let mut s = settings.clone();
            s.stream.consumer = format!("bench-worker-{i}");
            let worker = Worker::connect(s, Readiness::default()).await?;
            tasks.push(tokio::spawn(worker.run(token.clone())));
        }
        Ok(Fleet { token, tasks })
    }

    async fn stop(self) {
        self.token.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Direct,
    Seatgate,
}

/// One client's acquire → release cycle on its own session.
fn session_of(client: usize) -> (String, String) {
    (format!("bench-{}", client % LICENSES), format!("c{client}"))
}

/// One step of a client's acquire → release cycle (the acquire carries metadata).
fn cycle_call(acquire: bool, license: &str, session: &str) -> Call {
    if acquire {
        Call::new(Op::Acquire, license, session).with_meta(META)
    } else {
        Call::new(Op::Release, license, session)
    }
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
                let mut invocations = Vec::with_capacity(DEPTH);
                for k in 0..DEPTH / 2 {
                    let (license, session) = session_of(c * 10_000 + (round * DEPTH + k) % 5_000);
                    let lk = keys.license(&license);
                    let guard = Guard::none(&keys, &license, &session);
                    invocations.push((lk, guard, session));
                }
                for (lk, guard, session) in &invocations {
                    pipe.add_command(
                        Scripts::get()
                            .acquire(lk, guard, &acquire_now(session, META))
                            .cmd(),
                    );
                    pipe.add_command(
                        Scripts::get()
                            .release(lk, guard, &SessionArgs { session, lease: None })
                            .cmd(),
                    );
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

/// Closed loop: `clients` each run acquire → release as fast as answers come.
async fn closed_loop(
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
            let keys = Keys::new("seat");
            let lk = keys.license(&license);
            let guard = Guard::none(&keys, &license, &session);
            let mut direct: Option<Db> = None;
            let mut client: Option<Client> = None;
            match path {
                Path::Direct => direct = Some(Db::connect(&settings.redis).await?),
                Path::Seatgate => client = Some(Client::connect_with(&settings).await?),
            }
            let mut acquire = true;
            while Instant::now() < stop_at {
                let sent = Instant::now();
                let status = match (&mut direct, &mut client) {
                    (Some(con), _) => {
                        let s = Scripts::get();
                        let o = if acquire {
                            s.acquire(&lk, &guard, &acquire_now(&session, META))
                                .run(con)
                                .await?
                        } else {
                            s.release(
                                &lk,
                                &guard,
                                &SessionArgs {
                                    session: &session,
                                    lease: None,
                                },
                            )
                            .run(con)
                            .await?
                        };
                        o.status
                    }
                    (_, Some(cl)) => cl
                        .call(&cycle_call(acquire, &license, &session), Duration::from_secs(10))
                        .await?
                        .status(),
                    _ => unreachable!("one path is set"),
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
            if let Some(cl) = client {
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
    let name = if path == Path::Direct {
        "direct"
    } else {
        "seatgate"
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

/// Open loop: requests sent on a fixed schedule at `rate`/s over 64
/// connections; latency counts from the scheduled time, so queueing shows.
async fn open_loop(
    settings: &Settings,
    rate: f64,
    warmup: Duration,
    d: Duration,
    label: &str,
) -> Result<Row, Error> {
    const CLIENTS: usize = 64;
    let start = Instant::now() + Duration::from_millis(200);
    let measure_from = start + warmup;
    let stop_at = measure_from + d;
    let interval = Duration::from_secs_f64(CLIENTS as f64 / rate.max(1.0));
    let shared = Arc::new(Mutex::new(hist()));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let settings = settings.clone();
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect_with(&settings).await?;
            let (license, session) = session_of(c);
            let mut h = hist();
            let mut ops = 0u64;
            let mut due = start + interval.mul_f64(c as f64 / CLIENTS as f64);
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
            let _ = client.close().await;
            shared.lock().await.add(&h).map_err(bench_err)?;
            Ok::<u64, Error>(ops)
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.map_err(bench_err)??;
    }
    let h = shared.lock().await;
    Ok(row(
        "fixed-rate",
        format!("{label} (target {rate:.0}/s)"),
        ops,
        d,
        Some(&h),
        "open loop, latency from the scheduled send time (timer lateness of an idle client excluded)".into(),
    ))
}

/// One license, 10 seats, 120 users who queue, hold a seat 2 ms and release.
async fn contention(settings: &Settings, con: &mut Db, warmup: Duration, d: Duration) -> Result<Row, Error> {
    const USERS: usize = 120;
    let spec = LicenseSpec {
        seats_total: 10,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms: None,
    };
    license::put(con, &Keys::new("seat"), "contended", &spec).await?;
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + d;
    let shared = Arc::new(Mutex::new(hist()));
    let mut tasks = Vec::new();
    for u in 0..USERS {
        let settings = settings.clone();
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect_with(&settings).await?;
            let session = format!("user-{u}");
            let mut h = hist();
            let (mut grants, mut queued) = (0u64, 0u64);
            while Instant::now() < stop_at {
                let asked = Instant::now();
                let call = Call::new(Op::Acquire, "contended", session.as_str())
                    .with_meta(META)
                    .with_wait(30_000);
                let id = client.send(&call).await?;
                let mut r = client.wait_for(&id, Duration::from_secs(30)).await?;
                if r.status() == Status::Queued {
                    queued += 1;
                    r = client.wait_for(&id, Duration::from_secs(35)).await?;
                }
                if !r.ok() {
                    return Err(bench_err(format!("contention: unexpected {}", r.status())));
                }
                if asked >= measure_from {
                    let _ = h.record(asked.elapsed().as_micros() as u64);
                    grants += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                let release = Call {
                    op: Op::Release,
                    meta: None,
                    wait_ms: 0,
                    ..call
                };
                client.call(&release, Duration::from_secs(10)).await?;
            }
            let _ = client.close().await;
            shared.lock().await.add(&h).map_err(bench_err)?;
            Ok::<(u64, u64), Error>((grants, queued))
        }));
    }
    let (mut grants, mut queued) = (0, 0);
    for t in tasks {
        let (g, q) = t.await.map_err(bench_err)??;
        grants += g;
        queued += q;
    }
    let h = shared.lock().await;
    Ok(row(
        "contention",
        format!("1 license, 10 seats, {USERS} users"),
        grants,
        d,
        Some(&h),
        format!("seats granted/s; latency = wait for a seat; {queued} waits were queued"),
    ))
}

/// Redis main-thread CPU seconds so far.
async fn redis_cpu(con: &mut Db) -> Result<f64, Error> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(con).await?;
    let f = |k: &str| {
        info_field(&info, k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(f("used_cpu_sys_main_thread") + f("used_cpu_user_main_thread"))
}

async fn used_memory(con: &mut Db) -> Result<i64, Error> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(con).await?;
    Ok(info_field(&info, "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// The reaper over `total` sessions in 10,000 licenses: passes with 1%,
/// 0.1% and no stale sessions, timing each and Redis's CPU for it.
async fn reaper_run(settings: &Settings, con: &mut Db, total: usize) -> Result<Vec<Row>, Error> {
    const LICENSES: usize = 10_000;
    let _: () = redis::cmd("FLUSHALL").query_async(con).await?;
    Scripts::get().load_all(con).await?;
    let keys = Keys::new(settings.keys.prefix.clone());
    let (secs, _): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
    let now_ms = secs * 1000;
    let per = total / LICENSES;
    let stale_every = 100; // 1%
    let mut pipe = redis::pipe();
    let mut queued = 0;
    for l in 0..LICENSES {
        let lic = format!("r{l}");
        let lk = keys.license(&lic);
        pipe.cmd("HSET")
            .arg(&lk.license)
            .arg("seats_total")
            .arg(per * 2)
            .arg("expires_at_ms")
            .arg(0)
            .arg("active")
            .arg(1)
            .ignore();
        pipe.cmd("SADD").arg(keys.license_index()).arg(&lic).ignore();
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&lk.holders);
        let mut hset = redis::cmd("HSET");
        hset.arg(&lk.sessions);
        for s in 0..per {
            let stale = (l * per + s) % stale_every == 0;
            let beat = if stale { now_ms - 600_000 } else { now_ms };
            zadd.arg(beat).arg(format!("s{s}"));
            hset.arg(format!("s{s}")).arg(format!("{now_ms}:0:{META}"));
        }
        pipe.add_command(zadd).ignore();
        pipe.add_command(hset).ignore();
        queued += 1;
        if queued == 200 {
            pipe.query_async::<()>(con).await?;
            pipe = redis::pipe();
            queued = 0;
        }
    }
    if !pipe.is_empty() {
        pipe.query_async::<()>(con).await?;
    }
    let reaper = Reaper::new(con.clone(), settings);
    let mut rows = Vec::new();
    for (label, mark) in [("1% stale", 0usize), ("0.1% stale", 1_000), ("none stale", 0)] {
        if mark > 0 {
            // Age `mark` sessions, spread over the licenses.
            let mut pipe = redis::pipe();
            for i in 0..mark {
                let lk = keys.license(&format!("r{}", (i * 7) % LICENSES));
                pipe.cmd("ZADD")
                    .arg(&lk.holders)
                    .arg("XX")
                    .arg(now_ms - 600_000)
                    .arg(format!("s{}", 1 + i % (per - 1)))
                    .ignore();
            }
            pipe.query_async::<()>(con).await?;
        }
        // Redis's latency monitor records any command that blocked it >= 1 ms.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("latency-monitor-threshold")
            .arg(1)
            .query_async(con)
            .await?;
        let _: i64 = redis::cmd("LATENCY").arg("RESET").query_async(con).await?;
        let cpu0 = redis_cpu(con).await?;
        let started = Instant::now();
        let report = reaper.pass().await?;
        let elapsed = started.elapsed();
        let cpu = redis_cpu(con).await? - cpu0;
        let latest: Vec<(String, i64, i64, i64)> =
            redis::cmd("LATENCY").arg("LATEST").query_async(con).await?;
        let longest_call = latest.iter().filter(|l| l.0 == "command").map(|l| l.3).max();
        let mut r = row(
            "reaper",
            format!("{total} sessions, {LICENSES} licenses, {label}"),
            report.evicted as u64,
            elapsed,
            None,
            format!(
                "one pass: {:.0} ms wall, {:.0} ms Redis CPU, {} evicted, longest call {}",
                elapsed.as_secs_f64() * 1000.0,
                cpu * 1000.0,
                report.evicted,
                longest_call
                    .map(|ms| format!("{ms} ms"))
                    .unwrap_or_else(|| "< 1 ms".into())
            ),
        );
        r.ops_per_sec = report.evicted as f64 / elapsed.as_secs_f64();
        rows.push(r);
    }
    Ok(rows)
}

/// Bytes of Redis memory per active session (10,000 licenses × 10 sessions,
/// ~60-byte metadata) and per queued waiter.
async fn memory_run(settings: &Settings, con: &mut Db) -> Result<Vec<Row>, Error> {
    let _: () = redis::cmd("FLUSHALL").query_async(con).await?;
    Scripts::get().load_all(con).await?;
    let keys = Keys::new(settings.keys.prefix.clone());
    for l in 0..10_000 {
        let spec = LicenseSpec {
            seats_total: 10,
            expires_at_ms: 0,
            active: true,
            heartbeat_timeout_ms: None,
        };
        license::put(con, &keys, &format!("m{l}"), &spec).await?;
    }
    let spec = LicenseSpec {
        seats_total: 0,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms: None,
    };
    license::put(con, &keys, "waitlist", &spec).await?;
    let _: () = redis::cmd("HSET")
        .arg(keys.license("waitlist").license)
        .arg("queue_max")
        .arg(100_000)
        .query_async(con)
        .await?;
    let before = used_memory(con).await?;
    let mut pipe = redis::pipe();
    let mut n = 0;
    for l in 0..10_000 {
        let lic = format!("m{l}");
        let lk = keys.license(&lic);
        for s in 0..10 {
            let session = format!("sess-{l}-{s}");
            let guard = Guard::none(&keys, &lic, &session);
            let meta = format!(
                r#"{{"user_email":"user{:04}@example.com","hardware_id":"hw-{:06x}"}}"#,
                s, l
            );
            pipe.add_command(
                Scripts::get()
                    .acquire(&lk, &guard, &acquire_now(&session, &meta))
                    .cmd(),
            )
            .ignore();
            n += 1;
        }
        if n >= 2_000 {
            pipe.query_async::<()>(con).await?;
            pipe = redis::pipe();
            n = 0;
        }
    }
    if !pipe.is_empty() {
        pipe.query_async::<()>(con).await?;
    }
    let after_sessions = used_memory(con).await?;
    let used: i64 = redis::cmd("ZCARD")
        .arg(keys.license("m0").holders)
        .query_async(con)
        .await?;
    if used != 10 {
        return Err(bench_err(format!(
            "memory: expected 10 holders of m0, found {used}"
        )));
    }
    let lk = keys.license("waitlist");
    let mut pipe = redis::pipe();
    for w in 0..10_000 {
        let session = format!("wait-{w}");
        let guard = Guard::none(&keys, "waitlist", &session);
        let meta = format!(r#"{{"user_email":"user{w:04}@example.com","hardware_id":"hw-{w:06x}"}}"#);
        let args = AcquireArgs {
            session: &session,
            lease: None,
            meta: &meta,
            wait_ms: 3_600_000,
            request_id: "req-1796011839633-0",
            reply_to: "seat:reply:client-0001",
            default_queue_max: u64::MAX,
        };
        pipe.add_command(Scripts::get().acquire(&lk, &guard, &args).cmd())
            .ignore();
    }
    pipe.query_async::<()>(con).await?;
    let after_waiters = used_memory(con).await?;
    let per_session = (after_sessions - before) as f64 / 100_000.0;
    let per_waiter = (after_waiters - after_sessions) as f64 / 10_000.0;
    Ok(vec![
        Row {
            scenario: "memory".into(),
            variant: "10,000 licenses x 10 sessions, ~60 B meta".into(),
            ops_per_sec: 0.0,
            p50_us: None,
            p90_us: None,
            p99_us: None,
            p999_us: None,
            note: format!("{per_session:.0} bytes per active session"),
        },
        Row {
            scenario: "memory".into(),
            variant: "10,000 queued waiters on one license".into(),
            ops_per_sec: 0.0,
            p50_us: None,
            p90_us: None,
            p99_us: None,
            p999_us: None,
            note: format!("{per_waiter:.0} bytes per queued waiter"),
        },
    ])
}

/// seatgate end to end (64 clients, 2 workers) and the direct path on Redis
/// Cluster with each master count (no replicas: a benchmark of masters), with
/// 4 request shards per master; a single node beside them for reference.
async fn cluster_run(masters: &[usize], warmup: Duration, d: Duration) -> Result<Vec<Row>, Error> {
    let mut rows = Vec::new();
    let single = LocalRedis::start(&["--hash-max-listpack-value", "256"])?;
    let mut runs: Vec<(String, Settings, Option<crate::tools::local_redis::LocalCluster>)> = Vec::new();
    let mut s = Settings::load(None)?;
    s.redis.url = single.url();
    runs.push(("1 node (not a cluster)".into(), s, None));
    for &m in masters {
        let cluster =
            tokio::task::spawn_blocking(move || crate::tools::local_redis::LocalCluster::start_with(m, 0))
                .await
                .map_err(bench_err)??;
        let mut s = Settings::load(None)?;
        s.redis.cluster_urls = cluster.urls();
        s.stream.shards = 4 * m;
        runs.push((
            format!("cluster, {m} masters, {} shards", 4 * m),
            s,
            Some(cluster),
        ));
    }
    for (label, mut s, cluster) in runs {
        s.metrics.listen = String::new();
        s.stream.block_ms = 100;
        s.limits.session_requests = 0;
        s.reaper.enabled = false;
        let mut con = Db::connect(&s.redis).await?;
        Scripts::get().load_all(&mut con).await?;
        for i in 0..LICENSES {
            let spec = LicenseSpec {
                seats_total: 1_000_000,
                expires_at_ms: 0,
                active: true,
                heartbeat_timeout_ms: None,
            };
            license::put(&mut con, &Keys::new("seat"), &format!("bench-{i}"), &spec).await?;
        }
        let mut direct = closed_loop(&s, 64, warmup, d, Path::Direct).await?;
        direct.scenario = "cluster".into();
        direct.variant = format!("{label}: direct, clients=64");
        rows.push(direct);
        let fleet = Fleet::start(&s, 2).await?;
        let mut r = closed_loop(&s, 64, warmup, d, Path::Seatgate).await?;
        fleet.stop().await;
        r.scenario = "cluster".into();
        r.variant = format!("{label}: seatgate, clients=64 workers=2");
        rows.push(r);
        drop(cluster);
    }
    Ok(rows)
}

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
    progress: &mut dyn FnMut(&Row),
) -> Result<Vec<Row>, Error> {
    const USERS: usize = 24;
    let _: () = redis::cmd("FLUSHALL").query_async(con).await?;
    Scripts::get().load_all(con).await?;
    let keys = Keys::new(settings.keys.prefix.clone());
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
    s.limits = Settings::load(None)?.limits; // the real per-session limits
    s.reaper.schedule = "*/2 * * * * *".into();
    let fleet = Fleet::start(&s, 2).await?;
    let reaper = Reaper::new(con.clone(), &s);
    let mut scheduler =
        crate::runtime::reaper::start(reaper.clone(), &s.reaper.schedule, s.reaper.lock_ms).await?;

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
                let mut client = Client::connect_with(&settings).await?;
                let mut call = Call::new(Op::Acquire, license, session).with_meta(META);
                let got = client.call(&call, Duration::from_secs(10)).await?;
                ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let abandon = cycle % 10 == 9;
                if got.ok() {
                    call.meta = None;
                    for _ in 0..2 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        call.op = Op::Heartbeat;
                        client.call(&call, Duration::from_secs(10)).await?;
                        ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if !abandon {
                        call.op = Op::Release;
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
            note: format!(
                "used_memory {:.2} MB, {dbsize} keys, requests stream {requests} entries",
                mem as f64 / 1e6
            ),
        };
        progress(&r);
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

/// The table as text.
pub fn render(report: &Report) -> String {
    let mut out = format!(
        "seatgate bench: Redis {}, {} cores, {:.0} s per scenario\n\n{:<11} {:<56} {:>11} {:>8} {:>8} {:>8} {:>8}  {}\n",
        report.redis_version, report.cores, report.duration_s, "scenario", "variant", "ops/s", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "note"
    );
    let us = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    for r in &report.rows {
        let ops = if r.ops_per_sec > 0.0 {
            format!("{:.0}", r.ops_per_sec)
        } else {
            "-".into()
        };
        out.push_str(&format!(
            "{:<11} {:<56} {:>11} {:>8} {:>8} {:>8} {:>8}  {}\n",
            r.scenario,
            r.variant,
            ops,
            us(r.p50_us),
            us(r.p90_us),
            us(r.p99_us),
            us(r.p999_us),
            r.note
        ));
    }
    out
}
