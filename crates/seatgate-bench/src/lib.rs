//! seatgate-bench: seatgate end to end beside the direct script path (FCALL) and
//! beside what one Redis core can do, in one run on one machine.
//!
//! Every scenario runs for a fixed time after a warm-up and reports
//! throughput and latency percentiles from an HDR histogram. Unless given a
//! URL, the benchmark starts its own redis-server on a free loopback port.
//!
//! This file holds the options, the report and the table of scenarios; the
//! scenarios live by kind in `throughput`, `latency`, `footprint`, `soak`,
//! `cluster`, `policy` and `gateway`, on the shared pieces of `harness`. Every direct call of
//! seatgate's scripts goes through `seat`, every call of the seed design's
//! through `seed`; `cost` reads what a measured window cost Redis, and
//! `compare` sets a run beside an earlier one (`--baseline`).

mod cluster;
mod compare;
mod cost;
mod error;
mod footprint;
mod gateway;
mod harness;
mod latency;
mod policy;
mod seat;
mod seed;
mod soak;
mod throughput;

pub use compare::{load_baseline, render_against};
pub use cost::{CommandCost, RedisCost};
pub use error::Error;
// What ops/callgrind.sh's end-to-end count (examples/script_calls.rs) shares
// with the benchmark: its workers' settings and fleet, and its request cycle.
pub use harness::{bench_settings, cycle_call, Fleet};

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use seatgate::config::{LimitSettings, Settings};
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;
use seatgate_testkit::LocalRedis;

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
    /// The `seatgate` binary the gateway scenario runs (None: the one beside the benchmark's).
    pub seatgate_bin: Option<std::path::PathBuf>,
}

/// One line of the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Scenario (seed, ceiling, direct, seatgate, fixed-rate, contention, reaper, memory, ...).
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
    /// What the measured window cost Redis, on the rows of scenarios that
    /// send requests at one Redis (absent elsewhere, and in reports from
    /// before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisCost>,
    /// Anything else worth printing.
    pub note: String,
}

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// How a scenario runs: it measures and [`Bench::emit`]s its rows.
type RunScenario = for<'a, 'p> fn(&'a mut Bench<'p>) -> BoxFuture<'a, Result<(), Error>>;

/// One entry of the table of scenarios.
struct Scenario {
    /// Its name, as `--only` and the report spell it.
    name: &'static str,
    /// Whether it runs when `--only` is not given; the long or costly ones
    /// run only when named.
    by_default: bool,
    /// Whether it wipes Redis (FLUSHALL) whatever `--flush` says, and so
    /// needs a Redis the benchmark may wipe. The others flush only when allowed.
    needs_flush: bool,
    /// The scenario itself.
    run: RunScenario,
}

impl Scenario {
    fn chosen(&self, only: &[String]) -> bool {
        if only.is_empty() {
            self.by_default
        } else {
            only.iter().any(|o| o == self.name)
        }
    }
}

/// Every scenario, in the order they run: later ones read what earlier ones
/// measured (the ratios to the seed, the ceiling and the direct path).
const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "seed",
        by_default: true,
        needs_flush: false,
        run: |b| Box::pin(throughput::seed(b)),
    },
    Scenario {
        name: "ceiling",
        by_default: true,
        needs_flush: false,
        run: |b| Box::pin(throughput::ceiling(b)),
    },
    Scenario {
        name: "direct",
        by_default: true,
        needs_flush: false,
        run: |b| Box::pin(throughput::direct(b)),
    },
    Scenario {
        name: "seatgate",
        by_default: true,
        needs_flush: false,
        run: |b| Box::pin(throughput::seatgate(b)),
    },
    Scenario {
        name: "fixed-rate",
        by_default: true,
        needs_flush: false,
        run: |b| Box::pin(latency::fixed_rate(b)),
    },
    Scenario {
        name: "contention",
        by_default: true,
        needs_flush: false,
        run: |b| Box::pin(latency::contention(b)),
    },
    Scenario {
        name: "policy",
        by_default: true,
        needs_flush: false,
        run: |b| Box::pin(policy::run(b)),
    },
    Scenario {
        name: "reaper",
        by_default: true,
        needs_flush: true,
        run: |b| Box::pin(footprint::reaper(b)),
    },
    Scenario {
        name: "gateway",
        by_default: false,
        needs_flush: false,
        run: |b| Box::pin(gateway::run(b)),
    },
    Scenario {
        name: "cluster",
        by_default: false,
        needs_flush: false,
        run: |b| Box::pin(cluster::run(b)),
    },
    Scenario {
        name: "soak",
        by_default: false,
        needs_flush: true,
        run: |b| Box::pin(soak::run(b)),
    },
    Scenario {
        name: "memory",
        by_default: true,
        needs_flush: true,
        run: |b| Box::pin(footprint::memory(b)),
    },
];

