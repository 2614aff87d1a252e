//! The request/reply path end to end: clients XADD, in-process workers decide.

use std::time::Duration;

use redis::AsyncCommands;
use seatgate::config::Settings;
use seatgate_client::Call;
use seatgate_core::keys::shard_name;
use seatgate_core::status::Status;

use crate::support::{
    acquire, client, consumers, db, holders, pending, provision, put_license, queue_up, reply_stream,
    seats_with_timeout, spawn_app, spawn_worker, RedisServer, RedisServerExt, TestApp, T,
};

#[tokio::test]
async fn acquire_heartbeat_release_round_trip() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;

    let r = client.call(&acquire("lic", "s1", 0), T).await.unwrap();
    assert_eq!(
        (r.status(), r.ok(), r.int("seats_used"), r.int("seats_total")),
        (Status::Acquired, true, 1, 1)
    );
    assert_eq!(
        (r.get("op"), r.get("license"), r.get("session")),
        ("acquire", "lic", "s1")
    );
    // The license sets no timeout: the service's, which the client need not know.
    let default = Duration::from_millis(settings.sessions.heartbeat_timeout_ms);
    assert_eq!(r.heartbeat_timeout(), Some(default));

    let r = client.call(&acquire("lic", "s1", 0), T).await.unwrap();
    assert_eq!(
        (r.status(), r.heartbeat_timeout()),
        (Status::AlreadyActive, Some(default))
    );
    let r = client.call(&acquire("lic", "s2", 0), T).await.unwrap();
    assert_eq!((r.status(), r.ok()), (Status::NoSeatsAvailable, false));
    assert!(!r.get("error").is_empty());

    let r = client.call(&Call::heartbeat("lic", "s1"), T).await.unwrap();
    assert_eq!((r.status(), r.int("heartbeats")), (Status::HeartbeatUpdated, 1));
    assert_eq!(
        r.heartbeat_timeout(),
        Some(default),
        "the replies that keep a seat carry it too"
    );
    let r = client.call(&Call::release("lic", "s1"), T).await.unwrap();
    assert_eq!((r.status(), r.int("seats_used")), (Status::Released, 0));
    let r = client.call(&Call::release("lic", "s1"), T).await.unwrap();
    assert_eq!(r.status(), Status::SessionNotFound);
    let r = client.call(&Call::heartbeat("lic", "s1"), T).await.unwrap();
    assert_eq!(r.status(), Status::SessionNotActive);
    let r = client.call(&acquire("nope", "s1", 0), T).await.unwrap();
    assert_eq!(r.status(), Status::LicenseNotFound);

    worker.stop().await;
    assert_eq!(pending(&settings).await, 0, "every request acknowledged");
}

/// An operator lowering a license's heartbeat timeout: a client that takes
/// the value from the latest reply that carries it (docs/protocol.md,
/// "Writing a client") learns of it from its next heartbeat's reply.
#[tokio::test]
async fn heartbeat_replies_carry_the_timeout_in_force() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    provision(&settings, "lic", &seats_with_timeout(1, 30_000)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    let heartbeat = Call::heartbeat("lic", "s1");

    let r = client.call(&acquire("lic", "s1", 0), T).await.unwrap();
    assert_eq!(
        (r.status(), r.heartbeat_timeout()),
        (Status::Acquired, Some(Duration::from_secs(30)))
    );
    let r = client.call(&heartbeat, T).await.unwrap();
    assert_eq!(
        (r.status(), r.get("heartbeat_timeout_ms")),
        (Status::HeartbeatUpdated, "30000")
    );

    // `seatgate license put --heartbeat-timeout 3s`.
    provision(&settings, "lic", &seats_with_timeout(1, 3_000)).await;
    let r = client.call(&heartbeat, T).await.unwrap();
    assert_eq!(
        (r.status(), r.get("heartbeat_timeout_ms")),
        (Status::HeartbeatUpdated, "3000")
    );

    worker.stop().await;
}

