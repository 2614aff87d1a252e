//! `gateway`: the HTTP gateway beside the stream path it sends on, in one
//! run: acquire → heartbeat → release at 64 clients through the streams
//! (one shared Rust client) and through a `seatgate gateway` process (HTTP/1.1
//! keep-alive on loopback), the same cycle at a fixed 1,000 requests/s, and
//! the gateway's resident memory for 10,000 idle server-sent event streams.
//! The gateway is the real binary (`--seatgate-bin`, by default the
//! `seatgate` next to this one), so its memory is its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use seatgate_client::{Call, Client};
use seatgate_gateway::tokens::{NewToken, TokenStore};
use tokio::sync::Mutex;

use super::harness::{bench_err, hist, note_row, row, session_of, Fleet, Window};
use super::{Bench, Row};
use crate::Error;

/// Closed-loop clients.
const CLIENTS: usize = 64;
/// The fixed rate, requests per second.
const RATE: f64 = 1000.0;
/// Idle event streams held open.
const STREAMS: usize = 10_000;
/// Event streams opened at once.
const OPEN_AT_ONCE: usize = 250;

/// The three steps of a cycle, in order.
#[derive(Clone, Copy)]
enum Step {
    Acquire,
    Heartbeat,
    Release,
}

impl Step {
    fn next(self) -> Step {
        match self {
            Step::Acquire => Step::Heartbeat,
            Step::Heartbeat => Step::Release,
            Step::Release => Step::Acquire,
        }
    }
}

/// A `seatgate gateway` child, killed on drop.
struct GatewayChild {
    child: Child,
    base: String,
}

impl Drop for GatewayChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GatewayChild {
    async fn start(bin: &Path, redis_url: &str) -> Result<GatewayChild, Error> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(bench_err)?
            .port();
        let child = Command::new(bin)
            .arg("--redis")
            .arg(redis_url)
            .arg("gateway")
            .env("SEATGATE__GATEWAY__LISTEN", format!("127.0.0.1:{port}"))
            .env("SEATGATE__GATEWAY__RATE_PER_SECOND", "0")
            .env(
                "SEATGATE__GATEWAY__MAX_EVENT_STREAMS",
                (STREAMS + 100).to_string(),
            )
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| bench_err(format!("cannot start {}: {e}", bin.display())))?;
        let gw = GatewayChild {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = http.get(format!("{}/ready", gw.base)).send().await {
                if r.status().is_success() {
                    return Ok(gw);
                }
            }
            if Instant::now() > deadline {
                return Err(bench_err("the gateway did not become ready within 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its resident memory now (`VmRSS`), KiB.
    fn rss_kib(&self) -> Result<u64, Error> {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).map_err(bench_err)?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| bench_err("no VmRSS in /proc/<pid>/status"))
    }
}

/// The `seatgate` binary to run: `--seatgate-bin`, else the one beside this benchmark.
fn seatgate_bin(given: Option<&PathBuf>) -> Result<PathBuf, Error> {
    let bin = match given {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(bench_err)?
            .with_file_name("seatgate"),
    };
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(bench_err(format!(
            "the gateway scenario runs the seatgate binary, and {} is missing: build it (cargo build --release -p seatgate) or pass --seatgate-bin",
            bin.display()
        )))
    }
}

/// One HTTP step of a session's cycle; the lease is kept in `lease`.
async fn http_step(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    license: &str,
    session: &str,
    step: Step,
    lease: &mut String,
) -> Result<(), Error> {
    let response = match step {
        Step::Acquire => {
            http.post(format!("{base}/v1/licenses/{license}/seats"))
                .bearer_auth(token)
                .json(&serde_json::json!({ "session": session }))
                .send()
                .await
        }
        Step::Heartbeat => {
            http.post(format!("{base}/v1/licenses/{license}/seats/{session}/heartbeat"))
                .bearer_auth(token)
                .header("Seatgate-Lease", lease.as_str())
                .send()
                .await
        }
        Step::Release => {
            http.delete(format!("{base}/v1/licenses/{license}/seats/{session}"))
                .bearer_auth(token)
                .header("Seatgate-Lease", lease.as_str())
                .send()
                .await
        }
    }
    .map_err(bench_err)?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.map_err(bench_err)?;
    if !status.is_success() {
        return Err(bench_err(format!("gateway answered {status}: {body}")));
    }
    if let Step::Acquire = step {
        *lease = body["lease"].as_str().unwrap_or_default().to_owned();
    }
    Ok(())
}

