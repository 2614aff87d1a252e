//! Exactly-once events (issue 22): a worker killed at any point of a
//! request's handling leaves exactly one event per seat change. Each case
//! runs the real `seatgate run` with the fault hook (`SEATGATE_FAULT`,
//! runtime::fault, feature `tools`), lets it abort the n-th time it passes
//! the point, starts a worker without the hook, and checks the license's
//! events against the replies and the final holders.

use std::collections::HashMap;
use std::time::Duration;

use seatgate::config::Settings;
use seatgate::runtime::fault::Point;
use seatgate_client::{Call, Client};
use seatgate_core::status::Status;

use crate::support::{acquire, client, events, holders, put_license, spawn_app, TestApp, WorkerProcess};

/// How long a reply may take: a claim of the dead worker's entries, and a
/// reaper pass for a queue reply it left undelivered.
const LONG: Duration = Duration::from_secs(20);

/// What the workers run with: short claim and redelivery times, a reaper
/// every second, and `fault` when given.
fn env(fault: Option<String>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("SEATGATE__STREAM__CLAIM_IDLE_MS", "300".to_owned()),
        ("SEATGATE__REAPER__SCHEDULE", "* * * * * *".to_owned()),
        ("SEATGATE__REAPER__REDELIVER_AFTER_MS", "300".to_owned()),
        ("SEATGATE__LIMITS__SESSION_REQUESTS", "0".to_owned()),
    ];
    if let Some(fault) = fault {
        env.push(("SEATGATE_FAULT", fault));
    }
    env
}

/// Waits for `id`'s next reply that is not `QUEUED` (a replayed acquire
/// answers QUEUED again before its GRANTED).
async fn after_queued(c: &Client, id: &str) -> Status {
    loop {
        let status = c.wait_for(id, LONG).await.expect("a reply").status();
        if status != Status::Queued {
            return status;
        }
    }
}

/// The requests of one run, one after the other on a license of 2 seats,
/// and the answers they got: every request is answered.
async fn workload(s: Settings) -> Vec<(&'static str, Status)> {
    let c = client(&s).await;
    let call = |call: Call| {
        let c = &c;
        async move { c.call(&call, LONG).await.expect("a reply").status() }
    };
    let mut got = vec![
        ("s1", call(acquire("lic", "s1", 0)).await),
        ("s2", call(acquire("lic", "s2", 0)).await),
    ];
    let waiter = c.send(&acquire("lic", "s3", 30_000)).await.expect("sent");
    got.push(("s3", c.wait_for(&waiter, LONG).await.expect("a reply").status()));
    got.push(("s4", call(acquire("lic", "s4", 0)).await));
    got.push(("s1", call(Call::release("lic", "s1")).await));
    got.push(("s3", after_queued(&c, &waiter).await));
    got.push(("s2", call(Call::release("lic", "s2")).await));
    got.push(("s3", call(Call::release("lic", "s3")).await));
    got
}

