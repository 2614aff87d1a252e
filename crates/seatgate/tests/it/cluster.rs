//! The same seatgate on a real Redis Cluster (3 masters + 3 replicas,
//! started by the test): sharded streams, the seat engine, the queue and
//! reaper, licenses on every master, and a master failover mid-burst.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_client::Call;
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{
    acquire, client, db, direct, events, holders, keep_waiting, lease_of, license_keys, prefixed_settings,
    provision, put_license, reaper, seats_with_timeout, spawn_worker, watch_holders, LocalCluster,
};

/// How long a test waits for a reply (a cluster answers slower while failing over).
const T: Duration = Duration::from_secs(10);

/// Settings for `cluster` under their own key prefix, 4 shards.
fn settings(cluster: &LocalCluster, prefix: &str) -> Settings {
    let mut s = prefixed_settings(prefix);
    s.redis.cluster_urls = cluster.urls();
    s.stream.shards = 4;
    s
}

/// One cluster for the scenarios below, run one after the other with their
/// own key prefixes (starting a cluster costs seconds; the failover test
/// has its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seat_engine_queue_and_reaper_on_a_cluster() {
    let cluster = LocalCluster::start(3).await.expect("cluster");
    assert_eq!(cluster.master_ports().await.len(), 3);
    hundred_acquires_over_sharded_streams(&cluster).await;
    round_trip_idempotency_release_heartbeat(&cluster).await;
    queue_reaper_and_self_healing(&cluster).await;
    licenses_on_every_master_served_by_two_workers(&cluster).await;
    the_sweep_finds_hash_only_licenses_on_every_master(&cluster).await;
    events_are_relayed_to_their_shard_exactly_once(&cluster).await;
    a_worker_killed_between_script_and_relay_loses_no_event(&cluster).await;
    the_invalid_request_budget_on_a_cluster(&cluster).await;
    the_function_library_is_on_every_master_and_loaded_again_when_lost(&cluster).await;
    a_client_built_from_the_nodes_finds_its_streams(&cluster).await;
    the_admin_trail_on_a_cluster(&cluster).await;
}

/// The admin events are recorded in the license's slot (its own log, which
/// the relay moves to the shard, as `seatgate license` does after each
/// change), and the tokens' trail in the tokens' slot, in the change's
/// transaction: a cluster refuses neither.
async fn the_admin_trail_on_a_cluster(cluster: &LocalCluster) {
    use seatgate_core::license::LicenseChange;
    use seatgate_core::provision;
    let s = settings(cluster, "c9");
    let keys = s.seat_keys();
    let mut con = db(&s).await;
    let relay = seatgate::runtime::relay::Relay::new(&keys).expect("a cluster relays");
    let seats = |n| LicenseChange {
        seats_total: Some(n),
        ..LicenseChange::default()
    };
    provision::change(&mut con, &keys, "adm", &seats(2), "ada")
        .await
        .unwrap();
    provision::change(&mut con, &keys, "adm", &seats(3), "bob")
        .await
        .unwrap();
    provision::set_group(&mut con, &keys, "adm", "eve", "eng", "carol")
        .await
        .unwrap();
    assert!(
        events(&s, "adm").await.is_empty(),
        "in the license's log until relayed"
    );
    relay.license(&mut con, "adm").await.unwrap();
    reaper(&s).await.delete_license("adm", "dave").await.unwrap();
    let recorded: Vec<String> = events(&s, "adm")
        .await
        .iter()
        .map(|e| {
            format!(
                "{} {} {} {} -> {}",
                e["seq"], e["type"], e["actor"], e["before"], e["after"]
            )
        })
        .collect();
    assert_eq!(
        recorded,
        [
            r#"1 license_put ada {} -> {"active":"1","expires_at_ms":"0","seats_total":"2"}"#,
            r#"2 license_put bob {"seats_total":"2"} -> {"seats_total":"3"}"#,
            r#"3 groups_changed carol {} -> {"eve":"eng"}"#,
            r#"4 license_deleted dave {"active":"1","expires_at_ms":"0","seats_total":"3"} -> {}"#,
        ]
    );

    let store = seatgate_gateway::tokens::TokenStore::new(&s.keys.prefix);
    let new = seatgate_gateway::tokens::NewToken {
        app: "cad".into(),
        user: Some("eve".into()),
        group: None,
        expires_in: None,
        issued_by: "ada".into(),
        note: String::new(),
    };
    let (_, record) = store.issue(&mut con, &new).await.unwrap();
    assert!(store.revoke(&mut con, &record.id, "sec").await.unwrap());
    let trail: Vec<(String, String)> = store
        .trail(&mut con)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e["type"].clone(), e["actor"].clone()))
        .collect();
    assert_eq!(
        trail,
        [
            ("token_issued".to_owned(), "ada".to_owned()),
            ("token_revoked".to_owned(), "sec".to_owned())
        ]
    );
}

