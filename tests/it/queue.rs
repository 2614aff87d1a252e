//! The reaper, the wait queue, seat events and grants to queued users.

use std::collections::HashMap;
use std::time::Duration;

use seatgate::client::{Call, Client, ReplyMsg};
use seatgate::engine::keys::Keys;
use seatgate::engine::license::{self, LicenseSpec};
use seatgate::engine::protocol::Op;
use seatgate::engine::scripts::{AcquireArgs, Guard, Scripts};
use seatgate::engine::status::Status;
use seatgate::runtime::reaper::Reaper;

use crate::support::{holders, spawn_worker, RedisServer, RedisServerExt};

const T: Duration = Duration::from_secs(5);

fn acquire(license: &str, session: &str, wait_ms: u64) -> Call {
    Call::new(Op::Acquire, license, session)
        .with_meta(format!(r#"{{"user_email":"{session}@example.com"}}"#))
        .with_wait(wait_ms)
}

fn op(op: Op, license: &str, session: &str) -> Call {
    Call::new(op, license, session)
}

async fn provision(redis: &RedisServer, license: &str, seats: u64, heartbeat_timeout_ms: Option<u64>) {
    let mut con = redis.con().await;
    let spec = LicenseSpec {
        seats_total: seats,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms,
    };
    license::put(&mut con, &Keys::new("seat"), license, &spec)
        .await
        .unwrap();
}

async fn reaper(redis: &RedisServer) -> Reaper {
    reaper_with_batch(redis, 500).await
}

async fn reaper_with_batch(redis: &RedisServer, batch: usize) -> Reaper {
    let mut settings = redis.settings();
    settings.reaper.batch = batch;
    Reaper::new(seatgate::connect(&settings).await.unwrap(), &settings)
}

/// Every event on the events stream, oldest first.
async fn events(redis: &RedisServer) -> Vec<HashMap<String, String>> {
    crate::support::stream_entries(&mut redis.con().await, "seat:events").await
}

fn of_type<'a>(events: &'a [HashMap<String, String>], kind: &str) -> Vec<&'a HashMap<String, String>> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The `granted` events name exactly `queue_order`, and their grant times
/// (the Redis clock when the script granted) follow it. The events of
/// concurrently decided batches may be appended in another order, so the
/// stream order itself is not the test.
fn assert_granted_in_order(events: &[HashMap<String, String>], queue_order: &[&str]) {
    let at: HashMap<&str, i64> = of_type(events, "granted")
        .iter()
        .map(|e| (e["session"].as_str(), e["at_ms"].parse().unwrap()))
        .collect();
    let mut names: Vec<&str> = at.keys().copied().collect();
    names.sort();
    let mut want = queue_order.to_vec();
    want.sort();
    assert_eq!(names, want, "granted sessions");
    for pair in queue_order.windows(2) {
        assert!(
            at[pair[0]] <= at[pair[1]],
            "{} granted after {}: {at:?}",
            pair[0],
            pair[1]
        );
    }
}

async fn client(redis: &RedisServer) -> Client {
    Client::connect(&redis.url(), "seat:requests").await.unwrap()
}

/// Sends an acquire that may queue and returns (first reply, request id, client).
async fn queue_up(
    redis: &RedisServer,
    license: &str,
    session: &str,
    wait_ms: u64,
) -> (ReplyMsg, String, Client) {
    let mut c = client(redis).await;
    let id = c.send(&acquire(license, session, wait_ms)).await.unwrap();
    let first = c.wait_for(&id, T).await.unwrap();
    (first, id, c)
}

#[tokio::test]
async fn stale_sessions_are_evicted_and_live_ones_kept() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "lic", 3, Some(300)).await;
    let worker = spawn_worker(redis.settings(), "w1").await;
    let mut c = client(&redis).await;
    for s in ["dead", "alive"] {
        assert_eq!(
            c.call(&acquire("lic", s, 0), T).await.unwrap().status(),
            Status::Acquired
        );
    }
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.call(&op(Op::Heartbeat, "lic", "alive"), T).await.unwrap();
    }
    let report = reaper(&redis).await.pass().await.unwrap();
    assert_eq!(report.evicted, 1);
    assert_eq!(holders(&redis, "lic").await, ["alive"]);
    let ev = events(&redis).await;
    let evicted = of_type(&ev, "evicted");
    assert_eq!(evicted.len(), 1);
    assert_eq!(
        (evicted[0]["session"].as_str(), evicted[0]["reason"].as_str()),
        ("dead", "heartbeat_timeout")
    );
    assert_eq!(evicted[0]["seats_used"], "1");
    let r = c.call(&op(Op::Heartbeat, "lic", "dead"), T).await.unwrap();
    assert_eq!(
        r.status(),
        Status::SessionNotActive,
        "an evicted session must acquire again"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reapers_evict_each_session_once() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "lic", 200, Some(100)).await;
    let mut con = redis.con().await;
    let keys = Keys::new("seat").license("lic");
    let scripts = Scripts::get();
    for i in 0..150 {
        let session = format!("s{i}");
        let guard = Guard::none(&Keys::new("seat"), "lic", &session);
        let args = AcquireArgs {
            session: &session,
            meta: "{}",
            wait_ms: 0,
            request_id: "r",
            reply_to: "",
            default_queue_max: 10,
        };
        scripts.acquire(&keys, &guard, &args).run(&mut con).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Small steps, so the two passes interleave on the same license.
    let (a, b) = (
        reaper_with_batch(&redis, 7).await,
        reaper_with_batch(&redis, 7).await,
    );
    let (ra, rb) = tokio::join!(a.pass(), b.pass());
    assert_eq!(ra.unwrap().evicted + rb.unwrap().evicted, 150);
    let ev = events(&redis).await;
    let evicted = of_type(&ev, "evicted");
    assert_eq!(evicted.len(), 150, "one event per eviction");
    let mut sessions: Vec<&str> = evicted.iter().map(|e| e["session"].as_str()).collect();
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), 150, "no session evicted twice");
    assert!(holders(&redis, "lic").await.is_empty());
}

