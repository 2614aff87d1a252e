//! The reaper, the wait queue, seat events and grants to queued users.

use std::collections::HashMap;
use std::time::Duration;

use seatgate::runtime::publish::Publisher;
use seatgate_client::Call;
use seatgate_core::scripts::Delivery;
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{
    acquire, client, db, direct, events, holders, keep_waiting, license_keys, outbox_len, provision,
    put_license, queue_up, reaper, reply_stream, seats_with_timeout, spawn_app, spawn_worker, stream_entries,
    watch_holders, Entry, TestApp, T,
};

fn of_type<'a>(events: &'a [Entry], kind: &str) -> Vec<&'a Entry> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The sessions of the `granted` events in the order the grants were made:
/// by grant time (the Redis clock of the script that granted), and within
/// one millisecond by position on the events stream, so two grants of one
/// millisecond in the wrong order are caught too. The stream order alone is
/// not the grant order: batches decided concurrently may publish in another
/// order. Within a millisecond it is for the grants of one script or one
/// batch (their events are published one after another, in order); two
/// concurrent batches (or a batch and the reaper) granting in the same
/// millisecond could still publish the other way round, and no event field
/// tells those apart.
fn grant_order(events: &[Entry]) -> Vec<&str> {
    let mut granted = of_type(events, "granted");
    granted.sort_by_key(|e| (e["at_ms"].parse::<i64>().expect("at_ms"), e.position()));
    granted.iter().map(|e| e["session"].as_str()).collect()
}

/// Exactly `queue_order` were granted, in that order.
fn assert_granted_in_order(events: &[Entry], queue_order: &[&str]) {
    assert_eq!(
        grant_order(events),
        queue_order,
        "granted out of queue order: {:?}",
        of_type(events, "granted")
    );
}

fn granted_event(id: &str, session: &str, at_ms: i64) -> Entry {
    let fields = [
        ("type", "granted"),
        ("session", session),
        ("at_ms", &at_ms.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Entry {
        id: id.to_owned(),
        fields,
    }
}

#[test]
fn grant_order_follows_the_grant_time_then_the_stream() {
    // Published out of time order (concurrent batches): time decides.
    let ev = [granted_event("1000-0", "b", 7), granted_event("1000-1", "a", 5)];
    assert_granted_in_order(&ev, &["a", "b"]);
    // Within one millisecond the stream decides.
    let ev = [granted_event("1000-0", "a", 5), granted_event("1000-1", "b", 5)];
    assert_granted_in_order(&ev, &["a", "b"]);
}

#[test]
#[should_panic(expected = "granted out of queue order")]
fn a_swap_within_one_millisecond_is_caught() {
    let ev = [granted_event("1000-0", "b", 5), granted_event("1000-1", "a", 5)];
    assert_granted_in_order(&ev, &["a", "b"]);
}

#[test]
#[should_panic(expected = "granted out of queue order")]
fn a_missing_grant_is_caught() {
    let ev = [granted_event("1000-0", "a", 5)];
    assert_granted_in_order(&ev, &["a", "b"]);
}

#[tokio::test]
async fn stale_sessions_are_evicted_and_live_ones_kept() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(3, 300)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    for s in ["dead", "alive"] {
        assert_eq!(
            c.call(&acquire("lic", s, 0), T).await.unwrap().status(),
            Status::Acquired
        );
    }
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.call(&Call::heartbeat("lic", "alive"), T).await.unwrap();
    }
    let report = reaper(&settings).await.pass().await.unwrap();
    assert_eq!(report.evicted, 1);
    assert_eq!(holders(&settings, "lic").await, ["alive"]);
    let ev = events(&settings, "lic").await;
    let evicted = of_type(&ev, "evicted");
    assert_eq!(evicted.len(), 1);
    assert_eq!(
        (evicted[0]["session"].as_str(), evicted[0]["reason"].as_str()),
        ("dead", "heartbeat_timeout")
    );
    assert_eq!(evicted[0]["seats_used"], "1");
    let r = c.call(&Call::heartbeat("lic", "dead"), T).await.unwrap();
    assert_eq!(
        r.status(),
        Status::SessionNotActive,
        "an evicted session must acquire again"
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reapers_evict_each_session_once() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(200, 100)).await;
    for i in 0..150 {
        direct(&settings, "lic", &format!("s{i}")).acquire(&mut con).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Small steps, so the two reapers interleave on the same license. (Two
    // passes would not: the first to claim the license from the due index
    // reaps it alone. What is shown here is that even two reapers working
    // one license at once, as around a change of leader, evict each once.)
    let mut small_steps = settings.clone();
    small_steps.reaper.batch = 7;
    let (a, b) = (reaper(&small_steps).await, reaper(&small_steps).await);
    let (ra, rb) = tokio::join!(a.reap_license("lic"), b.reap_license("lic"));
    assert_eq!(ra.unwrap().evicted + rb.unwrap().evicted, 150);
    let ev = events(&settings, "lic").await;
    let evicted = of_type(&ev, "evicted");
    assert_eq!(evicted.len(), 150, "one event per eviction");
    let mut sessions: Vec<&str> = evicted.iter().map(|e| e["session"].as_str()).collect();
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), 150, "no session evicted twice");
    assert!(holders(&settings, "lic").await.is_empty());
}