/// A client that gives up waiting in the queue releases with its lease
/// (docs/protocol.md, "Giving up a wait"): before a grant it leaves the
/// queue, so the next freed seat goes to nobody; after one, the seat it was
/// granted is freed at once.
#[tokio::test]
async fn giving_up_a_wait_is_a_release_with_the_lease() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let holder = client(&settings).await;
    let release = |session: &str| Call::release("lic", session);
    assert_eq!(
        holder.call(&acquire("lic", "a", 0), T).await.unwrap().status(),
        Status::Acquired
    );

    // Given up before a grant: LEFT_QUEUE, and the freed seat goes to nobody.
    let (queued, _, waiter) = queue_up(&settings, "lic", "b", 60_000).await;
    assert_eq!(queued.status(), Status::Queued);
    let r = waiter.call(&release("b"), T).await.unwrap();
    assert_eq!((r.status(), r.ok()), (Status::LeftQueue, true));
    let r = holder.call(&release("a"), T).await.unwrap();
    assert_eq!((r.status(), r.int("seats_used")), (Status::Released, 0));

    // Given up after a grant it has not seen yet: RELEASED frees the seat.
    assert_eq!(
        holder.call(&acquire("lic", "a", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    let (queued, id, waiter) = queue_up(&settings, "lic", "c", 60_000).await;
    assert_eq!(queued.status(), Status::Queued);
    let r = holder.call(&release("a"), T).await.unwrap();
    assert_eq!((r.status(), r.int("seats_used")), (Status::Released, 1));
    let r = waiter.call(&release("c"), T).await.unwrap();
    assert_eq!((r.status(), r.int("seats_used")), (Status::Released, 0));
    assert!(holders(&settings, "lic").await.is_empty());
    // The GRANTED it gave up on still arrives: to be ignored.
    assert_eq!(waiter.wait_for(&id, T).await.unwrap().status(), Status::Granted);

    worker.stop().await;
}

#[tokio::test]
async fn reply_streams_expire_after_their_last_reply() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    // <replies.prefix><client.name>:<unique>
    let own = reply_stream(&settings, &format!("{}:", settings.client.name));
    assert!(client.reply_to().starts_with(&own), "{}", client.reply_to());
    client.call(&Call::heartbeat("lic", "s1"), T).await.unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(client.reply_to())
        .query_async(&mut con)
        .await
        .unwrap();
    // replies.ttl_ms is 300 s; the stream outlives its last reply by 1.25 to 1.5 of it.
    assert!(
        ttl > 300_000 && ttl <= 450_000,
        "reply stream expires (pttl {ttl})"
    );
    worker.stop().await;
}

/// Waits until every request on the stream has been read and acknowledged.
async fn drained(settings: &Settings) {
    let mut con = db(settings).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&settings.stream.requests)
            .query_async(&mut con)
            .await
            .unwrap();
        let int = |k: &str| match groups[0].get(k) {
            Some(redis::Value::Int(n)) => *n,
            _ => -1,
        };
        if int("lag") == 0 && int("pending") == 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "requests not drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The request ids of every reply on `stream`, read in pages (one read of
/// thousands of entries could outlast the connection's response timeout on a
/// busy machine).
async fn reply_ids(settings: &Settings, stream: &str) -> Vec<String> {
    let mut con = db(settings).await;
    let mut ids = Vec::new();
    let mut from = "-".to_owned();
    loop {
        let page: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&from)
            .arg("+")
            .arg("COUNT")
            .arg(500)
            .query_async(&mut con)
            .await
            .unwrap();
        let Some(last) = page.ids.last() else { return ids };
        from = format!("({}", last.id);
        ids.extend(page.ids.iter().map(|e| e.get::<String>("id").unwrap_or_default()));
    }
}

