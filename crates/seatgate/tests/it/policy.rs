//! License policies (docs/protocol.md, "Policies"): per-user and per-group
//! limits, reservations, priority, linger and borrowing, each alone and
//! with the queue, through the worker and the reaper, under concurrency
//! and on a Redis Cluster. Every test runs against a real redis-server.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use seatgate::config::Settings;
use seatgate_client::{Call, Client, Reply};
use seatgate_core::db::Db;
use seatgate_core::policy::{LicensePolicy, RequestPolicy};
use seatgate_core::records::OwnerRecord;
use seatgate_core::scripts::Decision;
use seatgate_core::status::Status;
use tokio_util::sync::CancellationToken;

use crate::support::{
    acquire, client, db, direct, events, holders, keys, license_keys, license_record, metric, output,
    provision, provision_policy, put_policy, reaper, seatgate_cmd, seats_with_timeout, send_alone,
    set_license_field, spawn_app, spawn_worker, Entry, LocalCluster, RedisServer, TestApp, WorkerHandle,
    WorkerProcess, T,
};

/// An acquire asked by `user` of `group` ("" = none), at `priority`.
fn ask(user: &str, group: &str, priority: u8) -> RequestPolicy {
    let id = |s: &str| Some(s.to_owned()).filter(|s| !s.is_empty());
    RequestPolicy {
        user: id(user),
        group: id(group),
        priority,
        borrow_ms: 0,
    }
}

/// An acquire of `session` asked by `user` of `group`, waiting up to `wait_ms`.
fn acquire_as(license: &str, session: &str, user: &str, group: &str, wait_ms: u64) -> Call {
    acquire(license, session, wait_ms).with_policy(ask(user, group, 0))
}

fn release(license: &str, session: &str) -> Call {
    Call::release(license, session)
}

fn of_type<'a>(events: &'a [Entry], kind: &str) -> Vec<&'a Entry> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The `granted` events' sessions in grant order (grant time, then stream position).
fn grant_order(events: &[Entry]) -> Vec<String> {
    let mut granted = of_type(events, "granted");
    granted.sort_by_key(|e| (e["at_ms"].parse::<i64>().expect("at_ms"), e.position()));
    granted.iter().map(|e| e["session"].clone()).collect()
}

/// The seats held per user and per group, computed from the holders and
/// their owner records: what the scripts' counts must equal.
#[derive(Debug, Default, PartialEq, Eq)]
struct Held {
    /// Seats held.
    total: usize,
    /// Per user.
    users: BTreeMap<String, i64>,
    /// Per group.
    groups: BTreeMap<String, i64>,
}

/// One consistent read (MULTI) of `license`'s holders and owners hash:
/// the seats held per user and group as the holders say, the counts the
/// scripts keep, and the owner records of sessions neither holding nor waiting.
async fn read_owners(s: &Settings, license: &str) -> (Held, Held, Vec<String>) {
    read_owners_on(&mut db(s).await, s, license).await
}

/// [`read_owners`] on connection `con`.
async fn read_owners_on(
    con: &mut seatgate_core::db::Db,
    s: &Settings,
    license: &str,
) -> (Held, Held, Vec<String>) {
    let k = license_keys(s, license);
    let (holders, waiting, owners): (Vec<String>, Vec<String>, HashMap<String, String>) = redis::pipe()
        .atomic()
        .cmd("ZRANGE")
        .arg(&k.holders)
        .arg(0)
        .arg(-1)
        .cmd("ZRANGE")
        .arg(&k.queue)
        .arg(0)
        .arg(-1)
        .cmd("HGETALL")
        .arg(&k.owners)
        .query_async(con)
        .await
        .unwrap();
    let mut truth = Held {
        total: holders.len(),
        ..Held::default()
    };
    for h in &holders {
        if let Some(o) = owners.get(&format!("s:{h}")).and_then(|r| OwnerRecord::parse(r)) {
            if let Some(u) = o.user {
                *truth.users.entry(u).or_default() += 1;
            }
            if let Some(g) = o.group {
                *truth.groups.entry(g).or_default() += 1;
            }
        }
    }
    let counted = |prefix: &str| -> BTreeMap<String, i64> {
        owners
            .iter()
            .filter_map(|(f, n)| Some((f.strip_prefix(prefix)?.to_owned(), n.parse().unwrap())))
            .collect()
    };
    let kept = Held {
        total: holders.len(),
        users: counted("u:"),
        groups: counted("g:"),
    };
    let orphans = owners
        .keys()
        .filter_map(|f| f.strip_prefix("s:"))
        .filter(|s| !holders.iter().any(|h| h == s) && !waiting.iter().any(|w| w == s))
        .map(str::to_owned)
        .collect();
    (truth, kept, orphans)
}

/// The scripts' per-user and per-group counts equal what the holders say,
/// and no owner record outlives its session's seat or wait.
async fn assert_counts_match_holders(s: &Settings, license: &str) {
    let (truth, kept, orphans) = read_owners(s, license).await;
    assert_eq!(kept, truth, "{license}: the counts drifted from the holders");
    assert!(
        orphans.is_empty(),
        "{license}: owner records left behind: {orphans:?}"
    );
}

/// The reply to `request` sent by client `c` (which remembers the lease of
/// each seat it acquired, for the heartbeats and releases it sends later).
async fn call(c: &Client, request: Call) -> Reply {
    c.call(&request, T).await.unwrap()
}

/// [`call`], whose reply must have `status`.
async fn expect(c: &Client, request: Call, status: Status) -> Reply {
    let r = c.call(&request, T).await.unwrap();
    assert_eq!(r.status(), status, "{request:?}: {r:?}");
    r
}

/// Sends `request` (an acquire with a wait) from a client of its own, which
/// must be QUEUED: the QUEUED reply, the request id (its GRANTED or
/// QUEUE_TIMEOUT carries it) and the client.
async fn queued(s: &Settings, request: Call) -> (Reply, String, Client) {
    let (first, id, waiter) = send_alone(s, &request).await;
    assert_eq!(first.status(), Status::Queued, "{request:?}: {first:?}");
    (first, id, waiter)
}

/// The next reply to request `id` on `waiter`, which must have `status`.
async fn expect_reply(waiter: &Client, id: &str, status: Status) -> Reply {
    let r = waiter.wait_for(id, T).await.unwrap();
    assert_eq!(r.status(), status, "{id}: {r:?}");
    r
}

/// A redis-server with license "cad" of `seats` seats under `policy`, a
/// worker on it and a client. Bind the server to a name (`_redis`, not `_`):
/// dropping it stops the server.
async fn serve_cad(seats: u64, policy: &LicensePolicy) -> (RedisServer, Settings, WorkerHandle, Client) {
    let TestApp(redis, s, _) = spawn_app().await;
    provision_policy(&s, "cad", seats, policy).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    (redis, s, worker, c)
}

/// `license`'s status as `seatgate status` reads it.
async fn license_status(s: &Settings, license: &str) -> seatgate::views::status::LicenseStatus {
    seatgate::views::status::license_status(&mut db(s).await, &keys(s), license)
        .await
        .unwrap()
}

/// The `(session, reason)` of each `evicted` event.
fn evictions(events: &[Entry]) -> Vec<(&str, &str)> {
    of_type(events, "evicted")
        .iter()
        .map(|e| (e["session"].as_str(), e["reason"].as_str()))
        .collect()
}

// ---------------------------------------------------------------------------
// Each policy alone, through the worker.

