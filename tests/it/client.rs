//! The multiplexed request client: one connection and one reply stream
//! shared by any number of concurrent requests, each reply handed to the
//! request it answers; bounded in flight, a timeout per request, a reader
//! that survives a Redis restart, QUEUED then GRANTED through the API.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::AsyncCommands;
use seatgate::client::{Call, Client};
use seatgate::config::Settings;
use seatgate::db::Db;
use seatgate::engine::ops::Op;
use seatgate::engine::status::Status;
use seatgate::Error;

use crate::support::*;

/// Connections the server has open now (`INFO clients`), asked on `probe`:
/// the same connection every time, so that the count never includes one
/// just opened (or not quite closed) to ask.
async fn connected_clients(probe: &mut Db) -> usize {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(probe)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients in INFO")
}

/// Entries on the (unsharded) requests stream.
async fn requests_written(s: &Settings) -> usize {
    db(s).await.xlen(&s.stream.requests).await.unwrap()
}

/// One session's acquire → heartbeat → release through `client`, checking
/// that every reply carries this request's id, license, session and op.
async fn cycle(client: &Client, license: String, session: String) -> Vec<Status> {
    let calls = [
        acquire(&license, &session, 0),
        Call::new(Op::Heartbeat, &license, &session),
        Call::new(Op::Release, &license, &session),
    ];
    let mut statuses = Vec::new();
    for call in calls {
        let mut pending = client.request(&call).await.unwrap();
        let reply = pending.reply(Duration::from_secs(30)).await.unwrap();
        assert_eq!(
            (
                reply.get("id"),
                reply.get("license"),
                reply.get("session"),
                reply.get("op")
            ),
            (pending.id(), license.as_str(), session.as_str(), call.op.as_str()),
            "a reply reached the request it answers"
        );
        statuses.push(reply.status());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_on_one_connection_answers_1000_concurrent_sessions() {
    const LICENSES: usize = 10;
    const SESSIONS: usize = 1_000;
    let TestApp(_redis, settings, mut probe) = spawn_app().await;
    for l in 0..LICENSES {
        put_license(&settings, &format!("lic-{l}"), (SESSIONS / LICENSES) as u64).await;
    }
    let worker = spawn_worker(settings.clone(), "w1").await;
    // The worker's connections are all open once it has read (and so joined the group).
    let deadline = Instant::now() + T;
    while consumers(&settings).await.is_empty() {
        assert!(Instant::now() < deadline, "the worker never read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = connected_clients(&mut probe).await;
    let client = client(&settings).await;
    let with_client = connected_clients(&mut probe).await;
    assert_eq!(
        with_client,
        before + 2,
        "one connection for requests, one for replies"
    );

    let sampler = {
        let client = client.clone();
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let (mut most_connections, mut most_in_flight) = (0, 0);
            while !token.is_cancelled() {
                most_connections = most_connections.max(connected_clients(&mut probe).await);
                most_in_flight = most_in_flight.max(client.stats().in_flight);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (most_connections, most_in_flight)
        });
        (stop, task)
    };
    let started = Instant::now();
    let results =
        join_all((0..SESSIONS).map(|i| cycle(&client, format!("lic-{}", i % LICENSES), format!("s{i}"))))
            .await;
    let elapsed = started.elapsed();
    sampler.0.cancel();
    let (most_connections, most_in_flight) = sampler.1.await.unwrap();

    for statuses in &results {
        assert_eq!(
            statuses,
            &[Status::Acquired, Status::HeartbeatUpdated, Status::Released]
        );
    }
    assert_eq!(
        most_connections, with_client,
        "no connection was added under load"
    );
    assert!(
        most_in_flight > 100,
        "requests were in flight together ({most_in_flight} at most)"
    );
    let replies: usize = db(&settings).await.xlen(client.reply_to()).await.unwrap();
    assert_eq!(replies, 3 * SESSIONS, "every reply on the one reply stream");
    let stats = client.stats();
    assert_eq!(
        (stats.in_flight, stats.waiting, stats.unclaimed),
        (0, 0, 0),
        "nothing left waiting, nothing unclaimed"
    );
    eprintln!(
        "{} requests from one client in {elapsed:?}, at most {most_in_flight} in flight",
        3 * SESSIONS
    );
    worker.stop().await;
}

#[tokio::test]
async fn a_request_that_times_out_does_not_disturb_the_others() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 100).await;
    let client = client(&settings).await;
    // No worker yet: nothing is answered until one starts.
    let doomed = async {
        let mut pending = client.request(&acquire("lic", "doomed", 0)).await.unwrap();
        let timed_out = pending.reply(Duration::from_millis(200)).await;
        (pending.id().to_owned(), timed_out)
    };
    let others = join_all((0..50).map(|i| {
        let client = &client;
        async move {
            let reply = client
                .call(&acquire("lic", &format!("s{i}"), 0), T)
                .await
                .unwrap();
            (i, reply)
        }
    }));
    let starter = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        spawn_worker(settings.clone(), "w1").await
    };
    let ((doomed_id, timed_out), others, worker) = tokio::join!(doomed, others, starter);

    assert!(
        matches!(timed_out, Err(Error::ReplyTimeout(_))),
        "the short wait timed out: {timed_out:?}"
    );
    for (i, reply) in others {
        assert_eq!(
            (reply.status(), reply.get("session")),
            (Status::Acquired, format!("s{i}").as_str())
        );
    }
    // The timed-out request was still decided: its reply came to no waiter
    // and is kept, not handed to anyone else.
    let late = client.wait_for(&doomed_id, T).await.unwrap();
    assert_eq!((late.status(), late.get("session")), (Status::Acquired, "doomed"));
    let stats = client.stats();
    assert_eq!(
        (stats.in_flight, stats.waiting),
        (0, 0),
        "its waiter and slot are gone"
    );
    worker.stop().await;
}