#[tokio::test]
async fn waiters_queue_in_order_and_the_head_is_granted_a_freed_seat() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "lic", 2, None).await;
    let worker = spawn_worker(redis.settings(), "w1").await;

    let mut waiting = Vec::new();
    for (i, s) in ["u1", "u2", "u3", "u4", "u5"].into_iter().enumerate() {
        let (first, id, c) = queue_up(&redis, "lic", s, 30_000).await;
        if i < 2 {
            assert_eq!(first.status(), Status::Acquired, "{s}");
        } else {
            assert_eq!(first.status(), Status::Queued, "{s}");
            assert_eq!(first.int("position"), i as i64 - 1, "{s}");
            assert_eq!(first.get("ok"), "0");
            waiting.push((s, id, c));
        }
        assert!(holders(&redis, "lic").await.len() <= 2);
    }

    // No queue jumping: a newcomer without a wait is refused while others wait.
    let mut other = client(&redis).await;
    let r = other.call(&acquire("lic", "newcomer", 0), T).await.unwrap();
    assert_eq!(r.status(), Status::NoSeatsAvailable);
    // A newcomer that waits goes to the back.
    let r = other.call(&acquire("lic", "u6", 30_000), T).await.unwrap();
    assert_eq!((r.status(), r.int("position")), (Status::Queued, 4));

    let r = other.call(&op(Op::Release, "lic", "u1"), T).await.unwrap();
    assert_eq!(r.status(), Status::Released);
    let (_, id3, c3) = &mut waiting[0];
    let granted = c3.wait_for(id3, T).await.unwrap();
    assert_eq!(granted.status(), Status::Granted);
    assert_eq!(
        (granted.get("id"), granted.get("session"), granted.get("ok")),
        (id3.as_str(), "u3", "1")
    );
    assert_eq!(granted.int("seats_used"), 2);
    assert_eq!(holders(&redis, "lic").await, ["u2", "u3"]);

    // Two freed seats grant the next two, in order.
    other.call(&op(Op::Release, "lic", "u2"), T).await.unwrap();
    other.call(&op(Op::Release, "lic", "u3"), T).await.unwrap();
    for (session, id, c) in waiting.iter_mut().skip(1) {
        let g = c.wait_for(id, T).await.unwrap();
        assert_eq!((g.status(), g.get("session")), (Status::Granted, *session));
    }
    assert_eq!(holders(&redis, "lic").await, ["u4", "u5"]);

    let ev = events(&redis).await;
    assert_granted_in_order(&ev, &["u3", "u4", "u5"]);
    assert_eq!(of_type(&ev, "queued").len(), 4);
    assert_eq!(of_type(&ev, "released").len(), 3);
    for e in &ev {
        assert!(e["seats_used"].parse::<i64>().unwrap() <= 2, "overbooked: {e:?}");
    }
    worker.stop().await;
}