#[tokio::test]
async fn max_per_user_alone_with_and_without_wait() {
    let policy = LicensePolicy {
        max_per_user: Some(2),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(5, &policy).await;

    for session in ["a1", "a2"] {
        expect(&c, acquire_as("cad", session, "ada", "", 0), Status::Acquired).await;
    }
    let r = call(&c, acquire_as("cad", "a3", "ada", "", 0)).await;
    assert_eq!((r.status(), r.get("ok")), (Status::LimitReached, "0"));
    assert!(
        r.get("error").contains("user ada") && r.get("error").contains("max_per_user"),
        "{r:?}"
    );
    assert_eq!(r.int("seats_used"), 2);
    // Another user, and a request without a user, are not held back.
    expect(&c, acquire_as("cad", "b1", "bob", "", 0), Status::Acquired).await;
    expect(&c, acquire("cad", "anon", 0), Status::Acquired).await;

    // With wait_ms the third queues although a seat is free, and is granted
    // once ada is under her limit.
    let (first, id, waiter) = queued(&s, acquire_as("cad", "a3", "ada", "", 30_000)).await;
    assert_eq!((first.status(), first.int("position")), (Status::Queued, 1));
    assert_eq!(holders(&s, "cad").await.len(), 4, "the free seat stays free");
    expect(&c, release("cad", "a1"), Status::Released).await;
    let granted = waiter.wait_for(&id, T).await.unwrap();
    assert_eq!(
        (granted.status(), granted.get("session")),
        (Status::Granted, "a3")
    );
    assert_eq!(holders(&s, "cad").await, ["a2", "a3", "anon", "b1"]);
    assert_counts_match_holders(&s, "cad").await;

    // Lowering the limit evicts nobody: ada keeps her two seats, and gets no
    // third, nor a second once one is released.
    let lower = LicensePolicy {
        max_per_user: Some(1),
        ..LicensePolicy::default()
    };
    put_policy(&s, "cad", &lower).await;
    assert_eq!(holders(&s, "cad").await, ["a2", "a3", "anon", "b1"]);
    expect(&c, acquire_as("cad", "a4", "ada", "", 0), Status::LimitReached).await;
    expect(&c, release("cad", "a2"), Status::Released).await;
    expect(&c, acquire_as("cad", "a4", "ada", "", 0), Status::LimitReached).await;
    worker.stop().await;
}

#[tokio::test]
async fn group_max_alone_with_and_without_wait() {
    let policy = LicensePolicy {
        group_max: [("eng".to_owned(), 2)].into(),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(4, &policy).await;

    expect(&c, acquire_as("cad", "e1", "ada", "eng", 0), Status::Acquired).await;
    expect(&c, acquire_as("cad", "e2", "bob", "eng", 0), Status::Acquired).await;
    let r = expect(&c, acquire_as("cad", "e3", "cyd", "eng", 0), Status::LimitReached).await;
    assert!(
        r.get("error").contains("group eng") && r.get("error").contains("group_max:eng"),
        "{r:?}"
    );
    expect(&c, acquire_as("cad", "o1", "dan", "ops", 0), Status::Acquired).await;

    let (_, id, waiter) = queued(&s, acquire_as("cad", "e3", "cyd", "eng", 30_000)).await;
    // A free seat the group may not take goes to someone else outside it.
    expect(&c, acquire_as("cad", "o2", "eve", "ops", 0), Status::Acquired).await;
    expect(&c, release("cad", "e1"), Status::Released).await;
    expect_reply(&waiter, &id, Status::Granted).await;
    assert_eq!(holders(&s, "cad").await, ["e2", "e3", "o1", "o2"]);
    assert_counts_match_holders(&s, "cad").await;
    worker.stop().await;
}

#[tokio::test]
async fn a_reservation_alone_and_with_a_queue() {
    let policy = LicensePolicy {
        group_reserve: [("eng".to_owned(), 1)].into(),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(3, &policy).await;

    expect(&c, acquire_as("cad", "x1", "xi", "ops", 0), Status::Acquired).await;
    expect(&c, acquire("cad", "x2", 0), Status::Acquired).await;
    // One seat is free, but it is eng's.
    let r = expect(
        &c,
        acquire_as("cad", "x3", "xu", "ops", 0),
        Status::NoSeatsAvailable,
    )
    .await;
    assert!(r.get("error").contains("reserved"), "{r:?}");
    assert_eq!(r.int("seats_used"), 2);

    // Queued behind the reservation: x3 waits, and an eng acquire that
    // arrives later takes the reserved seat past it (x3 could not have).
    let (_, id, waiter) = queued(&s, acquire_as("cad", "x3", "xu", "ops", 30_000)).await;
    expect(&c, acquire_as("cad", "e1", "ada", "eng", 0), Status::Acquired).await;
    // Once eng uses its reservation, a freed seat is anybody's: x3's.
    expect(&c, release("cad", "x1"), Status::Released).await;
    expect_reply(&waiter, &id, Status::Granted).await;
    assert_eq!(holders(&s, "cad").await, ["e1", "x2", "x3"]);

    // A reservation used beyond its size leaves no seat reserved: eng's
    // second seat is an ordinary one, and others take what eng frees.
    expect(&c, release("cad", "x2"), Status::Released).await;
    expect(&c, acquire_as("cad", "e2", "bob", "eng", 0), Status::Acquired).await;
    expect(&c, release("cad", "e2"), Status::Released).await;
    expect(&c, acquire("cad", "x4", 0), Status::Acquired).await;
    assert_counts_match_holders(&s, "cad").await;
    worker.stop().await;
}

#[tokio::test]
async fn priority_orders_the_queue_fifo_within_a_level_capped_by_max_priority() {
    let policy = LicensePolicy {
        max_priority: Some(7),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(1, &policy).await;
    expect(&c, acquire("cad", "holder", 0), Status::Acquired).await;

    // Arrivals: low, mid-1, top (asks 9, gets 7), mid-2, low-2.
    let arrivals = [("low", 0), ("mid-1", 5), ("top", 9), ("mid-2", 5), ("low-2", 0)];
    let mut waiting = Vec::new();
    let mut positions = Vec::new();
    for (session, priority) in arrivals {
        let (r, id, c) = queued(
            &s,
            acquire("cad", session, 30_000).with_policy(ask("", "", priority)),
        )
        .await;
        positions.push((session, r.int("position"), r.get("priority").to_owned()));
        waiting.push((session, id, c));
    }
    assert_eq!(
        positions,
        [
            ("low", 1, String::new()),
            ("mid-1", 1, "5".to_owned()),
            ("top", 1, "7".to_owned()),
            ("mid-2", 3, "5".to_owned()),
            ("low-2", 5, String::new()),
        ]
    );
    let status = license_status(&s, "cad").await;
    let queue: Vec<(&str, u8)> = status
        .queue
        .iter()
        .map(|w| (w.session.as_str(), w.priority))
        .collect();
    assert_eq!(
        queue,
        [("top", 7), ("mid-1", 5), ("mid-2", 5), ("low", 0), ("low-2", 0)]
    );

    // One seat handed on five times: granted in queue order, each waiter
    // releasing it (with the lease its client holds) once granted.
    expect(&c, release("cad", "holder"), Status::Released).await;
    waiting.sort_by_key(|(session, _, _)| {
        ["top", "mid-1", "mid-2", "low", "low-2"]
            .iter()
            .position(|s| s == session)
    });
    for (session, id, c) in &mut waiting {
        let r = c.wait_for(id, T).await.unwrap();
        assert_eq!(r.status(), Status::Granted, "{session}");
        expect(c, release("cad", session), Status::Released).await;
    }
    let ev = events(&s, "cad").await;
    assert_eq!(grant_order(&ev), ["top", "mid-1", "mid-2", "low", "low-2"]);
    let queued: Vec<(&str, &str)> = of_type(&ev, "queued")
        .iter()
        .map(|e| (e["session"].as_str(), e["priority"].as_str()))
        .collect();
    assert_eq!(
        queued,
        [
            ("low", "0"),
            ("mid-1", "5"),
            ("top", "7"),
            ("mid-2", "5"),
            ("low-2", "0")
        ]
    );
    worker.stop().await;
}

/// A license that does not raise `max_priority` keeps its queue in arrival
/// order (issue 35, H2): a caller asking for priority 9 is queued at 0, so
/// no application can jump everyone else's waiters by asking.
#[tokio::test]
async fn without_max_priority_every_waiter_waits_in_arrival_order() {
    let (_redis, s, worker, c) = serve_cad(1, &LicensePolicy::default()).await;
    expect(&c, acquire("cad", "holder", 0), Status::Acquired).await;
    let mut waiting = Vec::new();
    for (session, priority) in [("first", 0), ("pusher", 9)] {
        let (r, id, c) = queued(
            &s,
            acquire("cad", session, 30_000).with_policy(ask("", "", priority)),
        )
        .await;
        assert_eq!(r.get("priority"), "", "{session} queued at priority 0: {r:?}");
        waiting.push((session, id, c));
    }
    expect(&c, release("cad", "holder"), Status::Released).await;
    let (session, id, c) = &mut waiting[0];
    assert_eq!(
        c.wait_for(id, T).await.unwrap().status(),
        Status::Granted,
        "{session}"
    );
    expect(c, release("cad", session), Status::Released).await;
    let (session, id, c) = &mut waiting[1];
    assert_eq!(
        c.wait_for(id, T).await.unwrap().status(),
        Status::Granted,
        "{session}"
    );
    let ev = events(&s, "cad").await;
    assert_eq!(grant_order(&ev), ["first", "pusher"]);
    worker.stop().await;
}

#[tokio::test]
async fn linger_keeps_a_released_seat_for_its_session_then_the_reaper_grants_it() {
    let policy = LicensePolicy {
        linger_ms: Some(400),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(1, &policy).await;

    expect(&c, acquire_as("cad", "a", "ada", "", 0), Status::Acquired).await;
    let r = call(&c, release("cad", "a")).await;
    assert_eq!(
        (r.status(), r.get("linger_ms"), r.int("seats_used")),
        (Status::Released, "400", 1)
    );
    // Nobody else takes it; its own session takes it back at once.
    expect(&c, acquire("cad", "b", 0), Status::NoSeatsAvailable).await;
    expect(&c, acquire("cad", "a", 0), Status::Acquired).await;
    expect(&c, Call::heartbeat("cad", "a"), Status::HeartbeatUpdated).await;
    let r = call(&c, release("cad", "a")).await;
    assert_eq!(r.get("linger_ms"), "400");
    // Released, it is the session's no more: no heartbeat, no second release.
    expect(&c, Call::heartbeat("cad", "a"), Status::SessionNotActive).await;
    expect(&c, release("cad", "a"), Status::SessionNotFound).await;

    // A waiter gets it from the reaper once the linger ends, not before.
    let (_, id, waiter) = queued(&s, acquire("cad", "b", 30_000)).await;
    let status = license_status(&s, "cad").await;
    assert_eq!((status.seats_used, status.seats_lingering), (1, 1));
    assert!(status.holders[0].lingering_until_ms.is_some());
    let r = reaper(&s).await;
    assert_eq!(r.pass().await.unwrap().ended, 0, "the linger has not ended");
    tokio::time::sleep(Duration::from_millis(450)).await;
    let report = r.pass().await.unwrap();
    assert_eq!((report.ended, report.granted), (1, 1));
    expect_reply(&waiter, &id, Status::Granted).await;
    assert_eq!(holders(&s, "cad").await, ["b"]);
    let ev = events(&s, "cad").await;
    let ended = evictions(&ev);
    assert_eq!(ended, [("a", "linger_ended")]);
    let released: Vec<&str> = of_type(&ev, "released")
        .iter()
        .map(|e| e["linger_ms"].as_str())
        .collect();
    assert_eq!(released, ["400", "400"]);
    assert_counts_match_holders(&s, "cad").await;
    worker.stop().await;
}

#[tokio::test]
async fn a_borrow_outlives_the_heartbeat_timeout_and_is_then_reaped() {
    let TestApp(_redis, s, _) = spawn_app().await;
    provision(&s, "plain", &seats_with_timeout(1, 200)).await;
    provision(&s, "cad", &seats_with_timeout(2, 200)).await;
    let policy = LicensePolicy {
        max_borrow_ms: Some(700),
        ..LicensePolicy::default()
    };
    put_policy(&s, "cad", &policy).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    let borrow = |license: &str, session: &str, ms: u64| {
        acquire(license, session, 0).with_policy(RequestPolicy {
            borrow_ms: ms,
            ..ask("ada", "", 0)
        })
    };

    // No borrowing without max_borrow_ms, nor longer than it.
    let r = expect(&c, borrow("plain", "p", 500), Status::LimitReached).await;
    assert!(r.get("error").contains("max_borrow_ms"), "{r:?}");
    expect(&c, borrow("cad", "long", 701), Status::LimitReached).await;

    let started = crate::support::redis_ms(&mut db(&s).await).await;
    let r = expect(&c, borrow("cad", "laptop", 700), Status::Acquired).await;
    let until = r.int("borrowed_until_ms");
    assert!(
        (started + 700..started + 800).contains(&until),
        "{until} vs {started}"
    );
    expect(&c, borrow("cad", "early", 600), Status::Acquired).await;
    // An early release returns it at once.
    expect(&c, release("cad", "early"), Status::Released).await;

    // Past the heartbeat timeout without a heartbeat: still held.
    let reap = reaper(&s).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    let report = reap.pass().await.unwrap();
    assert_eq!((report.evicted, report.ended), (0, 0));
    assert_eq!(holders(&s, "cad").await, ["laptop"]);
    let status = license_status(&s, "cad").await;
    assert_eq!(
        (status.seats_borrowed, status.holders[0].borrowed_until_ms),
        (1, Some(until))
    );
    // A heartbeat does not shorten the borrow.
    expect(&c, Call::heartbeat("cad", "laptop"), Status::HeartbeatUpdated).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = reap.pass().await.unwrap();
    assert_eq!((report.evicted, report.ended), (0, 1));
    assert!(holders(&s, "cad").await.is_empty());
    let ev = events(&s, "cad").await;
    let evicted = evictions(&ev);
    assert_eq!(evicted, [("laptop", "borrow_ended")]);
    let acquired = of_type(&ev, "acquired");
    assert_eq!(acquired[0]["borrowed_until_ms"], until.to_string());
    expect(&c, Call::heartbeat("cad", "laptop"), Status::SessionNotActive).await;
    assert_counts_match_holders(&s, "cad").await;

    // With wait_ms: a borrow queues like any acquire, and starts at its grant.
    for session in ["x1", "x2"] {
        expect(&c, acquire("cad", session, 0), Status::Acquired).await;
    }
    let (_, id, waiter) = queued(
        &s,
        acquire("cad", "travel", 30_000).with_policy(RequestPolicy {
            borrow_ms: 400,
            ..ask("ada", "", 0)
        }),
    )
    .await;
    expect(&c, release("cad", "x1"), Status::Released).await;
    expect_reply(&waiter, &id, Status::Granted).await;
    let status = license_status(&s, "cad").await;
    let travel = status.holders.iter().find(|h| h.session == "travel").unwrap();
    assert!(travel.borrowed_until_ms.is_some(), "{travel:?}");
    tokio::time::sleep(Duration::from_millis(450)).await;
    // The borrow ended; x2, which never heartbeated, is stale by now.
    let report = reap.pass().await.unwrap();
    assert_eq!((report.ended, report.evicted), (1, 1));
    assert!(holders(&s, "cad").await.is_empty());
    assert_counts_match_holders(&s, "cad").await;
    worker.stop().await;
}

// ---------------------------------------------------------------------------
// Provisioning, the rules, and what shows the policies.

/// `seatgate license put` sets every policy field with its flag, and
/// `--replace` removes them without; `license show`, `status` (text and JSON) and the
/// metrics show the policies, the counts and the lingering and borrowed seats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn license_put_status_and_metrics_show_the_policies() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    let url = redis.url();
    let run = |args: &[&str]| output(seatgate_cmd(&url, args));
    let put = run(&[
        "license",
        "put",
        "cad",
        "--seats",
        "5",
        "--max-per-user",
        "2",
        "--group-max",
        "eng=3",
        "--group-reserve",
        "ops=1",
        "--max-priority",
        "5",
        "--linger",
        "10m",
        "--max-borrow",
        "7d",
    ])
    .await;
    assert!(put.status.success(), "{put:?}");
    let show = run(&["license", "show", "cad", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        json["policy"],
        serde_json::json!({
            "max_per_user": 2, "group_max": {"eng": 3}, "group_reserve": {"ops": 1},
            "max_priority": 5, "linger_ms": 600_000, "max_borrow_ms": 604_800_000u64,
        })
    );
    let text = String::from_utf8_lossy(&run(&["license", "show", "cad"]).await.stdout).into_owned();
    assert!(
        text.contains("policy: max_per_user 2, group eng max 3, group ops reserve 1, max_priority 5, linger 10m, max_borrow 7days"),
        "{text}"
    );
    // A policy that does not fit is refused before anything is written.
    let bad = run(&[
        "license",
        "put",
        "cad",
        "--seats",
        "5",
        "--group-reserve",
        "ops=6",
    ])
    .await;
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("reservations add up to 6"),
        "{bad:?}"
    );

    // ada holds two seats (one borrowed), bob's released seat lingers.
    let ada = |session: &str, borrow_ms| {
        direct(&s, "cad", session).with_policy(RequestPolicy {
            borrow_ms,
            ..ask("ada", "eng", 0)
        })
    };
    assert_eq!(ada("a1", 0).acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(
        ada("a2", 3_600_000).acquire(&mut con).await.status(),
        Status::Acquired
    );
    let bob = direct(&s, "cad", "b1").with_policy(ask("bob", "", 0));
    assert_eq!(bob.acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(
        bob.release(&mut con).await.decision,
        Decision::Released {
            linger_ms: Some(600_000)
        }
    );

    let status = run(&["status", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let l = &json["licenses"][0];
    assert_eq!(
        (&l["seats_used"], &l["seats_lingering"], &l["seats_borrowed"]),
        (
            &serde_json::json!(3),
            &serde_json::json!(1),
            &serde_json::json!(1)
        )
    );
    assert_eq!(l["held_by_user"], serde_json::json!({"ada": 2, "bob": 1}));
    assert_eq!(l["held_by_group"], serde_json::json!({"eng": 2}));
    assert_eq!(l["policy"]["max_per_user"], 2);
    let by_session = |name: &str| {
        l["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["session"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(
        (
            by_session("a1")["user"].as_str(),
            by_session("a1")["group"].as_str()
        ),
        (Some("ada"), Some("eng"))
    );
    assert!(by_session("a2")["borrowed_until_ms"].is_i64());
    assert!(by_session("b1")["lingering_until_ms"].is_i64());
    let text = String::from_utf8_lossy(&run(&["status"]).await.stdout).into_owned();
    for expected in [
        "cad: 3 of 5 seats in use (1 lingering, 1 borrowed)",
        "  policy: max_per_user 2",
        "  held: user ada 2, user bob 1, group eng 2",
        "lingers 9m5",
        "borrowed 59m5",
    ] {
        assert!(text.contains(expected), "{expected:?} in\n{text}");
    }
    // The USER column is the acquire's `user`; the group follows the row.
    let row = |session: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("  {session} ")))
            .unwrap_or_else(|| panic!("no row for {session} in\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!((row("a1")[1], row("a1").last()), ("ada", Some(&"group=eng")));
    assert_eq!(row("b1")[1], "bob");

    // The reaper leader exports the lingering and borrowed seats.
    let every_second = [("SEATGATE__REAPER__SCHEDULE", "* * * * * *".to_owned())];
    let worker = WorkerProcess::start(&url, &every_second).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = worker.scrape().await;
        let lingering = metric(&page, "seatgate_seats_lingering{license=\"cad\"}");
        let borrowed = metric(&page, "seatgate_seats_borrowed{license=\"cad\"}");
        if (lingering, borrowed) == (Some(1.0), Some(1.0)) {
            assert_eq!(metric(&page, "seatgate_fleet_seats_lingering"), Some(1.0));
            assert_eq!(metric(&page, "seatgate_fleet_seats_borrowed"), Some(1.0));
            assert_eq!(metric(&page, "seatgate_seats_used{license=\"cad\"}"), Some(3.0));
            assert_eq!(
                metric(
                    &page,
                    "seatgate_policy_seats_freed_total{reason=\"linger_ended\"}"
                ),
                Some(0.0)
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no policy gauges:\n{page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `license put --replace` without policy flags removes every policy field.
    assert!(run(&["license", "put", "cad", "--replace", "--seats", "5"])
        .await
        .status
        .success());
    let record = license_record(&mut con, &s, "cad").await;
    let mut fields: Vec<&str> = record.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(fields, ["active", "expires_at_ms", "seats_total"]);
}

/// The policy fields keep the license rules, checked the same way by the
/// scripts (lua/includes/license.lua and policy.lua) and by Rust
/// (engine::license::StoredRecord), whatever `policy` says.
#[tokio::test]
async fn policy_fields_break_the_rules_alike_in_lua_and_in_rust() {
    use seatgate_core::license::StoredRecord;
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let refused = [
        ("max_per_user", "2.5"),
        ("max_per_user", "-1"),
        ("max_priority", "10"),
        ("linger_ms", "10m"),
        ("max_borrow_ms", "31536000001"),
        ("group_max:cad", "x"),
        ("group_reserve:cad", "1e3"),
        ("group_max:{bad}", "1"),
        ("policy", "yes"),
    ];
    let policy = LicensePolicy {
        max_per_user: Some(3),
        ..LicensePolicy::default()
    };
    for (i, (field, value)) in refused.into_iter().enumerate() {
        let license = format!("rules-{i}");
        provision_policy(&s, &license, 5, &policy).await;
        set_license_field(&mut con, &s, &license, field, value).await;
        let record = license_record(&mut con, &s, &license).await;
        let rust = StoredRecord::from_map(&record).validate().expect_err(field);
        let o = direct(&s, &license, "probe").acquire(&mut con).await;
        assert_eq!(o.status(), Status::LicenseInvalid, "{field} = {value:?}");
        let Decision::LicenseInvalid(lua) = o.decision else {
            panic!("the script names the field: {o:?}")
        };
        assert_eq!(lua, rust, "{field} = {value:?}");
        assert_eq!(lua.name(), field);
        assert!(holders(&s, &license).await.is_empty());
        // With the flag off (or absent) the scripts still read every policy
        // field, and so does Rust: the same refusal.
        if field != "policy" {
            for off in ["0", ""] {
                if off.is_empty() {
                    let _: i64 = redis::cmd("HDEL")
                        .arg(license_keys(&s, &license).license)
                        .arg("policy")
                        .query_async(&mut con)
                        .await
                        .unwrap();
                } else {
                    set_license_field(&mut con, &s, &license, "policy", off).await;
                }
                let record = license_record(&mut con, &s, &license).await;
                let rust = StoredRecord::from_map(&record).validate().expect_err(field);
                let o = direct(&s, &license, "probe").acquire(&mut con).await;
                assert_eq!(
                    o.decision,
                    Decision::LicenseInvalid(rust),
                    "{field} = {value:?} with the flag {off:?}"
                );
                assert!(holders(&s, &license).await.is_empty());
            }
        }
    }
}

/// Policy fields a billing system writes straight into the record are
/// enforced without the `policy` flag (and with it at 0): the record is the
/// contract, and a limit it holds is never silently ignored. `license show`
/// and `status` show them, with no "ignored" warning.
#[tokio::test]
async fn policy_fields_written_without_the_flag_are_enforced() {
    use seatgate_core::scripts::NoSeats;
    let TestApp(redis, s, mut con) = spawn_app().await;
    for (license, flag) in [("bare", None), ("flag-off", Some("0"))] {
        crate::support::put_license(&s, license, 3).await;
        if let Some(flag) = flag {
            set_license_field(&mut con, &s, license, "policy", flag).await;
        }
        set_license_field(&mut con, &s, license, "max_per_user", "1").await;
        let ada = |session: &str| direct(&s, license, session).with_policy(ask("ada", "", 0));
        assert_eq!(ada("a1").acquire(&mut con).await.status(), Status::Acquired);
        let o = ada("a2").acquire(&mut con).await;
        assert_eq!(
            o.decision,
            Decision::LimitReached(seatgate_core::policy::PolicyRefusal::MaxPerUser),
            "{license}: max_per_user without the flag"
        );
        assert_eq!(holders(&s, license).await, ["a1"]);
    }
    // A reservation alone: the one free seat of two is kept for ops.
    crate::support::put_license(&s, "reserve", 2).await;
    set_license_field(&mut con, &s, "reserve", "group_reserve:ops", "1").await;
    assert_eq!(
        direct(&s, "reserve", "x1").acquire(&mut con).await.status(),
        Status::Acquired
    );
    let o = direct(&s, "reserve", "x2").acquire(&mut con).await;
    assert_eq!(
        o.decision,
        Decision::NoSeatsAvailable(NoSeats::Reserved),
        "group_reserve without the flag"
    );
    // Linger alone: a released seat lingers.
    crate::support::put_license(&s, "linger", 1).await;
    set_license_field(&mut con, &s, "linger", "linger_ms", "60000").await;
    let a = direct(&s, "linger", "a");
    assert_eq!(a.acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(
        a.release(&mut con).await.decision,
        Decision::Released {
            linger_ms: Some(60_000)
        },
        "linger_ms without the flag"
    );
    // What operators see: the policy, no warning that it is ignored.
    let show = output(seatgate_cmd(&redis.url(), &["license", "show", "bare"])).await;
    let text = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(text.contains("policy: max_per_user 1"), "{text}");
    assert!(!text.contains("ignored"), "{text}");
    let status = output(seatgate_cmd(&redis.url(), &["status", "--json"])).await;
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let bare = json["licenses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["license"] == "bare")
        .unwrap()
        .clone();
    assert_eq!(bare["policy"]["max_per_user"], 1, "{bare}");
}

// ---------------------------------------------------------------------------
// Interactions.

/// Fair skipping: waiters over their user's limit keep their place but do
/// not block those behind them; FIFO holds among those who can be granted.
#[tokio::test]
async fn a_per_user_limit_with_a_queue_skips_fairly() {
    let policy = LicensePolicy {
        max_per_user: Some(1),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(2, &policy).await;
    expect(&c, acquire_as("cad", "a1", "ada", "", 0), Status::Acquired).await;
    expect(&c, acquire("cad", "x1", 0), Status::Acquired).await;

    let mut waiting = HashMap::new();
    for (session, user) in [("a2", "ada"), ("b1", "bob"), ("a3", "ada"), ("c1", "cyd")] {
        let (_, id, c) = queued(&s, acquire_as("cad", session, user, "", 30_000)).await;
        waiting.insert(session, (id, c));
    }
    // Waits for `session`'s GRANTED on its client, which then holds its lease.
    async fn granted(waiting: &mut HashMap<&str, (String, Client)>, session: &str) {
        let (id, c) = waiting.get_mut(session).unwrap();
        expect_reply(c, id, Status::Granted).await;
    }
    async fn give_back(waiting: &mut HashMap<&str, (String, Client)>, session: &str) {
        let (_, c) = waiting.get_mut(session).unwrap();
        expect(c, release("cad", session), Status::Released).await;
    }
    // A freed seat skips a2 (ada holds her one seat) and goes to b1.
    call(&c, release("cad", "x1")).await;
    granted(&mut waiting, "b1").await;
    // Then past a2 and a3 to c1.
    give_back(&mut waiting, "b1").await;
    granted(&mut waiting, "c1").await;
    // ada's own release lets her first waiter in: a2 before a3.
    call(&c, release("cad", "a1")).await;
    granted(&mut waiting, "a2").await;
    give_back(&mut waiting, "c1").await;
    // a3 still waits: ada holds a2; the free seat stays free.
    assert_eq!(holders(&s, "cad").await, ["a2"]);
    give_back(&mut waiting, "a2").await;
    granted(&mut waiting, "a3").await;
    // a3's GRANTED reply is written before its event: wait for the event.
    let deadline = std::time::Instant::now() + T;
    let mut order = grant_order(&events(&s, "cad").await);
    while order.len() < 4 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        order = grant_order(&events(&s, "cad").await);
    }
    assert_eq!(order, ["b1", "c1", "a2", "a3"]);
    assert_counts_match_holders(&s, "cad").await;
    worker.stop().await;
}

/// A grant step passes over a user its own limit blocks whole (the queue by
/// user): bob, queued behind SKIP_LIMIT + 1 of ada's blocked waiters, takes
/// the free seat at once. A queue of waiters from before that index (here:
/// the index deleted by hand) looks past at most SKIP_LIMIT blocked
/// waiters: a waiter behind more waits for a step that reaches it, and a
/// direct acquire does not jump a queue the step could not see to its end.
#[tokio::test]
async fn a_grant_step_passes_over_a_blocked_user_whole_and_an_old_queue_looks_past_a_bounded_number() {
    use seatgate_core::policy::SKIP_LIMIT;
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let policy = LicensePolicy {
        max_per_user: Some(1),
        ..LicensePolicy::default()
    };
    for (license, indexed) in [("cad", true), ("old", false)] {
        provision_policy(&s, license, 2, &policy).await;
        let ada = |session: &str| direct(&s, license, session).with_policy(ask("ada", "", 0));
        assert_eq!(ada("a0").acquire(&mut con).await.status(), Status::Acquired);
        for i in 0..SKIP_LIMIT + 1 {
            let o = ada(&format!("a{}", i + 1)).queue(&mut con, 30_000, "", "").await;
            assert_eq!(o.status(), Status::Queued);
        }
        if !indexed {
            let _: () = redis::cmd("DEL")
                .arg(license_keys(&s, license).queue_by_user)
                .query_async(&mut con)
                .await
                .unwrap();
        }
        let bob = direct(&s, license, "b1").with_policy(ask("bob", "", 0));
        let o = bob.queue(&mut con, 30_000, "", "").await;
        if indexed {
            assert_eq!((o.status(), o.seats_used), (Status::Acquired, 2), "{o:?}");
            assert_counts_match_holders(&s, license).await;
            continue;
        }
        assert_eq!(o.status(), Status::Queued);
        // One seat is free, but bob is behind SKIP_LIMIT + 1 blocked waiters:
        // not granted, and nobody without a wait takes the seat past him.
        let o = direct(&s, license, "newcomer").acquire(&mut con).await;
        assert_eq!((o.status(), o.seats_used), (Status::NoSeatsAvailable, 1));
        assert!(o.notes.is_empty());
        // One ada waiter leaves: bob is now within reach.
        assert_eq!(ada("a1").release(&mut con).await.status(), Status::LeftQueue);
        let o = direct(&s, license, "newcomer").acquire(&mut con).await;
        assert_eq!(o.status(), Status::NoSeatsAvailable, "the seat went to bob first");
        let granted: Vec<&str> = o.notes.iter().map(|n| n.session.as_str()).collect();
        assert_eq!(granted, ["b1"]);
        assert_counts_match_holders(&s, license).await;
    }
}

/// Queues `waiter` for an hour as request `request_id`: it must be 1,001st,
/// behind the blocked thousand.
async fn last_of_1001(con: &mut seatgate_core::db::Db, waiter: crate::support::Direct, request_id: &str) {
    let waiting = waiter.queue(con, 3_600_000, request_id, "").await;
    assert_eq!(
        waiting.decision,
        Decision::Queued {
            position: 1001,
            priority: 0
        },
        "{waiting:?}"
    );
}

/// Waiters a group limit blocks never hold a free seat back (issue 35, H2):
/// `gm` has 5 seats and `group_max cad=1`; one cad holder and 1,000 cad
/// waiters (priority 9, `max_priority` 9, an hour's wait) block nobody
/// else. Another group's direct acquire, and one of no group, take free
/// seats at once (on the main of before: NO_SEATS_AVAILABLE, the skip
/// stopping after 50), and once the seats are full, an eng waiter queued
/// behind all 1,000 is granted by the next freed seat, not a cad waiter.
#[tokio::test]
async fn blocked_waiters_of_one_group_hold_no_seat_back_from_another() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let policy = LicensePolicy {
        group_max: BTreeMap::from([("cad".to_owned(), 1)]),
        max_priority: Some(9),
        ..LicensePolicy::default()
    };
    provision_policy(&s, "gm", 5, &policy).await;
    set_license_field(&mut con, &s, "gm", "queue_max", "2000").await;
    let as_group = |session: &str, group: &str, priority: u8| {
        direct(&s, "gm", session).with_policy(ask("", group, priority))
    };
    assert_eq!(
        as_group("cad-0", "cad", 0).acquire(&mut con).await.status(),
        Status::Acquired
    );
    for i in 1..=1000 {
        let o = as_group(&format!("cad-{i}"), "cad", 9)
            .queue(&mut con, 3_600_000, "", "")
            .await;
        assert!(matches!(o.decision, Decision::Queued { .. }), "{o:?}");
    }
    assert_eq!(license_status(&s, "gm").await.queue.len(), 1000);

    let eng = as_group("eng-1", "eng", 0).acquire(&mut con).await;
    assert_eq!((eng.status(), eng.seats_used), (Status::Acquired, 2), "{eng:?}");
    let nobody = direct(&s, "gm", "plain-1").acquire(&mut con).await;
    assert_eq!(
        (nobody.status(), nobody.seats_used),
        (Status::Acquired, 3),
        "{nobody:?}"
    );
    for session in ["eng-2", "eng-3"] {
        assert_eq!(
            as_group(session, "eng", 0).acquire(&mut con).await.status(),
            Status::Acquired
        );
    }
    last_of_1001(&mut con, as_group("eng-w", "eng", 0), "r-eng-w").await;
    // A freed seat goes to eng-w, past the 1,000 cad waiters ahead.
    let released = as_group("eng-2", "eng", 0).release(&mut con).await;
    let granted: Vec<&str> = released.notes.iter().map(|n| n.session.as_str()).collect();
    assert_eq!((released.status(), granted), (Status::Released, vec!["eng-w"]));
    assert_eq!(license_status(&s, "gm").await.queue.len(), 1000);
    // And a cad seat freed goes to the first cad waiter.
    let released = as_group("cad-0", "cad", 0).release(&mut con).await;
    let granted: Vec<&str> = released.notes.iter().map(|n| n.session.as_str()).collect();
    assert_eq!(granted, ["cad-1"]);
    assert_counts_match_holders(&s, "gm").await;
}

/// Waiters their own user's limit blocks never hold a free seat back either
/// (issue 35): `pu` has 5 seats and `max_per_user 1`; mallory holds one and
/// has 1,000 sessions waiting an hour, all in group eng. Another eng user's
/// direct acquire takes a free seat at once (on the main of before:
/// NO_SEATS_AVAILABLE, the skip within a group stopping after 50), and once
/// the seats are full, bob's waiter queued behind all 1,000 is granted by
/// the next freed seat, not one of mallory's.
#[tokio::test]
async fn blocked_waiters_of_one_user_hold_no_seat_back_from_another_in_their_group() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let policy = LicensePolicy {
        max_per_user: Some(1),
        ..LicensePolicy::default()
    };
    provision_policy(&s, "pu", 5, &policy).await;
    set_license_field(&mut con, &s, "pu", "queue_max", "2000").await;
    let as_user = |session: &str, user: &str| direct(&s, "pu", session).with_policy(ask(user, "eng", 0));
    assert_eq!(
        as_user("m-0", "mallory").acquire(&mut con).await.status(),
        Status::Acquired
    );
    for i in 1..=1000 {
        let o = as_user(&format!("m-{i}"), "mallory")
            .queue(&mut con, 3_600_000, "", "")
            .await;
        assert!(matches!(o.decision, Decision::Queued { .. }), "{o:?}");
    }
    let ada = as_user("ada-1", "ada").acquire(&mut con).await;
    assert_eq!((ada.status(), ada.seats_used), (Status::Acquired, 2), "{ada:?}");
    for (session, user) in [("cy-1", "cy"), ("di-1", "di"), ("ed-1", "ed")] {
        assert_eq!(
            as_user(session, user).acquire(&mut con).await.status(),
            Status::Acquired
        );
    }
    last_of_1001(&mut con, as_user("bob-w", "bob"), "r-bob-w").await;
    // A freed seat goes to bob, past mallory's 1,000 waiters ahead.
    let released = as_user("cy-1", "cy").release(&mut con).await;
    let granted: Vec<&str> = released.notes.iter().map(|n| n.session.as_str()).collect();
    assert_eq!((released.status(), granted), (Status::Released, vec!["bob-w"]));
    // And mallory's own seat freed goes to mallory's first waiter.
    let released = as_user("m-0", "mallory").release(&mut con).await;
    let granted: Vec<&str> = released.notes.iter().map(|n| n.session.as_str()).collect();
    assert_eq!(granted, ["m-1"]);
    assert_eq!(license_status(&s, "pu").await.queue.len(), 999);
    assert_counts_match_holders(&s, "pu").await;
}

/// Every holder change keeps the counts: direct acquires, grants, releases,
/// stale evictions, queue timeouts and leaving the queue, with and without
/// policies on the license.
#[tokio::test]
async fn counts_follow_every_holder_change_in_the_scripts() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    provision(&s, "plain", &seats_with_timeout(2, 150)).await;
    let who = |session: &str, user: &str, group: &str| {
        direct(&s, "plain", session).with_policy(ask(user, group, 0))
    };
    assert_eq!(
        who("s1", "ada", "eng").acquire(&mut con).await.status(),
        Status::Acquired
    );
    assert_eq!(
        who("s2", "ada", "").acquire(&mut con).await.status(),
        Status::Acquired
    );
    assert_eq!(
        who("s3", "bob", "eng")
            .queue(&mut con, 60_000, "", "")
            .await
            .status(),
        Status::Queued
    );
    assert_eq!(
        who("s4", "cyd", "ops")
            .queue(&mut con, 100, "", "")
            .await
            .status(),
        Status::Queued
    );
    assert_eq!(
        who("s5", "dan", "ops")
            .queue(&mut con, 60_000, "", "")
            .await
            .status(),
        Status::Queued
    );
    assert_counts_match_holders(&s, "plain").await;
    let (_, kept, _) = read_owners(&s, "plain").await;
    assert_eq!(kept.users, [("ada".to_owned(), 2)].into());

    assert_eq!(
        who("s5", "", "").release(&mut con).await.status(),
        Status::LeftQueue
    );
    assert_eq!(
        who("s1", "", "").release(&mut con).await.status(),
        Status::Released
    );
    // s4's wait ran out: s3 got s1's seat, then the reaper evicts both
    // silent holders and ends s4's wait.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_counts_match_holders(&s, "plain").await;
    let report = reaper(&s).await.pass().await.unwrap();
    assert_eq!((report.evicted, report.timed_out), (2, 1));
    assert_counts_match_holders(&s, "plain").await;
    let (_, kept, _) = read_owners(&s, "plain").await;
    assert_eq!(kept, Held::default(), "nothing left counted");
}

/// A revoke frees a counted seat like a release (a borrowed or lingering one
/// at once), hands it to the queue under the policies, and forgets a revoked
/// waiter's owner record.
#[tokio::test]
async fn a_revoke_keeps_the_counts_and_grants_under_the_policies() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let policy = LicensePolicy {
        max_per_user: Some(1),
        linger_ms: Some(60_000),
        max_borrow_ms: Some(3_600_000),
        ..LicensePolicy::default()
    };
    provision_policy(&s, "cad", 2, &policy).await;
    let who = |session: &str, user: &str, borrow_ms| {
        direct(&s, "cad", session).with_policy(RequestPolicy {
            borrow_ms,
            ..ask(user, "", 0)
        })
    };
    assert_eq!(
        who("a1", "ada", 0).acquire(&mut con).await.status(),
        Status::Acquired
    );
    assert_eq!(
        who("b1", "bob", 3_600_000).acquire(&mut con).await.status(),
        Status::Acquired
    );
    for (session, user) in [("a2", "ada"), ("c1", "cyd"), ("d1", "dan")] {
        let o = who(session, user, 0).queue(&mut con, 60_000, "", "").await;
        assert_eq!(o.status(), Status::Queued, "{session}");
    }
    let granted = |o: &seatgate_core::scripts::Outcome| -> Vec<String> {
        o.notes.iter().map(|n| n.session.clone()).collect()
    };
    // The borrowed seat goes at once, past a2 (ada holds a1) to c1.
    let o = who("b1", "", 0).revoke(&mut con, "audit", "admin", 0).await;
    assert_eq!(
        (o.status(), granted(&o)),
        (Status::Revoked, vec!["c1".to_owned()])
    );
    assert_counts_match_holders(&s, "cad").await;
    // A lingering seat is revoked at once too; ada's waiter gets it.
    assert_eq!(
        who("a1", "", 0).release(&mut con).await.decision,
        Decision::Released {
            linger_ms: Some(60_000)
        }
    );
    let o = who("a1", "", 0).revoke(&mut con, "audit", "admin", 0).await;
    assert_eq!(
        (o.status(), granted(&o)),
        (Status::Revoked, vec!["a2".to_owned()])
    );
    assert_counts_match_holders(&s, "cad").await;
    // A revoked waiter's owner record goes with its place.
    let o = who("d1", "", 0).revoke(&mut con, "audit", "admin", 0).await;
    assert_eq!(o.decision, Decision::Revoked { held: false });
    assert_counts_match_holders(&s, "cad").await;
    let (truth, _, _) = read_owners(&s, "cad").await;
    assert_eq!(truth.users, [("ada".to_owned(), 1), ("cyd".to_owned(), 1)].into());
    assert_eq!(holders(&s, "cad").await, ["a2", "c1"]);
}

// ---------------------------------------------------------------------------
// Under concurrency.

/// The burst's license: 8 seats, one user holds at most 2, group eng at most
/// 4 and 2 kept for group ops.
fn burst_policy() -> LicensePolicy {
    LicensePolicy {
        max_per_user: Some(2),
        group_max: [("eng".to_owned(), 4)].into(),
        group_reserve: [("ops".to_owned(), 2)].into(),
        ..LicensePolicy::default()
    }
}

/// Samples `license`'s holders and owner records (one MULTI each time) until
/// `stop`; returns the violations seen and how many samples were taken.
fn watch_policy(
    s: &Settings,
    license: &str,
    seats: usize,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<(Vec<String>, usize)> {
    let s = s.clone();
    let license = license.to_owned();
    tokio::spawn(async move {
        let (mut bad, mut samples) = (Vec::new(), 0);
        let policy = burst_policy();
        let mut con = db(&s).await;
        while !stop.is_cancelled() {
            let (held, _, _) = read_owners_on(&mut con, &s, &license).await;
            samples += 1;
            if held.total > seats {
                bad.push(format!("{} seats held of {seats}", held.total));
            }
            for (user, n) in &held.users {
                if *n > 2 {
                    bad.push(format!("user {user} holds {n}"));
                }
            }
            let eng = held.groups.get("eng").copied().unwrap_or(0);
            if eng > 4 {
                bad.push(format!("group eng holds {eng}"));
            }
            // Others never take ops's unused reservation.
            let ops = held.groups.get("ops").copied().unwrap_or(0);
            let reserve = policy.group_reserve["ops"] as i64;
            if held.total as i64 - ops + ops.max(reserve) > seats as i64 {
                bad.push(format!(
                    "{} held, ops holds {ops} of its {reserve} reserved",
                    held.total
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (bad, samples)
    })
}

/// A few hundred acquires from a handful of users in three groups, over two
/// workers, each holder releasing after a moment: no user above its limit,
/// no group above its max, reserved seats never taken by others, never more
/// seats than seats_total (sampled throughout), and the counts equal the
/// holders afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_keeps_every_limit_and_the_counts() {
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    s.limits.session_requests = 0;
    provision_policy(&s, "burst", 8, &burst_policy()).await;
    let w1 = spawn_worker(s.clone(), "w1").await;
    let w2 = spawn_worker(s.clone(), "w2").await;
    let stop = CancellationToken::new();
    let watch = watch_policy(&s, "burst", 8, stop.clone());
    // ivy holds her two seats throughout: her acquires in the burst are over
    // her limit, whatever the timing.
    let ivy = |session: &str| direct(&s, "burst", session).with_policy(ask("ivy", "", 0));
    for session in ["ivy-1", "ivy-2"] {
        assert_eq!(ivy(session).acquire(&mut con).await.status(), Status::Acquired);
    }

    let users = [
        ("ada", "eng"),
        ("bob", "eng"),
        ("cyd", "eng"),
        ("dan", "ops"),
        ("eve", "ops"),
        ("fay", "sales"),
        ("gus", "sales"),
        ("hal", ""),
        ("ivy", ""),
    ];
    let mut tasks = Vec::new();
    for i in 0..240 {
        let s = s.clone();
        let (user, group) = users[i % users.len()];
        tasks.push(tokio::spawn(async move {
            let c = client(&s).await;
            let session = format!("s{i}");
            let wait = if i % 3 == 0 || user == "ivy" { 0 } else { 2_000 };
            let id = c
                .send(&acquire_as("burst", &session, user, group, wait))
                .await
                .unwrap();
            let mut r = c.wait_for(&id, T).await.unwrap();
            if r.status() == Status::Queued {
                r = c.wait_for(&id, Duration::from_secs(15)).await.unwrap();
            }
            let status = r.status();
            if status.is_ok() {
                tokio::time::sleep(Duration::from_millis(5 + (i as u64 % 7) * 3)).await;
                let released = c.call(&release("burst", &session), T).await.unwrap();
                assert_eq!(released.status(), Status::Released, "{session}");
            }
            status
        }));
    }
    // The reaper ends the waits that run out meanwhile.
    let reaper = reaper(&s).await;
    let mut outcomes: HashMap<Status, usize> = HashMap::new();
    let mut pending = tasks;
    while !pending.is_empty() {
        reaper.pass().await.unwrap();
        let (done, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|t| t.is_finished());
        for t in done {
            *outcomes.entry(t.await.unwrap()).or_default() += 1;
        }
        pending = rest;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    let (violations, samples) = watch.await.unwrap();
    w1.stop().await;
    w2.stop().await;
    eprintln!("policy burst: {outcomes:?}, {samples} samples");
    assert!(violations.is_empty(), "{violations:?}");
    assert!(samples > 50, "the sampler ran ({samples} samples)");
    let served = outcomes.get(&Status::Acquired).unwrap_or(&0) + outcomes.get(&Status::Granted).unwrap_or(&0);
    assert!(served >= 100, "{outcomes:?}");
    assert!(outcomes.contains_key(&Status::LimitReached), "{outcomes:?}");
    assert_eq!(holders(&s, "burst").await, ["ivy-1", "ivy-2"]);
    assert_counts_match_holders(&s, "burst").await;
    for session in ["ivy-1", "ivy-2"] {
        assert_eq!(ivy(session).release(&mut con).await.status(), Status::Released);
    }
    assert!(holders(&s, "burst").await.is_empty());
    assert_counts_match_holders(&s, "burst").await;
    let (_, kept, _) = read_owners(&s, "burst").await;
    assert_eq!(kept, Held::default());
}

// ---------------------------------------------------------------------------
// Redis Cluster.

/// The same policies on a license on each master of a local cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_on_a_license_on_each_master_of_a_cluster() {
    let cluster = LocalCluster::start(3).await.expect("cluster");
    let mut s = Settings::load(None).expect("defaults");
    s.redis.cluster_urls = cluster.urls();
    s.keys.prefix = "pol".into();
    s.stream.requests = "pol:requests".into();
    s.stream.dead_letter = "pol:requests:dead".into();
    s.events.stream = "pol:events".into();
    s.stream.shards = 3;
    s.stream.block_ms = 100;
    s.metrics.listen = String::new();
    s.limits.session_requests = 0;

    // One license per master.
    let mut by_master: BTreeMap<u16, String> = BTreeMap::new();
    for i in 0..60 {
        let l = format!("pl-{i}");
        let master = cluster
            .master_of(&license_keys(&s, &l).holders)
            .await
            .expect("a master");
        by_master.entry(master).or_insert(l);
        if by_master.len() == 3 {
            break;
        }
    }
    assert_eq!(by_master.len(), 3, "a license on every master");
    let policy = LicensePolicy {
        max_per_user: Some(1),
        group_reserve: [("ops".to_owned(), 1)].into(),
        max_priority: Some(5),
        linger_ms: Some(300),
        max_borrow_ms: Some(60_000),
        require_user: Some(true),
        ..LicensePolicy::default()
    };
    for l in by_master.values() {
        provision_policy(&s, l, 3, &policy).await;
        // The group map lives in the license's slot (KEYS[18] of acquire).
        seatgate_core::provision::set_group(&mut db(&s).await, &keys(&s), l, "olga", "ops", "test")
            .await
            .unwrap();
    }
    let w = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    for l in by_master.values() {
        let l = l.as_str();
        expect(&c, acquire_as(l, "a1", "ada", "", 0), Status::Acquired).await;
        expect(&c, acquire_as(l, "a2", "ada", "", 0), Status::LimitReached).await;
        let borrowed = acquire(l, "b1", 0).with_policy(RequestPolicy {
            borrow_ms: 30_000,
            ..ask("bob", "", 0)
        });
        let r = expect(&c, borrowed, Status::Acquired).await;
        assert!(r.int("borrowed_until_ms") > 0);
        // The last seat is ops's.
        expect(&c, acquire_as(l, "c1", "cyd", "", 0), Status::NoSeatsAvailable).await;
        let (q, id, waiter) = queued(&s, acquire(l, "c1", 30_000).with_policy(ask("cyd", "", 9))).await;
        assert_eq!((q.status(), q.get("priority")), (Status::Queued, "5"));
        // Neither a claim of ops's seat nor an acquire without a user gets it.
        expect(&c, acquire_as(l, "x1", "cyd", "ops", 0), Status::LimitReached).await;
        expect(&c, acquire(l, "n1", 0), Status::LimitReached).await;
        expect(&c, acquire_as(l, "o1", "olga", "ops", 0), Status::Acquired).await;
        // ada's release lingers; the reaper then grants the seat to cyd.
        assert_eq!(call(&c, release(l, "a1")).await.get("linger_ms"), "300");
        tokio::time::sleep(Duration::from_millis(350)).await;
        let report = reaper(&s).await.reap_license(l).await.unwrap();
        assert_eq!((report.ended, report.granted), (1, 1), "{l}");
        expect_reply(&waiter, &id, Status::Granted).await;
        assert_eq!(holders(&s, l).await, ["b1", "c1", "o1"]);
        assert_counts_match_holders(&s, l).await;
    }
    w.stop().await;
}

// ---------------------------------------------------------------------------
// Identity the server decides: `require_user` and the license's group map.

/// Omitting `user` escaped `max_per_user`: with `require_user` (written
/// straight into the record, as a billing system does) such an acquire is
/// refused, with and without a wait.
#[tokio::test]
async fn require_user_refuses_an_acquire_without_a_user() {
    let policy = LicensePolicy {
        max_per_user: Some(1),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(5, &policy).await;
    set_license_field(&mut db(&s).await, &s, "cad", "require_user", "1").await;

    expect(&c, acquire_as("cad", "a1", "ada", "", 0), Status::Acquired).await;
    expect(&c, acquire_as("cad", "a2", "ada", "", 0), Status::LimitReached).await;
    for wait_ms in [0, 10_000] {
        let r = call(&c, acquire("cad", "anon", wait_ms)).await;
        assert_eq!((r.status(), r.get("ok")), (Status::LimitReached, "0"), "{r:?}");
        assert!(r.get("error").contains("require_user"), "{r:?}");
    }
    assert_eq!(holders(&s, "cad").await, ["a1"]);
    worker.stop().await;
}

/// Sending `group=sim` took sim's reserved seats: with a group map (written
/// straight into its hash, as a billing system does) a request's group is
/// its user's, and a claim that disagrees is refused.
#[tokio::test]
async fn the_group_map_decides_a_request_s_group() {
    let policy = LicensePolicy {
        group_reserve: [("sim".to_owned(), 2)].into(),
        ..LicensePolicy::default()
    };
    let (_redis, s, worker, c) = serve_cad(3, &policy).await;
    let groups = license_keys(&s, "cad").groups;
    let _: () = redis::cmd("HSET")
        .arg(&groups)
        .arg("sam")
        .arg("sim")
        .arg("eve")
        .arg("eng")
        .query_async(&mut db(&s).await)
        .await
        .unwrap();

    expect(&c, acquire_as("cad", "e1", "eve", "", 0), Status::Acquired).await;
    // The two seats left are sim's: no claim takes them.
    for (session, user, group) in [("e2", "eve", "sim"), ("m1", "mallory", "sim"), ("n1", "", "sim")] {
        let r = call(&c, acquire_as("cad", session, user, group, 0)).await;
        assert_eq!(
            (r.status(), r.get("ok")),
            (Status::LimitReached, "0"),
            "{session}: {r:?}"
        );
        assert!(r.get("error").contains("group map"), "{r:?}");
    }
    // sam is sim's without saying so, and may say so.
    expect(&c, acquire_as("cad", "s1", "sam", "", 0), Status::Acquired).await;
    expect(&c, acquire_as("cad", "s2", "sam", "sim", 0), Status::Acquired).await;
    assert_eq!(holders(&s, "cad").await, ["e1", "s1", "s2"]);
    assert_eq!(license_status(&s, "cad").await.held_by_group.get("sim"), Some(&2));
    assert_counts_match_holders(&s, "cad").await;
    worker.stop().await;
}

/// lua/acquire.lua's identity refusals, called directly and decoded:
/// `require_user` (and its rule), the group map's refusal of a claim, of a
/// mapped group that is no id, and the mapped group counted for a user who
/// claims none.
#[tokio::test]
async fn identity_refusals_decode_from_the_script() {
    use seatgate_core::policy::PolicyRefusal;
    let TestApp(_redis, s, mut con) = spawn_app().await;
    crate::support::put_license(&s, "cad", 5).await;
    set_license_field(&mut con, &s, "cad", "require_user", "1").await;
    let o = direct(&s, "cad", "anon").acquire(&mut con).await;
    assert_eq!(o.decision, Decision::LimitReached(PolicyRefusal::RequireUser));
    set_license_field(&mut con, &s, "cad", "require_user", "2").await;
    let o = direct(&s, "cad", "anon").acquire(&mut con).await;
    assert_eq!(o.status(), Status::LicenseInvalid, "require_user keeps its rule");
    set_license_field(&mut con, &s, "cad", "require_user", "0").await;

    let groups = license_keys(&s, "cad").groups;
    let _: () = redis::cmd("HSET")
        .arg(&groups)
        .arg("ada")
        .arg("eng")
        .arg("bad")
        .arg("a|b")
        .query_async(&mut con)
        .await
        .unwrap();
    let as_ =
        |session: &str, user: &str, group: &str| direct(&s, "cad", session).with_policy(ask(user, group, 0));
    let o = as_("a1", "ada", "ops").acquire(&mut con).await;
    assert_eq!(o.decision, Decision::LimitReached(PolicyRefusal::GroupMap));
    let o = as_("b1", "bad", "").acquire(&mut con).await;
    assert_eq!(
        o.decision,
        Decision::LimitReached(PolicyRefusal::GroupMap),
        "a mapped group that is no id"
    );
    assert_eq!(
        as_("a1", "ada", "").acquire(&mut con).await.status(),
        Status::Acquired
    );
    assert_eq!(
        as_("anon", "", "").acquire(&mut con).await.status(),
        Status::Acquired
    );
    assert_eq!(holders(&s, "cad").await, ["a1", "anon"]);
    assert_eq!(license_status(&s, "cad").await.held_by_group.get("eng"), Some(&1));
}

// ---------------------------------------------------------------------------
// queue_max_per_user: a user's waiters, through every way a wait ends.

/// The sessions each user has waiting, as the queue and the owner records
/// say, and the per-user waiter counts (`w:<user>`) the scripts keep.
async fn waiters_per_user(s: &Settings, license: &str) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    waiter_counts(s, license, "w:", |o| o.user).await
}

/// The same per group: the queue's, and the scripts' `wg:<group>` counts.
async fn waiters_per_group(s: &Settings, license: &str) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    waiter_counts(s, license, "wg:", |o| o.group).await
}

/// The sessions waiting per `of` (a user or a group) of their owner
/// records, and the counts the scripts keep under `prefix`.
async fn waiter_counts(
    s: &Settings,
    license: &str,
    prefix: &str,
    of: fn(OwnerRecord) -> Option<String>,
) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let k = license_keys(s, license);
    let (waiting, owners): (Vec<String>, HashMap<String, String>) = redis::pipe()
        .atomic()
        .cmd("ZRANGE")
        .arg(&k.queue)
        .arg(0)
        .arg(-1)
        .cmd("HGETALL")
        .arg(&k.owners)
        .query_async(&mut db(s).await)
        .await
        .unwrap();
    let mut truth = BTreeMap::new();
    for w in &waiting {
        if let Some(who) = owners
            .get(&format!("s:{w}"))
            .and_then(|r| OwnerRecord::parse(r))
            .and_then(of)
        {
            *truth.entry(who).or_default() += 1;
        }
    }
    let kept = owners
        .iter()
        .filter_map(|(f, n)| Some((f.strip_prefix(prefix)?.to_owned(), n.parse().unwrap())))
        .collect();
    (truth, kept)
}

/// The scripts' per-user waiter counts equal the queue's.
async fn assert_waiter_counts(s: &Settings, license: &str, at: &str) {
    let (truth, kept) = waiters_per_user(s, license).await;
    assert_eq!(kept, truth, "{at}: the waiter counts drifted from the queue");
}

/// The end of a waiter quota test on license "cad": through a worker,
/// `call` (one waiter past the quota) is refused NO_SEATS_AVAILABLE with an
/// error naming each of `names`; deleting the license then ends every wait
/// and leaves no count under `prefix` (`of` picks the owner's user or group).
async fn named_then_cleared(
    s: &Settings,
    con: &mut Db,
    call: Call,
    names: &[&str],
    prefix: &str,
    of: fn(OwnerRecord) -> Option<String>,
) {
    let worker = spawn_worker(s.clone(), "w1").await;
    let c = client(s).await;
    let r = expect(&c, call, Status::NoSeatsAvailable).await;
    assert!(
        names.iter().all(|n| r.get("error").contains(n)),
        "{names:?}: {r:?}"
    );
    worker.stop().await;
    assert!(seatgate_core::license::delete(con, &keys(s), "cad")
        .await
        .unwrap());
    let (truth, kept) = waiter_counts(s, "cad", prefix, of).await;
    assert!(truth.is_empty() && kept.is_empty(), "{truth:?} {kept:?}");
}

/// Session `session` of license "cad" asked by `user`, waiting up to
/// `wait_ms` (called directly).
async fn queue_as(s: &Settings, session: &str, user: &str, wait_ms: u64) -> seatgate_core::scripts::Outcome {
    direct(s, "cad", session)
        .with_policy(ask(user, "", 0))
        .queue(&mut db(s).await, wait_ms, &format!("r-{session}"), "")
        .await
}

/// `queue_max_per_user` 2 on a full one-seat license: ada's third waiter is
/// refused (NO_SEATS_AVAILABLE, `queue_user_full`) while bob and an acquire
/// without a user still queue; each way a wait ends gives ada her place back
/// (a grant, a timeout, leaving the queue, a revocation), a re-sent acquire
/// of a waiting session is not counted twice, and deleting the license
/// leaves no count behind. The counts equal the queue after every step.
#[tokio::test]
async fn queue_max_per_user_through_every_way_a_wait_ends() {
    let policy = LicensePolicy {
        queue_max_per_user: Some(2),
        ..LicensePolicy::default()
    };
    let TestApp(_redis, s, mut con) = spawn_app().await;
    provision_policy(&s, "cad", 1, &policy).await;
    let as_user = |session: &str, user: &str| direct(&s, "cad", session).with_policy(ask(user, "", 0));
    assert!(matches!(
        as_user("holder", "hal").acquire(&mut con).await.decision,
        Decision::Acquired { .. }
    ));
    let queued = |o: &seatgate_core::scripts::Outcome| matches!(o.decision, Decision::Queued { .. });
    let user_full = |o: &seatgate_core::scripts::Outcome| {
        o.decision == Decision::NoSeatsAvailable(seatgate_core::scripts::NoSeats::QueueUserFull)
    };

    assert!(queued(&queue_as(&s, "a1", "ada", 60_000).await));
    assert!(queued(&queue_as(&s, "a2", "ada", 60_000).await));
    let refused = queue_as(&s, "a3", "ada", 60_000).await;
    assert!(user_full(&refused), "{refused:?}");
    assert!(refused.changed, "a denial, with its event");
    // A re-sent acquire of a waiting session keeps its place, counted once.
    assert!(queued(&queue_as(&s, "a1", "ada", 60_000).await));
    assert_waiter_counts(&s, "cad", "re-sent").await;
    // Others are not held back by ada's quota.
    assert!(queued(&queue_as(&s, "b1", "bob", 60_000).await));
    assert!(queued(&queue_as(&s, "anon", "", 60_000).await));
    assert_waiter_counts(&s, "cad", "queued").await;

    // A grant: the holder releases, a1 (first in line) gets the seat, and
    // ada may queue again.
    assert_eq!(
        as_user("holder", "hal").release(&mut con).await.decision.status(),
        Status::Released
    );
    assert_eq!(holders(&s, "cad").await, ["a1"]);
    assert_waiter_counts(&s, "cad", "granted").await;
    assert!(queued(&queue_as(&s, "a3", "ada", 60_000).await));
    assert!(user_full(&queue_as(&s, "a4", "ada", 60_000).await));

    // Leaving the queue (a release while waiting).
    assert_eq!(
        as_user("a2", "ada").release(&mut con).await.decision.status(),
        Status::LeftQueue
    );
    assert_waiter_counts(&s, "cad", "left").await;
    // A timeout: a4 queues for 50 ms, and its wait ends on the next script.
    assert!(queued(&queue_as(&s, "a4", "ada", 50).await));
    assert!(user_full(&queue_as(&s, "a5", "ada", 60_000).await));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(
        queued(&queue_as(&s, "a5", "ada", 60_000).await),
        "a4's wait ran out"
    );
    assert_waiter_counts(&s, "cad", "timed out").await;
    // A revocation of a waiter.
    let revoked = as_user("a5", "ada").revoke(&mut con, "audit", "root", 0).await;
    assert_eq!(revoked.decision.status(), Status::Revoked);
    assert_waiter_counts(&s, "cad", "revoked").await;
    assert!(queued(&queue_as(&s, "a6", "ada", 60_000).await));
    assert!(user_full(&queue_as(&s, "a7", "ada", 60_000).await));
    let (truth, kept) = waiters_per_user(&s, "cad").await;
    assert_eq!(kept, truth);
    assert_eq!(
        kept,
        BTreeMap::from([("ada".to_owned(), 2), ("bob".to_owned(), 1)])
    );

    // The reply says which quota, through the worker.
    named_then_cleared(
        &s,
        &mut con,
        acquire_as("cad", "a8", "ada", "", 60_000),
        &["user ada", "queue_max_per_user"],
        "w:",
        |o| o.user,
    )
    .await;
}

/// `queue_max_per_group` 2 on a full one-seat license (issue 35, H2's cap
/// on waiters per group): group cad's third waiter is refused
/// (NO_SEATS_AVAILABLE, `queue_group_full`) while eng and a waiter without
/// a group still queue, so one group cannot fill the queue ahead of the
/// others; each way a wait ends gives cad its place back, and the counts
/// (`wg:<group>`) equal the queue after every step.
#[tokio::test]
async fn queue_max_per_group_holds_one_groups_waiters_and_frees_their_places() {
    let policy = LicensePolicy {
        queue_max_per_group: Some(2),
        ..LicensePolicy::default()
    };
    let TestApp(_redis, s, mut con) = spawn_app().await;
    provision_policy(&s, "cad", 1, &policy).await;
    let as_group = |session: &str, group: &str| direct(&s, "cad", session).with_policy(ask("", group, 0));
    let queue = |session: &'static str, group: &'static str, wait_ms: u64| {
        let s = s.clone();
        async move {
            direct(&s, "cad", session)
                .with_policy(ask("", group, 0))
                .queue(&mut db(&s).await, wait_ms, &format!("r-{session}"), "")
                .await
        }
    };
    assert!(matches!(
        as_group("holder", "ops").acquire(&mut con).await.decision,
        Decision::Acquired { .. }
    ));
    let queued = |o: &seatgate_core::scripts::Outcome| matches!(o.decision, Decision::Queued { .. });
    let group_full = |o: &seatgate_core::scripts::Outcome| {
        o.decision == Decision::NoSeatsAvailable(seatgate_core::scripts::NoSeats::QueueGroupFull)
    };
    let counted = |at: &'static str| {
        let s = s.clone();
        async move {
            let (truth, kept) = waiters_per_group(&s, "cad").await;
            assert_eq!(
                kept, truth,
                "{at}: the group waiter counts drifted from the queue"
            );
            kept
        }
    };

    assert!(queued(&queue("c1", "cad", 60_000).await));
    assert!(queued(&queue("c2", "cad", 60_000).await));
    let refused = queue("c3", "cad", 60_000).await;
    assert!(group_full(&refused), "{refused:?}");
    assert!(
        queued(&queue("c1", "cad", 60_000).await),
        "a re-sent acquire keeps its place"
    );
    assert!(
        queued(&queue("e1", "eng", 60_000).await),
        "another group is not held back"
    );
    assert!(
        queued(&queue("none", "", 60_000).await),
        "nor a waiter of no group"
    );
    assert_eq!(
        counted("queued").await,
        BTreeMap::from([("cad".to_owned(), 2), ("eng".to_owned(), 1)])
    );

    // A grant gives cad a place back.
    assert_eq!(
        as_group("holder", "ops")
            .release(&mut con)
            .await
            .decision
            .status(),
        Status::Released
    );
    assert_eq!(holders(&s, "cad").await, ["c1"]);
    counted("granted").await;
    assert!(queued(&queue("c3", "cad", 60_000).await));
    assert!(group_full(&queue("c4", "cad", 60_000).await));
    // So do leaving the queue, a timeout and a revocation.
    assert_eq!(
        as_group("c2", "cad").release(&mut con).await.decision.status(),
        Status::LeftQueue
    );
    counted("left").await;
    assert!(queued(&queue("c4", "cad", 50).await));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(queued(&queue("c5", "cad", 60_000).await), "c4's wait ran out");
    counted("timed out").await;
    let revoked = as_group("c5", "cad").revoke(&mut con, "audit", "root", 0).await;
    assert_eq!(revoked.decision.status(), Status::Revoked);
    counted("revoked").await;

    // The reply names the group and the quota, through the worker.
    assert!(queued(&queue("c6", "cad", 60_000).await));
    named_then_cleared(
        &s,
        &mut con,
        acquire_as("cad", "c7", "", "cad", 60_000),
        &["group cad", "queue_max_per_group"],
        "wg:",
        |o| o.group,
    )
    .await;
}

/// `seatgate license put --queue-max-per-user` writes the field, `license
/// show` shows it (text and JSON), and `--unset queue_max_per_user` lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn license_put_sets_and_show_shows_the_waiter_quota() {
    let TestApp(redis, _s, _con) = spawn_app().await;
    let url = redis.url();
    let run = |args: &[&str]| output(seatgate_cmd(&url, args));
    let put = run(&[
        "license",
        "put",
        "cad",
        "--seats",
        "2",
        "--queue-max-per-user",
        "3",
    ])
    .await;
    assert!(put.status.success(), "{put:?}");
    let show = run(&["license", "show", "cad", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(json["policy"], serde_json::json!({"queue_max_per_user": 3}));
    let text = String::from_utf8_lossy(&run(&["license", "show", "cad"]).await.stdout).into_owned();
    assert!(text.contains("policy: queue_max_per_user 3"), "{text}");
    let unset = run(&["license", "put", "cad", "--unset", "queue_max_per_user"]).await;
    assert!(unset.status.success(), "{unset:?}");
    let show = run(&["license", "show", "cad", "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert!(json["policy"].as_object().is_none_or(|p| p.is_empty()), "{json}");
}