/// One stream-path step of the same cycle.
async fn stream_step(client: &Client, license: &str, session: &str, step: Step) -> Result<(), Error> {
    let call = match step {
        Step::Acquire => Call::acquire(license, session),
        Step::Heartbeat => Call::heartbeat(license, session),
        Step::Release => Call::release(license, session),
    };
    let reply = client.call(&call, Duration::from_secs(10)).await?;
    if !reply.status().is_ok() {
        return Err(bench_err(format!(
            "unexpected {} in the benchmark loop",
            reply.status()
        )));
    }
    Ok(())
}

/// Which way a cycle goes.
#[derive(Clone)]
enum Via {
    Streams(Client),
    Http(reqwest::Client, Arc<str>, Arc<str>),
}

/// `users` sessions each running the cycle, closed loop (`interval` None) or
/// each at one step per `interval` from `start` (open loop, latency from the
/// scheduled send, as latency::open_loop measures it).
async fn cycles(
    via: Via,
    users: usize,
    w: Window,
    start: Instant,
    interval: Option<Duration>,
) -> Result<(u64, Histogram<u64>), Error> {
    let shared = Arc::new(Mutex::new(hist()));
    let mut tasks = Vec::new();
    for c in 0..users {
        let via = via.clone();
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let (license, session) = session_of(c);
            let session = format!("g{session}");
            let mut h = hist();
            let mut ops = 0u64;
            let mut lease = String::new();
            let mut step = Step::Acquire;
            let mut due = interval.map(|i| start + i.mul_f64(c as f64 / users as f64));
            loop {
                let begun = match (due, interval) {
                    (Some(at), Some(_)) => {
                        if at >= w.stop_at {
                            break;
                        }
                        let busy_past_due = Instant::now() > at;
                        tokio::time::sleep_until(at.into()).await;
                        if busy_past_due {
                            at
                        } else {
                            Instant::now()
                        }
                    }
                    _ => {
                        if Instant::now() >= w.stop_at {
                            break;
                        }
                        Instant::now()
                    }
                };
                match &via {
                    Via::Streams(client) => stream_step(client, &license, &session, step).await?,
                    Via::Http(http, base, token) => {
                        http_step(http, base, token, &license, &session, step, &mut lease).await?
                    }
                }
                if begun >= w.measure_from {
                    let _ = h.record(begun.elapsed().as_micros() as u64);
                    ops += 1;
                }
                step = step.next();
                if let (Some(at), Some(i)) = (due.as_mut(), interval) {
                    *at += i;
                }
            }
            // Leave nothing held for the next row.
            while !matches!(step, Step::Acquire) {
                match &via {
                    Via::Streams(client) => stream_step(client, &license, &session, Step::Release).await?,
                    Via::Http(http, base, token) => {
                        http_step(http, base, token, &license, &session, Step::Release, &mut lease).await?
                    }
                }
                step = Step::Acquire;
            }
            shared.lock().await.add(&h).map_err(bench_err)?;
            Ok::<u64, Error>(ops)
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.map_err(bench_err)??;
    }
    let h = shared.lock().await.clone();
    Ok((ops, h))
}

/// The scenario.
pub(super) async fn run(b: &mut Bench<'_>) -> Result<(), Error> {
    // reqwest is built without a TLS provider of its own (the gateway's
    // features): it needs the process's before a client is made.
    seatgate_gateway::use_ring_for_tls();
    let bin = seatgate_bin(b.opts.seatgate_bin.as_ref())?;
    b.reset().await?;
    let (token, _) = TokenStore::new(&b.settings.keys.prefix)
        .issue(
            &mut b.con,
            &NewToken {
                app: b.settings.client.name.clone(),
                user: None,
                group: None,
                expires_in: None,
                issued_by: "seatgate-bench".into(),
                note: String::new(),
            },
        )
        .await
        .map_err(bench_err)?;
    let fleet = Fleet::start(&b.settings, 1).await?;
    let result = measure(b, &bin, token).await;
    fleet.stop().await;
    result
}

