//! What a measured window cost Redis: its CPU per request (`INFO cpu`) and
//! the commands it ran (`INFO commandstats`), each the difference of two
//! snapshots taken where the window starts and ends.
//!
//! Differences rather than `CONFIG RESETSTAT` before each scenario: the
//! figures are the same, the warm-up stays out of them, and a `--bench-redis`
//! keeps its own statistics (and needs no `CONFIG` rights).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::harness::{bench_err, info_field, Window};
use super::Row;
use crate::Error;
use seatgate::config::Settings;
use seatgate_core::db::Db;

/// Redis's work for one row's requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RedisCost {
    /// Server CPU (user + system, every thread: `used_cpu_user` +
    /// `used_cpu_sys`) over the measured window, per request, µs. Unlike the
    /// commands' own times it includes Redis's network work.
    pub cpu_us_per_op: f64,
    /// The requests of the window that figure is divided by.
    pub ops: u64,
    /// Every command Redis ran in the window, most total time first. A
    /// script's own commands are counted too, and their time is also inside
    /// the script's (FCALL, or the seed's EVALSHA): do not add the two up.
    pub commands: Vec<CommandCost>,
}

/// One command's share of a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandCost {
    /// Redis's name for it (`evalsha`, `xadd`, `client|setname`).
    pub command: String,
    /// Calls in the window.
    pub calls: u64,
    /// Calls per request.
    pub calls_per_op: f64,
    /// Mean Redis time per call, µs (`usec` / `calls`).
    pub usec_per_call: f64,
}

impl CommandCost {
    /// Its Redis time per request, µs.
    pub fn us_per_op(&self) -> f64 {
        self.calls_per_op * self.usec_per_call
    }
}

/// Redis's cumulative counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Snapshot {
    /// `used_cpu_user` + `used_cpu_sys`, seconds.
    cpu_s: f64,
    /// Command -> (calls, usec) from `INFO commandstats`.
    commands: BTreeMap<String, (u64, u64)>,
}

/// The probe's own command: it runs in every window and is nobody's request.
const PROBE_COMMAND: &str = "info";

impl Snapshot {
    /// Reads the counters from the text of `INFO cpu` and `INFO commandstats`.
    fn parse(cpu: &str, commandstats: &str) -> Snapshot {
        let secs = |k: &str| {
            info_field(cpu, k)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // cmdstat_<name>:calls=<n>,usec=<n>,usec_per_call=<f>,rejected_calls=<n>,failed_calls=<n>
        let commands = commandstats
            .lines()
            .filter_map(|line| {
                let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |k: &str| {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix(k)?.strip_prefix('=')?.parse::<u64>().ok())
                };
                Some((name.to_owned(), (field("calls")?, field("usec")?)))
            })
            .collect();
        Snapshot {
            cpu_s: secs("used_cpu_user") + secs("used_cpu_sys"),
            commands,
        }
    }

    /// The counters now, in one round trip.
    pub(super) async fn take(con: &mut Db) -> Result<Snapshot, Error> {
        let (cpu, commandstats): (String, String) = redis::pipe()
            .cmd("INFO")
            .arg("cpu")
            .cmd("INFO")
            .arg("commandstats")
            .query_async(con)
            .await?;
        Ok(Snapshot::parse(&cpu, &commandstats))
    }
}

/// What happened between `before` and `after`, spread over `ops` requests
/// (None when there were none to spread it over).
pub(super) fn cost(before: &Snapshot, after: &Snapshot, ops: u64) -> Option<RedisCost> {
    if ops == 0 {
        return None;
    }
    let per_op = ops as f64;
    let mut commands: Vec<CommandCost> = after
        .commands
        .iter()
        .filter(|(name, _)| name.as_str() != PROBE_COMMAND)
        .filter_map(|(name, &(calls, usec))| {
            let (calls0, usec0) = before.commands.get(name).copied().unwrap_or((0, 0));
            // Counters only grow; a smaller one means Redis reset them
            // (CONFIG RESETSTAT, a restart) inside the window: count from zero.
            let (calls, usec) = if calls >= calls0 && usec >= usec0 {
                (calls - calls0, usec - usec0)
            } else {
                (calls, usec)
            };
            (calls > 0).then(|| CommandCost {
                command: name.clone(),
                calls,
                calls_per_op: calls as f64 / per_op,
                usec_per_call: usec as f64 / calls as f64,
            })
        })
        .collect();
    commands.sort_by(|a, b| b.us_per_op().total_cmp(&a.us_per_op()));
    Some(RedisCost {
        cpu_us_per_op: (after.cpu_s - before.cpu_s).max(0.0) * 1e6 / per_op,
        ops,
        commands,
    })
}

/// Takes a snapshot where a window starts and another where it ends, on
/// its own connection, while the scenario runs.
pub(super) struct Probe {
    /// The two snapshots, once the window has ended.
    task: JoinHandle<Result<(Snapshot, Snapshot), Error>>,
    /// The window's measured length, to count its requests from a row's rate.
    length: Duration,
}

