//! A request is decided once, in time or not at all (issue 20, points 1 and
//! 4): requests that expire (`ttl_ms`), dedupe records that never join two
//! streams' entries, and the caller's request id as the idempotency key.
//! Real redis-server, real workers, raw XADDs as any client sends them.

use std::time::{Duration, Instant};

use seatgate_core::keys::shard_name;
use seatgate_core::request::{Guard, GuardPolicy};
use seatgate_core::status::Status;

use crate::support::{
    add_request, client, create_group, direct, events, holders, keys, license_keys, put_license, redis_ms,
    reply_stream, spawn_app, spawn_worker, stream_entries, take, Entry, TestApp, T,
};

const LEASE: &str = "lease-of-the-one-client-0001";

/// Waits until `stream` holds `n` entries; all of them.
async fn replies(con: &mut seatgate_core::db::Db, stream: &str, n: usize) -> Vec<Entry> {
    let started = Instant::now();
    loop {
        let got = stream_entries(con, stream).await;
        if got.len() >= n || started.elapsed() > T {
            assert_eq!(got.len(), n, "replies on {stream}: {got:?}");
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ghost seat of point 1: an acquire held up in a dead worker's pending
/// list past its `ttl_ms` is answered REQUEST_EXPIRED and takes nothing,
/// after the client's re-send (new id, same lease) took the seat, used it
/// and gave it back. On the main of before: the late acquire was ACQUIRED,
/// a seat held under a lease nobody heartbeats.
#[tokio::test]
async fn a_request_held_up_past_its_ttl_is_expired_and_takes_no_seat() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.stream.claim_idle_ms = 500;
    put_license(&settings, "lic", 2).await;
    create_group(&settings).await;
    let c = client(&settings).await;
    let request = |op: &'static str, id: &'static str, ttl: &'static str| {
        vec![
            ("op", op),
            ("id", id),
            ("license", "lic"),
            ("session", "s1"),
            ("lease", LEASE),
            ("ttl_ms", ttl),
            ("reply_to", c.reply_to()),
        ]
    };
    add_request(&mut con, &settings, &request("acquire", "first", "300")).await;
    // Read by a worker that then dies: the entry sits in its pending list.
    assert_eq!(take(&settings, "dead", 10).await.len(), 1);
    let _worker = spawn_worker(settings.clone(), "w1").await;

    // The client timed out and sends again: a new id, the same lease.
    add_request(&mut con, &settings, &request("acquire", "second", "5000")).await;
    let r = c.wait_for("second", T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    assert_eq!(holders(&settings, "lic").await, ["s1"], "exactly one seat");
    add_request(&mut con, &settings, &request("heartbeat", "beat", "5000")).await;
    let r = c.wait_for("beat", T).await.unwrap();
    assert_eq!(r.status(), Status::HeartbeatUpdated, "bound to the lease sent");
    add_request(&mut con, &settings, &request("release", "done", "5000")).await;
    assert_eq!(c.wait_for("done", T).await.unwrap().status(), Status::Released);

    // The first acquire is claimed from the dead worker, too late.
    let r = c.wait_for("first", T).await.unwrap();
    println!("the late acquire: {} ok={}", r.status(), r.ok());
    assert_eq!((r.status(), r.ok()), (Status::RequestExpired, false));
    assert!(!r.get("error").is_empty());
    assert_eq!(
        holders(&settings, "lic").await,
        Vec::<String>::new(),
        "no ghost seat"
    );
    let types: Vec<String> = events(&settings, "lic")
        .await
        .iter()
        .map(|e| e.fields["type"].clone())
        .collect();
    assert_eq!(
        types,
        ["acquired", "released"],
        "an expired request publishes nothing"
    );
}

/// Point 4 (a): with shards, the base stream and a shard may hold entries
/// with the same id (two XADDs in one millisecond). Each is decided on its
/// own. On the main of before: the second was answered with the first's
/// ACQUIRED and held no seat.
#[tokio::test]
async fn the_same_entry_id_on_two_streams_is_two_requests() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    settings.stream.shards = 3;
    put_license(&settings, "lic", 5).await;
    let _worker = spawn_worker(settings.clone(), "w1").await;
    let (c1, c2) = (client(&settings).await, client(&settings).await);
    let id = format!("{}-7", redis_ms(&mut con).await);
    let base = settings.stream.requests.clone();
    let shard = shard_name(&base, 3, "lic");
    assert_ne!(base, shard);
    for (stream, session, reply_to) in [
        (&base, "on-base", c1.reply_to()),
        (&shard, "on-shard", c2.reply_to()),
    ] {
        let added: String = redis::cmd("XADD")
            .arg(stream)
            .arg(&id)
            .arg(&[
                ("op", "acquire"),
                ("license", "lic"),
                ("session", session),
                ("lease", LEASE),
                ("reply_to", reply_to),
            ])
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(added, id);
    }
    // No caller id: each reply carries the entry id.
    let (r1, r2) = (
        c1.wait_for(&id, T).await.unwrap(),
        c2.wait_for(&id, T).await.unwrap(),
    );
    println!(
        "base: {} {}, shard: {} {}",
        r1.status(),
        r1.get("session"),
        r2.status(),
        r2.get("session")
    );
    assert_eq!((r1.status(), r1.get("session")), (Status::Acquired, "on-base"));
    assert_eq!((r2.status(), r2.get("session")), (Status::Acquired, "on-shard"));
    let mut held = holders(&settings, "lic").await;
    held.sort();
    assert_eq!(held, ["on-base", "on-shard"], "each told the truth");
}

/// Point 4 (b): the same request id sent again as a new entry (an XADD
/// whose acknowledgement was lost) gets the first answer again, and the
/// request has one event. On the main of before: ACQUIRED then
/// ALREADY_ACTIVE, RELEASED then SESSION_NOT_FOUND.
#[tokio::test]
async fn the_same_request_id_sent_twice_is_decided_once() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 3).await;
    let _worker = spawn_worker(settings.clone(), "w1").await;
    let to = reply_stream(&settings, "twice");
    let mut sent = 0;
    let mut statuses = Vec::new();
    for (op, id) in [
        ("acquire", "req-1"),
        ("acquire", "req-1"),
        ("release", "req-2"),
        ("release", "req-2"),
    ] {
        let fields = [
            ("op", op),
            ("id", id),
            ("license", "lic"),
            ("session", "s1"),
            ("lease", LEASE),
            ("reply_to", to.as_str()),
        ];
        add_request(&mut con, &settings, &fields).await;
        sent += 1;
        let got = replies(&mut con, &to, sent).await;
        let last = &got[sent - 1];
        assert_eq!(last.fields["id"], id);
        statuses.push(last.fields["status"].clone());
    }
    println!("replies: {statuses:?}");
    assert_eq!(statuses, ["ACQUIRED", "ACQUIRED", "RELEASED", "RELEASED"]);
    let types: Vec<String> = events(&settings, "lic")
        .await
        .iter()
        .map(|e| e.fields["type"].clone())
        .collect();
    assert_eq!(types, ["acquired", "released"], "one event per request");

    // Another session's request with the same id is another request.
    let fields = [
        ("op", "acquire"),
        ("id", "req-1"),
        ("license", "lic"),
        ("session", "s2"),
        ("lease", LEASE),
        ("reply_to", to.as_str()),
    ];
    add_request(&mut con, &settings, &fields).await;
    let got = replies(&mut con, &to, 5).await;
    assert_eq!(
        (
            got[4].fields["status"].as_str(),
            got[4].fields["session"].as_str()
        ),
        ("ACQUIRED", "s2")
    );
    assert_eq!(holders(&settings, "lic").await, ["s2"]);
}