async fn measure(b: &mut Bench<'_>, bin: &Path, token: String) -> Result<(), Error> {
    let gw = GatewayChild::start(bin, &b.settings.redis.url).await?;
    let client = b.settings.client().connect().await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .map_err(bench_err)?;
    let via_http = Via::Http(http, gw.base.as_str().into(), token.as_str().into());

    let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
    let (ops, h) = cycles(Via::Streams(client.clone()), CLIENTS, w, Instant::now(), None).await?;
    let streams = row(
        "gateway",
        format!("streams clients={CLIENTS} workers=1"),
        ops,
        w.length(),
        Some(&h),
        "acquire, heartbeat, release through the requests stream: one shared Rust client".into(),
    );
    let stream_rate = streams.ops_per_sec;
    b.emit(streams);

    let w = Window::new(Instant::now(), b.opts.warmup, b.opts.duration);
    let (ops, h) = cycles(via_http.clone(), CLIENTS, w, Instant::now(), None).await?;
    let mut r = row(
        "gateway",
        format!("http clients={CLIENTS} workers=1"),
        ops,
        w.length(),
        Some(&h),
        String::new(),
    );
    r.note = format!(
        "the same cycle through seatgate gateway, plain HTTP/1.1 keep-alive on loopback: {:.0}% of the stream path above",
        100.0 * r.ops_per_sec / stream_rate.max(1e-9)
    );
    b.emit(r);

    let start = Instant::now() + Duration::from_millis(200);
    let w = Window::new(start, b.opts.warmup, b.opts.duration);
    let interval = Duration::from_secs_f64(CLIENTS as f64 / RATE);
    let (ops, h) = cycles(via_http, CLIENTS, w, start, Some(interval)).await?;
    let mut r = row(
        "gateway",
        format!("http {RATE:.0}/s"),
        ops,
        w.length(),
        Some(&h),
        String::new(),
    );
    r.note = format!("open loop, {CLIENTS} users, latency from the scheduled send");
    b.emit(r);

    let r = idle_streams(&gw, &token).await?;
    b.emit(r);
    let _ = client.close().await;
    Ok(())
}

/// Opens [`STREAMS`] event streams and holds them: the gateway's resident
/// memory before and after.
async fn idle_streams(gw: &GatewayChild, token: &str) -> Result<Row, Error> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(bench_err)?;
    // Warm the gateway's reader and allocator with one stream first.
    let url = |i: usize| format!("{}/v1/licenses/bench-0/seats/idle-{i}/events", gw.base);
    let first = http
        .get(url(STREAMS))
        .bearer_auth(token)
        .send()
        .await
        .map_err(bench_err)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = gw.rss_kib()?;
    let mut held = Vec::with_capacity(STREAMS);
    let t = Instant::now();
    for chunk in (0..STREAMS).collect::<Vec<_>>().chunks(OPEN_AT_ONCE) {
        let opened =
            futures_util::future::join_all(chunk.iter().map(|&i| http.get(url(i)).bearer_auth(token).send()))
                .await;
        for r in opened {
            let r = r.map_err(bench_err)?;
            if !r.status().is_success() {
                return Err(bench_err(format!("an event stream was refused: {}", r.status())));
            }
            held.push(r);
        }
    }
    let opened_in = t.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = gw.rss_kib()?;
    drop(held);
    drop(first);
    let per = (after.saturating_sub(before) * 1024) as f64 / STREAMS as f64;
    Ok(note_row(
        "gateway",
        format!("{STREAMS} idle SSE streams"),
        format!(
            "gateway resident memory {before} KiB -> {after} KiB: {per:.0} bytes per open stream (user space; each also holds a TCP socket in the kernel); opened in {opened_in:.1?}"
        ),
    ))
}
