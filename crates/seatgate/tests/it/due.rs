//! The reaper's due index (src/runtime/due.rs): a pass reaps the licenses
//! due and no others, a license provisioned as its hash alone is reaped all
//! the same, the sweep files what the index lacks, and a due time filed while
//! a license is being reaped is never lost.

use std::time::Duration;

use redis::AsyncCommands;
use seatgate::config::Settings;
use seatgate_client::Call;
use seatgate_core::keys::shard_of;
use seatgate_core::policy::{LicensePolicy, RequestPolicy};
use seatgate_core::scripts::{Scripts, DUE_CLAIM_BASE};
use seatgate_core::status::Status;

use crate::support::{
    acquire, client, command_calls, db, direct, encoding, holders, keep_waiting, keys, license_keys,
    provision, queue_up, reaper, reply_stream, seats_with_timeout, spawn_app, spawn_worker, TestApp, T,
};

/// Writes `license`'s record the way a billing system may (the documented
/// provisioning contract): the hash alone, not added to the license index.
async fn hash_only(s: &Settings, license: &str, seats: u64, heartbeat_timeout_ms: u64) {
    let _: () = redis::cmd("HSET")
        .arg(license_keys(s, license).license)
        .arg("seats_total")
        .arg(seats)
        .arg("expires_at_ms")
        .arg(0)
        .arg("active")
        .arg(1)
        .arg("heartbeat_timeout_ms")
        .arg(heartbeat_timeout_ms)
        .query_async(&mut db(s).await)
        .await
        .unwrap();
}

/// The times `license` is filed under: (stale, due).
async fn filed(s: &Settings, license: &str) -> (Option<i64>, Option<i64>) {
    let shard = keys(s).due_index(shard_of(license, s.stream.shards));
    let mut con = db(s).await;
    (
        con.zscore(&shard.stale, license).await.unwrap(),
        con.zscore(&shard.due, license).await.unwrap(),
    )
}

