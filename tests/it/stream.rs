//! The request/reply path end to end: clients XADD, in-process workers decide.

use std::time::Duration;

use redis::AsyncCommands;
use seatgate::client::Call;
use seatgate::engine::protocol::Op;
use seatgate::engine::status::Status;

use crate::support::{
    acquire, client, consumers, db, holders, pending, put_license, spawn_worker, RedisServer, RedisServerExt,
    T,
};

#[tokio::test]
async fn acquire_heartbeat_release_round_trip() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut client = client(&settings).await;

    let r = client.call(&acquire("lic", "s1", 0), T).await.unwrap();
    assert_eq!(
        (r.status(), r.ok(), r.int("seats_used"), r.int("seats_total")),
        (Status::Acquired, true, 1, 1)
    );
    assert_eq!(
        (r.get("op"), r.get("license"), r.get("session")),
        ("acquire", "lic", "s1")
    );

    let r = client.call(&acquire("lic", "s1", 0), T).await.unwrap();
    assert_eq!(r.status(), Status::AlreadyActive);
    let r = client.call(&acquire("lic", "s2", 0), T).await.unwrap();
    assert_eq!((r.status(), r.ok()), (Status::NoSeatsAvailable, false));
    assert!(!r.get("error").is_empty());

    let r = client
        .call(&Call::new(Op::Heartbeat, "lic", "s1"), T)
        .await
        .unwrap();
    assert_eq!((r.status(), r.int("heartbeats")), (Status::HeartbeatUpdated, 1));
    let r = client
        .call(&Call::new(Op::Release, "lic", "s1"), T)
        .await
        .unwrap();
    assert_eq!((r.status(), r.int("seats_used")), (Status::Released, 0));
    let r = client
        .call(&Call::new(Op::Release, "lic", "s1"), T)
        .await
        .unwrap();
    assert_eq!(r.status(), Status::SessionNotFound);
    let r = client
        .call(&Call::new(Op::Heartbeat, "lic", "s1"), T)
        .await
        .unwrap();
    assert_eq!(r.status(), Status::SessionNotActive);
    let r = client.call(&acquire("nope", "s1", 0), T).await.unwrap();
    assert_eq!(r.status(), Status::LicenseNotFound);

    worker.stop().await;
    assert_eq!(pending(&settings).await, 0, "every request acknowledged");
}

#[tokio::test]
async fn reply_streams_are_capped_and_expire() {
    // Small stream nodes, so that the approximate cap (MAXLEN ~) trims early.
    let redis = RedisServer::start_with(&["--stream-node-max-entries", "10"]).await;
    let mut settings = redis.settings();
    settings.replies.maxlen = 10;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut client = client(&settings).await;
    for _ in 0..50 {
        client
            .call(&Call::new(Op::Heartbeat, "lic", "s1"), T)
            .await
            .unwrap();
    }
    let mut con = db(&settings).await;
    let len: usize = con.xlen(client.reply_to()).await.unwrap();
    assert!(len <= 20, "50 replies capped at about 10: {len} left");
    let ttl: i64 = con.pttl(client.reply_to()).await.unwrap();
    assert!(ttl > 0 && ttl <= 300_000, "reply stream expires (pttl {ttl})");
    worker.stop().await;
}

#[tokio::test]
async fn requests_written_before_any_worker_are_served() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 2).await;
    let mut client = client(&settings).await;
    let early = client.send(&acquire("lic", "early", 0)).await.unwrap();
    let worker = spawn_worker(settings.clone(), "w1").await;
    let r = client.wait_for(&early, T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    worker.stop().await;
}

/// The seed's load test, through the stream: 100 concurrent acquirers, 10 seats, two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_acquires_over_the_stream_with_two_workers() {
    let redis = RedisServer::start_with(&[]).await;
    let mut settings = redis.settings();
    put_license(&settings, "load", 10).await;
    settings.stream.batch_size = 8; // several batches per worker, so both take part
    let w1 = spawn_worker(settings.clone(), "w1").await;
    let w2 = spawn_worker(settings.clone(), "w2").await;

    let mut tasks = Vec::new();
    for i in 0..100 {
        let settings = settings.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = client(&settings).await;
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
