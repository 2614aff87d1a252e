//! What the cheaper per-request paths keep promising: a waiter that re-sends
//! its acquire hears its grant where it listens now, and the rate limits'
//! window counters admit and refuse as documented.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use seatgate_core::records::WaiterRecord;
use seatgate_core::scripts::Decision;
use seatgate_core::status::Status;

use crate::support::{
    acquire, add_request, client, command_calls, direct, keys, license_keys, put_license, queue_up, redis_ms,
    reply_stream, spawn_app, spawn_worker, stream_entries, Entry, TestApp, T,
};

/// Waits up to [`T`] for the reply to request `id` on `stream`.
async fn reply_to_id(con: &mut seatgate_core::db::Db, stream: &str, id: &str, status: &str) -> Entry {
    let deadline = Instant::now() + T;
    loop {
        let found = stream_entries(con, stream)
            .await
            .into_iter()
            .find(|e| e.fields.get("id").map(String::as_str) == Some(id) && e["status"] == status);
        if let Some(entry) = found {
            return entry;
        }
        assert!(Instant::now() < deadline, "no {status} for {id} on {stream}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_waiter_that_re_sends_its_acquire_hears_its_grant_on_the_new_stream() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "lic", 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let holder = client(&s).await;
    let held = holder.call(&acquire("lic", "h", 0), T).await.unwrap();
    assert_eq!(held.status(), Status::Acquired);

    // The waiter queues from its first process, bound to a lease...
    let (first, first_id, first_client) = queue_up(&s, "lic", "w", 60_000).await;
    assert_eq!((first.status(), first.int("position")), (Status::Queued, 1));
    let lease = first.lease().cloned().expect("the client sent a lease");
    // ...restarts, and re-sends from a new process with that lease.
    let restarted = client(&s).await;
    let again = acquire("lic", "w", 60_000).with_lease(lease);
    let again_id = restarted.send(&again).await.unwrap();
    let queued = restarted.wait_for(&again_id, T).await.unwrap();
    assert_eq!((queued.status(), queued.int("position")), (Status::Queued, 1));
    // A re-send with another lease is refused and redirects nothing.
    let stranger = client(&s).await;
    let stranger_id = stranger.send(&acquire("lic", "w", 60_000)).await.unwrap();
    assert_eq!(
        stranger.wait_for(&stranger_id, T).await.unwrap().status(),
        Status::LeaseMismatch
    );
    let raw: String = con.hget(license_keys(&s, "lic").waiters, "w").await.unwrap();
    let record = WaiterRecord::parse(&raw).expect("a waiter record");
    assert_eq!(
        (record.id.as_str(), record.reply_to.as_str()),
        (again_id.as_str(), restarted.reply_to())
    );

    // The seat comes free: the grant goes to the newest request.
    let released = holder
        .call(&seatgate_client::Call::release("lic", "h"), T)
        .await
        .unwrap();
    assert_eq!(released.status(), Status::Released);
    let granted = restarted.wait_for(&again_id, T).await.unwrap();
    assert_eq!(granted.status(), Status::Granted);
    assert!(
        first_client
            .wait_for(&first_id, Duration::from_millis(300))
            .await
            .is_err(),
        "the old stream hears nothing more"
    );
    assert!(
        stranger
            .wait_for(&stranger_id, Duration::from_millis(100))
            .await
            .is_err(),
        "nor does the stranger's"
    );
    worker.stop().await;
}

#[tokio::test]
async fn a_waiter_bound_to_no_lease_follows_every_re_send_that_names_a_stream() {
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    // A waiter with no lease: only where an operator turned
    // sessions.require_lease off while clients move to leases.
    s.sessions.require_lease = false;
    put_license(&s, "lic", 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let (r0, r1, r2) = (
        reply_stream(&s, "h"),
        reply_stream(&s, "old"),
        reply_stream(&s, "new"),
    );
    let send = |id: &'static str, session: &'static str, op: &'static str, reply_to: Option<String>| {
        let mut fields = vec![("op", op.to_owned()), ("id", id.to_owned())];
        fields.extend([("license", "lic".to_owned()), ("session", session.to_owned())]);
        if op == "acquire" && session == "w" {
            fields.push(("wait_ms", "60000".to_owned()));
        }
        if let Some(stream) = reply_to {
            fields.push(("reply_to", stream));
        }
        fields
    };
    for (id, session, op, reply_to, status) in [
        ("h-1", "h", "acquire", Some(r0.clone()), "ACQUIRED"),
        ("w-1", "w", "acquire", Some(r1.clone()), "QUEUED"),
        ("w-2", "w", "acquire", Some(r2.clone()), "QUEUED"),
    ] {
        let fields = send(id, session, op, reply_to.clone());
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        add_request(&mut con, &s, &pairs).await;
        reply_to_id(&mut con, &reply_to.unwrap(), id, status).await;
    }
    // A re-send naming no stream keeps the address: nobody would hear it.
    let fields = send("w-3", "w", "acquire", None);
    let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    add_request(&mut con, &s, &pairs).await;
    let fields = send("h-2", "h", "release", Some(r0.clone()));
    let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    add_request(&mut con, &s, &pairs).await;
    reply_to_id(&mut con, &r0, "h-2", "RELEASED").await;

    let granted = reply_to_id(&mut con, &r2, "w-2", "GRANTED").await;
    assert_eq!(granted["session"], "w");
    let old: Vec<String> = stream_entries(&mut con, &r1)
        .await
        .into_iter()
        .map(|e| e["status"].clone())
        .collect();
    assert_eq!(old, ["QUEUED"], "the first stream got only the first answer");
    worker.stop().await;
}

/// The rate limits keep two window counters per key: a burst of N is
/// admitted and the next refused (not counted); the record says so; and
/// once the windows have passed the whole budget is back.
#[tokio::test]
async fn the_window_counters_admit_a_burst_refuse_the_rest_and_forget_it() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "lic", 3).await;
    const WINDOW: u64 = 400;
    let guard = |session: &str, per_session: u64, per_license: u64| {
        let mut g = seatgate_core::request::Guard::none(&keys(&s), "lic", session);
        (g.session_limit, g.license_limit, g.window_ms) = (per_session, per_license, WINDOW);
        g
    };
    // Start right after a window boundary, so the burst stays in one window.
    while redis_ms(&mut con).await as u64 % WINDOW > WINDOW / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let a = direct(&s, "lic", "a").with_guard(guard("a", 3, 0));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(a.acquire(&mut con).await.status());
    }
    assert_eq!(
        statuses,
        [
            Status::Acquired,
            Status::AlreadyActive,
            Status::AlreadyActive,
            Status::RateLimited,
            Status::RateLimited
        ]
    );
    let key = keys(&s).session_rate("lic", "a");
    let record: String = con.get(&key).await.unwrap();
    let parts: Vec<u64> = record.split(':').map(|p| p.parse().unwrap()).collect();
    let now = redis_ms(&mut con).await as u64;
    assert_eq!(parts[1..], [3, 0], "{record}: refusals are not counted");
    assert!(
        parts[0] == now / WINDOW || parts[0] + 1 == now / WINDOW,
        "{record}"
    );
    let ttl: i64 = con.pttl(&key).await.unwrap();
    assert!(
        ttl > 0 && ttl as u64 <= 2 * WINDOW,
        "lives through the next window: {ttl}"
    );
    // Release is never limited nor counted.
    let released = a.release(&mut con).await;
    assert_eq!(released.status(), Status::Released);
    assert_eq!(con.get::<_, String>(&key).await.unwrap(), record);

    // The license's limit counts every session together.
    let b = |session: &str| direct(&s, "lic", session).with_guard(guard(session, 0, 2));
    assert_eq!(b("b").acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(b("c").acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(b("d").acquire(&mut con).await.status(), Status::RateLimited);

    // Two windows later nothing of the burst counts any more.
    tokio::time::sleep(Duration::from_millis(2 * WINDOW + 50)).await;
    assert_eq!(a.acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(b("d").acquire(&mut con).await.status(), Status::NoSeatsAvailable);
}

/// A queued acquire reports its license due at once (the reaper watches the
/// queue's deadlines) without asking Redis whether the queue it has just
/// joined exists: one `EXISTS` a call, the lease check's, where it was two.
#[tokio::test]
async fn a_queued_acquire_knows_its_queue_is_there_without_asking() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "lic", 1).await;
    let held = direct(&s, "lic", "a").acquire(&mut con).await;
    assert_eq!(held.status(), Status::Acquired);
    for (n, session) in ["b", "c"].into_iter().enumerate() {
        let exists = command_calls(&mut con, "exists").await;
        let queued = direct(&s, "lic", session)
            .queue(&mut con, 30_000, session, "seat:reply:speed")
            .await;
        let place = match queued.decision {
            Decision::Queued { position, .. } => position,
            _ => panic!("{session}: {} instead of QUEUED", queued.status()),
        };
        assert_eq!(place, n as i64 + 1, "{session}'s place");
        assert_eq!(
            queued.due_ms,
            Some(queued.now_ms),
            "{session}: the license is due at once"
        );
        assert_eq!(command_calls(&mut con, "exists").await, exists + 1, "{session}");
    }
}

#[tokio::test]
async fn an_acquire_looks_in_holders_only_for_a_session_with_a_record() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "lic", 2).await;
    let zscores = command_calls(&mut con, "zscore").await;
    // A new session has no session record: it holds no seat, and its acquire
    // does not look for one.
    let first = direct(&s, "lic", "a").acquire(&mut con).await;
    assert_eq!((first.status(), first.seats_used), (Status::Acquired, 1));
    assert_eq!(command_calls(&mut con, "zscore").await, zscores);
    // Its retry has the record, looks, and is answered as a holder.
    let again = direct(&s, "lic", "a").acquire(&mut con).await;
    assert_eq!((again.status(), again.seats_used), (Status::AlreadyActive, 1));
    assert!(
        command_calls(&mut con, "zscore").await > zscores,
        "the retry did not look"
    );
    // Released, it has neither: a new acquire takes a seat again.
    assert_eq!(
        direct(&s, "lic", "a").release(&mut con).await.status(),
        Status::Released
    );
    let back = direct(&s, "lic", "a").acquire(&mut con).await;
    assert_eq!((back.status(), back.seats_used), (Status::Acquired, 1));
}
