//! The multiplexed request client: one connection and one reply stream
//! shared by any number of concurrent requests, each reply handed to the
//! request it answers; bounded in flight, a timeout per request, a reader
//! that survives a Redis restart, QUEUED then GRANTED through the API;
//! and the seat handle (`Client::acquire_seat`): it keeps its seat across
//! heartbeat timeouts, follows a lowered timeout, sends a request a frozen
//! worker holds again under a new id and the same lease, waits out QUEUED,
//! undoes an acquire given up in the queue, and releases when dropped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::AsyncCommands;
use seatgate::config::Settings;
use seatgate_client::{AcquireError, Call, Client, Seat, SeatOptions, SeatState};
use seatgate_core::db::Db;
use seatgate_core::status::Status;
use seatgate_core::Error;

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

/// `connected_clients` once it has stopped moving (the same reading twice,
/// 250 ms apart): a worker that just joined the group may still be opening
/// a connection of its own (its reaper's, its liveness key's).
async fn settled_clients(probe: &mut Db) -> usize {
    let deadline = Instant::now() + T;
    let mut last = connected_clients(probe).await;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = connected_clients(probe).await;
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
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
        Call::heartbeat(&license, &session),
        Call::release(&license, &session),
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
    let before = settled_clients(&mut probe).await;
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
    let beat = client.call(&Call::heartbeat("lic", "patient"), T).await.unwrap();
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

    let released = client.call(&Call::release("lic", "holder"), T).await.unwrap();
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

    client.call(&Call::release("lic", "second"), T).await.unwrap();
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
    let r = second.call(&Call::release("lic", "a"), T).await.unwrap();
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

// ---------------------------------------------------------------------------
// The seat handle.

/// The heartbeat timeout and heartbeat count of a held seat; panics otherwise.
fn held(seat: &Seat) -> (Duration, u64) {
    match seat.state() {
        SeatState::Held {
            heartbeat_timeout,
            heartbeats,
        } => (heartbeat_timeout, heartbeats),
        other => panic!("the seat is not held: {other:?}"),
    }
}

/// Waits up to `within` for the seat's state to satisfy `cond`.
async fn state_becomes(seat: &Seat, within: Duration, cond: impl FnMut(&SeatState) -> bool) {
    let mut rx = seat.watch();
    tokio::time::timeout(within, rx.wait_for(cond))
        .await
        .unwrap_or_else(|_| panic!("the seat's state stayed {:?}", seat.state()))
        .expect("the seat's state is kept");
}

/// Waits up to `within` until `cond` holds of `license`'s holders.
async fn holders_become(s: &Settings, license: &str, within: Duration, cond: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let now = holders(s, license).await;
        if cond(&now) {
            return;
        }
        assert!(Instant::now() < deadline, "holders of {license} stayed {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits up to `T` for a `kind` event of `session` on `license`.
async fn event_comes(s: &Settings, license: &str, session: &str, kind: &str) {
    let deadline = Instant::now() + T;
    while !events(s, license)
        .await
        .iter()
        .any(|e| e["type"] == kind && e["session"] == session)
    {
        assert!(Instant::now() < deadline, "no {kind} event of {session}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_handle_keeps_its_seat_across_heartbeat_timeouts() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(2, 1500)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let _reaping = reaping(&settings).await;
    let c = client(&settings).await;
    let seat = c
        .acquire_seat(&acquire("lic", "kept", 0), &SeatOptions::default())
        .await
        .unwrap();
    assert_eq!(seat.grant().status(), Status::Acquired);
    // Beside it a seat nobody heartbeats: the reaper does evict.
    let left = c.call(&acquire("lic", "left", 0), T).await.unwrap();
    assert_eq!(left.status(), Status::Acquired);

    // Three heartbeat timeouts; the caller does nothing.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(
        holders(&settings, "lic").await,
        ["kept"],
        "only the kept seat survived"
    );
    let (timeout, beats) = held(&seat);
    assert_eq!(timeout, Duration::from_millis(1500));
    // Every 500 ms: about 9; fewer than 5 would let a seat lapse.
    assert!(beats >= 5, "{beats} heartbeats in 4.5 s");

    let gone = seat.release().await.unwrap();
    assert_eq!(gone.status(), Some(Status::Released));
    assert!(holders(&settings, "lic").await.is_empty());
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seat_handle_follows_a_lowered_heartbeat_timeout() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(1, 6000)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    let seat = c
        .acquire_seat(&acquire("lic", "s1", 0), &SeatOptions::default())
        .await
        .unwrap();
    assert_eq!(held(&seat).0, Duration::from_millis(6000), "the grant's timeout");
    // An operator lowers the timeout below the handle's 2 s cadence. No
    // reaper runs until the handle has heard of it: the seat may be
    // evicted in that gap, which is the operator's doing, not the client's.
    set_license_field(&mut con, &settings, "lic", "heartbeat_timeout_ms", "1500").await;
    state_becomes(&seat, Duration::from_secs(5), |s| {
        matches!(s, SeatState::Held { heartbeat_timeout, .. } if *heartbeat_timeout == Duration::from_millis(1500))
    })
    .await;
    let before = held(&seat).1;
    // Now with a reaper: a handle still heartbeating every 2 s would lose
    // the seat within the next 2 s.
    let _reaping = reaping(&settings).await;
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert_eq!(holders(&settings, "lic").await, ["s1"]);
    let (timeout, after) = held(&seat);
    assert_eq!(timeout, Duration::from_millis(1500));
    assert!(
        after - before >= 5,
        "{} heartbeats in 4 s at a 1.5 s timeout",
        after - before
    );
    seat.release().await.unwrap();
    worker.stop().await;
}

#[tokio::test]
async fn dropping_a_seat_handle_releases_its_seat() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    let seat = c
        .acquire_seat(&acquire("lic", "s1", 0), &SeatOptions::default())
        .await
        .unwrap();
    assert_eq!(holders(&settings, "lic").await, ["s1"]);
    drop(seat);
    // The heartbeat timeout is 90 s: only the release frees it this soon.
    holders_become(&settings, "lic", T, |h| h.is_empty()).await;
    event_comes(&settings, "lic", "s1", "released").await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_frozen_worker_holds_is_sent_again_under_a_new_id_and_the_same_lease() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    // A worker that read the request and froze before deciding it: the
    // entry sits in its consumer's pending list, undecided (consumer
    // `frozen` takes it and never answers, as a SIGSTOPped process would).
    create_group(&settings).await;
    let c = client(&settings).await;
    let opts = SeatOptions {
        request_timeout: Duration::from_secs(1),
        // The client's 5 s ttl, capped at the request timeout.
        ttl: None,
        give_up_after: Duration::from_secs(20),
    };
    let acquiring = tokio::spawn({
        let c = c.clone();
        async move { c.acquire_seat(&acquire("lic", "s1", 0), &opts).await }
    });
    let deadline = Instant::now() + T;
    while take(&settings, "frozen", 10).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the frozen consumer was not handed the acquire"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A live worker decides the attempt sent after the request timeout, and
    // claims the frozen one's entry once it has been idle for 3 s.
    let mut live = settings.clone();
    live.stream.claim_idle_ms = 3_000;
    let worker = spawn_worker(live, "w2").await;
    let seat = acquiring
        .await
        .unwrap()
        .expect("a seat through the second attempt");
    assert_eq!(seat.grant().status(), Status::Acquired);
    let sent: Vec<_> = stream_entries(&mut con, &settings.stream.requests)
        .await
        .into_iter()
        .filter(|e| e["op"] == "acquire")
        .collect();
    assert!(sent.len() >= 2, "sent again: {sent:?}");
    let ids: std::collections::HashSet<&str> = sent.iter().map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), sent.len(), "each attempt under a new id");
    for e in &sent {
        assert_eq!(
            e["lease"],
            seat.lease().as_str(),
            "every attempt under the same lease"
        );
        assert_eq!(
            e["ttl_ms"], "1000",
            "every attempt with a ttl of its request timeout"
        );
    }

    // Claimed from the frozen consumer, the attempt it held is decided
    // (ALREADY_ACTIVE from a service that does not expire requests, else
    // REQUEST_EXPIRED).
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending(&settings).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the frozen consumer's entry was left pending"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Exactly one seat, bound to the handle's lease.
    assert_eq!(holders(&settings, "lic").await, ["s1"]);
    let heartbeat = |lease| Call::heartbeat("lic", "s1").with_lease(lease);
    let other = seatgate_core::protocol::Lease::parse("someone-elses-lease-0000").unwrap();
    assert_eq!(
        c.call(&heartbeat(other), T).await.unwrap().status(),
        Status::LeaseMismatch
    );
    assert_eq!(
        c.call(&heartbeat(seat.lease().clone()), T)
            .await
            .unwrap()
            .status(),
        Status::HeartbeatUpdated
    );
    held(&seat);
    assert_eq!(seat.release().await.unwrap().status(), Some(Status::Released));
    assert!(holders(&settings, "lic").await.is_empty());
    worker.stop().await;
}

/// A 1-seat license `lic` served by a worker: session `first` holds its
/// seat, and `second` waits in the queue (up to `wait_ms`) through a seat
/// handle, whose acquire is the returned task.
async fn second_queued_behind_first(
    wait_ms: u64,
) -> (
    RedisServer,
    Settings,
    WorkerHandle,
    Client,
    tokio::task::JoinHandle<Result<Seat, AcquireError>>,
) {
    let TestApp(redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    assert_eq!(
        c.call(&acquire("lic", "first", 0), T).await.unwrap().status(),
        Status::Acquired
    );
    let waiting = tokio::spawn({
        let c = c.clone();
        async move {
            c.acquire_seat(&acquire("lic", "second", wait_ms), &SeatOptions::default())
                .await
        }
    });
    event_comes(&settings, "lic", "second", "queued").await;
    (redis, settings, worker, c, waiting)
}

#[tokio::test]
async fn a_queued_acquire_gets_its_grant_through_the_seat_handle() {
    let (_redis, settings, worker, c, waiting) = second_queued_behind_first(10_000).await;
    let released = c.call(&Call::release("lic", "first"), T).await.unwrap();
    assert_eq!(released.status(), Status::Released);
    let seat = waiting.await.unwrap().expect("granted");
    assert_eq!(seat.grant().status(), Status::Granted);
    assert_eq!(holders(&settings, "lic").await, ["second"]);
    held(&seat);
    assert_eq!(seat.release().await.unwrap().status(), Some(Status::Released));
    worker.stop().await;
}

#[tokio::test]
async fn an_acquire_given_up_in_the_queue_is_undone() {
    let (_redis, settings, worker, c, waiting) = second_queued_behind_first(30_000).await;
    // The caller goes away while queued: the handle leaves the queue for it.
    waiting.abort();
    event_comes(&settings, "lic", "second", "left_queue").await;
    let released = c.call(&Call::release("lic", "first"), T).await.unwrap();
    assert_eq!(released.status(), Status::Released);
    // Nobody waits any more: the seat goes to no one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(holders(&settings, "lic").await.is_empty());
    worker.stop().await;
}

/// `seatgate acquire/release/heartbeat` send `ttl_ms`: `client.ttl_ms`
/// unless `--ttl` says otherwise; `--ttl 0s` is refused as a usage error.
#[tokio::test]
async fn the_cli_sends_ttl_ms_with_every_request() {
    let TestApp(redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let url = redis.url();
    let acquired = output(seatgate_cmd(
        &url,
        &["acquire", "--license", "lic", "--session", "s1"],
    ))
    .await;
    assert!(acquired.status.success(), "{acquired:?}");
    let lease = printed_lease(&String::from_utf8_lossy(&acquired.stdout));
    let released = output(seatgate_cmd(
        &url,
        &[
            "release",
            "--license",
            "lic",
            "--session",
            "s1",
            "--lease",
            &lease,
            "--ttl",
            "2500ms",
        ],
    ))
    .await;
    assert!(released.status.success(), "{released:?}");
    let zero = output(seatgate_cmd(
        &url,
        &["heartbeat", "--license", "lic", "--session", "s1", "--ttl", "0s"],
    ))
    .await;
    assert_eq!(zero.status.code(), Some(2), "{zero:?}");

    let sent: Vec<(String, String)> = stream_entries(&mut con, &settings.stream.requests)
        .await
        .into_iter()
        .map(|e| (e["op"].clone(), e["ttl_ms"].clone()))
        .collect();
    let default = settings.client.ttl_ms.to_string();
    assert_eq!(
        sent,
        [
            ("acquire".to_owned(), default),
            ("release".to_owned(), "2500".to_owned())
        ]
    );
    worker.stop().await;
}

/// An administrator revokes a handle's seat: the handle's next heartbeat
/// hears SESSION_REVOKED, `lost()` returns it, and dropping the lost
/// handle sends nothing more.
#[tokio::test]
async fn a_seat_handle_reports_the_status_that_took_its_seat() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(1, 1500)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    let seat = c
        .acquire_seat(&acquire("lic", "s1", 0), &SeatOptions::default())
        .await
        .unwrap();
    let admin = settings.client().connect_admin().await.unwrap();
    let revoke = seatgate_client::Revoke {
        license: "lic".into(),
        session: "s1".into(),
        reason: "audit".into(),
        actor: "ada".into(),
        cooldown_ms: 0,
        user_wide: false,
    };
    assert_eq!(admin.revoke(&revoke, T).await.unwrap().status(), Status::Revoked);
    let lost = tokio::time::timeout(T, seat.lost())
        .await
        .expect("the handle heard");
    match lost {
        SeatState::Lost { status, error } => {
            assert_eq!(status, Status::SessionRevoked);
            assert!(error.contains("audit"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let sent = requests_written(&settings).await;
    drop(seat);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        requests_written(&settings).await,
        sent,
        "no release for a lost seat"
    );
    worker.stop().await;
}

/// Five seats, each released by its handle; `SeatOptions::give_up_after`
/// well under the outage.
async fn five_seats(settings: &Settings, client: &Client) -> Vec<Seat> {
    let opts = SeatOptions {
        request_timeout: Duration::from_millis(500),
        give_up_after: Duration::from_secs(1),
        ..SeatOptions::default()
    };
    let mut seats = Vec::new();
    for i in 0..5 {
        let seat = client
            .acquire_seat(&Call::acquire("lic", format!("out-{i}")), &opts)
            .await
            .unwrap();
        seats.push(seat);
    }
    assert_eq!(holders(settings, "lic").await.len(), 5);
    seats
}

/// What each release said, and how long it took.
async fn released(
    tasks: Vec<tokio::task::JoinHandle<(Result<seatgate_client::Released, Error>, Duration)>>,
) -> Vec<String> {
    let mut said = Vec::new();
    for t in tasks {
        let (r, took) = t.await.unwrap();
        let r = r.unwrap();
        println!("release: {:?} after {took:.1?}", r.status());
        assert!(matches!(r, seatgate_client::Released::Released(_)), "{r:?}");
        said.push(format!("{:?}", r.status()));
    }
    said
}

fn release_all(
    seats: Vec<Seat>,
) -> Vec<tokio::task::JoinHandle<(Result<seatgate_client::Released, Error>, Duration)>> {
    seats
        .into_iter()
        .map(|seat| {
            tokio::spawn(async move {
                let started = Instant::now();
                (seat.release().await, started.elapsed())
            })
        })
        .collect()
}

/// Issue 37, problem 3: releases sent while Redis is stopped (3 s, three
/// times `give_up_after`) are each reported released once it is back, as
/// the events say; none is reported as failed.
#[tokio::test]
async fn a_release_while_redis_is_stopped_is_reported_released_once_it_is_back() {
    let TestApp(mut redis, settings, _) =
        spawn_app_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    put_license(&settings, "lic", 5).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    let seats = five_seats(&settings, &client).await;
    redis.shutdown().await;
    let tasks = release_all(seats);
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.restart().await.expect("restart redis");
    let said = released(tasks).await;
    assert_eq!(said.len(), 5);
    assert!(holders(&settings, "lic").await.is_empty());
    let mut con = db(&settings).await;
    let events = stream_entries(&mut con, &settings.events_stream_for("lic")).await;
    let freed = events
        .iter()
        .filter(|e| e.fields.get("type").map(String::as_str) == Some("released"))
        .count();
    assert_eq!(freed, 5, "the events show each released once");
    worker.stop().await;
}

/// Issue 37, problem 3, the freeze: releases sent while Redis is frozen
/// (SIGSTOP 3 s, three times `give_up_after`) wait in it and are decided
/// when it goes on; each handle reports released (before the fix: an
/// error once `give_up_after` passed).
#[tokio::test]
async fn a_release_while_redis_is_frozen_is_reported_released_not_already_gone() {
    let TestApp(redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 5).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    let seats = five_seats(&settings, &client).await;
    let pid = redis.pid().to_string();
    let kill = |sig: &str| {
        std::process::Command::new("kill")
            .arg(sig)
            .arg(&pid)
            .status()
            .unwrap()
    };
    assert!(kill("-STOP").success());
    let tasks = release_all(seats);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(kill("-CONT").success());
    let said = released(tasks).await;
    assert_eq!(said.len(), 5);
    assert!(holders(&settings, "lic").await.is_empty());
    worker.stop().await;
}