/// Reply streams are trimmed by age, never by count: a client that sends
/// thousands of requests before reading finds every reply (the old cap of
/// `replies.maxlen` = 100 kept about the last 100).
#[tokio::test]
async fn a_client_with_5000_requests_in_flight_receives_every_reply() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    let mut sent = std::collections::HashSet::new();
    for i in 0..5_000 {
        // Releases are never rate limited; each (with its lease) is
        // answered SESSION_NOT_FOUND.
        let session = format!("s{i}");
        let lease = seatgate_core::protocol::Lease::parse(&crate::support::lease_of(&session)).unwrap();
        let id = client
            .send(&Call::release("lic", session).with_lease(lease))
            .await
            .unwrap();
        sent.insert(id);
    }
    drained(&settings).await;
    let replies = reply_ids(&settings, client.reply_to()).await;
    assert_eq!(replies.len(), 5_000, "one reply per request, none trimmed");
    let received: std::collections::HashSet<String> = replies.into_iter().collect();
    assert_eq!(received, sent);
    worker.stop().await;
}

/// Replies older than `replies.ttl_ms` are trimmed (by the Redis clock) when
/// later replies come; younger ones never are.
#[tokio::test]
async fn replies_older_than_the_ttl_are_trimmed() {
    let TestApp(_redis, mut settings, _) = spawn_app().await;
    settings.replies.ttl_ms = 1_000;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    // Releases of sessions nobody holds, each with its lease: every one
    // answered SESSION_NOT_FOUND.
    let release = |session: String| {
        let lease = seatgate_core::protocol::Lease::parse(&crate::support::lease_of(&session)).unwrap();
        Call::release("lic", session).with_lease(lease)
    };
    for i in 0..1_000 {
        client.send(&release(format!("old{i}"))).await.unwrap();
    }
    drained(&settings).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let mut young = Vec::new();
    for i in 0..300 {
        young.push(client.send(&release(format!("young{i}"))).await.unwrap());
    }
    drained(&settings).await;
    let replies = reply_ids(&settings, client.reply_to()).await;
    let ids: std::collections::HashSet<&str> = replies.iter().map(String::as_str).collect();
    assert!(
        young.iter().all(|id| ids.contains(id.as_str())),
        "every young reply kept"
    );
    assert!(
        replies.len() < 1_000,
        "most of the 1000 replies older than the ttl trimmed ({} left)",
        replies.len()
    );
    worker.stop().await;
}

#[tokio::test]
async fn requests_written_before_any_worker_are_served() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let client = client(&settings).await;
    let early = client.send(&acquire("lic", "early", 0)).await.unwrap();
    let worker = spawn_worker(settings.clone(), "w1").await;
    let r = client.wait_for(&early, T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    worker.stop().await;
}