#[tokio::test]
async fn waiters_queue_in_order_and_the_head_is_granted_a_freed_seat() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;

    let mut waiting = Vec::new();
    let mut holding = Vec::new();
    for (i, s) in ["u1", "u2", "u3", "u4", "u5"].into_iter().enumerate() {
        let (first, id, c) = queue_up(&settings, "lic", s, 30_000).await;
        if i < 2 {
            assert_eq!(first.status(), Status::Acquired, "{s}");
            holding.push(c);
        } else {
            assert_eq!(first.status(), Status::Queued, "{s}");
            assert_eq!(first.int("position"), i as i64 - 1, "{s}");
            assert_eq!(first.get("ok"), "0");
            waiting.push((s, id, c));
        }
        assert!(holders(&settings, "lic").await.len() <= 2);
    }

    // No queue jumping: a newcomer without a wait is refused while others wait.
    let other = client(&settings).await;
    let r = other.call(&acquire("lic", "newcomer", 0), T).await.unwrap();
    assert_eq!(r.status(), Status::NoSeatsAvailable);
    // A newcomer that waits goes to the back.
    let r = other.call(&acquire("lic", "u6", 30_000), T).await.unwrap();
    assert_eq!((r.status(), r.int("position")), (Status::Queued, 4));

    // Any client may release a seat with its lease (here: that of u1's acquire).
    let lease = |c: &seatgate_client::Client, session: &str| c.lease("lic", session).expect("a lease");
    let r = other
        .call(
            &Call::release("lic", "u1").with_lease(lease(&holding[0], "u1")),
            T,
        )
        .await
        .unwrap();
    assert_eq!(r.status(), Status::Released);
    let (_, id3, c3) = &mut waiting[0];
    let granted = c3.wait_for(id3, T).await.unwrap();
    assert_eq!(granted.status(), Status::Granted);
    assert_eq!(
        (granted.get("id"), granted.get("session"), granted.get("ok")),
        (id3.as_str(), "u3", "1")
    );
    assert_eq!(
        granted.heartbeat_timeout(),
        Some(Duration::from_millis(settings.sessions.heartbeat_timeout_ms)),
        "a grant made by a release carries the timeout the seat is held under"
    );
    assert_eq!(granted.int("seats_used"), 2);
    assert_eq!(holders(&settings, "lic").await, ["u2", "u3"]);

    // Two freed seats grant the next two, in order.
    other
        .call(
            &Call::release("lic", "u2").with_lease(lease(&holding[1], "u2")),
            T,
        )
        .await
        .unwrap();
    let (_, _, c3) = &waiting[0];
    other
        .call(&Call::release("lic", "u3").with_lease(lease(c3, "u3")), T)
        .await
        .unwrap();
    for (session, id, c) in waiting.iter_mut().skip(1) {
        let g = c.wait_for(id, T).await.unwrap();
        assert_eq!((g.status(), g.get("session")), (Status::Granted, *session));
    }
    assert_eq!(holders(&settings, "lic").await, ["u4", "u5"]);

    let ev = events(&settings, "lic").await;
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
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let _: () = redis::cmd("HSET")
        .arg(license_keys(&settings, "lic").license)
        .arg("queue_max")
        .arg(2)
        .query_async(&mut con)
        .await
        .unwrap();
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    c.call(&acquire("lic", "holder", 0), T).await.unwrap();

    // Idempotent re-queue: same place, one queued event.
    let (first, _, patient) = queue_up(&settings, "lic", "patient", 30_000).await;
    assert_eq!((first.status(), first.int("position")), (Status::Queued, 1));
    let (short, short_id, short_client) = queue_up(&settings, "lic", "hasty", 300).await;
    assert_eq!((short.status(), short.int("position")), (Status::Queued, 2));
    // (Re-sent by its own client: the place is bound to that client's lease.)
    let again = patient.call(&acquire("lic", "patient", 30_000), T).await.unwrap();
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
    let report = reaper(&settings).await.pass().await.unwrap();
    assert_eq!(report.timed_out, 1);
    let timeout = short_client.wait_for(&short_id, T).await.unwrap();
    assert_eq!((timeout.status(), timeout.get("ok")), (Status::QueueTimeout, "0"));
    assert!(timeout.int("waited_ms") >= 300);

    // Leaving the queue.
    let left = patient.call(&Call::release("lic", "patient"), T).await.unwrap();
    assert_eq!(left.status(), Status::LeftQueue);
    let ev = events(&settings, "lic").await;
    assert_eq!(
        of_type(&ev, "queued").len(),
        2,
        "re-sent acquire publishes no second event"
    );
    assert_eq!(of_type(&ev, "queue_timeout").len(), 1);
    assert_eq!(of_type(&ev, "left_queue").len(), 1);
    let mut con = db(&settings).await;
    let depth: i64 = redis::cmd("ZCARD")
        .arg(license_keys(&settings, "lic").queue)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(depth, 0);
    worker.stop().await;
}

