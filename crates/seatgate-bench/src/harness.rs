//! What the scenarios share: the benchmark's settings and licenses, the
//! in-process worker fleet, histograms and rows, and Redis's own figures.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio_util::sync::CancellationToken;

use super::Row;
use crate::Error;
use seatgate::config::Settings;
use seatgate::runtime::health::Readiness;
use seatgate::runtime::worker::Worker;
use seatgate_client::Call;
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;
use seatgate_core::license::{self, LicenseSpec};
use seatgate_core::scripts::Scripts;

/// Licenses the throughput scenarios spread their sessions over.
pub(super) const LICENSES: usize = 100;

/// A typical ~60-byte session metadata record.
pub(super) const META: &str = r#"{"user_email":"user1234@example.com","hardware_id":"hw-5f3a9c"}"#;

/// [`META`] as the client sends it.
pub(super) fn meta() -> serde_json::Value {
    serde_json::json!({"user_email": "user1234@example.com", "hardware_id": "hw-5f3a9c"})
}

pub(super) fn bench_err(e: impl std::fmt::Display) -> Error {
    Error::Bench(e.to_string())
}

/// `loaded` as the benchmark runs it: no metrics endpoint, short blocks, no
/// per-session limit (a benchmark client is a retry loop by design) and no
/// scheduled reaper (the reaper scenario runs its passes itself).
pub fn bench_settings(loaded: &Settings) -> Settings {
    let mut s = loaded.clone();
    s.metrics.listen = String::new();
    s.stream.block_ms = 100;
    s.limits.session_requests = 0;
    s.reaper.enabled = false;
    s
}

/// Loads the scripts (pipelines do not re-load them) and provisions the
/// throughput scenarios' licenses `bench-0` .. `bench-99`, with more seats
/// than any run takes.
pub(super) async fn provision(con: &mut Db, keys: &Keys) -> Result<(), Error> {
    Scripts::get().load_all(con).await?;
    for i in 0..LICENSES {
        let spec = LicenseSpec {
            seats_total: 1_000_000,
            expires_at_ms: 0,
            active: true,
            heartbeat_timeout_ms: None,
        };
        license::put(con, keys, &format!("bench-{i}"), &spec).await?;
    }
    Ok(())
}

/// FLUSHALL and the scripts loaded: the start of the scenarios that build
/// their own data set.
pub(super) async fn wipe(con: &mut Db) -> Result<(), Error> {
    let _: () = redis::cmd("FLUSHALL").query_async(con).await?;
    Scripts::get().load_all(con).await?;
    Ok(())
}

/// When a scenario measures: after its warm-up, for its duration. Requests
/// count when sent inside it, and Redis's figures are read at its two ends.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    /// The end of the warm-up.
    pub(super) measure_from: Instant,
    /// The end of the measurement.
    pub(super) stop_at: Instant,
}

impl Window {
    /// A window of `length` after `warmup` counted from `start`.
    pub(super) fn new(start: Instant, warmup: Duration, length: Duration) -> Window {
        let measure_from = start + warmup;
        Window {
            measure_from,
            stop_at: measure_from + length,
        }
    }

    /// Its measured length.
    pub(super) fn length(&self) -> Duration {
        self.stop_at - self.measure_from
    }
}

pub(super) fn hist() -> Histogram<u64> {
    // 1 µs .. 60 s, 3 significant figures.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// A row of `ops` operations in `elapsed`, with the percentiles of `h`.
pub(super) fn row(
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
        redis: None,
        note,
    }
}

/// A row with a note only (no rate, no latency).
pub(super) fn note_row(scenario: &str, variant: String, note: String) -> Row {
    Row {
        scenario: scenario.into(),
        variant,
        ops_per_sec: 0.0,
        p50_us: None,
        p90_us: None,
        p99_us: None,
        p999_us: None,
        redis: None,
        note,
    }
}

pub(super) fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .map(|v| v.trim().to_owned())
}

/// Redis main-thread CPU seconds so far.
pub(super) async fn redis_cpu(con: &mut Db) -> Result<f64, Error> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(con).await?;
    let f = |k: &str| {
        info_field(&info, k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok(f("used_cpu_sys_main_thread") + f("used_cpu_user_main_thread"))
}

/// Redis's `used_memory`, bytes.
pub(super) async fn used_memory(con: &mut Db) -> Result<i64, Error> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(con).await?;
    Ok(info_field(&info, "used_memory")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// In-process workers for the seatgate scenarios.
pub struct Fleet {
    /// Stops them all.
    token: CancellationToken,
    /// Their run loops, awaited on stop.
    tasks: Vec<tokio::task::JoinHandle<Result<(), seatgate::Error>>>,
}

impl Fleet {
    /// Starts `workers` in-process workers (`bench-worker-<i>`) on `settings`.
    pub async fn start(settings: &Settings, workers: usize) -> Result<Fleet, Error> {
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

    /// Stops them and waits for each to finish.
    pub async fn stop(self) {
        self.token.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// One client's license and session (`bench-<n % 100>`, `c<n>`).
pub(super) fn session_of(client: usize) -> (String, String) {
    (format!("bench-{}", client % LICENSES), format!("c{client}"))
}

/// One step of a client's acquire → release cycle (the acquire carries metadata).
pub fn cycle_call(acquire: bool, license: &str, session: &str) -> Call {
    if acquire {
        Call::acquire(license, session).with_meta(meta())
    } else {
        Call::release(license, session)
    }
}