/// The scripts themselves: past its deadline (ARGV[6]) every op answers
/// REQUEST_EXPIRED and changes nothing: no seat, no place in the queue, no
/// rate-limit hit, no revocation; a delivery again hears the same; in time,
/// the same call decides.
#[tokio::test]
async fn past_its_deadline_every_op_changes_nothing() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    direct(&settings, "lic", "holder").acquire(&mut con).await;
    let now = redis_ms(&mut con).await as u64;
    let policy = GuardPolicy {
        session_limit: 1,
        license_limit: 1,
        ..settings.guard_policy()
    };
    let guard = |entry: &str, session: &str, deadline_ms: u64| {
        let mut g = Guard::for_entry(&policy, &keys(&settings), entry, "lic", session);
        g.redelivery = true;
        g.deadline_ms = deadline_ms;
        g
    };
    let late = |session: &str, i: u64| {
        direct(&settings, "lic", session).with_guard(guard(
            &format!("{}-{i}", now - 10_000),
            session,
            now - 5_000,
        ))
    };
    let hits = license_keys(&settings, "lic");
    let count = |con: &mut seatgate_core::db::Db, key: String| {
        let mut con = con.clone();
        async move {
            let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut con).await.unwrap();
            n
        }
    };
    let mut outcomes = vec![
        late("waiter", 1).queue(&mut con, 60_000, "w-1", "").await,
        late("holder", 2).heartbeat(&mut con).await,
        late("holder", 3).release(&mut con).await,
        late("holder", 4).revoke(&mut con, "audit", "ada", 60_000).await,
    ];
    outcomes.push(late("waiter", 1).queue(&mut con, 60_000, "w-1", "").await);
    for o in &outcomes {
        assert_eq!((o.status(), o.changed), (Status::RequestExpired, false), "{o:?}");
    }
    assert!(outcomes[4].replayed, "delivered again: the same answer");
    assert_eq!(holders(&settings, "lic").await, ["holder"]);
    let keys = keys(&settings);
    for key in [
        hits.queue.clone(),
        hits.revoked.clone(),
        keys.session_rate("lic", "waiter"),
        keys.session_rate("lic", "holder"),
        keys.license_rate("lic"),
    ] {
        assert_eq!(count(&mut con, key.clone()).await, 0, "{key}");
    }
    // Only the holder's own acquire (the setup's) recorded an event.
    let recorded: Vec<(String, String)> = events(&settings, "lic")
        .await
        .iter()
        .map(|e| (e["type"].clone(), e["session"].clone()))
        .collect();
    assert_eq!(recorded, [("acquired".to_owned(), "holder".to_owned())]);

    // In time, the same heartbeat is decided (and counted in the window).
    let in_time =
        direct(&settings, "lic", "holder").with_guard(guard(&format!("{now}-9"), "holder", now + 60_000));
    assert_eq!(
        in_time.heartbeat(&mut con).await.status(),
        Status::HeartbeatUpdated
    );
    assert_eq!(count(&mut con, keys.session_rate("lic", "holder")).await, 1);
}