/// The seed's load test, through the stream: 100 concurrent acquirers, 10 seats, two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_acquires_over_the_stream_with_two_workers() {
    let TestApp(_redis, mut settings, _) = spawn_app().await;
    put_license(&settings, "load", 10).await;
    settings.stream.batch_size = 8; // several batches per worker, so both take part
    let w1 = spawn_worker(settings.clone(), "w1").await;
    let w2 = spawn_worker(settings.clone(), "w2").await;

    let mut tasks = Vec::new();
    for i in 0..100 {
        let settings = settings.clone();
        tasks.push(tokio::spawn(async move {
            let client = client(&settings).await;
            let id = client
                .send(&acquire("load", &format!("session-{i}"), 0))
                .await
                .unwrap();
            let reply = client.wait_for(&id, Duration::from_secs(20)).await.unwrap();
            // Exactly one reply per request on this client's stream.
            let replies: i64 = db(&settings).await.xlen(client.reply_to()).await.unwrap();
            (reply.status(), replies)
        }));
    }
    let (mut acquired, mut refused) = (0, 0);
    for t in tasks {
        let (status, replies) = t.await.unwrap();
        assert_eq!(replies, 1, "one reply per request");
        match status {
            Status::Acquired => acquired += 1,
            Status::NoSeatsAvailable => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((acquired, refused), (10, 90));
    assert_eq!(holders(&settings, "load").await.len(), 10, "10 holders in Redis");

    // Both workers joined the group (each consumer is created by its first read).
    assert_eq!(consumers(&settings).await.len(), 2);
    w1.stop().await;
    w2.stop().await;
    assert_eq!(pending(&settings).await, 0);
}

/// With sharded streams the workers still answer a request sent to the
/// unsharded `stream.requests` (by a client that does not shard), record the
/// shard count where clients find it, and a worker started with another
/// count refuses to start rather than read other streams than the clients
/// write to. (Growing the count is allowed: topology.rs.)
#[tokio::test]
async fn sharded_workers_answer_the_base_stream_and_guard_the_shard_count() {
    let TestApp(redis, mut sharded, _) = spawn_app().await;
    sharded.stream.shards = 3;
    put_license(&sharded, "lic", 2).await;
    let worker = spawn_worker(sharded.clone(), "w1").await;
    let deployment = seatgate_core::keys::Keys::new(sharded.keys.prefix.clone()).deployment();
    let recorded: Option<String> = db(&sharded).await.hget(&deployment, "shards").await.unwrap();
    assert_eq!(recorded.as_deref(), Some("3"), "the shard count is discoverable");

    // A client that does not shard writes to the base stream itself.
    let unsharded = redis.settings();
    let plain = client(&unsharded).await;
    let r = plain.call(&acquire("lic", "plain", 0), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired, "the base stream is served too");
    let sharding = client(&sharded).await;
    let r = sharding.call(&acquire("lic", "sharded", 0), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    assert_eq!(holders(&sharded, "lic").await, ["plain", "sharded"]);
    worker.stop().await;

    let mut two = sharded.clone();
    two.stream.shards = 2;
    let refused = seatgate::runtime::worker::Worker::connect(two, Default::default())
        .await
        .err()
        .expect("a worker with another shard count refuses to start")
        .to_string();
    assert!(
        refused.contains("stream.shards is 2") && refused.contains("runs with 3"),
        "{refused}"
    );
    // Once the operator records the new counts (streams drained), it starts.
    let _: () = db(&sharded)
        .await
        .hset_multiple(&deployment, &[("shards", 2), ("events_shards", 2)])
        .await
        .unwrap();
    let mut two = sharded.clone();
    two.stream.shards = 2;
    spawn_worker(two, "w2").await.stop().await;
}

/// The scripts' per-application counts of `lic`: waiters of cad and
/// billing, then seats of cad and billing.
async fn app_counts(s: &Settings) -> Vec<Option<i64>> {
    redis::cmd("HMGET")
        .arg(crate::support::license_keys(s, "lic").owners)
        .arg(&["wa:cad", "wa:billing", "a:cad", "a:billing"])
        .query_async(&mut db(s).await)
        .await
        .unwrap()
}

/// What one application may have waiting for a license is its own budget
/// (`tenancy.application_waiters`, issue 35 M1): cad's third waiter is
/// refused NO_SEATS_AVAILABLE naming the limit while billing still queues;
/// each way a wait ends (leaving, a grant) gives cad its place back, and the
/// scripts' counts (`wa:<app>`, `a:<app>`) follow the queue and the holders.
#[tokio::test]
async fn an_applications_waiters_are_held_to_its_own_budget() {
    let TestApp(_redis, mut settings, _con) = spawn_app().await;
    settings.stream.applications = vec!["billing".to_owned(), "cad".to_owned()];
    settings.tenancy.application_waiters = 2;
    put_license(&settings, "lic", 1).await;
    let _worker = spawn_worker(settings.clone(), "w1").await;
    let as_app = |app: &str| {
        let mut s = settings.clone();
        s.client.name = app.to_owned();
        s
    };
    let billing = client(&as_app("billing")).await;
    let cad = client(&as_app("cad")).await;
    let status = |r: seatgate_client::Reply| r.status();
    assert_eq!(
        status(billing.call(&acquire("lic", "b-holder", 0), T).await.unwrap()),
        Status::Acquired
    );
    for session in ["c-1", "c-2"] {
        assert_eq!(
            status(cad.call(&acquire("lic", session, 60_000), T).await.unwrap()),
            Status::Queued
        );
    }
    let refused = cad.call(&acquire("lic", "c-3", 60_000), T).await.unwrap();
    assert_eq!(refused.status(), Status::NoSeatsAvailable, "{refused:?}");
    assert!(refused.error().contains("application_waiters"), "{refused:?}");
    assert_eq!(
        status(billing.call(&acquire("lic", "b-w1", 60_000), T).await.unwrap()),
        Status::Queued
    );
    // Leaving the queue gives cad a place back.
    assert_eq!(
        status(cad.call(&Call::release("lic", "c-1"), T).await.unwrap()),
        Status::LeftQueue
    );
    assert_eq!(
        status(cad.call(&acquire("lic", "c-3", 60_000), T).await.unwrap()),
        Status::Queued
    );
    assert_eq!(app_counts(&settings).await, [Some(2), Some(1), None, Some(1)]);
    // A grant moves a waiter from one count to the other.
    assert_eq!(
        status(billing.call(&Call::release("lic", "b-holder"), T).await.unwrap()),
        Status::Released
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(holders(&settings, "lic").await, ["cad/c-2"]);
    assert_eq!(app_counts(&settings).await, [Some(1), Some(1), Some(1), None]);
}

/// Two applications with requests streams of their own, sharded two ways
/// (`stream.applications`): each one's Rust client sends to its own stream
/// and is served there. An entry id one application gives its XADD is no
/// other stream's entry: two acquires without a caller id under the same
/// explicit entry id, one on each application's stream, are both decided,
/// neither replayed as the other (the dedupe key names the stream).
#[tokio::test]
async fn each_application_is_served_on_its_own_stream_and_entry_ids_do_not_collide() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.stream.applications = vec!["billing".to_owned(), "cad".to_owned()];
    settings.stream.shards = 2;
    put_license(&settings, "lic", 4).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let apps = ["billing", "cad"];
    for app in apps {
        let mut s = settings.clone();
        s.client.name = app.to_owned();
        let r = client(&s)
            .await
            .call(&acquire("lic", &format!("{app}-1"), 0), T)
            .await
            .unwrap();
        assert_eq!(r.status(), Status::Acquired, "{app}");
        let own = shard_name(&settings.app_requests(app), 2, "lic");
        let sent: usize = con.xlen(&own).await.unwrap();
        assert_eq!(sent, 1, "{app}'s request went to its own stream, {own}");
    }
    let shared: usize = con.xlen(settings.request_stream_for("lic")).await.unwrap();
    assert_eq!(shared, 0, "nothing on the shared stream");

    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let id = format!("{}-7", secs * 1000 + 1000);
    for app in apps {
        let own = shard_name(&settings.app_requests(app), 2, "lic");
        let reply_to = reply_stream(&settings, &format!("{app}:same-id"));
        let _: String = redis::cmd("XADD")
            .arg(&own)
            .arg(&id)
            .arg("op")
            .arg("acquire")
            .arg("license")
            .arg("lic")
            .arg("session")
            .arg(format!("{app}-2"))
            .arg("lease")
            .arg(crate::support::lease_of(&format!("{app}-2")))
            .arg("reply_to")
            .arg(&reply_to)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    for app in apps {
        let reply_to = reply_stream(&settings, &format!("{app}:same-id"));
        let read: redis::streams::StreamReadReply = redis::cmd("XREAD")
            .arg("BLOCK")
            .arg(5000)
            .arg("STREAMS")
            .arg(&reply_to)
            .arg("0")
            .query_async(&mut con)
            .await
            .unwrap();
        let entry = &read.keys[0].ids[0];
        assert_eq!(
            (entry.get::<String>("status"), entry.get::<String>("session")),
            (Some("ACQUIRED".to_owned()), Some(format!("{app}-2"))),
            "{app}: {entry:?}"
        );
    }
    assert_eq!(
        holders(&settings, "lic").await,
        // Each application's sessions are its own (seatgate_core::tenancy).
        ["billing/billing-1", "billing/billing-2", "cad/cad-1", "cad/cad-2"]
    );
    worker.stop().await;
}