/// `seatgate run` on the cluster, killed by the fault hook right after its
/// scripts ran (`SEATGATE_FAULT=after_script`): the acquire's event waits in
/// the license's log; one reaper pass relays it; the worker that takes the
/// entry over replays the reply and records nothing more.
async fn a_worker_killed_between_script_and_relay_loses_no_event(cluster: &LocalCluster) {
    // The default prefix and names, which the process gets without settings.
    let s = settings(cluster, "seat");
    put_license(&s, "killed", 1).await;
    let env = [
        ("SEATGATE__REDIS__CLUSTER_URLS", cluster.urls().join(",")),
        ("SEATGATE__STREAM__SHARDS", s.stream.shards.to_string()),
        ("SEATGATE__REAPER__ENABLED", "false".to_owned()),
        ("SEATGATE_FAULT", "after_script".to_owned()),
    ];
    let mut armed = crate::support::WorkerProcess::start(&cluster.urls()[0], &env).await;
    let c = client(&s).await;
    let id = c.send(&acquire("killed", "k1", 0)).await.unwrap();
    let status = armed.exited(T).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "the armed worker did not abort: {status:?}"
    );
    let log = s.seat_keys().event_keys("killed").log;
    let log_len: usize = redis::cmd("XLEN")
        .arg(&log)
        .query_async(&mut db(&s).await)
        .await
        .unwrap();
    assert_eq!(log_len, 1, "recorded with the seat, not relayed");
    assert!(events(&s, "killed").await.is_empty());
    reaper(&s).await.pass().await.unwrap();
    let recorded = |s: &Settings| {
        let s = s.clone();
        async move {
            events(&s, "killed")
                .await
                .iter()
                .map(|e| format!("{} {} {}", e["seq"], e["type"], e["session"]))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        recorded(&s).await,
        ["1 acquired k1"],
        "relayed by one reaper pass"
    );
    let w = spawn_worker(s.clone(), "w-after").await;
    assert_eq!(c.wait_for(&id, T).await.unwrap().status(), Status::Acquired);
    assert_eq!(
        recorded(&s).await,
        ["1 acquired k1"],
        "the replay records nothing"
    );
    assert_eq!(holders(&s, "killed").await, ["k1"]);
    w.stop().await;
}

