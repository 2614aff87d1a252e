//! seatgate behind Redis Sentinel (real `redis-server --sentinel`
//! processes): workers and clients find the master through the Sentinels,
//! and follow it when the master is killed and a replica promoted.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_core::status::Status;
use seatgate_testkit::LocalSentinel;
use tokio_util::sync::CancellationToken;

use crate::support::{
    acquire, db, holders, json, output, prefixed_settings, put_license, seatgate_cmd, spawn_worker,
    watch_holders, WorkerProcess, BIN,
};

/// How long one attempt waits for its reply (longer than a failover).
const T: Duration = Duration::from_secs(5);

/// Settings for `deployment` under key prefix `prefix`.
fn settings(deployment: &LocalSentinel, prefix: &str) -> Settings {
    let mut s = prefixed_settings(prefix);
    deployment.apply(&mut s.redis);
    s
}

/// What became of the acquires of one burst.
#[derive(Default)]
struct Burst {
    /// Requests sent, one per session.
    sent: usize,
    /// Answered at the first attempt.
    first_try: usize,
    /// Answered only when sent again (the first attempt's entry or reply
    /// was lost with the master, or it timed out while it failed over).
    after_retry: usize,
    /// Never answered, however often sent within the deadline.
    lost: usize,
    /// Sessions told they hold a seat (ACQUIRED or ALREADY_ACTIVE), by license.
    held: HashMap<String, HashSet<String>>,
}

/// Each license's client sends `n` acquires, one per session, `gap` apart;
/// one that fails (no reply in time, Redis failing over) is sent again
/// until `deadline`, as a caller retries.
async fn burst(
    s: &Settings,
    licenses: &[String],
    tag: &str,
    n: usize,
    gap: Duration,
    deadline: Duration,
) -> Burst {
    let mut tasks = Vec::new();
    for (idx, l) in licenses.iter().enumerate() {
        let (s, l, tag) = (s.clone(), l.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            let c = s
                .client()
                .connect()
                .await
                .expect("client connects through the Sentinels");
            let until = Instant::now() + deadline;
            let mut out = Burst::default();
            for i in 0..n {
                tokio::time::sleep(gap).await;
                let session = format!("{tag}-{idx}-{i}");
                out.sent += 1;
                let mut attempts = 0;
                let status = loop {
                    attempts += 1;
                    match c.call(&acquire(&l, &session, 0), T).await {
                        Ok(reply) => break Some(reply.status()),
                        Err(_) if Instant::now() < until => {
                            tokio::time::sleep(Duration::from_millis(50)).await
                        }
                        Err(_) => break None,
                    }
                };
                match (status, attempts) {
                    (None, _) => out.lost += 1,
                    (Some(_), 1) => out.first_try += 1,
                    (Some(_), _) => out.after_retry += 1,
                }
                if matches!(status, Some(Status::Acquired | Status::AlreadyActive)) {
                    out.held.entry(l.clone()).or_default().insert(session);
                }
            }
            out
        }));
    }
    let mut all = Burst::default();
    for t in tasks {
        let b = t.await.expect("burst task");
        all.sent += b.sent;
        all.first_try += b.first_try;
        all.after_retry += b.after_retry;
        all.lost += b.lost;
        for (l, sessions) in b.held {
            all.held.entry(l).or_default().extend(sessions);
        }
    }
    all
}