/// One run: a worker armed to abort the `n`-th time it passes `point`, then
/// one without, and the checks.
async fn killed_at(point: Point, n: u32) {
    let TestApp(redis, s, _con) = spawn_app().await;
    put_license(&s, "lic", 2).await;
    let fault = format!("{}:{n}", point.as_str());
    let mut armed = WorkerProcess::start(&redis.url(), &env(Some(fault.clone()))).await;
    let requests = tokio::spawn(workload(s.clone()));
    let status = armed.exited(LONG).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "{fault}: the armed worker did not abort ({status:?})"
    );
    let _survivor = WorkerProcess::start(&redis.url(), &env(None)).await;
    let replies = requests.await.expect("the requests' task");

    // Every request answered, as if nothing had happened.
    let expected = [
        ("s1", Status::Acquired),
        ("s2", Status::Acquired),
        ("s3", Status::Queued),
        ("s4", Status::NoSeatsAvailable),
        ("s1", Status::Released),
        ("s3", Status::Granted),
        ("s2", Status::Released),
        ("s3", Status::Released),
    ];
    assert_eq!(replies, expected, "{fault}");
    assert!(holders(&s, "lic").await.is_empty(), "{fault}");

    // Exactly one event per change (and per denial), numbered gaplessly
    // from 1 in the order of the changes.
    let recorded = events(&s, "lic").await;
    let seqs: Vec<u64> = recorded.iter().map(|e| e["seq"].parse().expect("seq")).collect();
    let gapless: Vec<u64> = (1..=recorded.len() as u64).collect();
    assert_eq!(seqs, gapless, "{fault}: {recorded:?}");
    let mut per_change: HashMap<(String, String), usize> = HashMap::new();
    for e in &recorded {
        *per_change
            .entry((e["type"].clone(), e["session"].clone()))
            .or_default() += 1;
    }
    let changes = [
        ("acquired", "s1"),
        ("acquired", "s2"),
        ("queued", "s3"),
        ("denied", "s4"),
        ("released", "s1"),
        ("granted", "s3"),
        ("released", "s2"),
        ("released", "s3"),
    ];
    for (kind, session) in changes {
        assert_eq!(
            per_change.get(&(kind.to_owned(), session.to_owned())),
            Some(&1),
            "{fault}: one {kind} of {session}: {recorded:?}"
        );
    }
    assert_eq!(recorded.len(), changes.len(), "{fault}: {recorded:?}");
    let seq_of = |kind: &str, session: &str| {
        recorded
            .iter()
            .find(|e| e["type"] == kind && e["session"] == session)
            .map(|e| e["seq"].parse::<u64>().expect("seq"))
    };
    assert!(
        seq_of("released", "s1") < seq_of("granted", "s3"),
        "{fault}: the seat is freed before it is granted"
    );
    // Taken minus freed per session: the final holders (none).
    for session in ["s1", "s2", "s3", "s4"] {
        let count = |kind: &str| {
            per_change
                .get(&(kind.to_owned(), session.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(
            count("acquired") + count("granted"),
            count("released"),
            "{fault}: {session}"
        );
    }
}

/// The points a worker passes for every batch, at the first request (s1's
/// acquire) and at the fifth (s1's release, whose script grants s3 its seat).
async fn every_pass_of(point: Point) {
    for n in [1, 5] {
        killed_at(point, n).await;
    }
}

#[tokio::test]
async fn a_kill_after_the_read_leaves_one_event_per_change() {
    every_pass_of(Point::AfterRead).await;
}

#[tokio::test]
async fn a_kill_after_the_script_leaves_one_event_per_change() {
    every_pass_of(Point::AfterScript).await;
}

#[tokio::test]
async fn a_kill_after_the_relay_leaves_one_event_per_change() {
    every_pass_of(Point::AfterRelay).await;
}

#[tokio::test]
async fn a_kill_after_the_reply_leaves_one_event_per_change() {
    every_pass_of(Point::AfterReply).await;
}

#[tokio::test]
async fn a_kill_before_the_ack_leaves_one_event_per_change() {
    every_pass_of(Point::BeforeAck).await;
}

/// Every point has its case above.
#[test]
fn every_point_is_tried() {
    let source = include_str!("events_once.rs");
    for point in Point::ALL {
        assert!(
            source.contains(&format!("every_pass_of(Point::{point:?})")),
            "{point:?}"
        );
    }
}

/// `seq` never restarts: a license deleted (its seats `evicted`, reason
/// `license_deleted`, its waiter `denied` LICENSE_NOT_FOUND) and made again
/// goes on counting. `user` and `group` (the group map's) ride on every
/// event of the session, its denial too; an acquire by nobody in
/// particular carries neither.
#[tokio::test]
async fn seq_survives_a_delete_and_every_event_names_its_user_and_group() {
    use seatgate_core::policy::RequestPolicy;

    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "lic", 1).await;
    let groups = crate::support::license_keys(&s, "lic").groups;
    let _: () = redis::cmd("HSET")
        .arg(&groups)
        .arg("ann")
        .arg("eng")
        .query_async(&mut con)
        .await
        .unwrap();
    let ann = RequestPolicy {
        user: Some("ann".to_owned()),
        ..RequestPolicy::NONE
    };
    let direct = |session: &str| crate::support::direct(&s, "lic", session);
    assert_eq!(
        direct("a")
            .with_policy(ann.clone())
            .acquire(&mut con)
            .await
            .status(),
        Status::Acquired
    );
    assert_eq!(
        direct("b")
            .with_policy(ann.clone())
            .acquire(&mut con)
            .await
            .status(),
        Status::NoSeatsAvailable
    );
    assert_eq!(
        direct("c").acquire(&mut con).await.status(),
        Status::NoSeatsAvailable
    );
    let queued = direct("w")
        .with_policy(ann.clone())
        .queue(&mut con, 60_000, "w-1", "")
        .await;
    assert_eq!(queued.status(), Status::Queued);
    let deleted = crate::support::reaper(&s)
        .await
        .delete_license("lic", "test")
        .await
        .unwrap();
    assert_eq!((deleted.seats, deleted.waits), (1, 1));
    put_license(&s, "lic", 1).await;
    assert_eq!(direct("d").acquire(&mut con).await.status(), Status::Acquired);

    let recorded: Vec<String> = events(&s, "lic")
        .await
        .iter()
        .map(|e| {
            let field = |name: &str| e.fields.get(name).cloned().unwrap_or_default();
            format!(
                "{} {} {} {} {} {}",
                field("seq"),
                field("type"),
                field("session"),
                field("user"),
                field("group"),
                field("reason")
            )
        })
        .collect();
    assert_eq!(
        recorded,
        [
            "1 acquired a ann eng ",
            "2 denied b ann eng NO_SEATS_AVAILABLE",
            "3 denied c   NO_SEATS_AVAILABLE",
            "4 queued w ann eng ",
            // The admin trail's event first, in the same step (its actor,
            // before and after: tests/it/admin.rs).
            "5 license_deleted    ",
            "6 evicted a ann eng license_deleted",
            "7 denied w ann eng LICENSE_NOT_FOUND",
            "8 acquired d   ",
        ]
    );
}