#[tokio::test]
async fn a_license_written_as_its_hash_alone_has_its_stale_seat_reaped_and_its_waiter_granted() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    hash_only(&settings, "billed", 1, 300).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    assert_eq!(
        c.call(&acquire("billed", "first", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    let (queued, id, waiter) = queue_up(&settings, "billed", "second", 30_000).await;
    assert_eq!(queued.status(), Status::Queued);
    let indexed: bool = db(&settings)
        .await
        .sismember(keys(&settings).license_index(), "billed")
        .await
        .unwrap();
    assert!(!indexed, "provisioned without the license index");

    // "first" never heartbeats; "second" shows it is alive while it waits.
    let _alive = keep_waiting(&waiter, "billed", "second", Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = reaper(&settings).await.pass().await.unwrap();
    assert_eq!((report.evicted, report.granted), (1, 1), "{report:?}");
    assert!(report.filed.is_empty(), "the worker filed it: {:?}", report.filed);
    assert_eq!(waiter.wait_for(&id, T).await.unwrap().status(), Status::Granted);
    assert_eq!(holders(&settings, "billed").await, ["second"]);
    // And a wait runs out by the reaper too.
    let (queued, id, waiter) = queue_up(&settings, "billed", "third", 200).await;
    assert_eq!(queued.status(), Status::Queued);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let report = reaper(&settings).await.pass().await.unwrap();
    assert!(report.timed_out >= 1, "{report:?}");
    assert_eq!(
        waiter.wait_for(&id, T).await.unwrap().status(),
        Status::QueueTimeout
    );
    worker.stop().await;
}

#[tokio::test]
async fn the_sweep_files_licenses_the_due_index_lacks_and_the_same_pass_reaps_them() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    // Seats taken by calling the scripts directly: nobody filed the licenses,
    // one of them not even in the license index.
    hash_only(&settings, "unlisted", 1, 100).await;
    provision(&settings, "listed", &seats_with_timeout(1, 100)).await;
    for license in ["unlisted", "listed"] {
        direct(&settings, license, "a").acquire(&mut con).await;
    }
    let waiter = reply_stream(&settings, "b");
    direct(&settings, "unlisted", "b")
        .queue(&mut con, 60_000, "req-b", &waiter)
        .await;
    assert_eq!(filed(&settings, "unlisted").await, (None, None));
    tokio::time::sleep(Duration::from_millis(150)).await;
    // b shows it is alive (a waiter heartbeat), a does not.
    let alive = direct(&settings, "unlisted", "b").heartbeat(&mut con).await;
    assert_eq!(alive.status(), Status::Queued);

    let report = reaper(&settings).await.pass().await.unwrap();
    let mut found = report.filed.clone();
    found.sort();
    assert_eq!(found, ["listed", "unlisted"]);
    assert_eq!((report.evicted, report.granted), (2, 1), "{report:?}");
    assert_eq!(holders(&settings, "unlisted").await, ["b"]);
    assert!(
        filed(&settings, "unlisted").await.0.is_some(),
        "b's seat goes stale in time"
    );
    assert_eq!(
        filed(&settings, "listed").await,
        (None, None),
        "nothing left to reap"
    );
    assert_eq!(
        report.census.map(|c| c.licenses()),
        Some(1),
        "the census counts the license index"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_calls_reap_lua_only_for_the_licenses_due() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    const LICENSES: usize = 200;
    let short = |i: usize| i % 40 == 0; // 5 of them
    for i in 0..LICENSES {
        let timeout = if short(i) { 300 } else { 600_000 };
        provision(&settings, &format!("l{i}"), &seats_with_timeout(1, timeout)).await;
    }
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    for i in 0..LICENSES {
        let r = c.call(&acquire(&format!("l{i}"), "s", 0), T).await.unwrap();
        assert_eq!(r.status(), Status::Acquired);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;

    let reaper = reaper(&settings).await;
    // reap.lua reads the license's outbox with one HSCAN per call; no other
    // script or command of a pass does.
    let before = command_calls(&mut con, "hscan").await;
    let report = reaper.pass().await.unwrap();
    let reaped = command_calls(&mut con, "hscan").await - before;
    assert_eq!(
        (report.licenses, report.evicted, reaped),
        (5, 5, 5),
        "only the 5 licenses whose seat went stale: {report:?}"
    );
    assert!(report.filed.is_empty(), "{:?}", report.filed);
    assert_eq!(report.census.map(|c| c.licenses()), Some(LICENSES));

    let before = command_calls(&mut con, "hscan").await;
    let report = reaper.pass().await.unwrap();
    assert_eq!(
        (report.licenses, command_calls(&mut con, "hscan").await - before),
        (0, 0),
        "nothing is due: no reap.lua call at all"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pass_reaps_every_license_due_page_after_page() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    // More licenses due than a claim takes at a time (64), in one shard.
    const LICENSES: usize = 300;
    for i in 0..LICENSES {
        provision(&settings, &format!("p{i}"), &seats_with_timeout(1, 300)).await;
    }
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    let acquires = (0..LICENSES).map(|i| {
        let c = c.clone();
        async move {
            c.call(&acquire(&format!("p{i}"), "s", 0), T)
                .await
                .unwrap()
                .status()
        }
    });
    let statuses = futures_util::future::join_all(acquires).await;
    assert!(statuses.iter().all(|s| *s == Status::Acquired), "{statuses:?}");
    worker.stop().await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let reaper = reaper(&settings).await;
    let report = reaper.pass().await.unwrap();
    assert_eq!(
        (report.licenses, report.evicted),
        (LICENSES, LICENSES),
        "every stale seat, over five claims: {report:?}"
    );
    for i in [0, 127, 128, 255, 256, LICENSES - 1] {
        assert!(holders(&settings, &format!("p{i}")).await.is_empty(), "p{i}");
        assert_eq!(filed(&settings, &format!("p{i}")).await, (None, None), "p{i}");
    }
    let report = reaper.pass().await.unwrap();
    assert_eq!(report.licenses, 0, "nothing is left due: {report:?}");
}

#[tokio::test]
async fn heartbeats_keep_a_license_from_falling_due() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    provision(&settings, "hb", &seats_with_timeout(2, 300)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    for s in ["s1", "s2"] {
        assert_eq!(
            c.call(&acquire("hb", s, 0), T).await.unwrap().status(),
            Status::Acquired
        );
    }
    let beat = |session: &'static str| Call::heartbeat("hb", session);
    let reaper = reaper(&settings).await;
    // Twice the timeout, both heartbeating: the oldest's heartbeats move the
    // license's stale time on, so no pass has it due.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for s in ["s1", "s2"] {
            c.call(&beat(s), T).await.unwrap();
        }
        let report = reaper.pass().await.unwrap();
        assert_eq!(report.licenses, 0, "{report:?}");
    }
    // s2 stops: once it is stale, the license is due, and only then.
    let mut reaped = 0;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.call(&beat("s1"), T).await.unwrap();
        let report = reaper.pass().await.unwrap();
        reaped += report.licenses;
        assert!(report.evicted == report.licenses, "{report:?}");
    }
    assert_eq!(reaped, 1, "one visit, when s2 went stale");
    assert_eq!(holders(&settings, "hb").await, ["s1"]);
    worker.stop().await;
}

/// Polls the times `license` is filed under until `done` holds (the worker
/// files them in the pipeline that also carries the reply just read).
async fn filed_when(
    s: &Settings,
    license: &str,
    done: impl Fn((Option<i64>, Option<i64>)) -> bool,
) -> (Option<i64>, Option<i64>) {
    let deadline = std::time::Instant::now() + T;
    loop {
        let times = filed(s, license).await;
        if done(times) || std::time::Instant::now() > deadline {
            return times;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_borrow_and_a_linger_make_their_license_due_when_they_end() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    provision(&settings, "cad", &seats_with_timeout(2, 600_000)).await;
    let policy = LicensePolicy {
        linger_ms: Some(300),
        max_borrow_ms: Some(1_000),
        ..LicensePolicy::default()
    };
    seatgate_core::license::put_policy(&mut db(&settings).await, &keys(&settings), "cad", &policy)
        .await
        .unwrap();
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    let borrow = acquire("cad", "laptop", 0).with_policy(RequestPolicy {
        borrow_ms: 800,
        ..RequestPolicy::NONE
    });
    let r = c.call(&borrow, T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    let until = r.int("borrowed_until_ms");
    let (_, due) = filed_when(&settings, "cad", |(_, due)| due.is_some()).await;
    assert_eq!(due, Some(until), "due when the borrow ends");

    assert_eq!(
        c.call(&acquire("cad", "desk", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    let r = c.call(&Call::release("cad", "desk"), T).await.unwrap();
    assert_eq!(r.get("linger_ms"), "300");
    let (_, due) = filed_when(&settings, "cad", |(_, due)| due < Some(until)).await;
    assert!(due < Some(until), "the linger ends first: {due:?}");

    // Nothing is stale (a 10-minute timeout): each end is what makes it due.
    let reaper = reaper(&settings).await;
    assert_eq!(reaper.pass().await.unwrap().licenses, 0);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let report = reaper.pass().await.unwrap();
    assert_eq!(
        (report.licenses, report.ended),
        (1, 1),
        "the linger ended: {report:?}"
    );
    assert_eq!(
        filed(&settings, "cad").await.1,
        Some(until),
        "next: the borrow's end"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = reaper.pass().await.unwrap();
    assert_eq!(
        (report.licenses, report.ended),
        (1, 1),
        "the borrow ended: {report:?}"
    );
    assert_eq!(
        filed(&settings, "cad").await,
        (None, None),
        "nothing held, nothing due"
    );
    worker.stop().await;
}

#[tokio::test]
async fn a_time_filed_while_a_license_is_reaped_is_kept() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    let index = keys(&settings).due_index(0);
    let _: () = con
        .zadd_multiple(&index.stale, &[(100, "a"), (100, "b"), (5_000, "d")])
        .await
        .unwrap();
    let _: () = con
        .zadd_multiple(&index.due, &[(100, "b"), (100, "c")])
        .await
        .unwrap();
    let scripts = Scripts::get();
    let (marker, mut taken) = scripts
        .due_claim(&mut con, &index, 1_000, 10, 2_000)
        .await
        .unwrap();
    taken.sort();
    assert_eq!(marker, DUE_CLAIM_BASE + 2_000);
    assert_eq!(taken, ["a", "b", "c"], "each once, due in either index");
    // While they are reaped, a worker files b's stale time (as it is) and
    // c's other work (LT).
    let _: () = con.zadd(&index.stale, "b", 1_500).await.unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(&index.due)
        .arg("LT")
        .arg(1_200)
        .arg("c")
        .query_async(&mut con)
        .await
        .unwrap();
    let removed = scripts
        .due_settle(
            &mut con,
            &index,
            marker,
            &[("a", 3_000, 0), ("b", 4_000, 0), ("c", 0, 0)],
        )
        .await
        .unwrap();
    assert_eq!(removed, 1, "b has no other work");
    let mut scores = Vec::new();
    for key in [&index.stale, &index.due] {
        for m in ["a", "b", "c", "d"] {
            let score: Option<i64> = con.zscore(key, m).await.unwrap();
            scores.push(score);
        }
    }
    assert_eq!(
        scores,
        [
            // stale: a as the reaper found it, b the earlier of both, d untouched
            Some(3_000),
            Some(1_500),
            None,
            Some(5_000),
            // due: b gone, c keeps the worker's time
            None,
            None,
            Some(1_200),
            None,
        ]
    );
    // A pass that dies leaves its claims; they are taken again once they run out.
    let (_, taken) = scripts
        .due_claim(&mut con, &index, 2_000, 10, 2_600)
        .await
        .unwrap();
    assert_eq!(taken, ["b", "c"]);
    let (_, taken) = scripts
        .due_claim(&mut con, &index, 2_500, 10, 3_000)
        .await
        .unwrap();
    assert!(taken.is_empty(), "still claimed: {taken:?}");
    let (_, taken) = scripts
        .due_claim(&mut con, &index, 2_700, 10, 3_500)
        .await
        .unwrap();
    assert_eq!(taken, ["b", "c"], "the claims ran out");
}

#[tokio::test]
async fn a_pass_keeps_the_stale_index_a_skiplist_and_whole() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    const LICENSES: usize = 20;
    for i in 0..LICENSES {
        provision(&settings, &format!("l{i}"), &seats_with_timeout(1, 600_000)).await;
    }
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    for i in 0..LICENSES {
        let r = c.call(&acquire(&format!("l{i}"), "s", 0), T).await.unwrap();
        assert_eq!(r.status(), Status::Acquired);
    }
    let stale = keys(&settings).due_index(0).stale;
    // Filed by the workers' ZADDs: a listpack, searched entry by entry.
    assert_eq!(encoding(&mut con, &stale).await, "listpack");
    let before: Vec<(String, i64)> = con.zrange_withscores(&stale, 0, -1).await.unwrap();
    assert_eq!(before.len(), LICENSES);
    let report = reaper(&settings).await.pass().await.unwrap();
    assert_eq!(report.licenses, 0, "nothing due: {report:?}");
    assert_eq!(encoding(&mut con, &stale).await, "skiplist");
    let after: Vec<(String, i64)> = con.zrange_withscores(&stale, 0, -1).await.unwrap();
    assert_eq!(after, before, "every license filed as it was, nothing else");
    worker.stop().await;
}
