//! The same seatgate on a real Redis Cluster (3 masters + 3 replicas,
//! started by the test): sharded streams, the seat engine, the queue and
//! reaper, licenses on every master, and a master failover mid-burst.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use seatgate::client::{Call, Client};
use seatgate::config::Settings;
use seatgate::db::Db;
use seatgate::engine::keys::Keys;
use seatgate::engine::license::{self, LicenseSpec};
use seatgate::engine::protocol::Op;
use seatgate::engine::status::Status;
use seatgate::runtime::reaper::Reaper;
use seatgate::tools::local_redis::LocalCluster;

use crate::support::spawn_worker;

const T: Duration = Duration::from_secs(10);

/// Settings for `cluster` under their own key prefix, 4 shards.
fn settings(cluster: &LocalCluster, prefix: &str) -> Settings {
    let mut s = Settings::load(None).expect("defaults");
    s.redis.cluster_urls = cluster.urls();
    s.keys.prefix = prefix.into();
    s.stream.requests = format!("{prefix}:requests");
    s.stream.dead_letter = format!("{prefix}:requests:dead");
    s.events.stream = format!("{prefix}:events");
    s.stream.shards = 4;
    s.stream.block_ms = 100;
    s.stream.claim_idle_ms = 1_000;
    s.metrics.listen = String::new();
    s.limits.session_requests = 0;
    s
}

async fn provision(s: &Settings, license: &str, seats: u64, heartbeat_timeout_ms: Option<u64>) {
    let mut con = Db::connect(&s.redis).await.unwrap();
    let spec = LicenseSpec {
        seats_total: seats,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms,
    };
    license::put(&mut con, &Keys::new(s.keys.prefix.clone()), license, &spec)
        .await
        .unwrap();
}

async fn holders(s: &Settings, license: &str) -> Vec<String> {
    let mut con = Db::connect(&s.redis).await.unwrap();
    let key = Keys::new(s.keys.prefix.clone()).license(license).holders;
    let mut v: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    v.sort();
    v
}

fn acquire(license: &str, session: &str, wait_ms: u64) -> Call {
    Call::new(Op::Acquire, license, session)
        .with_meta(r#"{"user_email":"dev@example.com"}"#)
        .with_wait(wait_ms)
}

fn op(op: Op, license: &str, session: &str) -> Call {
    Call::new(op, license, session)
}

/// One cluster for the scenarios below, run one after the other with their
/// own key prefixes (starting a cluster costs seconds; the failover test
/// has its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seat_engine_queue_and_reaper_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(|| LocalCluster::start(3))
        .await
        .unwrap()
        .expect("cluster");
    assert_eq!(cluster.master_ports().len(), 3);
    hundred_acquires_over_sharded_streams(&cluster).await;
    round_trip_idempotency_release_heartbeat(&cluster).await;
    queue_reaper_and_self_healing(&cluster).await;
    licenses_on_every_master_served_by_two_workers(&cluster).await;
}

async fn hundred_acquires_over_sharded_streams(cluster: &LocalCluster) {
    let s = settings(cluster, "c1");
    provision(&s, "load", 10, None).await;
    let w1 = spawn_worker(s.clone(), "w1").await;
    let w2 = spawn_worker(s.clone(), "w2").await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect_with(&s).await.unwrap();
            c.call(&acquire("load", &format!("s{i}"), 0), T)
                .await
                .unwrap()
                .status()
        }));
    }
    let mut counts: HashMap<Status, usize> = HashMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_default() += 1;
    }
    assert_eq!(counts.get(&Status::Acquired), Some(&10), "{counts:?}");
    assert_eq!(counts.get(&Status::NoSeatsAvailable), Some(&90), "{counts:?}");
    assert_eq!(holders(&s, "load").await.len(), 10);
    w1.stop().await;
    w2.stop().await;
}