/// Exactly-once events on a cluster (runtime::relay): a seat script records
/// into its license's own log; a worker killed between its script and its
/// relay leaves the event there, and the reaper's next pass relays it; a
/// relay done again (one that died before deleting what it relayed) appends
/// nothing twice; a worker relays its batch's events before its replies.
async fn events_are_relayed_to_their_shard_exactly_once(cluster: &LocalCluster) {
    let s = settings(cluster, "c6");
    put_license(&s, "lic", 2).await;
    let mut con = db(&s).await;
    let log = s.seat_keys().event_keys("lic");
    let log_len = |con: &mut seatgate_core::db::Db| {
        let mut con = con.clone();
        let key = log.log.clone();
        async move {
            redis::cmd("XLEN")
                .arg(key)
                .query_async::<usize>(&mut con)
                .await
                .unwrap()
        }
    };
    let recorded = |s: &Settings| {
        let s = s.clone();
        async move {
            events(&s, "lic")
                .await
                .iter()
                .map(|e| format!("{} {} {}", e["seq"], e["type"], e["session"]))
                .collect::<Vec<_>>()
        }
    };
    // The script ran; its worker died before relaying.
    assert_eq!(
        direct(&s, "lic", "a")
            .with_lease(Some(&lease_of("a")))
            .acquire(&mut con)
            .await
            .status(),
        Status::Acquired
    );
    assert_eq!(log_len(&mut con).await, 1);
    assert!(recorded(&s).await.is_empty(), "not on the shard yet");
    // The reaper's next pass (its sweep finds the log) relays it.
    reaper(&s).await.pass().await.unwrap();
    assert_eq!(recorded(&s).await, ["1 acquired a"]);
    assert_eq!(log_len(&mut con).await, 0, "relayed entries leave the log");

    // A relay repeated: the same entries twice more, then the relay proper.
    // (Over a second after the first event, so that the audit expects a
    // start event for b's seat.)
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        direct(&s, "lic", "b").acquire(&mut con).await.status(),
        Status::Acquired
    );
    // The audit, meanwhile, knows b's start is on its way from the log:
    // not a holder without a start.
    let query = seatgate::views::audit::Query {
        license: Some("lic".to_owned()),
        since: None,
    };
    let audit = seatgate::views::audit::audit(&mut con, &s, &query).await.unwrap();
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
    let page: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(&log.log)
        .arg("-")
        .arg("+")
        .query_async(&mut con)
        .await
        .unwrap();
    let entries: Vec<(i64, &[Vec<u8>])> = page.iter().map(|(_, f)| (2, f.as_slice())).collect();
    for _ in 0..2 {
        let cursor = seatgate_core::scripts::Scripts::get()
            .relay(&mut con, &log, 0, &entries)
            .await
            .unwrap();
        assert_eq!(cursor, 2);
    }
    let relay = seatgate::runtime::relay::Relay::new(&s.seat_keys()).expect("a cluster relays");
    assert_eq!(
        relay.license(&mut con, "lic").await.unwrap(),
        1,
        "deleted from the log"
    );
    assert_eq!(recorded(&s).await, ["1 acquired a", "2 acquired b"]);
    assert_eq!(log_len(&mut con).await, 0);

    // Through a worker: the event is on the shard when the reply arrives.
    let w = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    let lease = seatgate_core::protocol::Lease::parse(&lease_of("a")).unwrap();
    let released = c
        .call(&Call::release("lic", "a").with_lease(lease), T)
        .await
        .unwrap();
    assert_eq!(released.status(), Status::Released);
    assert_eq!(
        recorded(&s).await,
        ["1 acquired a", "2 acquired b", "3 released a"],
        "relayed before the reply"
    );
    w.stop().await;
}

async fn hundred_acquires_over_sharded_streams(cluster: &LocalCluster) {
    let s = settings(cluster, "c1");
    put_license(&s, "load", 40).await;
    let w1 = spawn_worker(s.clone(), "w1").await;
    let w2 = spawn_worker(s.clone(), "w2").await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let c = client(&s).await;
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
    assert_eq!(counts.get(&Status::Acquired), Some(&40), "{counts:?}");
    assert_eq!(counts.get(&Status::NoSeatsAvailable), Some(&60), "{counts:?}");
    assert_eq!(holders(&s, "load").await.len(), 40);
    // The 32nd seat made the holders a skiplist (encoding.lua), on the
    // license's own master: the key is in the script's slot.
    let encoding: String = redis::cmd("EVAL")
        .arg("return redis.call('OBJECT', 'ENCODING', KEYS[1])")
        .arg(1)
        .arg(license_keys(&s, "load").holders)
        .query_async(&mut db(&s).await)
        .await
        .unwrap();
    assert_eq!(encoding, "skiplist");
    w1.stop().await;
    w2.stop().await;
}

async fn round_trip_idempotency_release_heartbeat(cluster: &LocalCluster) {
    let s = settings(cluster, "c2");
    put_license(&s, "lic", 1).await;
    let w = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
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
    let hb = c.call(&Call::heartbeat("lic", "a"), T).await.unwrap();
    assert_eq!((hb.status(), hb.int("heartbeats")), (Status::HeartbeatUpdated, 1));
    assert_eq!(
        c.call(&Call::release("lic", "a"), T).await.unwrap().status(),
        Status::Released
    );
    assert_eq!(
        c.call(&Call::release("lic", "a"), T).await.unwrap().status(),
        Status::SessionNotFound
    );
    // Events went to the license's events shard.
    let kinds: Vec<String> = events(&s, "lic")
        .await
        .iter()
        .map(|e| e["type"].clone())
        .collect();
    assert_eq!(
        kinds,
        ["acquired", "denied", "released"],
        "acquired, b's refusal and released on the license's events shard"
    );
    w.stop().await;
}

