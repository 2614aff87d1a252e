//! Hardening, the runtime side: promises kept under heavy and hostile callers.
//!
//! - claims reach idle entries behind any number of recently delivered ones;
//! - the reaper never removes a live worker's consumer, and never drops an
//!   entry from the pending list;
//! - an entry delivered more than `stream.max_deliveries` times is
//!   dead-lettered without being decided again, while Redis refusing for a
//!   long time dead-letters nothing;
//! - no entry reaches a worker whole when it is over the entry limits,
//!   however many fields it has;
//! - a caller-chosen entry id far ahead of the clock harms nothing but its own
//!   latency figure, and the stream recovers from an id pushed to the maximum
//!   (the runbook of docs/failure-modes.md) without losing a pending entry.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_client::Call;
use seatgate_core::db::Db;
use seatgate_core::keys::consumer_alive;
use seatgate_core::request::{Guard, GuardPolicy};
use seatgate_core::scripts::Scripts;
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{
    add_request, client, command_calls, consumers, create_group, db, free_memory, holders, http_get, keys,
    metric, pending, put_license, reaper, redis_ms, run_out_of_memory, spawn_app, spawn_app_with,
    spawn_worker, stream_entries, take, Entry, TestApp, WorkerProcess, T,
};

/// The largest stream entry id Redis accepts.
const MAX_ID: &str = "18446744073709551615-18446744073709551615";

/// XADD `fields` to `stream` under `id` (`*` for a new id from Redis).
async fn xadd(con: &mut Db, stream: &str, id: &str, fields: &[(&str, &str)]) -> redis::RedisResult<String> {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg(id);
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    cmd.query_async(con).await
}

/// Names of the consumers of the group on the requests stream.
async fn consumer_names(s: &Settings) -> Vec<String> {
    consumers(s).await.into_iter().map(|c| c.name).collect()
}

