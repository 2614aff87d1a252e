//! The history checker in the suite (issue 22): short seeded runs of real
//! processes — redis-server with an fsynced AOF, three `seatgate run`
//! workers, eight clients, an administrator — under seeded faults (kill -9
//! and SIGSTOP of workers, kill -9 and restart of Redis, Redis stopped and
//! paused, license seats changed, a license deleted and created again while
//! in use), each checked against the model in `seatgate::tools::history`.
//! `bash ops/history.sh` is the long run; `bash ops/mutate.sh` shows these
//! checks catch broken seat rules.

use seatgate::tools::history::{self, Options};

use crate::support::BIN;

/// Three seeds, one after another (each runs eight clients and three
/// workers: in parallel they would starve each other's heartbeats on a
/// small machine), 35 s of ops each plus the quiesce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_histories_under_faults_have_no_anomalies() {
    let mut failed = Vec::new();
    for seed in [1, 2, 3] {
        let opts = Options::short(BIN, seed, 35);
        let recorded = history::run(&opts).await.expect("history run");
        let checked = history::check(&recorded);
        println!("{checked}");
        assert!(
            checked.requests > 100,
            "seed {seed}: too few requests to mean anything:\n{checked}"
        );
        assert!(
            checked.faults.values().sum::<usize>() >= 3,
            "seed {seed}: too few faults:\n{checked}"
        );
        if !checked.anomalies.is_empty() {
            failed.push(checked.to_string());
        }
    }
    assert!(failed.is_empty(), "anomalies:\n{}", failed.join("\n"));
}