#[tokio::test]
async fn queue_timeout_leaving_full_queue_and_idempotent_requeue() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "lic", 1, None).await;
    let mut con = redis.con().await;
    let _: () = redis::cmd("HSET")
        .arg("seat:{lic}:license")
        .arg("queue_max")
        .arg(2)
        .query_async(&mut con)
        .await
        .unwrap();
    let worker = spawn_worker(redis.settings(), "w1").await;
    let mut c = client(&redis).await;
    c.call(&acquire("lic", "holder", 0), T).await.unwrap();

    // Idempotent re-queue: same place, one queued event.
    let (first, _, _) = queue_up(&redis, "lic", "patient", 30_000).await;
    assert_eq!((first.status(), first.int("position")), (Status::Queued, 1));
    let (short, short_id, mut short_client) = queue_up(&redis, "lic", "hasty", 300).await;
    assert_eq!((short.status(), short.int("position")), (Status::Queued, 2));
    let again = c.call(&acquire("lic", "patient", 30_000), T).await.unwrap();
    assert_eq!((again.status(), again.int("position")), (Status::Queued, 1));

    // Queue full (queue_max = 2).
    let full = c.call(&acquire("lic", "third", 30_000), T).await.unwrap();
    assert_eq!(full.status(), Status::NoSeatsAvailable);
    assert!(
        full.get("error").contains("queue is full"),
        "{:?}",
        full.get("error")
    );

    // Timeout: the reaper drops the waiter and tells it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = reaper(&redis).await.pass().await.unwrap();
    assert_eq!(report.timed_out, 1);
    let timeout = short_client.wait_for(&short_id, T).await.unwrap();
    assert_eq!((timeout.status(), timeout.get("ok")), (Status::QueueTimeout, "0"));
    assert!(timeout.int("waited_ms") >= 300);

    // Leaving the queue.
    let left = c.call(&op(Op::Release, "lic", "patient"), T).await.unwrap();
    assert_eq!(left.status(), Status::LeftQueue);
    let ev = events(&redis).await;
    assert_eq!(
        of_type(&ev, "queued").len(),
        2,
        "re-sent acquire publishes no second event"
    );
    assert_eq!(of_type(&ev, "queue_timeout").len(), 1);
    assert_eq!(of_type(&ev, "left_queue").len(), 1);
    let mut con = redis.con().await;
    let depth: i64 = redis::cmd("ZCARD")
        .arg("seat:{lic}:queue")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(depth, 0);
    worker.stop().await;
}

#[tokio::test]
async fn a_seat_freed_without_a_grant_is_healed_by_the_next_reaper_pass() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "lic", 1, None).await;
    let worker = spawn_worker(redis.settings(), "w1").await;
    let mut c = client(&redis).await;
    c.call(&acquire("lic", "holder", 0), T).await.unwrap();
    let (first, id, mut waiter) = queue_up(&redis, "lic", "waiter", 30_000).await;
    assert_eq!(first.status(), Status::Queued);

    // Free the seat behind seatgate's back: no event, no grant.
    let mut con = redis.con().await;
    let _: () = redis::cmd("ZREM")
        .arg("seat:{lic}:holders")
        .arg("holder")
        .query_async(&mut con)
        .await
        .unwrap();
    let report = reaper(&redis).await.pass().await.unwrap();
    assert_eq!(report.granted, 1);
    let g = waiter.wait_for(&id, T).await.unwrap();
    assert_eq!(g.status(), Status::Granted);
    assert_eq!(holders(&redis, "lic").await, ["waiter"]);
    worker.stop().await;
}

