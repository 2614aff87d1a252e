//! `seatgate-history`: one history run from the command line, for
//! ops/history.sh and ops/mutate.sh:
//!
//! ```sh
//! cargo run --release -p seatgate-history -- \
//!     --binary target/release/seatgate --seed 7 --secs 1800
//! ```
//!
//! Starts its own redis-server (with `--cluster`, a Redis Cluster of 3
//! masters with a replica each, whose Redis faults include a coordinated
//! master failover) and `seatgate run` workers (the `--binary` given), runs
//! clients and faults for `--secs`, checks the history and prints the
//! summary. Exit 0: no anomaly; 1: anomalies (printed with
//! their evidence); 2: the run itself failed (bad arguments, a process that
//! would not start).

use std::process::ExitCode;
use std::time::Duration;

use seatgate_history as history;
use seatgate_history::Options;

fn usage() -> ExitCode {
    eprintln!(
        "usage: seatgate-history --binary PATH [--seed N] [--secs N] [--workers N] [--clients N] [--no-faults] [--cluster [--master-kill9]]"
    );
    ExitCode::from(2)
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut opts = Options::short("target/debug/seatgate", 1, 40);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_default();
        match arg.as_str() {
            "--binary" => opts.binary = value().into(),
            "--seed" => match value().parse() {
                Ok(n) => opts.seed = n,
                Err(_) => return usage(),
            },
            "--secs" => match value().parse() {
                Ok(n) => opts.duration = Duration::from_secs(n),
                Err(_) => return usage(),
            },
            "--workers" => match value().parse() {
                Ok(n) => opts.workers = n,
                Err(_) => return usage(),
            },
            "--clients" => match value().parse() {
                Ok(n) => opts.clients = n,
                Err(_) => return usage(),
            },
            "--no-faults" => opts.faults = false,
            "--cluster" => opts.cluster = true,
            "--master-kill9" => opts.master_kill9 = true,
            _ => return usage(),
        }
    }
    eprintln!(
        "history: seed {} for {} s, {} workers, {} clients, faults {}{}",
        opts.seed,
        opts.duration.as_secs(),
        opts.workers,
        opts.clients,
        if opts.faults { "on" } else { "off" },
        if opts.cluster {
            ", on a Redis Cluster (3 masters, 3 replicas)"
        } else {
            ""
        }
    );
    if opts.master_kill9 && !opts.cluster {
        return usage();
    }
    let recorded = match history::run(&opts).await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("history: the run failed: {e}");
            return ExitCode::from(2);
        }
    };
    // HISTORY_DUMP=FILE: the whole record, for reading an anomaly's context.
    if let Ok(path) = std::env::var("HISTORY_DUMP") {
        if let Err(e) = std::fs::write(&path, format!("{recorded:#?}")) {
            eprintln!("history: cannot write {path}: {e}");
        }
    }
    let checked = history::check(&recorded);
    print!("{checked}");
    if checked.anomalies.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