/// The reply to request `id` on `reply_to`, waiting up to `within` for it.
async fn reply(con: &mut Db, reply_to: &str, id: &str, within: Duration) -> Option<Entry> {
    let deadline = Instant::now() + within;
    loop {
        let found = stream_entries(con, reply_to)
            .await
            .into_iter()
            .find(|r| r.fields.get("id").map(String::as_str) == Some(id));
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// XAUTOCLAIM looks at no more than ten times COUNT pending entries per call.
/// An idle entry behind more recently delivered ones than that used to wait
/// for as long as they stayed busy (every claim restarted at `0-0`); the
/// sweep now goes on where the last page stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_entry_behind_more_than_a_claim_scan_of_busy_ones_is_claimed() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    create_group(&settings).await;
    // 400 heartbeats ahead of it: more than one XAUTOCLAIM scan (10 × COUNT 32).
    let mut pipe = redis::pipe();
    for i in 0..400 {
        pipe.cmd("XADD")
            .arg(&settings.stream.requests)
            .arg("*")
            .arg("op")
            .arg("heartbeat")
            .arg("license")
            .arg("busy")
            .arg("session")
            .arg(format!("s{i}"));
    }
    let busy_ids: Vec<String> = pipe.query_async(&mut con).await.unwrap();
    let client = client(&settings).await;
    let id = client.send(&Call::acquire("lic", "behind")).await.unwrap();
    // A worker that died took all of them ...
    assert_eq!(take(&settings, "dead", 1000).await.len(), 401);
    let delivered = Instant::now();
    // ... and another consumer keeps the 400 busy, as a live worker's batches in flight would be.
    let stop = CancellationToken::new();
    let toucher = {
        let mut con = db(&settings).await;
        let (stream, group) = (settings.stream.requests.clone(), settings.stream.group.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _: Vec<String> = redis::cmd("XCLAIM")
                    .arg(&stream)
                    .arg(&group)
                    .arg("alive")
                    .arg(0)
                    .arg(&busy_ids)
                    .arg("JUSTID")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let claim_idle = Duration::from_millis(1000);
    settings.stream.claim_idle_ms = claim_idle.as_millis() as u64; // a claim every 500 ms
    let worker = spawn_worker(settings.clone(), "w1").await;

    let r = client.wait_for(&id, Duration::from_secs(8)).await;
    let waited = delivered.elapsed();
    stop.cancel();
    toucher.await.unwrap();
    worker.stop().await;
    let r = r.expect("the idle entry behind 400 busy ones was never claimed");
    assert_eq!(r.status(), Status::Acquired);
    let claim_period = claim_idle / 2;
    assert!(
        waited <= claim_idle + 4 * claim_period,
        "claimed {waited:?} after it was delivered: more than claim_idle_ms and a couple of claim periods"
    );
    assert_eq!(holders(&settings, "lic").await, ["behind"]);
}

/// On Redis 7.0 a read that finds nothing does not reset a consumer's idle
/// time, so a live worker on a quiet stream looks idle. Its liveness key
/// keeps the reaper from removing it; a consumer without one, and with
/// nothing pending, is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_worker_on_a_quiet_stream_keeps_its_consumer_and_a_dead_one_is_removed() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "live").await;
    let client = client(&settings).await;
    let lease = seatgate_core::protocol::Lease::parse(&crate::support::lease_of("s0")).unwrap();
    let r = client
        .call(&Call::heartbeat("lic", "s0").with_lease(lease), T)
        .await
        .unwrap();
    assert_eq!(r.status(), Status::SessionNotActive);
    let (stream, group) = (&settings.stream.requests, &settings.stream.group);
    let _: i64 = redis::cmd("XGROUP")
        .arg("CREATECONSUMER")
        .arg(stream)
        .arg(group)
        .arg("gone")
        .query_async(&mut con)
        .await
        .unwrap();
    let alive: bool = redis::cmd("EXISTS")
        .arg(consumer_alive(stream, group, "live"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(alive, "the worker keeps its liveness key");

    let mut tiny = settings.clone();
    tiny.stream.consumer_idle_ms = 20;
    let reaper = reaper(&tiny).await;
    let mut looked_idle = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let before = consumers(&settings).await.into_iter().find(|c| c.name == "live");
        reaper.maintain_stream().await.unwrap();
        assert!(
            consumer_names(&settings).await.contains(&"live".to_owned()),
            "the reaper removed a live worker's consumer (it was {before:?})"
        );
        looked_idle = looked_idle.max(before.map_or(0, |c| c.idle_ms));
    }
    assert!(
        looked_idle > tiny.stream.consumer_idle_ms,
        "the live consumer looked idle ({looked_idle} ms): the quiet stream really tested the cleanup"
    );
    assert!(
        !consumer_names(&settings).await.contains(&"gone".to_owned()),
        "a consumer without a worker and with nothing pending is removed"
    );
    let r = client.call(&Call::acquire("lic", "later"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "an entry added later is answered");
    worker.stop().await;
    assert_eq!(pending(&settings).await, 0);
}

/// The removal is one script: it refuses while the consumer holds pending
/// entries, so a read landing between the reaper's look and its delete
/// cannot lose them from the pending list.
#[tokio::test]
async fn removing_a_consumer_refuses_while_it_holds_entries() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    create_group(&settings).await;
    add_request(
        &mut con,
        &settings,
        &[("op", "heartbeat"), ("license", "l"), ("session", "s")],
    )
    .await;
    let held = take(&settings, "holder", 10).await;
    let (stream, group) = (&settings.stream.requests, &settings.stream.group);
    let scripts = Scripts::get();
    let gone = scripts
        .remove_consumer(&mut con, stream, group, "holder")
        .await
        .unwrap();
    assert!(!gone, "refused while an entry is pending");
    assert_eq!(
        consumers(&settings)
            .await
            .iter()
            .find(|c| c.name == "holder")
            .map(|c| c.pending),
        Some(1),
        "its entry is still pending"
    );
    let _: i64 = redis::cmd("XACK")
        .arg(stream)
        .arg(group)
        .arg(&held)
        .query_async(&mut con)
        .await
        .unwrap();
    let gone = scripts
        .remove_consumer(&mut con, stream, group, "holder")
        .await
        .unwrap();
    assert!(gone, "removed once it holds nothing");
    assert!(consumer_names(&settings).await.is_empty());
    let gone = scripts
        .remove_consumer(&mut con, stream, group, "never-was")
        .await
        .unwrap();
    assert!(gone, "a consumer that does not exist is gone already");
}

/// An entry that crashed or stalled its workers comes back again and again.
/// Once delivered more than `stream.max_deliveries` times it is dead-lettered
/// and answered ERROR without its script running again: the acquire below
/// would succeed, and no seat is taken.
#[tokio::test]
async fn an_entry_delivered_more_than_max_deliveries_is_dead_lettered_without_deciding_it() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    create_group(&settings).await;
    let client = client(&settings).await;
    let id = client.send(&Call::acquire("lic", "s1")).await.unwrap();
    let entry = take(&settings, "crashed", 10).await;
    // Nine deliveries so far, each ending in a crash.
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(&settings.stream.requests)
        .arg(&settings.stream.group)
        .arg("crashed")
        .arg(0)
        .arg(&entry)
        .arg("RETRYCOUNT")
        .arg(9)
        .arg("JUSTID")
        .query_async(&mut con)
        .await
        .unwrap();
    settings.stream.max_deliveries = 3;
    settings.stream.claim_idle_ms = 200;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let r = client.wait_for(&id, T).await.unwrap();
    worker.stop().await;

    assert_eq!(r.status(), Status::Error);
    assert!(
        r.get("error").contains("delivered 10 times without an answer"),
        "{:?}",
        r.get("error")
    );
    assert!(
        holders(&settings, "lic").await.is_empty(),
        "its script did not run again"
    );
    let dead = stream_entries(&mut con, &settings.stream.dead_letter).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (
            dead[0]["dead_entry_id"].as_str(),
            dead[0]["dead_deliveries"].as_str(),
            dead[0]["dead_reason"].as_str(),
            dead[0]["session"].as_str(),
        ),
        (
            entry[0].as_str(),
            "10",
            "delivered 10 times without an answer",
            "s1"
        )
    );
    assert_eq!(pending(&settings).await, 0);
}

/// A refusal by Redis is not the entry's fault: however many times the
/// worker re-reads an entry while Redis is out of memory, the delivery is
/// handed back each time, and the request is decided once memory is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_refusal_by_redis_never_dead_letters_a_request() {
    let TestApp(_redis, mut settings, mut con) = spawn_app_with(&["--maxmemory-policy", "noeviction"]).await;
    put_license(&settings, "lic", 1).await;
    create_group(&settings).await;
    let client = client(&settings).await;
    let id = client.send(&Call::acquire("lic", "patient")).await.unwrap();
    run_out_of_memory(&mut con).await;
    settings.stream.max_deliveries = 2;
    let worker = spawn_worker(settings.clone(), "w1").await;
    // Re-read with a backoff of 50 ms doubling to 1 s: about six retries in 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pel: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(&settings.stream.requests)
        .arg(&settings.stream.group)
        .arg("-")
        .arg("+")
        .arg(10)
        .query_async(&mut con)
        .await
        .unwrap();
    // The read itself (lua/read.lua, a script that may write) is refused
    // while Redis is out of memory, so the entry waits unread or pending,
    // and never dead-lettered.
    assert!(pel.len() <= 1, "{pel:?}");
    free_memory(&mut con).await;
    let r = client.wait_for(&id, Duration::from_secs(10)).await.unwrap();
    worker.stop().await;
    assert_eq!(
        r.status(),
        Status::Acquired,
        "decided once memory was freed: {r:?}"
    );
    let seen = pel.first().map_or(0, |entry| entry.3);
    assert!(seen <= 2, "refused deliveries are handed back ({seen} seen)");
    assert_eq!(holders(&settings, "lic").await, ["patient"]);
    let dead: i64 = redis::cmd("XLEN")
        .arg(&settings.stream.dead_letter)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(dead, 0);
}