/// Three runs, each on a fresh deployment (a master, one replica, three
/// Sentinels): kill -9 of the master during a burst of acquires from 12
/// licenses' clients; a Sentinel promotes the replica; the workers and
/// clients, configured with the Sentinels only, find it. Every request is
/// answered (sent again by its caller when an attempt fails), no license
/// is ever overbooked, and every seat a caller was told it holds is held on
/// the promoted master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_burst_is_replaced_by_sentinel_and_seatgate_follows() {
    for run in 1..=3 {
        let mut deployment = LocalSentinel::start(1, 3).await.expect("a Sentinel deployment");
        let s = settings(&deployment, &format!("sn{run}"));
        // Half the licenses have a seat for every session (so seats are
        // granted right up to the kill), half run out (so refusals are too).
        let licenses: Vec<String> = (0..12).map(|i| format!("sn-{i}")).collect();
        let seats = |idx: usize| if idx % 2 == 0 { 40 } else { 5 };
        for (idx, l) in licenses.iter().enumerate() {
            put_license(&s, l, seats(idx)).await;
        }
        let w1 = spawn_worker(s.clone(), "w1").await;
        let w2 = spawn_worker(s.clone(), "w2").await;

        let before = burst(
            &s,
            &licenses,
            "before",
            3,
            Duration::ZERO,
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            before.first_try, before.sent,
            "run {run}: every request before the kill answered at once"
        );

        let stop = CancellationToken::new();
        let watched: Vec<&str> = licenses.iter().skip(1).step_by(2).map(String::as_str).collect();
        let sampler = watch_holders(&s, &watched, stop.clone());
        let during = {
            let (s, licenses) = (s.clone(), licenses.clone());
            tokio::spawn(async move {
                burst(
                    &s,
                    &licenses,
                    "during",
                    30,
                    Duration::from_millis(20),
                    Duration::from_secs(60),
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;

        let victim = deployment
            .master_port()
            .await
            .expect("the Sentinels name a master");
        deployment.kill9(victim);
        let killed = Instant::now();
        let promoted = deployment
            .promoted(victim, Duration::from_secs(30))
            .await
            .expect("a replica promoted");
        let took = killed.elapsed();

        let during = during.await.expect("burst");
        let after = burst(&s, &licenses, "after", 3, Duration::ZERO, Duration::from_secs(30)).await;
        stop.cancel();
        let watch = sampler.await.expect("sampler");

        // Every seat a caller was told it holds, on the promoted master.
        let mut acknowledged = 0;
        let mut missing = Vec::new();
        for (idx, l) in licenses.iter().enumerate() {
            let now: HashSet<String> = holders(&s, l).await.into_iter().collect();
            let of = seats(idx) as usize;
            assert!(
                now.len() <= of,
                "run {run}: license {l} overbooked: {} holders of {of}",
                now.len()
            );
            for burst in [&before, &during, &after] {
                for session in burst.held.get(l).into_iter().flatten() {
                    acknowledged += 1;
                    if !now.contains(session) {
                        missing.push(format!("{l}/{session}"));
                    }
                }
            }
        }
        eprintln!(
            "sentinel run {run}: master :{victim} killed, :{promoted} promoted after {took:?}; \
             around the kill {} sent, {} answered at once, {} answered when sent again, {} lost; \
             after it {} of {} answered at once; {acknowledged} seats acknowledged, {} missing; \
             most holders of a 5-seat license seen {}",
            during.sent,
            during.first_try,
            during.after_retry,
            during.lost,
            after.first_try,
            after.sent,
            missing.len(),
            watch.most.0,
        );
        assert_eq!(during.lost, 0, "run {run}: requests never answered");
        assert_eq!(
            after.lost, 0,
            "run {run}: requests after the promotion never answered"
        );
        assert!(watch.samples > 0, "run {run}: the sampler ran");
        assert!(
            watch.most.0 <= 5,
            "run {run}: overbooked during the failover: {:?}",
            watch.most
        );
        assert!(
            missing.is_empty(),
            "run {run}: acknowledged seats lost: {missing:?}"
        );
        // The workers write to the promoted master.
        let mut con = db(&s).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut con).await.expect("ROLE");
        assert_eq!(
            redis::from_redis_value::<String>(role[0].clone()).ok().as_deref(),
            Some("master")
        );
        w1.stop().await;
        w2.stop().await;
    }
}

/// The `SEATGATE__*` variables that put a process in Sentinel mode for `deployment`.
fn sentinel_env(deployment: &LocalSentinel) -> Vec<(&'static str, String)> {
    vec![
        ("SEATGATE__REDIS__SENTINEL__URLS", deployment.urls().join(",")),
        (
            "SEATGATE__REDIS__SENTINEL__MASTER_NAME",
            LocalSentinel::MASTER_NAME.to_owned(),
        ),
    ]
}

/// `--redis` names no server at all: in Sentinel mode the URL is unused.
const NOWHERE: &str = "redis://127.0.0.1:1";

/// The programs as an operator runs them, configured from the environment
/// with the Sentinels only: `seatgate run` serves, `seatgate license put`,
/// `acquire` and `status` work; after kill -9 of the master the same worker
/// process serves from the promoted replica, and the CLI finds it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_and_the_cli_follow_the_master_through_a_failover() {
    let mut deployment = LocalSentinel::start(1, 3).await.expect("a Sentinel deployment");
    let env = sentinel_env(&deployment);
    let cli = |args: &[&str]| {
        let mut cmd = seatgate_cmd(NOWHERE, args);
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        output(cmd)
    };
    let o = cli(&["check-config"]).await;
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("the master \"seatgate\" of 3 Sentinel(s)"),
        "{o:?}"
    );
    let o = cli(&["license", "put", "cad", "--seats", "2"]).await;
    assert!(o.status.success(), "{o:?}");
    let worker = WorkerProcess::start(NOWHERE, &env).await;
    let o = cli(&["acquire", "--license", "cad", "--session", "before"]).await;
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("ACQUIRED"), "{o:?}");

    let victim = deployment.master_port().await.expect("a master");
    deployment.kill9(victim);
    deployment
        .promoted(victim, Duration::from_secs(30))
        .await
        .expect("a replica promoted");

    // The CLI's first attempt may meet the worker still reconnecting: a
    // caller sends again after a timeout, as the CLI's exit code 4 asks.
    let deadline = Instant::now() + Duration::from_secs(30);
    let o = loop {
        let o = cli(&["acquire", "--license", "cad", "--session", "after"]).await;
        if o.status.success() || Instant::now() > deadline {
            break o;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(String::from_utf8_lossy(&o.stdout).contains("ACQUIRED"), "{o:?}");
    let o = cli(&["status", "--json"]).await;
    assert!(o.status.success(), "{o:?}");
    let status = json(&String::from_utf8_lossy(&o.stdout));
    let text = status.to_string();
    assert!(
        text.contains("\"before\"") && text.contains("\"after\""),
        "both seats held: {text}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker.status("/ready").await != Some(200) {
        assert!(
            Instant::now() < deadline,
            "the worker is not ready on the new master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `check-config` refuses Sentinel settings without a master name, and
/// Sentinel and Cluster settings together, naming the keys.
#[tokio::test]
async fn check_config_names_what_is_wrong_with_sentinel_settings() {
    let check = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("check-config");
        cmd.envs(env.iter().copied());
        output(cmd)
    };
    let sentinels = (
        "SEATGATE__REDIS__SENTINEL__URLS",
        "redis://127.0.0.1:26379,redis://127.0.0.1:26380",
    );
    let o = check(&[sentinels]).await;
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("redis.sentinel.master_name"),
        "{o:?}"
    );
    let named = ("SEATGATE__REDIS__SENTINEL__MASTER_NAME", "prod");
    let o = check(&[sentinels, named]).await;
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("the master \"prod\" of 2 Sentinel(s)"),
        "{o:?}"
    );
    let o = check(&[
        sentinels,
        named,
        ("SEATGATE__REDIS__CLUSTER_URLS", "redis://127.0.0.1:7000"),
    ])
    .await;
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("redis.cluster_urls") && err.contains("redis.sentinel.urls"),
        "{err}"
    );
}