#[tokio::test]
async fn the_reply_reader_survives_a_redis_restart_and_keeps_its_waiters() {
    // Persistence on, so that the request and the license outlive the restart.
    let TestApp(mut redis, settings, _) =
        spawn_app_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    put_license(&settings, "lic", 2).await;
    let client = client(&settings).await;
    // Sent with no worker running: it waits through the restart.
    let mut waiting = client.request(&acquire("lic", "patient", 0)).await.unwrap();
    assert_eq!(requests_written(&settings).await, 1);

    redis.shutdown().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.restart().await.expect("restart redis");
    let worker = spawn_worker(settings.clone(), "w1").await;

    let reply = waiting.reply(Duration::from_secs(15)).await.unwrap();
    assert_eq!(
        (reply.status(), reply.get("id"), reply.get("session")),
        (Status::Acquired, waiting.id(), "patient")
    );
    assert!(client.stats().reconnects >= 1, "the reader reconnected");
    // And its next request goes out at once, on a new connection.
    let beat = client
        .call(&Call::new(Op::Heartbeat, "lic", "patient"), T)
        .await
        .unwrap();
    assert_eq!(beat.status(), Status::HeartbeatUpdated);
    worker.stop().await;
}

#[tokio::test]
async fn a_queued_acquire_is_answered_queued_then_granted() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    let holder = client.call(&acquire("lic", "holder", 0), T).await.unwrap();
    assert_eq!(holder.status(), Status::Acquired);

    // Through a Pending: QUEUED, then the final answer on the same waiter.
    let mut second = client.request(&acquire("lic", "second", 30_000)).await.unwrap();
    let queued = second.reply(T).await.unwrap();
    assert_eq!(
        (queued.status(), queued.get("id"), queued.int("position")),
        (Status::Queued, second.id(), 1)
    );
    assert!(!queued.is_final() && !queued.ok());
    // Through call: it returns QUEUED, and wait_for collects the GRANTED later.
    let third = client.call(&acquire("lic", "third", 30_000), T).await.unwrap();
    assert_eq!((third.status(), third.int("position")), (Status::Queued, 2));
    let stats = client.stats();
    assert_eq!(
        (stats.in_flight, stats.waiting),
        (0, 1),
        "a queued acquire gives its in-flight slot back; one still waits"
    );

    let released = client
        .call(&Call::new(Op::Release, "lic", "holder"), T)
        .await
        .unwrap();
    assert_eq!(released.status(), Status::Released);
    let granted = second.final_reply(T).await.unwrap();
    assert_eq!(
        (
            granted.status(),
            granted.get("id"),
            granted.get("session"),
            granted.ok()
        ),
        (Status::Granted, second.id(), "second", true)
    );
    drop(second);

    client
        .call(&Call::new(Op::Release, "lic", "second"), T)
        .await
        .unwrap();
    let granted = client.wait_for(third.get("id"), T).await.unwrap();
    assert_eq!(
        (granted.status(), granted.get("session")),
        (Status::Granted, "third")
    );
    assert_eq!(holders(&settings, "lic").await, ["third"]);
    worker.stop().await;
}