#[tokio::test]
async fn a_granted_user_who_never_heartbeats_is_reaped_and_the_next_is_granted() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "lic", 1, Some(300)).await;
    let worker = spawn_worker(redis.settings(), "w1").await;
    let mut c = client(&redis).await;
    c.call(&acquire("lic", "first", 0), T).await.unwrap();
    let (_, id2, mut c2) = queue_up(&redis, "lic", "second", 30_000).await;
    let (_, id3, mut c3) = queue_up(&redis, "lic", "third", 30_000).await;
    let r = reaper(&redis).await;

    tokio::time::sleep(Duration::from_millis(350)).await;
    r.pass().await.unwrap(); // first is stale: second gets the seat
    assert_eq!(c2.wait_for(&id2, T).await.unwrap().status(), Status::Granted);
    tokio::time::sleep(Duration::from_millis(350)).await;
    r.pass().await.unwrap(); // second never heartbeated: third gets it
    assert_eq!(c3.wait_for(&id3, T).await.unwrap().status(), Status::Granted);
    assert_eq!(holders(&redis, "lic").await, ["third"]);
    worker.stop().await;
}

/// Many sessions heartbeating, some dying, a queue draining under the
/// scheduled reaper: every waiter is granted in FIFO order or times out, and
/// the seats are never exceeded (sampled throughout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_heartbeats_deaths_and_a_draining_queue() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "e2e", 3, Some(400)).await;
    let mut settings = redis.settings();
    settings.reaper.schedule = "* * * * * *".into(); // every second
    let worker = spawn_worker(settings.clone(), "w1").await;
    let scheduled = Reaper::new(seatgate::connect(&settings).await.unwrap(), &settings);
    let mut scheduler = seatgate::runtime::reaper::start(scheduled, &settings.reaper.schedule, 5_000)
        .await
        .unwrap();

    // The sampler: seats used never exceed 3.
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let stop = stop.clone();
        let mut con = redis.con().await;
        tokio::spawn(async move {
            let mut samples = 0;
            while !stop.is_cancelled() {
                let n: i64 = redis::cmd("ZCARD")
                    .arg("seat:{e2e}:holders")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                assert!(n <= 3, "overbooked: {n} holders");
                samples += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        })
    };

    // Three holders: one heartbeats for a while then releases, two die silently.
    let mut c = Client::connect(&redis.url(), "seat:requests").await.unwrap();
    for s in ["steady", "dies-1", "dies-2"] {
        assert_eq!(
            c.call(&acquire("e2e", s, 0), T).await.unwrap().status(),
            Status::Acquired
        );
    }
    // Six waiters in order; w5 only waits briefly.
    let mut waiters = Vec::new();
    for i in 0..6 {
        let wait = if i == 4 { 200 } else { 20_000 };
        let (first, id, cl) = queue_up(&redis, "e2e", &format!("w{i}"), wait).await;
        assert_eq!((first.status(), first.int("position")), (Status::Queued, i + 1));
        waiters.push((i, id, cl));
    }
    let steady = tokio::spawn({
        let url = redis.url();
        async move {
            let mut c = Client::connect(&url, "seat:requests").await.unwrap();
            for _ in 0..10 {
                c.call(&op(Op::Heartbeat, "e2e", "steady"), T).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            c.call(&op(Op::Release, "e2e", "steady"), T).await.unwrap();
        }
    });
    // Granted waiters heartbeat until they release, so they are not reaped.
    let mut outcomes = Vec::new();
    let mut tasks = Vec::new();
    for (i, id, mut cl) in waiters {
        let url = redis.url();
        tasks.push(tokio::spawn(async move {
            let r = cl.wait_for(&id, Duration::from_secs(15)).await.unwrap();
            if r.status() == Status::Granted {
                let mut c = Client::connect(&url, "seat:requests").await.unwrap();
                for _ in 0..3 {
                    c.call(&op(Op::Heartbeat, "e2e", &format!("w{i}")), T)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                c.call(&op(Op::Release, "e2e", &format!("w{i}")), T)
                    .await
                    .unwrap();
            }
            (i, r.status())
        }));
    }
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    steady.await.unwrap();
    stop.cancel();
    let samples = sampler.await.unwrap();
    scheduler.shutdown().await.unwrap();
    worker.stop().await;

    let by_waiter: HashMap<i64, Status> = outcomes.into_iter().collect();
    assert_eq!(
        by_waiter[&4],
        Status::QueueTimeout,
        "the impatient waiter gave up"
    );
    for i in [0, 1, 2, 3, 5] {
        assert_eq!(by_waiter[&i], Status::Granted, "w{i}");
    }
    let ev = events(&redis).await;
    assert_granted_in_order(&ev, &["w0", "w1", "w2", "w3", "w5"]);
    let evicted: Vec<&str> = of_type(&ev, "evicted")
        .iter()
        .map(|e| e["session"].as_str())
        .collect();
    assert!(
        evicted.contains(&"dies-1") && evicted.contains(&"dies-2"),
        "{evicted:?}"
    );
    assert!(samples > 50, "the sampler ran ({samples} samples)");
}

/// Queue replies left in the outbox (their deliverer died) beyond one reap
/// step's limit are all delivered by one reaper pass, over several bounded steps.
#[tokio::test]
async fn undelivered_queue_replies_beyond_the_step_limit_are_all_delivered_in_one_pass() {
    let redis = RedisServer::start_with(&[]);
    provision(&redis, "lic", 0, None).await;
    let mut con = redis.con().await;
    let ks = Keys::new("seat");
    let keys = ks.license("lic");
    let scripts = Scripts::get();
    for i in 0..20 {
        let (session, request_id) = (format!("w{i:02}"), format!("r{i:02}"));
        let reply_to = format!("seat:reply:{session}");
        let args = AcquireArgs {
            session: &session,
            meta: "{}",
            wait_ms: 200,
            request_id: &request_id,
            reply_to: &reply_to,
            default_queue_max: 100,
        };
        let guard = Guard::none(&ks, "lic", &session);
        let o = scripts.acquire(&keys, &guard, &args).run(&mut con).await.unwrap();
        assert_eq!(o.status, Status::Queued);
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    // A script ends all 20 waits and its worker dies before delivering.
    let args = AcquireArgs {
        session: "late",
        meta: "{}",
        wait_ms: 0,
        request_id: "x",
        reply_to: "",
        default_queue_max: 100,
    };
    let guard = Guard::none(&ks, "lic", "late");
    let o = scripts.acquire(&keys, &guard, &args).run(&mut con).await.unwrap();
    assert_eq!(o.notes.len(), 20);

    let mut settings = redis.settings();
    settings.reaper.batch = 7;
    settings.reaper.redeliver_after_ms = 1;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Reaper::new(seatgate::connect(&settings).await.unwrap(), &settings)
        .pass()
        .await
        .unwrap();
    for i in 0..20 {
        let replies = crate::support::stream_entries(&mut con, &format!("seat:reply:w{i:02}")).await;
        assert_eq!(replies.len(), 1, "w{i:02}: {replies:?}");
        assert_eq!(
            (replies[0]["id"].as_str(), replies[0]["status"].as_str()),
            (format!("r{i:02}").as_str(), "QUEUE_TIMEOUT")
        );
    }
    let left: i64 = redis::cmd("HLEN")
        .arg(&keys.outbox)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(left, 0, "delivered notes leave the outbox");
}