impl Probe {
    /// Connects now (within the warm-up) and watches `window`.
    pub(super) async fn start(settings: &Settings, window: Window) -> Result<Probe, Error> {
        let mut con = Db::connect(&settings.redis).await?;
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(window.measure_from.into()).await;
            let before = Snapshot::take(&mut con).await?;
            tokio::time::sleep_until(window.stop_at.into()).await;
            let after = Snapshot::take(&mut con).await?;
            Ok((before, after))
        });
        Ok(Probe {
            task,
            length: window.length(),
        })
    }

    /// The window's cost for a row measured over it at `ops_per_sec`.
    pub(super) async fn finish(self, ops_per_sec: f64) -> Result<Option<RedisCost>, Error> {
        let (before, after) = self.task.await.map_err(bench_err)??;
        let ops = (ops_per_sec * self.length.as_secs_f64()).round() as u64;
        Ok(cost(&before, &after, ops))
    }
}

/// `run`, a row measured over `window`, with what the window cost Redis.
pub(super) async fn costed(
    settings: &Settings,
    window: Window,
    run: impl Future<Output = Result<Row, Error>>,
) -> Result<Row, Error> {
    let probe = Probe::start(settings, window).await?;
    match run.await {
        Ok(mut row) => {
            row.redis = probe.finish(row.ops_per_sec).await?;
            Ok(row)
        }
        Err(e) => {
            probe.task.abort();
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(cpu_user: f64, cpu_sys: f64, stats: &[(&str, u64, u64)]) -> Snapshot {
        let cpu = format!(
            "# CPU\r\nused_cpu_sys:{cpu_sys}\r\nused_cpu_user:{cpu_user}\r\nused_cpu_sys_children:9.0\r\nused_cpu_user_children:9.0\r\nused_cpu_sys_main_thread:7.0\r\nused_cpu_user_main_thread:7.0\r\n"
        );
        let mut cs = String::from("# Commandstats\r\n");
        for (name, calls, usec) in stats {
            let per = if *calls > 0 {
                *usec as f64 / *calls as f64
            } else {
                0.0
            };
            cs.push_str(&format!(
                "cmdstat_{name}:calls={calls},usec={usec},usec_per_call={per:.2},rejected_calls=0,failed_calls=0\r\n"
            ));
        }
        Snapshot::parse(&cpu, &cs)
    }

    #[test]
    fn parses_server_cpu_not_children_nor_main_thread_alone() {
        let s = snap(1.5, 0.25, &[("evalsha", 10, 250), ("client|setname", 2, 3)]);
        assert_eq!(s.cpu_s, 1.75);
        assert_eq!(s.commands["evalsha"], (10, 250));
        assert_eq!(s.commands["client|setname"], (2, 3));
    }

    #[test]
    fn cpu_per_request_is_the_window_delta_over_its_requests() {
        let before = snap(10.0, 2.0, &[("evalsha", 100, 2_000), ("info", 5, 50)]);
        // 0.3 s user + 0.1 s sys over 20,000 requests = 20 µs each.
        let after = snap(
            10.3,
            2.1,
            &[
                ("evalsha", 20_100, 482_000),
                ("xadd", 30_000, 42_000),
                ("info", 7, 70),
            ],
        );
        let c = cost(&before, &after, 20_000).expect("requests were made");
        assert!((c.cpu_us_per_op - 20.0).abs() < 1e-9, "{}", c.cpu_us_per_op);
        assert_eq!(c.ops, 20_000);
        let names: Vec<&str> = c.commands.iter().map(|c| c.command.as_str()).collect();
        assert_eq!(
            names,
            ["evalsha", "xadd"],
            "most time first, the probe's INFO left out"
        );
        let evalsha = &c.commands[0];
        assert_eq!(evalsha.calls, 20_000);
        assert_eq!(evalsha.calls_per_op, 1.0);
        assert_eq!(evalsha.usec_per_call, 24.0);
        let xadd = &c.commands[1];
        assert_eq!(xadd.calls_per_op, 1.5);
        assert!((xadd.usec_per_call - 1.4).abs() < 1e-9);
        assert!((xadd.us_per_op() - 2.1).abs() < 1e-9);
    }

    #[test]
    fn no_requests_no_cost_and_counters_reset_inside_the_window_count_from_zero() {
        let before = snap(1.0, 1.0, &[("evalsha", 1_000, 9_000)]);
        let after = snap(1.5, 1.0, &[("evalsha", 10, 200)]);
        assert_eq!(cost(&before, &after, 0), None);
        let c = cost(&before, &after, 10).expect("requests were made");
        assert_eq!(c.commands[0].calls, 10);
        assert_eq!(c.commands[0].usec_per_call, 20.0);
        assert!((c.cpu_us_per_op - 50_000.0).abs() < 1e-6);
        // Commands idle in the window do not show.
        let idle = cost(&before, &snap(1.0, 1.0, &[("evalsha", 1_000, 9_000)]), 5).expect("requests");
        assert!(idle.commands.is_empty());
        assert_eq!(idle.cpu_us_per_op, 0.0);
    }
}