#[tokio::test]
async fn a_seat_freed_without_a_grant_is_healed_by_the_next_reaper_pass() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    c.call(&acquire("lic", "holder", 0), T).await.unwrap();
    let (first, id, waiter) = queue_up(&settings, "lic", "waiter", 30_000).await;
    assert_eq!(first.status(), Status::Queued);

    // Free the seat behind seatgate's back: no event, no grant.
    let _: () = redis::cmd("ZREM")
        .arg(license_keys(&settings, "lic").holders)
        .arg("holder")
        .query_async(&mut con)
        .await
        .unwrap();
    let report = reaper(&settings).await.pass().await.unwrap();
    assert_eq!(report.granted, 1);
    let g = waiter.wait_for(&id, T).await.unwrap();
    assert_eq!(g.status(), Status::Granted);
    assert_eq!(holders(&settings, "lic").await, ["waiter"]);
    worker.stop().await;
}

#[tokio::test]
async fn a_granted_user_who_never_heartbeats_is_reaped_and_the_next_is_granted() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    provision(&settings, "lic", &seats_with_timeout(1, 300)).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let c = client(&settings).await;
    c.call(&acquire("lic", "first", 0), T).await.unwrap();
    let (_, id2, c2) = queue_up(&settings, "lic", "second", 30_000).await;
    let (_, id3, c3) = queue_up(&settings, "lic", "third", 30_000).await;
    let every = Duration::from_millis(100);
    let alive2 = keep_waiting(&c2, "lic", "second", every);
    let _alive3 = keep_waiting(&c3, "lic", "third", every);
    let r = reaper(&settings).await;

    tokio::time::sleep(Duration::from_millis(350)).await;
    r.pass().await.unwrap(); // first is stale: second gets the seat
                             // Second stops at once (a heartbeat already on its way may claim the
                             // seat once: the wait below is longer than a timeout after it).
    drop(alive2);
    let granted = c2.wait_for(&id2, T).await.unwrap();
    assert_eq!(
        (granted.status(), granted.heartbeat_timeout()),
        (Status::Granted, Some(Duration::from_millis(300))),
        "the reaper's grant carries the license's own timeout"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.pass().await.unwrap(); // second never heartbeated: third gets it
    assert_eq!(c3.wait_for(&id3, T).await.unwrap().status(), Status::Granted);
    assert_eq!(holders(&settings, "lic").await, ["third"]);
    worker.stop().await;
}