#[tokio::test]
async fn backpressure_caps_the_requests_in_flight() {
    let TestApp(_redis, mut settings, _) = spawn_app().await;
    settings.client.max_in_flight = 3;
    put_license(&settings, "lic", 100).await;
    let client = client(&settings).await;
    // No worker yet: the first three requests go out and stay unanswered;
    // the other seven wait for a slot without being sent.
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .call(&acquire("lic", &format!("s{i}"), 0), Duration::from_secs(30))
                    .await
            })
        })
        .collect();
    let deadline = Instant::now() + T;
    while requests_written(&settings).await < 3 {
        assert!(Instant::now() < deadline, "the first requests were not sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(requests_written(&settings).await, 3, "no fourth request sent");
    assert_eq!(client.stats().in_flight, 3);
    assert_eq!(client.stats().waiting, 3, "only the sent ones registered");

    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut sessions = HashMap::new();
    for call in calls {
        let reply = call.await.unwrap().unwrap();
        assert_eq!(reply.status(), Status::Acquired);
        *sessions.entry(reply.get("session").to_owned()).or_insert(0) += 1;
    }
    assert_eq!(sessions.len(), 10, "each call got its own session's reply");
    assert_eq!(requests_written(&settings).await, 10);
    assert_eq!(client.stats().in_flight, 0);
    worker.stop().await;
}

#[tokio::test]
async fn the_last_clone_stops_the_reader_and_deletes_the_reply_stream() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut probe = db(&settings).await;
    let before = connected_clients(&mut probe).await;
    let first = client(&settings).await;
    let reply_to = first.reply_to().to_owned();
    let exists = |key: String| {
        let settings = settings.clone();
        async move { db(&settings).await.exists::<_, bool>(key).await.unwrap() }
    };
    first.call(&acquire("lic", "a", 0), T).await.unwrap();
    assert!(exists(reply_to.clone()).await);

    // A clone keeps the stream and the reader, and knows the lease the seat
    // was acquired with (a release without it would be LEASE_MISMATCH).
    let second = first.clone();
    drop(first);
    let r = second.call(&Call::new(Op::Release, "lic", "a"), T).await.unwrap();
    assert_eq!(r.status(), Status::Released);
    assert!(exists(reply_to.clone()).await);

    // Closing the last one stops the reader, which deletes the stream.
    second.close().await.unwrap();
    assert!(!exists(reply_to).await, "reply stream deleted");
    let deadline = Instant::now() + T;
    while connected_clients(&mut probe).await != before {
        assert!(Instant::now() < deadline, "the client's connections stayed open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Dropping it (no close) does the same, in the background.
    let dropped = client(&settings).await;
    let reply_to = dropped.reply_to().to_owned();
    dropped.call(&acquire("lic", "b", 0), T).await.unwrap();
    drop(dropped);
    let deadline = Instant::now() + T;
    while exists(reply_to.clone()).await {
        assert!(Instant::now() < deadline, "reply stream left behind");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await;
}