async fn round_trip_idempotency_release_heartbeat(cluster: &LocalCluster) {
    let s = settings(cluster, "c2");
    provision(&s, "lic", 1, None).await;
    let w = spawn_worker(s.clone(), "w1").await;
    let mut c = Client::connect_with(&s).await.unwrap();
    assert_eq!(
        c.call(&acquire("lic", "a", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    assert_eq!(
        c.call(&acquire("lic", "a", 0), T).await.unwrap().status(),
        Status::AlreadyActive
    );
    assert_eq!(
        c.call(&acquire("lic", "b", 0), T).await.unwrap().status(),
        Status::NoSeatsAvailable
    );
    let hb = c.call(&op(Op::Heartbeat, "lic", "a"), T).await.unwrap();
    assert_eq!((hb.status(), hb.int("heartbeats")), (Status::HeartbeatUpdated, 1));
    assert_eq!(
        c.call(&op(Op::Release, "lic", "a"), T).await.unwrap().status(),
        Status::Released
    );
    assert_eq!(
        c.call(&op(Op::Release, "lic", "a"), T).await.unwrap().status(),
        Status::SessionNotFound
    );
    // Events went to the license's events shard.
    let mut con = Db::connect(&s.redis).await.unwrap();
    let n: i64 = redis::cmd("XLEN")
        .arg(s.events_stream_for("lic"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(n, 2, "acquired + released on the license's events shard");
    w.stop().await;
}

async fn queue_reaper_and_self_healing(cluster: &LocalCluster) {
    let s = settings(cluster, "c3");
    provision(&s, "q", 1, Some(300)).await;
    let w = spawn_worker(s.clone(), "w1").await;
    let mut c = Client::connect_with(&s).await.unwrap();
    assert_eq!(
        c.call(&acquire("q", "first", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    let mut w2 = Client::connect_with(&s).await.unwrap();
    let id2 = w2.send(&acquire("q", "second", 30_000)).await.unwrap();
    assert_eq!(w2.wait_for(&id2, T).await.unwrap().status(), Status::Queued);
    let mut w3 = Client::connect_with(&s).await.unwrap();
    let id3 = w3.send(&acquire("q", "third", 30_000)).await.unwrap();
    assert_eq!(w3.wait_for(&id3, T).await.unwrap().int("position"), 2);

    let reaper = Reaper::new(Db::connect(&s.redis).await.unwrap(), &s);
    // Eviction: "first" never heartbeats; FIFO: "second" gets the seat.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let report = reaper.pass().await.unwrap();
    assert_eq!((report.evicted, report.granted), (1, 1));
    assert_eq!(w2.wait_for(&id2, T).await.unwrap().status(), Status::Granted);
    // Self-healing: free the seat behind seatgate's back; the next pass grants "third".
    let mut con = Db::connect(&s.redis).await.unwrap();
    let key = Keys::new(s.keys.prefix.clone()).license("q").holders;
    let _: i64 = redis::cmd("ZREM")
        .arg(&key)
        .arg("second")
        .query_async(&mut con)
        .await
        .unwrap();
    let report = reaper.pass().await.unwrap();
    assert_eq!(report.granted, 1);
    assert_eq!(w3.wait_for(&id3, T).await.unwrap().status(), Status::Granted);
    assert_eq!(holders(&s, "q").await, ["third"]);
    w.stop().await;
}

async fn licenses_on_every_master_served_by_two_workers(cluster: &LocalCluster) {
    let s = settings(cluster, "c4");
    let keys = Keys::new(s.keys.prefix.clone());
    let licenses: Vec<String> = (0..30).map(|i| format!("org-{i}")).collect();
    let masters: HashSet<u16> = licenses
        .iter()
        .filter_map(|l| cluster.master_of(&keys.license(l).holders))
        .collect();
    assert_eq!(masters.len(), 3, "the licenses' slots land on all three masters");
    let shard_masters: HashSet<u16> = s
        .request_streams()
        .iter()
        .filter_map(|k| cluster.master_of(k))
        .collect();
    eprintln!(
        "cluster: 30 licenses on {} masters; 4 request shards on {} masters",
        masters.len(),
        shard_masters.len()
    );
    for l in &licenses {
        provision(&s, l, 3, None).await;
    }
    let w1 = spawn_worker(s.clone(), "w1").await;
    let w2 = spawn_worker(s.clone(), "w2").await;
    let mut tasks = Vec::new();
    for l in licenses.clone() {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect_with(&s).await.unwrap();
            let mut got = Vec::new();
            for i in 0..5 {
                got.push(
                    c.call(&acquire(&l, &format!("u{i}"), 0), T)
                        .await
                        .unwrap()
                        .status(),
                );
            }
            got
        }));
    }
    for t in tasks {
        let got = t.await.unwrap();
        assert_eq!(
            got.iter().filter(|s| **s == Status::Acquired).count(),
            3,
            "{got:?}"
        );
        assert_eq!(
            got.iter().filter(|s| **s == Status::NoSeatsAvailable).count(),
            2,
            "{got:?}"
        );
    }
    for l in &licenses {
        assert_eq!(holders(&s, l).await.len(), 3, "{l}");
    }
    w1.stop().await;
    w2.stop().await;
}

/// kill -9 of a master during a burst: its replica is promoted, the workers
/// carry on, every request written after the promotion is answered, and the
/// seats are never exceeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_burst_fails_over_and_seatgate_carries_on() {
    let mut cluster = tokio::task::spawn_blocking(|| LocalCluster::start(3))
        .await
        .unwrap()
        .expect("cluster");
    let s = settings(&cluster, "fo");
    let keys = Keys::new(s.keys.prefix.clone());
    let licenses: Vec<String> = (0..12).map(|i| format!("fo-{i}")).collect();
    for l in &licenses {
        provision(&s, l, 5, None).await;
    }
    let w1 = spawn_worker(s.clone(), "w1").await;
    let w2 = spawn_worker(s.clone(), "w2").await;

    // Each license's client sends `n` acquires one after another, `gap` apart.
    let burst = |tag: &'static str, n: usize, gap: Duration| {
        let s = s.clone();
        let licenses = licenses.clone();
        async move {
            let mut tasks = Vec::new();
            for (idx, l) in licenses.into_iter().enumerate() {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    let mut statuses = Vec::new();
                    let mut c = match Client::connect_with(&s).await {
                        Ok(c) => c,
                        Err(_) => return statuses,
                    };
                    for i in 0..n {
                        tokio::time::sleep(gap).await;
                        match c.call(&acquire(&l, &format!("{tag}-{idx}-{i}"), 0), T).await {
                            Ok(r) => statuses.push(Some(r.status())),
                            Err(_) => statuses.push(None),
                        }
                    }
                    statuses
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all
        }
    };
    let before = burst("before", 8, Duration::ZERO).await;
    assert!(
        before.iter().all(|s| s.is_some()),
        "every request before the failover answered"
    );

    // Sample every license's holders throughout (reads fail while a master is down).
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let (s, stop, licenses) = (s.clone(), stop.clone(), licenses.clone());
        tokio::spawn(async move {
            let mut most = 0usize;
            let mut samples = 0usize;
            let mut con = Db::connect(&s.redis).await.unwrap();
            let keys = Keys::new(s.keys.prefix.clone());
            while !stop.is_cancelled() {
                for l in &licenses {
                    let n: redis::RedisResult<usize> = redis::cmd("ZCARD")
                        .arg(keys.license(l).holders)
                        .query_async(&mut con)
                        .await;
                    if let Ok(n) = n {
                        most = most.max(n);
                        samples += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (most, samples)
        })
    };
    // A burst in flight when the master dies.
    let during = tokio::spawn(burst("during", 40, Duration::from_millis(10)));
    tokio::time::sleep(Duration::from_millis(30)).await;

    let victim = cluster
        .master_of(&keys.license(&licenses[0]).holders)
        .expect("a master");
    cluster.kill9(victim);
    let promoted = Instant::now();
    loop {
        let masters = cluster.master_ports();
        if masters.len() == 3
            && !masters.contains(&victim)
            && cluster.wait_ok(Duration::from_millis(100)).is_ok()
        {
            break;
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(30),
            "no replica was promoted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "failover: replica promoted {:?} after kill -9 of master :{victim}",
        promoted.elapsed()
    );

    // Requests written after the promotion are all answered.
    let after = burst("after", 8, Duration::ZERO).await;
    assert!(
        after.iter().all(|s| s.is_some()),
        "every request after the promotion answered: {after:?}"
    );
    let during = during.await.unwrap();
    let answered = during.iter().filter(|s| s.is_some()).count();
    eprintln!(
        "failover: {answered} of {} requests sent around the kill answered",
        during.len()
    );
    stop.cancel();
    let (most, samples) = sampler.await.unwrap();
    assert!(samples > 0, "the sampler ran");
    assert!(
        most <= 5,
        "a license was overbooked during the failover: {most} holders of 5"
    );
    for l in &licenses {
        let n = holders(&s, l).await.len();
        assert!(n <= 5, "license {l} overbooked after the failover: {n}");
    }
    w1.stop().await;
    w2.stop().await;
}