/// What the scenarios share: where they run, and what earlier ones measured.
struct Bench<'p> {
    /// The options of this run.
    opts: BenchOptions,
    /// The loaded settings pointed at the measured Redis, with no metrics
    /// endpoint, short blocks, no per-session limit (a benchmark client is a
    /// retry loop by design) and no scheduled reaper.
    settings: Settings,
    /// The per-session limits as loaded, for the soak scenario's real traffic.
    loaded_limits: LimitSettings,
    /// Key names under the settings' prefix.
    keys: Keys,
    /// A connection to the measured Redis.
    con: Db,
    /// Whether a scenario may FLUSHALL before it runs (a private Redis, or --flush).
    may_flush: bool,
    /// The seed's pipelined ops/s (0 = not measured), for the ceiling's ratio.
    seed_pipelined: f64,
    /// The seed's direct ops/s by client count, for the direct and seatgate
    /// rows' ratios at equal concurrency.
    seed_direct: HashMap<usize, f64>,
    /// The ceiling's ops/s (0 = not measured), for the seatgate rows' ratios.
    ceiling: f64,
    /// The direct path's ops/s by client count, for the seatgate rows' ratios.
    direct_best: HashMap<usize, f64>,
    /// The rows so far.
    rows: Vec<Row>,
    /// Told each row as it is measured.
    progress: &'p mut (dyn FnMut(&Row) + Send),
}

impl Bench<'_> {
    /// Reports a measured row.
    fn emit(&mut self, row: Row) {
        (self.progress)(&row);
        self.rows.push(row);
    }

    /// A clean slate for one measurement: FLUSHALL where allowed, the
    /// scripts loaded, the benchmark's licenses provisioned.
    async fn reset(&mut self) -> Result<(), Error> {
        if self.may_flush {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut self.con).await?;
        }
        harness::provision(&mut self.con, &self.keys).await
    }
}

/// Refuses, before anything runs, scenarios that would wipe a Redis the
/// benchmark may not wipe.
fn check_flush(chosen: &[&Scenario], may_flush: bool) -> Result<(), Error> {
    let wiping: Vec<&str> = chosen.iter().filter(|s| s.needs_flush).map(|s| s.name).collect();
    if may_flush || wiping.is_empty() {
        return Ok(());
    }
    let (names, need) = match wiping.as_slice() {
        [one] => (one.to_string(), "scenario needs a Redis it"),
        [first @ .., last] => (
            format!("{} and {last}", first.join(", ")),
            "scenarios need a Redis they",
        ),
        [] => unreachable!("checked above"),
    };
    Err(harness::bench_err(format!(
        "the {names} {need} may FLUSHALL (--flush)"
    )))
}

/// Runs the benchmark and returns its report; `progress` is told each row as it is measured.
pub async fn run(opts: BenchOptions, mut progress: impl FnMut(&Row) + Send) -> Result<Report, Error> {
    let chosen: Vec<&Scenario> = SCENARIOS.iter().filter(|s| s.chosen(&opts.only)).collect();
    // A private redis-server is the benchmark's own; another only with --flush.
    let may_flush = opts.redis_url.is_none() || opts.flush;
    check_flush(&chosen, may_flush)?;
    let local = match &opts.redis_url {
        Some(_) => None,
        // The memory settings of ops/redis.conf; persistence stays off so
        // that disk speed does not blur the figures. In a session of its
        // own, as a deployed Redis runs: in ours it would share the CPU
        // thread for thread with the clients' and workers' runtime.
        None => Some(
            LocalRedis::start_as_service(&[
                "--hash-max-listpack-value",
                "256",
                "--maxmemory-policy",
                "noeviction",
            ])
            .await?,
        ),
    };
    let url = opts
        .redis_url
        .clone()
        .or_else(|| local.as_ref().map(LocalRedis::url))
        .unwrap_or_default();
    let loaded = Settings::load(None)?;
    let mut settings = harness::bench_settings(&loaded);
    settings.redis.url = url;

    let mut con = seatgate::connect(&settings).await?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut con).await?;
    let redis_version = harness::info_field(&info, "redis_version").unwrap_or_default();
    let duration = opts.duration;
    let mut bench = Bench {
        opts,
        keys: settings.seat_keys(),
        settings,
        loaded_limits: loaded.limits,
        con,
        may_flush,
        seed_pipelined: 0.0,
        seed_direct: HashMap::new(),
        ceiling: 0.0,
        direct_best: HashMap::new(),
        rows: Vec::new(),
        progress: &mut progress,
    };
    for scenario in chosen {
        (scenario.run)(&mut bench).await?;
    }
    let rows = std::mem::take(&mut bench.rows);
    drop(bench);
    drop(local);
    Ok(Report {
        redis_version,
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        duration_s: duration.as_secs_f64(),
        rows,
    })
}