/// Many sessions heartbeating, some dying, a queue draining under the
/// scheduled reaper: every waiter is granted in FIFO order or times out, and
/// the seats are never exceeded (sampled throughout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_heartbeats_deaths_and_a_draining_queue() {
    let TestApp(_redis, mut settings, _) = spawn_app().await;
    provision(&settings, "e2e", &seats_with_timeout(3, 400)).await;
    settings.reaper.schedule = "* * * * * *".into(); // every second
    let worker = spawn_worker(settings.clone(), "w1").await;
    let scheduled = reaper(&settings).await;
    let mut scheduler = seatgate::runtime::reaper::start(scheduled, &settings.reaper.schedule, 5_000)
        .await
        .unwrap();

    // The sampler: seats used never exceed 3.
    let stop = CancellationToken::new();
    let sampler = watch_holders(&settings, &["e2e"], stop.clone());

    // Three holders: one heartbeats for a while then releases, two die silently.
    let c = client(&settings).await;
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
        let (first, id, cl) = queue_up(&settings, "e2e", &format!("w{i}"), wait).await;
        assert_eq!((first.status(), first.int("position")), (Status::Queued, i + 1));
        let alive = keep_waiting(&cl, "e2e", &format!("w{i}"), Duration::from_millis(100));
        waiters.push((i, id, cl, alive));
    }
    let steady = tokio::spawn({
        let settings = settings.clone();
        async move {
            let c = client(&settings).await;
            for _ in 0..10 {
                c.call(&Call::heartbeat("e2e", "steady"), T).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            c.call(&Call::release("e2e", "steady"), T).await.unwrap();
        }
    });
    // Granted waiters heartbeat until they release, so they are not reaped.
    let mut outcomes = Vec::new();
    let mut tasks = Vec::new();
    for (i, id, cl, alive) in waiters {
        let settings = settings.clone();
        tasks.push(tokio::spawn(async move {
            let r = cl.wait_for(&id, Duration::from_secs(15)).await.unwrap();
            drop(alive);
            if r.status() == Status::Granted {
                let c = client(&settings).await;
                for _ in 0..3 {
                    c.call(&Call::heartbeat("e2e", format!("w{i}")), T).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // Waiters granted in the same millisecond release apart: two
                // releases decided in concurrent batches within one
                // millisecond may publish their grants in either order, which
                // no event field tells apart (see `grant_order`).
                tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
                c.call(&Call::release("e2e", format!("w{i}")), T).await.unwrap();
            }
            (i, r.status())
        }));
    }
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    steady.await.unwrap();
    stop.cancel();
    let watch = sampler.await.unwrap();
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
    let ev = events(&settings, "e2e").await;
    assert_granted_in_order(&ev, &["w0", "w1", "w2", "w3", "w5"]);
    let evicted: Vec<&str> = of_type(&ev, "evicted")
        .iter()
        .map(|e| e["session"].as_str())
        .collect();
    assert!(
        evicted.contains(&"dies-1") && evicted.contains(&"dies-2"),
        "{evicted:?}"
    );
    assert!(watch.most.0 <= 3, "overbooked: {:?} holders", watch.most);
    assert!(watch.samples > 50, "the sampler ran ({} samples)", watch.samples);
}

/// Queue replies left in the outbox (their deliverer died) beyond one reap
/// step's limit are all delivered by one reaper pass, over several bounded steps.
#[tokio::test]
async fn undelivered_queue_replies_beyond_the_step_limit_are_all_delivered_in_one_pass() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 0).await;
    for i in 0..20 {
        let (session, request_id) = (format!("w{i:02}"), format!("r{i:02}"));
        let o = direct(&settings, "lic", &session)
            .queue(&mut con, 200, &request_id, &reply_stream(&settings, &session))
            .await;
        assert_eq!(o.status(), Status::Queued);
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    // A script ends all 20 waits and its worker dies before delivering
    // (as on a cluster: on one node the script would write them itself).
    let o = direct(&settings, "lic", "late")
        .via_outbox()
        .acquire(&mut con)
        .await;
    assert_eq!(o.notes.len(), 20);
    assert_eq!(
        outbox_len(&settings, "lic").await,
        20,
        "all 20 wait in the outbox"
    );

    settings.reaper.batch = 7;
    settings.reaper.redeliver_after_ms = 1;
    tokio::time::sleep(Duration::from_millis(5)).await;
    reaper(&settings).await.pass().await.unwrap();
    for i in 0..20 {
        let replies = stream_entries(&mut con, &reply_stream(&settings, &format!("w{i:02}"))).await;
        assert_eq!(replies.len(), 1, "w{i:02}: {replies:?}");
        assert_eq!(
            (replies[0]["id"].as_str(), replies[0]["status"].as_str()),
            (format!("r{i:02}").as_str(), "QUEUE_TIMEOUT")
        );
    }
    assert_eq!(
        outbox_len(&settings, "lic").await,
        0,
        "delivered notes leave the outbox"
    );
}