async fn queue_reaper_and_self_healing(cluster: &LocalCluster) {
    let s = settings(cluster, "c3");
    provision(&s, "q", &seats_with_timeout(1, 300)).await;
    let w = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    assert_eq!(
        c.call(&acquire("q", "first", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    let w2 = client(&s).await;
    let id2 = w2.send(&acquire("q", "second", 30_000)).await.unwrap();
    assert_eq!(w2.wait_for(&id2, T).await.unwrap().status(), Status::Queued);
    let w3 = client(&s).await;
    let id3 = w3.send(&acquire("q", "third", 30_000)).await.unwrap();
    assert_eq!(w3.wait_for(&id3, T).await.unwrap().int("position"), 2);
    let every = Duration::from_millis(100);
    let _alive = (
        keep_waiting(&w2, "q", "second", every),
        keep_waiting(&w3, "q", "third", every),
    );

    let reaper = reaper(&s).await;
    // Eviction: "first" never heartbeats; FIFO: "second" gets the seat.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let report = reaper.pass().await.unwrap();
    assert_eq!((report.evicted, report.granted), (1, 1));
    assert_eq!(w2.wait_for(&id2, T).await.unwrap().status(), Status::Granted);
    // Self-healing: free the seat behind seatgate's back; the next pass grants "third".
    let _: i64 = redis::cmd("ZREM")
        .arg(license_keys(&s, "q").holders)
        .arg("second")
        .query_async(&mut db(&s).await)
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
    let licenses: Vec<String> = (0..30).map(|i| format!("org-{i}")).collect();
    let mut masters = HashSet::new();
    for l in &licenses {
        masters.extend(cluster.master_of(&license_keys(&s, l).holders).await);
    }
    assert_eq!(masters.len(), 3, "the licenses' slots land on all three masters");
    let mut shard_masters = HashSet::new();
    for k in s.request_streams() {
        shard_masters.extend(cluster.master_of(&k).await);
    }
    eprintln!(
        "cluster: 30 licenses on {} masters; 4 request shards on {} masters",
        masters.len(),
        shard_masters.len()
    );
    for l in &licenses {
        put_license(&s, l, 3).await;
    }
    let w1 = spawn_worker(s.clone(), "w1").await;
    let w2 = spawn_worker(s.clone(), "w2").await;
    let mut tasks = Vec::new();
    for l in licenses.clone() {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let c = client(&s).await;
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
    let mut cluster = LocalCluster::start(3).await.expect("cluster");
    let s = settings(&cluster, "fo");
    let licenses: Vec<String> = (0..12).map(|i| format!("fo-{i}")).collect();
    for l in &licenses {
        put_license(&s, l, 5).await;
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
                    let c = match s.client().connect().await {
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
    let stop = CancellationToken::new();
    let watched: Vec<&str> = licenses.iter().map(String::as_str).collect();
    let sampler = watch_holders(&s, &watched, stop.clone());
    // A burst in flight when the master dies.
    let during = tokio::spawn(burst("during", 40, Duration::from_millis(10)));
    tokio::time::sleep(Duration::from_millis(30)).await;

    let victim = cluster
        .master_of(&license_keys(&s, &licenses[0]).holders)
        .await
        .expect("a master");
    cluster.kill9(victim);
    let promoted = Instant::now();
    loop {
        let masters = cluster.master_ports().await;
        if masters.len() == 3
            && !masters.contains(&victim)
            && cluster.wait_ok(Duration::from_millis(100)).await.is_ok()
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
    let watch = sampler.await.unwrap();
    assert!(watch.samples > 0, "the sampler ran");
    assert!(
        watch.most.0 <= 5,
        "a license was overbooked during the failover: {:?} holders of 5",
        watch.most
    );
    for l in &licenses {
        let n = holders(&s, l).await.len();
        assert!(n <= 5, "license {l} overbooked after the failover: {n}");
    }
    w1.stop().await;
    w2.stop().await;
}

/// Licenses written as their hash alone (no license index) and used by
/// calling the scripts directly (so nothing filed them for the reaper), on
/// every master: one pass's sweep scans each master's keyspace, files them
/// in the due index shards, and reaps their stale seats.
async fn the_sweep_finds_hash_only_licenses_on_every_master(cluster: &LocalCluster) {
    let s = settings(cluster, "c5");
    let licenses: Vec<String> = (0..30).map(|i| format!("billed-{i}")).collect();
    let mut masters = HashSet::new();
    let mut con = db(&s).await;
    for l in &licenses {
        let lk = license_keys(&s, l);
        masters.extend(cluster.master_of(&lk.license).await);
        let _: () = redis::cmd("HSET")
            .arg(&lk.license)
            .arg("seats_total")
            .arg(1)
            .arg("active")
            .arg(1)
            .arg("heartbeat_timeout_ms")
            .arg(100)
            .query_async(&mut con)
            .await
            .unwrap();
        let took = direct(&s, l, "gone").acquire(&mut con).await;
        assert_eq!(took.status(), Status::Acquired);
    }
    assert_eq!(masters.len(), 3, "the licenses lie on every master");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = reaper(&s).await.pass().await.unwrap();
    assert_eq!(
        (report.filed.len(), report.evicted),
        (30, 30),
        "every master's keyspace was scanned: {report:?}"
    );
    for l in &licenses {
        assert!(holders(&s, l).await.is_empty(), "{l}");
    }
}

/// limits.invalid_requests counts on a cluster too (its key in any slot,
/// no transaction): past the budget, invalid requests naming reply streams
/// that do not exist are dead-lettered, not answered.
async fn the_invalid_request_budget_on_a_cluster(cluster: &LocalCluster) {
    let mut s = settings(cluster, "c6");
    s.limits.invalid_requests = 10;
    s.limits.window_ms = 600_000;
    let w = spawn_worker(s.clone(), "w1").await;
    let mut con = db(&s).await;
    let n = 40;
    let reply = |i: usize| format!("{}c6:flood:{i}", s.replies.prefix);
    for i in 0..n {
        let _: String = redis::cmd("XADD")
            .arg(s.client_requests())
            .arg("*")
            .arg("op")
            .arg("steal")
            .arg("reply_to")
            .arg(reply(i))
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let (answered, dead) = loop {
        let mut answered = 0;
        for i in 0..n {
            let exists: bool = redis::cmd("EXISTS")
                .arg(reply(i))
                .query_async(&mut con)
                .await
                .unwrap();
            answered += usize::from(exists);
        }
        let dead: usize = redis::cmd("XLEN")
            .arg(&s.stream.dead_letter)
            .query_async(&mut con)
            .await
            .unwrap();
        if answered + dead >= n || Instant::now() > deadline {
            break (answered, dead);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (answered, dead),
        (10, 30),
        "the budget's reply streams, the rest dead-lettered"
    );
    w.stop().await;
}

/// Whether the node at `port` has seatgate's function library loaded.
async fn library_on(port: u16) -> bool {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
    let mut con = client.get_multiplexed_async_connection().await.expect("node");
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(seatgate_core::scripts::Scripts::get().library_name())
        .query_async(&mut con)
        .await
        .expect("FUNCTION LIST");
    !libraries.is_empty()
}

/// The seat functions on a cluster (issue 24): one load puts the library on
/// every master (and their replicas, which replicate it); a master that lost
/// it (FUNCTION FLUSH, as a node restarted without persistence or newly
/// added would have) answers `Function not found`, and the call loads the
/// library again and is served.
async fn the_function_library_is_on_every_master_and_loaded_again_when_lost(cluster: &LocalCluster) {
    let s = settings(cluster, "fnlib");
    let mut con = db(&s).await;
    seatgate_core::scripts::Scripts::get()
        .load_all(&mut con)
        .await
        .expect("load");
    let masters = cluster.master_ports().await;
    assert_eq!(masters.len(), 3);
    for &port in &masters {
        assert!(library_on(port).await, "the library is on master {port}");
    }
    // One license per master.
    let mut on: HashMap<u16, String> = HashMap::new();
    for i in 0..60 {
        let l = format!("fn-{i}");
        if let Some(port) = cluster.master_of(&license_keys(&s, &l).holders).await {
            on.entry(port).or_insert(l);
        }
    }
    assert_eq!(on.len(), 3, "a license on every master");
    for l in on.values() {
        put_license(&s, l, 2).await;
    }
    for &port in &masters {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
        let mut node = client.get_multiplexed_async_connection().await.expect("node");
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut node)
            .await
            .expect("flush");
        assert!(!library_on(port).await, "flushed on {port}");
    }
    for (port, l) in &on {
        let o = direct(&s, l, "s1").acquire(&mut con).await;
        assert_eq!(o.status(), Status::Acquired, "{l} on master {port}");
        // The function was handed the license record's key and the events
        // log; the holders key it wrote it derived, in the same slot.
        assert_eq!(holders(&s, l).await, ["s1"], "{l}");
    }
    for &port in &masters {
        assert!(library_on(port).await, "loaded again on master {port}");
    }
    // What Redis 7 allows a function on a cluster: an undeclared key of
    // the declared key's slot, not one of another slot.
    let _: () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(
            "#!lua name=fnlib_slots\n\
             redis.register_function('fnlib_touch', function(keys, args)\n\
               return redis.call('INCR', args[1])\n\
             end)\n",
        )
        .query_async(&mut con)
        .await
        .expect("load");
    let fcall = |key: &str, touch: &str| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("fnlib_touch").arg(1).arg(key).arg(touch);
        cmd
    };
    let same: i64 = fcall("fnlib:{L}:license", "fnlib:{L}:derived")
        .query_async(&mut con)
        .await
        .expect("an undeclared key of the same slot");
    assert_eq!(same, 1);
    let other: redis::RedisResult<i64> = fcall("fnlib:{L}:license", "fnlib:{other-tag}:derived")
        .query_async(&mut con)
        .await;
    let err = other.expect_err("a key of another slot is refused").to_string();
    assert!(
        err.contains("same slot") || err.contains("non local key"),
        "{err}"
    );
}

/// A Rust program on a cluster names the seed nodes, the key prefix and its
/// application, nothing of the service's settings: the builder reads the
/// topology the workers recorded in `<prefix>:config` (on that key's
/// master), and its requests go to the application's own stream, on the
/// license's shard.
async fn a_client_built_from_the_nodes_finds_its_streams(cluster: &LocalCluster) {
    let mut s = settings(cluster, "c9");
    s.stream.applications = vec!["cad".to_owned()];
    put_license(&s, "lic", 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let client = seatgate_client::Client::builder()
        .cluster(cluster.urls())
        .key_prefix("c9")
        .application("cad")
        .connect()
        .await
        .unwrap();
    assert!(
        client.reply_to().starts_with("seat:reply:cad:"),
        "{}",
        client.reply_to()
    );
    let reply = client.call(&acquire("lic", "ws-1", 0), T).await.unwrap();
    assert_eq!(reply.status(), Status::Acquired, "{reply:?}");
    let shard = seatgate_core::keys::shard_name("c9:requests:app:cad", 4, "lic");
    let sent: usize = redis::cmd("XLEN")
        .arg(&shard)
        .query_async(&mut db(&s).await)
        .await
        .unwrap();
    assert!(sent >= 1, "the acquire went to {shard}");
    // A waiter's GRANTED goes through the outbox on a cluster (the worker
    // writes it, not the script): it names the session as the caller sent
    // it, while the seat is kept as the application's.
    let id = client.send(&acquire("lic", "ws-2", 30_000)).await.unwrap();
    assert_eq!(client.wait_for(&id, T).await.unwrap().status(), Status::Queued);
    let released = client.call(&Call::release("lic", "ws-1"), T).await.unwrap();
    assert_eq!(released.status(), Status::Released);
    let granted = client.wait_for(&id, T).await.unwrap();
    assert_eq!(
        (granted.status(), granted.get("session")),
        (Status::Granted, "ws-2")
    );
    assert_eq!(holders(&s, "lic").await, ["cad/ws-2"]);
    client.close().await.unwrap();
    worker.stop().await;
}
