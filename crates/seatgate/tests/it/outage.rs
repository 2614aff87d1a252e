//! Outages evict no live holder (issue 20, point 2), and a grant is never
//! news of a seat already gone (point 7): real Redis, real workers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seatgate_client::Call;
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{
    acquire, client, direct, events, holders, provision, queue_up, reaper, seats_with_timeout, spawn_app,
    spawn_app_with, spawn_worker, Entry, TestApp, WorkerProcess, T,
};

/// The heartbeat timeout of these tests' licenses.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The sessions of `license`'s `evicted` events.
async fn evicted(settings: &seatgate::config::Settings, license: &str) -> Vec<String> {
    let ev: Vec<Entry> = events(settings, license).await;
    ev.iter()
        .filter(|e| e["type"] == "evicted")
        .map(|e| e["session"].clone())
        .collect()
}

/// What each heartbeat of a holder got: when it was answered, and its
/// status (`None`: no answer, Redis was away).
type Beats = Arc<Mutex<Vec<(Instant, Option<Status>)>>>;

/// Heartbeats `session` of "lic" every 500 ms from a client of its own
/// (a new one after any failure, so a Redis restart is ridden out) until
/// `stop` is cancelled.
fn heartbeat_every_500ms(
    settings: &seatgate::config::Settings,
    session: &str,
    lease: seatgate_core::protocol::Lease,
    stop: CancellationToken,
) -> (Beats, tokio::task::JoinHandle<()>) {
    let beats: Beats = Arc::default();
    let (settings, session, log) = (settings.clone(), session.to_owned(), beats.clone());
    let task = tokio::spawn(async move {
        let mut c = None;
        while !stop.is_cancelled() {
            if c.is_none() {
                c = tokio::time::timeout(Duration::from_secs(1), settings.client().connect())
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            if let Some(client) = &c {
                let call = Call::heartbeat("lic", &session).with_lease(lease.clone());
                let r = client.call(&call, Duration::from_secs(1)).await;
                log.lock()
                    .unwrap()
                    .push((Instant::now(), r.as_ref().ok().map(|r| r.status())));
                if r.is_err() {
                    c = None;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    (beats, task)
}

/// Redis stopped for twice the heartbeat timeout and restarted (AOF on),
/// under a running worker that reaps every second, and a reaper pass the
/// moment Redis is back: the holder that kept
/// heartbeating keeps its seat; the one that had stopped is evicted within
/// timeout + gap + a reaper period or two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_longer_than_the_timeout_evicts_no_live_holder() {
    let TestApp(mut redis, settings, _) = spawn_app_with(&["--appendonly", "yes"]).await;
    provision(
        &settings,
        "lic",
        &seats_with_timeout(2, TIMEOUT.as_millis() as u64),
    )
    .await;
    let _worker = WorkerProcess::start(
        &redis.url(),
        &[
            ("SEATGATE__REAPER__SCHEDULE", "* * * * * *".into()),
            ("SEATGATE__REAPER__LOCK_MS", "2000".into()),
        ],
    )
    .await;
    let c = client(&settings).await;
    for s in ["live", "stopped"] {
        assert_eq!(
            c.call(&acquire("lic", s, 0), T).await.unwrap().status(),
            Status::Acquired
        );
    }
    let stopped_last_heartbeat = Instant::now();
    let stop = CancellationToken::new();
    let (beats, task) =
        heartbeat_every_500ms(&settings, "live", c.lease("lic", "live").unwrap(), stop.clone());
    // The service runs normally for a reaper period or so first.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    redis.shutdown().await;
    let down = Instant::now();
    tokio::time::sleep(2 * TIMEOUT).await;
    redis.restart().await.expect("restart redis");
    let gap = down.elapsed();
    let back = Instant::now();
    // A reaper of another process passes the moment Redis answers, before
    // any heartbeat sent since could be read.
    let first = reaper(&settings).await.pass().await.unwrap();
    eprintln!("first pass after the restart: evicted {}", first.evicted);

    // Two reaper periods of slack over the bound (the pass's schedule, and
    // the reap itself).
    let bound = stopped_last_heartbeat + TIMEOUT + gap + Duration::from_secs(1) + Duration::from_secs(2);
    loop {
        if evicted(&settings, "lic").await.contains(&"stopped".to_owned()) {
            break;
        }
        assert!(
            Instant::now() < bound,
            "the holder that stopped was not evicted within timeout + gap + a period (gap {gap:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped_evicted_after = stopped_last_heartbeat.elapsed();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.cancel();
    task.await.unwrap();

    let beats = beats.lock().unwrap().clone();
    let after: Vec<Option<Status>> = beats
        .iter()
        .filter(|(at, _)| *at > back)
        .map(|(_, s)| *s)
        .collect();
    eprintln!(
        "outage of {gap:?}: 'stopped' evicted {stopped_evicted_after:?} after its last heartbeat; \
         'live' heartbeats after the restart: {after:?}"
    );
    assert!(
        after.iter().flatten().count() >= 3,
        "the live holder's heartbeats were answered after the restart: {after:?}"
    );
    assert!(
        after.iter().flatten().all(|s| *s == Status::HeartbeatUpdated),
        "every heartbeat of the live holder after the outage is HEARTBEAT_UPDATED: {after:?}"
    );
    assert_eq!(
        evicted(&settings, "lic").await,
        ["stopped"],
        "only the stopped holder is evicted"
    );
    assert_eq!(holders(&settings, "lic").await, ["live"]);
}

/// Every worker stopped (SIGSTOP) for twice the heartbeat timeout while the
/// holder keeps sending heartbeats to the stream, and reaper passes run
/// meanwhile: nobody is evicted, and after SIGCONT its heartbeats are
/// answered HEARTBEAT_UPDATED. A holder that sent nothing is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_unread_while_every_worker_is_stopped_still_count() {
    let TestApp(redis, settings, _) = spawn_app().await;
    provision(
        &settings,
        "lic",
        &seats_with_timeout(2, TIMEOUT.as_millis() as u64),
    )
    .await;
    let worker = WorkerProcess::start(&redis.url(), &[("SEATGATE__REAPER__ENABLED", "false".into())]).await;
    let c = client(&settings).await;
    for s in ["live", "stopped"] {
        assert_eq!(
            c.call(&acquire("lic", s, 0), T).await.unwrap().status(),
            Status::Acquired
        );
    }
    let r = reaper(&settings).await;

    worker.signal("STOP");
    let stopped_at = Instant::now();
    let mut sent = Vec::new();
    let mut held = 0;
    while stopped_at.elapsed() < 2 * TIMEOUT {
        sent.push(c.send(&Call::heartbeat("lic", "live")).await.unwrap());
        let pass = r.pass().await.unwrap();
        assert!(
            pass.outage.watermark_ms.is_some(),
            "heartbeats wait unread: {pass:?}"
        );
        held = held.max(pass.held);
        assert_eq!(
            pass.evicted,
            0,
            "no eviction while the holder's heartbeats wait unread ({:?} into the stop)",
            stopped_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(held, 2, "both holders were stale by the clock, and kept");
    worker.signal("CONT");
    for id in &sent {
        assert_eq!(
            c.wait_for(id, T).await.unwrap().status(),
            Status::HeartbeatUpdated
        );
    }
    let r2 = c.call(&Call::heartbeat("lic", "live"), T).await.unwrap();
    assert_eq!(r2.status(), Status::HeartbeatUpdated);
    // Once the stream is read, the holder that sent nothing goes.
    assert_eq!(r.pass().await.unwrap().evicted, 1);
    assert_eq!(evicted(&settings, "lic").await, ["stopped"]);
    assert_eq!(holders(&settings, "lic").await, ["live"]);
}

/// `XINFO GROUPS` `lag` above 0 with nothing undelivered, as on a replica
/// promoted by a master failover (Redis 7.0 does not replicate a group's
/// `entries-read` when `XREADGROUP` delivers entries; the history checker
/// on a cluster found `lag` 70 with nothing after the last-delivered-id),
/// set here with `XGROUP SETID … ENTRIESREAD`: a holder that stopped
/// heartbeating is evicted all the same, and the lag metric's source says 0.
/// Before, the reaper took the lag at its word and held the read watermark
/// at the last delivered request, the holder's acquire: it was never evicted
/// while that stream stayed quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lag_redis_miscounts_holds_back_no_eviction() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(2, 1000)).await;
    let worker = spawn_worker(settings.clone(), "w").await;
    let c = client(&settings).await;
    assert_eq!(
        c.call(&acquire("lic", "gone", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    worker.stop().await;
    let stream = settings.stream.requests.clone();
    let group = settings.stream.group.clone();
    let info: std::collections::HashMap<String, redis::Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(&stream)
        .query_async(&mut con)
        .await
        .unwrap();
    let added: i64 = redis::from_redis_value(info["entries-added"].clone()).unwrap();
    let _: () = redis::cmd("XGROUP")
        .arg("SETID")
        .arg(&stream)
        .arg(&group)
        .arg("$")
        .arg("ENTRIESREAD")
        .arg(0)
        .query_async(&mut con)
        .await
        .unwrap();
    let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&stream)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(added > 0);
    assert_eq!(
        groups[0]["lag"],
        redis::Value::Int(added),
        "Redis miscounts: every entry read, all said unread"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = reaper(&settings).await;
    let pass = r.pass().await.unwrap();
    assert_eq!(pass.outage.watermark_ms, None, "nothing waits: {pass:?}");
    assert_eq!(pass.evicted, 1, "{pass:?}");
    assert_eq!(evicted(&settings, "lic").await, ["gone"]);
    let (health, _) = r.stream_health().await;
    let lag: Vec<_> = health.iter().map(|h| (h.stream.as_str(), h.lag)).collect();
    assert_eq!(lag, [(stream.as_str(), Some(0))]);
}

/// A waiter granted a seat by a release whose GRANTED nobody delivered (the
/// script ran directly: no worker settles it, the note stays in the
/// outbox), for longer than the heartbeat timeout. The reaper's pass then
/// either delivers GRANTED while the waiter holds the seat (and its
/// heartbeat is HEARTBEAT_UPDATED), or a final refusal: never GRANTED for a
/// seat gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undelivered_grant_is_delivered_only_with_its_seat() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.reaper.redeliver_after_ms = 0;
    provision(
        &settings,
        "lic",
        &seats_with_timeout(1, TIMEOUT.as_millis() as u64),
    )
    .await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    direct(&settings, "lic", "holder").acquire(&mut con).await;
    let (q, id, waiter) = queue_up(&settings, "lic", "waiter", 60_000).await;
    assert_eq!(q.status(), Status::Queued);
    // Run as on a cluster: its GRANTED waits in the outbox for a worker.
    let released = direct(&settings, "lic", "holder")
        .via_outbox()
        .release(&mut con)
        .await;
    assert_eq!(
        released.notes.len(),
        1,
        "the release granted the waiter: {released:?}"
    );
    // Its GRANTED sits in the outbox, undelivered, past the heartbeat timeout.
    tokio::time::sleep(TIMEOUT + Duration::from_millis(300)).await;

    reaper(&settings).await.pass().await.unwrap();
    let g = waiter.wait_for(&id, T).await.unwrap();
    let now_holding = holders(&settings, "lic").await;
    eprintln!(
        "after the pass: {:?} (held_since_ms {:?}); holders {now_holding:?}",
        g.status(),
        g.get("held_since_ms")
    );
    if g.status() == Status::Granted {
        assert_eq!(
            now_holding,
            ["waiter"],
            "GRANTED delivered for a seat the waiter no longer holds"
        );
        let hb = waiter.call(&Call::heartbeat("lic", "waiter"), T).await.unwrap();
        assert_eq!(hb.status(), Status::HeartbeatUpdated);
        let since: i64 = g
            .get("held_since_ms")
            .parse()
            .expect("GRANTED carries held_since_ms");
        assert!(since > 0, "held_since_ms is a Redis time: {since}");
    } else {
        assert!(!g.ok() && g.is_final(), "a final refusal: {g:?}");
    }
    assert!(
        evicted(&settings, "lic").await.is_empty(),
        "an unheard-of grant is not evicted"
    );
    worker.stop().await;
}

/// The same, but the granted seat was taken back (revoked) before the
/// reaper handed the note out again: the waiter hears a final refusal,
/// never GRANTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_seat_was_taken_back_is_delivered_as_a_refusal() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.reaper.redeliver_after_ms = 0;
    provision(
        &settings,
        "lic",
        &seats_with_timeout(1, TIMEOUT.as_millis() as u64),
    )
    .await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    direct(&settings, "lic", "holder").acquire(&mut con).await;
    let (_, id, waiter) = queue_up(&settings, "lic", "waiter", 60_000).await;
    // Run as on a cluster: its GRANTED waits in the outbox for a worker.
    let released = direct(&settings, "lic", "holder")
        .via_outbox()
        .release(&mut con)
        .await;
    assert_eq!(released.notes.len(), 1);
    let revoked = direct(&settings, "lic", "waiter")
        .revoke(&mut con, "test", "admin", 0)
        .await;
    assert_eq!(revoked.status(), Status::Revoked);
    assert!(holders(&settings, "lic").await.is_empty());

    reaper(&settings).await.pass().await.unwrap();
    let g = waiter.wait_for(&id, T).await.unwrap();
    eprintln!("after the pass: {:?} {:?}", g.status(), g.get("error"));
    assert_ne!(
        g.status(),
        Status::Granted,
        "GRANTED delivered for a seat taken back"
    );
    assert!(!g.ok() && g.is_final(), "a final refusal: {g:?}");
    worker.stop().await;
}

/// Replies that grant or keep a seat say when its heartbeat clock last
/// started: ACQUIRED the acquire, ALREADY_ACTIVE the last heartbeat.
#[tokio::test]
async fn replies_that_hold_a_seat_carry_held_since_ms() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(1, 60_000)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    let before = crate::support::redis_ms(&mut con).await;
    let a = c.call(&acquire("lic", "s", 0), T).await.unwrap();
    assert_eq!(a.status(), Status::Acquired);
    let since: i64 = a
        .get("held_since_ms")
        .parse()
        .expect("ACQUIRED carries held_since_ms");
    assert!(since >= before, "{since} vs {before}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let hb = c.call(&Call::heartbeat("lic", "s"), T).await.unwrap();
    assert_eq!(hb.status(), Status::HeartbeatUpdated);
    let again = c.call(&acquire("lic", "s", 0), T).await.unwrap();
    assert_eq!(again.status(), Status::AlreadyActive);
    let beat: i64 = again
        .get("held_since_ms")
        .parse()
        .expect("ALREADY_ACTIVE carries held_since_ms");
    assert!(
        beat > since,
        "the clock restarted at the heartbeat: {beat} vs {since}"
    );
    // The outcome itself, of the script run directly with the seat's lease.
    let lease = c.lease("lic", "s").unwrap();
    let retried = direct(&settings, "lic", "s")
        .with_lease(Some(lease.as_str()))
        .acquire(&mut con)
        .await;
    assert_eq!(
        (retried.status(), retried.held_since_ms),
        (Status::AlreadyActive, Some(beat))
    );
    worker.stop().await;
}