/// Entry-id arithmetic saturates: the largest id Redis accepts used to
/// overflow the dedupe expiry (a panic in a debug build, a wrapped time in
/// a release one).
#[test]
fn the_guard_of_the_largest_entry_id_saturates() {
    let settings = Settings::load(None).expect("default settings");
    let policy = GuardPolicy {
        dedupe_window_ms: 60_000,
        session_limit: 0,
        license_limit: 0,
        rate_window_ms: 10_000,
        application: Default::default(),
    };
    let keys = keys(&settings);
    let guard = Guard::for_entry(&policy, &keys, MAX_ID, "lic", "s");
    assert_eq!(guard.done_until_ms, u64::MAX);
    let bucket = u64::MAX / 60_000;
    assert_eq!(guard.done_key, keys.dedupe("lic", bucket));
}

/// Entries of 40,000 fields of 250 bytes (10 MB, every value far under
/// `proto-max-bulk-len`) come to the worker process as lua/read.lua's stubs:
/// each is answered INVALID_REQUEST with its size as stored, nothing is
/// left pending, the request after them is served, and the worker's peak
/// memory grows by far less than one of them (issue 35, M3: it read them
/// whole, 33 MB → 612 MB for ten 50 MB entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_of_many_fields_never_reaches_a_worker_whole() {
    let TestApp(redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    create_group(&settings).await;
    let worker = WorkerProcess::start(&redis.url(), &[]).await;
    let reply_to = format!("{}big", settings.replies.prefix);
    // A reply stream exists before its replies come (a client's does).
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&reply_to)
        .arg("readers")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut con)
        .await
        .unwrap();
    let before = worker.peak_rss_kib();
    const ENTRIES: usize = 8;
    let value = "v".repeat(250);
    for i in 0..ENTRIES {
        let session = format!("s-{i}");
        let mut cmd = crate::support::request_xadd(&settings);
        cmd.arg("id")
            .arg(format!("big-{i}"))
            .arg("reply_to")
            .arg(&reply_to);
        cmd.arg("op")
            .arg("acquire")
            .arg("license")
            .arg("lic")
            .arg("session")
            .arg(&session);
        for f in 0..40_000 {
            cmd.arg(format!("f{f}")).arg(&value);
        }
        let _: String = cmd.query_async(&mut con).await.unwrap();
    }
    let client = client(&settings).await;
    let r = client.call(&Call::acquire("lic", "after"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "the request after them is served");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut replies = loop {
        let replies = stream_entries(&mut con, &reply_to).await;
        if replies.len() >= ENTRIES {
            break replies;
        }
        assert!(
            Instant::now() < deadline,
            "answered {} of {ENTRIES}",
            replies.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    replies.sort_by(|a, b| a["id"].cmp(&b["id"]));
    for (i, reply) in replies.iter().enumerate() {
        assert_eq!(reply["id"], format!("big-{i}"), "{reply:?}");
        assert_eq!(reply["status"], "INVALID_REQUEST", "{reply:?}");
        assert_eq!(reply["session"], format!("s-{i}"), "{reply:?}");
        assert!(
            reply["error"].contains("request has 40005 fields"),
            "named by its size as stored: {reply:?}"
        );
    }
    assert_eq!(pending(&settings).await, 0, "nothing left pending");
    assert_eq!(holders(&settings, "lic").await, vec!["after".to_owned()]);
    let grown = worker.peak_rss_kib().saturating_sub(before);
    assert!(
        grown < 32 * 1024,
        "the worker's peak memory grew by {grown} KiB for {ENTRIES} entries of 10 MB"
    );
}

/// A worker reads through a script, which cannot block; an idle worker
/// still makes almost no calls, and answers at once: its doorbell
/// (`CLIENT TRACKING`) wakes the read loop whose stream was written. With
/// `stream.poll_ms = 1` a worker without a doorbell would call lua/read.lua
/// about a thousand times a second per loop; this one's two loops (the
/// requests stream and the admin stream) make a few calls in 2 s. And a
/// wait for the bell loses no write: every request after a quiet spell is
/// answered long before the read would have ended (`stream.block_ms`, 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_waits_for_writes_not_a_timer() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.stream.poll_ms = 1;
    settings.stream.block_ms = 5_000;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    // Served: the doorbell is up once a request gets through.
    let r = client.call(&Call::acquire("lic", "s0"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = command_calls(&mut con, "fcall").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = command_calls(&mut con, "fcall").await - before;
    assert!(idle <= 12, "{idle} script calls in 2 s of nothing to read");
    // Each request after the quiet spell is answered, well before a read
    // would have ended on its own.
    for i in 1..=5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let r = client
            .call(&Call::release("lic", format!("s{i}")), T)
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            Status::InvalidRequest,
            "no lease for a session never held"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "answered {:?} after a quiet spell",
            started.elapsed()
        );
    }
    worker.stop().await;
}

/// A request whose entry id a caller set an hour ahead of the Redis clock
/// is answered like any other, and counted (and logged) as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_id_ahead_of_the_clock_is_answered_and_counted() {
    let TestApp(redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    create_group(&settings).await;
    let worker = WorkerProcess::start(&redis.url(), &[]).await;
    let before = worker.scrape().await;
    assert_eq!(
        metric(&before, "seatgate_future_entry_ids_total"),
        Some(0.0),
        "at 0 from startup: {before}"
    );
    assert!(
        before.contains("# HELP seatgate_future_entry_ids_total "),
        "{before}"
    );
    let client = client(&settings).await;
    let ahead = redis_ms(&mut con).await + 3_600_000;
    xadd(
        &mut con,
        &settings.stream.requests,
        &format!("{ahead}-0"),
        &[
            ("op", "acquire"),
            ("id", "ahead-1"),
            ("license", "lic"),
            ("session", "s1"),
            ("lease", &crate::support::lease_of("s1")),
            ("reply_to", client.reply_to()),
        ],
    )
    .await
    .unwrap();
    let r = client.wait_for("ahead-1", T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    let (_, text) = http_get(&worker.metrics, "/metrics")
        .await
        .expect("metrics endpoint");
    let counted = text
        .lines()
        .find(|l| l.starts_with("seatgate_future_entry_ids_total"))
        .unwrap_or_else(|| panic!("no seatgate_future_entry_ids_total in\n{text}"));
    assert_eq!(counted.split_whitespace().last(), Some("1"), "{counted}");
}

/// The runbook of docs/failure-modes.md, "Entry ids ahead of the clock": a
/// caller pushed the stream's last id to the maximum, so every `XADD *`
/// fails. The stream is renamed aside, the workers carry on with a fresh
/// one at once, and a drain worker answers what the old one still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbook_recovers_a_stream_pushed_to_the_last_id_and_loses_no_pending_entry() {
    let TestApp(redis, settings, mut con) = spawn_app().await;
    let requests = &settings.stream.requests;
    let old = format!("{requests}:old");
    put_license(&settings, "lic", 10).await;
    create_group(&settings).await;
    let client = client(&settings).await;
    // Two requests held by a worker that died, and one nobody has read yet.
    let mut held = Vec::new();
    for session in ["held-1", "held-2"] {
        held.push(client.send(&Call::acquire("lic", session)).await.unwrap());
    }
    assert_eq!(take(&settings, "died", 10).await.len(), 2);
    let unread = client.send(&Call::acquire("lic", "unread")).await.unwrap();
    // The hostile caller.
    xadd(
        &mut con,
        requests,
        MAX_ID,
        &[("op", "heartbeat"), ("license", "lic"), ("session", "x")],
    )
    .await
    .unwrap();
    let refused = client
        .send(&Call::acquire("lic", "refused"))
        .await
        .expect_err("XADD * after the last possible id");
    assert!(
        refused.to_string().contains("exhausted the last possible ID"),
        "{refused}"
    );
    // A worker was serving all along (claim_idle_ms 15 s: it claims nothing here).
    let worker = spawn_worker(settings.clone(), "w1").await;
    let r = client.wait_for(&unread, T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "undelivered entries are still read");

    // Step 1: rename the stream aside; the next XADD makes a fresh one, and
    // the workers create the group on it by themselves.
    let _: () = redis::cmd("RENAME")
        .arg(requests)
        .arg(&old)
        .query_async(&mut con)
        .await
        .unwrap();
    let r = client.call(&Call::acquire("lic", "after-1"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "new requests are served at once");

    // Step 2: a drain worker on the old stream claims what dead consumers
    // held and reads what nobody read, then leaves.
    let mut drain = WorkerProcess::start(
        &redis.url(),
        &[
            ("SEATGATE__STREAM__REQUESTS", old.clone()),
            ("SEATGATE__STREAM__SHARDS", "1".to_owned()),
            ("SEATGATE__STREAM__CLAIM_IDLE_MS", "1000".to_owned()),
            ("SEATGATE__REAPER__ENABLED", "false".to_owned()),
        ],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let groups: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&old)
            .query_async(&mut con)
            .await
            .unwrap();
        let info: HashMap<String, redis::Value> = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(&old)
            .query_async(&mut con)
            .await
            .unwrap();
        let text = |v: &redis::Value| redis::from_redis_value::<String>(v.clone()).unwrap();
        let drained = groups[0]["pending"] == redis::Value::Int(0)
            && text(&groups[0]["last-delivered-id"]) == text(&info["last-generated-id"]);
        if drained {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old stream was not drained: {groups:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(drain.terminate(T).await.success());
    let _: i64 = redis::cmd("DEL").arg(&old).query_async(&mut con).await.unwrap();

    for id in &held {
        let r = reply(&mut con, client.reply_to(), id, T)
            .await
            .unwrap_or_else(|| panic!("pending request {id} was never answered"));
        assert_eq!(r["status"], "ACQUIRED", "{r:?}");
    }
    let r = client.call(&Call::acquire("lic", "after-2"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "XADD * works again");
    worker.stop().await;
    assert_eq!(
        holders(&settings, "lic").await,
        ["after-1", "after-2", "held-1", "held-2", "unread"]
    );
    assert_eq!(pending(&settings).await, 0);
}
