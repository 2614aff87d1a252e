//! The history checker in the suite (issue 22): short seeded runs of real
//! processes — redis-server with an fsynced AOF, three `seatgate run`
//! workers, eight clients, an administrator — under seeded faults (kill -9
//! and SIGSTOP of workers, kill -9 and restart of Redis, Redis stopped and
//! paused, license seats changed, a license deleted and created again while
//! in use), each checked against the model in `seatgate_history`;
//! and one run on a Redis Cluster whose Redis faults include a coordinated
//! master failover.
//! `bash ops/history.sh` is the long run; `bash ops/mutate.sh` shows these
//! checks catch broken seat rules.

use seatgate_history::{self as history, Options};

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

/// One seeded run on a Redis Cluster (3 masters with a replica each, 6
/// shards: the four licenses' keys and events shards on all three masters,
/// events relayed from each license's log), under worker faults, master
/// stops and pauses and at least one coordinated master failover
/// (`CLUSTER FAILOVER`): the same checks, no anomaly. It runs beside the
/// seeds above (the module in about 2.5 minutes on 2 cores; one after the
/// other would take about 3.5): a cluster run's heartbeats come from the
/// same clients at the same pace, and the checks judge only holds whose
/// heartbeats came in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_history_on_a_cluster_with_a_master_failover_has_no_anomalies() {
    let opts = Options {
        cluster: true,
        ..Options::short(BIN, 5, 35)
    };
    let recorded = history::run(&opts).await.expect("history run");
    let checked = history::check(&recorded);
    println!("{checked}");
    for f in &recorded.faults {
        println!("  fault at {:?}: {} {:?}", f.at, f.kind.as_str(), f.detail);
    }
    assert!(
        checked.requests > 100,
        "too few requests to mean anything:\n{checked}"
    );
    let failovers = checked.faults.get("cluster_failover").copied().unwrap_or(0);
    assert!(failovers >= 1, "no master failed over:\n{checked}");
    // Each failover moved a master: the recorded old and new ports differ.
    for f in recorded
        .faults
        .iter()
        .filter(|f| f.kind.as_str() == "cluster_failover")
    {
        let detail = f.detail.as_deref().unwrap_or("");
        let ports: Vec<&str> = detail
            .rsplit(": master ")
            .next()
            .unwrap_or("")
            .split(" -> ")
            .collect();
        assert!(
            ports.len() == 2 && ports[0] != ports[1],
            "a failover that moved nothing: {detail:?}"
        );
    }
    assert!(checked.anomalies.is_empty(), "anomalies:\n{checked}");
}