/// The table as text, then what each request cost Redis, command by command.
pub fn render(report: &Report) -> String {
    let mut out = format!(
        "seatgate bench: Redis {}, {} cores, {:.0} s per scenario\n\n{:<11} {:<56} {:>11} {:>8} {:>8} {:>8} {:>8} {:>12}  {}\n",
        report.redis_version, report.cores, report.duration_s, "scenario", "variant", "ops/s", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "Redis µs/req", "note"
    );
    let us = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    for r in &report.rows {
        let ops = if r.ops_per_sec > 0.0 {
            format!("{:.0}", r.ops_per_sec)
        } else {
            "-".into()
        };
        let cpu = r
            .redis
            .as_ref()
            .map(|c| format!("{:.1}", c.cpu_us_per_op))
            .unwrap_or_else(|| "-".into());
        let line = format!(
            "{:<11} {:<56} {:>11} {:>8} {:>8} {:>8} {:>8} {:>12}  {}",
            r.scenario,
            r.variant,
            ops,
            us(r.p50_us),
            us(r.p90_us),
            us(r.p99_us),
            us(r.p999_us),
            cpu,
            r.note
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let costed: Vec<&Row> = report.rows.iter().filter(|r| r.redis.is_some()).collect();
    if !costed.is_empty() {
        out.push_str(
            "\nRedis per request over each measured window: server CPU (INFO cpu), then each command's calls per request × µs per call (INFO commandstats; a script's own commands are inside its EVALSHA or FCALL time)\n",
        );
    }
    for r in costed {
        if let Some(c) = &r.redis {
            out.push_str(&format!(
                "{:<11} {:<56} {:>7.1} µs: {}\n",
                r.scenario,
                r.variant,
                c.cpu_us_per_op,
                command_breakdown(c)
            ));
        }
    }
    out
}

/// `evalsha 1.00×23.9, xadd 3.00×1.4, ...` (calls per request × µs per
/// call) for the commands worth at least [`SHOWN_US`] per request, and how
/// many smaller ones the JSON report has besides.
fn command_breakdown(c: &RedisCost) -> String {
    let (shown, small): (Vec<&CommandCost>, Vec<&CommandCost>) =
        c.commands.iter().partition(|k| k.us_per_op() >= SHOWN_US);
    let mut parts: Vec<String> = shown
        .iter()
        .map(|k| format!("{} {:.2}×{:.1}", k.command, k.calls_per_op, k.usec_per_call))
        .collect();
    if !small.is_empty() {
        parts.push(format!("{} more under {SHOWN_US} µs", small.len()));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The smallest Redis time per request, µs, of a command the table lists:
/// below it are mostly a script's own commands, already inside its EVALSHA or FCALL.
const SHOWN_US: f64 = 0.5;

#[cfg(test)]
mod tests {
    use super::*;

    fn names(only: &[&str]) -> Vec<&'static str> {
        let only: Vec<String> = only.iter().map(|s| s.to_string()).collect();
        SCENARIOS
            .iter()
            .filter(|s| s.chosen(&only))
            .map(|s| s.name)
            .collect()
    }

    #[test]
    fn the_default_run_leaves_out_soak_and_cluster() {
        assert_eq!(
            names(&[]),
            [
                "seed",
                "ceiling",
                "direct",
                "seatgate",
                "fixed-rate",
                "contention",
                "policy",
                "reaper",
                "memory"
            ]
        );
        assert_eq!(names(&["soak", "ceiling"]), ["ceiling", "soak"], "table order");
        assert_eq!(names(&["cluster"]), ["cluster"]);
    }

    #[test]
    fn scenarios_that_wipe_redis_are_refused_up_front_without_flush() {
        let pick = |wanted: &[&str]| -> Vec<&Scenario> {
            SCENARIOS.iter().filter(|s| wanted.contains(&s.name)).collect()
        };
        let err = |wanted: &[&str]| check_flush(&pick(wanted), false).unwrap_err().to_string();
        assert_eq!(
            err(&["ceiling", "reaper", "memory"]),
            "benchmark: the reaper and memory scenarios need a Redis they may FLUSHALL (--flush)"
        );
        assert_eq!(
            err(&["soak"]),
            "benchmark: the soak scenario needs a Redis it may FLUSHALL (--flush)"
        );
        assert!(check_flush(&pick(&["ceiling", "direct", "cluster"]), false).is_ok());
        assert!(check_flush(&pick(&["reaper", "soak", "memory"]), true).is_ok());
    }
}