/// On one Redis node the call that grants a waiter its seat, or ends its
/// wait, writes the waiter's GRANTED or QUEUE_TIMEOUT itself, in the same
/// atomic step: the answer reaches the waiter with nobody left to deliver
/// it (no worker runs here, as when the worker died right after the
/// script), and nothing waits in the outbox. The reply carries the fields,
/// and values, of the one a worker writes when it delivers the same note
/// from the outbox (as on a cluster).
#[tokio::test]
async fn a_queue_reply_is_written_in_the_step_that_decides_it_with_the_workers_fields() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let publisher = Publisher::new(&settings);
    direct(&settings, "lic", "holder").acquire(&mut con).await;
    let queue = |session: &'static str, wait_ms: u64| {
        let settings = settings.clone();
        async move {
            let mut con = db(&settings).await;
            let o = direct(&settings, "lic", session)
                .queue(
                    &mut con,
                    wait_ms,
                    &format!("r-{session}"),
                    &reply_stream(&settings, session),
                )
                .await;
            assert_eq!(o.status(), Status::Queued, "{session}");
        }
    };
    // GRANTED: "inline" by the script, "outboxed" by the worker's delivery.
    queue("inline", 60_000).await;
    queue("outboxed", 60_000).await;
    let freed = direct(&settings, "lic", "holder").release(&mut con).await;
    assert_eq!(freed.notes.len(), 1);
    assert_eq!(freed.notes[0].delivery, Delivery::Sent);
    let freed = direct(&settings, "lic", "inline")
        .via_outbox()
        .release(&mut con)
        .await;
    assert_eq!(freed.notes[0].delivery, Delivery::Caller);
    publisher
        .deliver(&mut con, "lic", &freed.notes[0], freed.seats_at(), true)
        .await
        .unwrap();
    // QUEUE_TIMEOUT: the same pair, their waits ended by an acquire of each kind.
    queue("late-inline", 1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let seen = direct(&settings, "lic", "x").acquire(&mut con).await;
    assert_eq!(seen.notes[0].delivery, Delivery::Sent);
    queue("late-outboxed", 1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let seen = direct(&settings, "lic", "y").via_outbox().acquire(&mut con).await;
    assert_eq!(seen.notes[0].delivery, Delivery::Caller);
    publisher
        .deliver(&mut con, "lic", &seen.notes[0], seen.seats_at(), true)
        .await
        .unwrap();
    assert_eq!(outbox_len(&settings, "lic").await, 0, "nothing left to deliver");

    for (by_script, by_worker, status) in [
        ("inline", "outboxed", "GRANTED"),
        ("late-inline", "late-outboxed", "QUEUE_TIMEOUT"),
    ] {
        let mut pair = Vec::new();
        for session in [by_script, by_worker] {
            let replies = stream_entries(&mut con, &reply_stream(&settings, session)).await;
            let mut answer = replies
                .into_iter()
                .find(|r| r["status"] != "QUEUED")
                .unwrap_or_else(|| panic!("{session}: no answer after QUEUED"))
                .fields;
            assert_eq!(answer["status"], status, "{session}");
            assert_eq!(answer["id"], format!("r-{session}"));
            assert_eq!(answer["session"], session);
            if status == "QUEUE_TIMEOUT" {
                let said = format!("waited {} ms without a seat", answer["waited_ms"]);
                assert_eq!(answer["error"], said, "{session}");
            }
            // What differs by waiter: its ids, how long it waited, when its seat's clock started.
            for own in ["id", "session", "waited_ms", "held_since_ms", "error"] {
                if let Some(v) = answer.remove(own) {
                    assert!(!v.is_empty(), "{session}: {own} empty");
                }
            }
            pair.push(answer);
        }
        assert_eq!(pair[0], pair[1], "{status}: the script's reply and the worker's");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(reply_stream(&settings, by_script))
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            ttl > 0 && ttl as u64 <= settings.replies.expiry_ms(),
            "the reply stream keeps expiring: {ttl}"
        );
    }
}

/// A waiter whose reply stream its owner replaced by another type: the
/// grant stands (the seat is the waiter's, as when the worker cannot
/// deliver it), the script's own reply is dropped without touching the key,
/// and the release that made it still answers.
#[tokio::test]
async fn a_grant_whose_reply_stream_is_no_stream_is_dropped_and_the_release_answers() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    direct(&settings, "lic", "holder").acquire(&mut con).await;
    let stream = reply_stream(&settings, "w");
    let o = direct(&settings, "lic", "w")
        .queue(&mut con, 60_000, "r-w", &stream)
        .await;
    assert_eq!(o.status(), Status::Queued);
    let _: () = redis::cmd("SET")
        .arg(&stream)
        .arg("mine")
        .query_async(&mut con)
        .await
        .unwrap();
    let freed = direct(&settings, "lic", "holder").release(&mut con).await;
    assert_eq!(freed.status(), Status::Released);
    assert_eq!(freed.notes.len(), 1);
    assert_eq!(freed.notes[0].delivery, Delivery::Undeliverable);
    assert_eq!(holders(&settings, "lic").await, ["w"]);
    let (value, ttl): (String, i64) = redis::pipe()
        .cmd("GET")
        .arg(&stream)
        .cmd("PTTL")
        .arg(&stream)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((value.as_str(), ttl), ("mine", -1), "the key is untouched");
}
