//! Usage reports (`seatgate report`) and the events they are made of: known
//! events written straight to the events streams give exact figures in every
//! format; a run through real workers gives the figures its own events say;
//! events are trimmed by their own age; what an event costs in memory.

use std::time::Duration;

use seatgate::config::Settings;
use seatgate::views::usage::{self, LicenseUsage, Query, UsageReport, Waits, When};
use seatgate_client::{Call, SeatOp};
use seatgate_core::events::{Event, EventType};
use seatgate_core::keys::shard_of;
use seatgate_core::status::Status;

use crate::support::{
    add_request, client, db, events, output, put_license, reaping, redis_ms, seatgate_cmd, spawn_app,
    spawn_worker, Entry, TestApp, T,
};

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

/// `ms` as the RFC 3339 time the CLI takes and prints.
fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

/// An event of `license` as the runtime encodes it, with its optional fields.
struct Ev {
    kind: EventType,
    session: &'static str,
    seats_used: i64,
    at: i64,
    reason: Option<&'static str>,
    waited_ms: Option<i64>,
    user: Option<&'static str>,
}

fn ev(kind: EventType, session: &'static str, seats_used: i64, at: i64) -> Ev {
    Ev {
        kind,
        session,
        seats_used,
        at,
        reason: None,
        waited_ms: None,
        user: None,
    }
}

impl Ev {
    fn user(self, user: &'static str) -> Ev {
        Ev {
            user: Some(user),
            ..self
        }
    }
    fn reason(self, reason: &'static str) -> Ev {
        Ev {
            reason: Some(reason),
            ..self
        }
    }
    fn waited(self, ms: i64) -> Ev {
        Ev {
            waited_ms: Some(ms),
            ..self
        }
    }
}

/// Appends `events` of `license` (seats_total `total`) to its events shard
/// with the ids a worker would give them: the time each was appended, here
/// its decision time, or `appended` ms later when given.
async fn write_events(s: &Settings, license: &str, total: i64, events: &[(Ev, i64)]) {
    let mut con = db(s).await;
    let stream = s.events_stream_for(license);
    for (seq, (e, appended)) in events.iter().enumerate() {
        let mut event = Event::new(e.kind, license, e.session, e.seats_used, total, e.at);
        event.reason = e.reason;
        event.waited_ms = e.waited_ms;
        event.user = e.user.map(str::to_owned);
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&stream).arg(format!("{}-{seq}", e.at + appended));
        for (field, value) in event.fields() {
            xadd.arg(field).arg(value);
        }
        let _: String = xadd.query_async(&mut con).await.unwrap();
    }
}

/// Two license ids whose events lie on different shards of `shards`.
fn on_two_shards(shards: usize) -> (String, String) {
    let first = "acme".to_owned();
    let other = (0..100)
        .map(|i| format!("beta{i}"))
        .find(|l| shard_of(l, shards) != shard_of(&first, shards))
        .unwrap();
    (first, other)
}

/// A morning of `acme` (3 seats) from T to T + 4h, and the events before it:
///
/// - early@ took a seat at T − 1h and gives it back at T + 1h (a hold
///   running into the period: its start is found by reading back);
/// - gone@ held one from T − 30m to T − 10m (not in the period at all);
/// - ann@ T + 10m .. T + 3h, bob@ T + 30m .. evicted T + 2h30m;
/// - dave refused at T + 45m (appended 6 minutes late, after erin's queued),
///   erin@ queued at T + 50m and granted on early@'s release at T + 1h
///   after 10 minutes, still holding at the end;
/// - frank rate limited at T + 1h30m, gina's 20-minute wait ran out at
///   T + 2h, hal refused at T + 3h30m as the license had expired;
/// - erin@ releases at T + 4h10m, after the period.
///
/// Seats in use: 1 (early@, before the first event of the period) for 10m,
/// 2 for 20m, 3 for 2h, 2 for 30m, 1 for 1h: 530 seat-minutes.
fn acme_morning(t: i64) -> Vec<(Ev, i64)> {
    use EventType::*;
    vec![
        (ev(Acquired, "s-early", 1, t - HOUR).user("early@example.com"), 0),
        (
            ev(Acquired, "s-gone", 2, t - 30 * MIN).user("gone@example.com"),
            0,
        ),
        (ev(Released, "s-gone", 1, t - 10 * MIN), 0),
        (ev(Acquired, "s-ann", 2, t + 10 * MIN).user("ann@example.com"), 0),
        (ev(Acquired, "s-bob", 3, t + 30 * MIN).user("bob@example.com"), 0),
        (ev(Queued, "s-erin", 3, t + 50 * MIN), 0),
        (
            ev(Denied, "s-dave", 3, t + 45 * MIN).reason("NO_SEATS_AVAILABLE"),
            6 * MIN,
        ),
        (ev(Released, "s-early", 3, t + HOUR), 0),
        (
            ev(Granted, "s-erin", 3, t + HOUR)
                .waited(10 * MIN)
                .user("erin@example.com"),
            0,
        ),
        (ev(Denied, "s-frank", 3, t + 90 * MIN).reason("RATE_LIMITED"), 0),
        (ev(QueueTimeout, "s-gina", 3, t + 2 * HOUR).waited(20 * MIN), 0),
        (
            ev(Evicted, "s-bob", 2, t + 150 * MIN).reason("heartbeat_timeout"),
            0,
        ),
        (ev(Released, "s-ann", 1, t + 3 * HOUR), 0),
        (ev(Denied, "s-hal", 1, t + 210 * MIN).reason("LICENSE_EXPIRED"), 0),
        (ev(Released, "s-erin", 0, t + 250 * MIN), 0),
    ]
}

/// `beta` (1 seat): one session without a user, T + 1h .. T + 2h.
fn beta_morning(t: i64) -> Vec<(Ev, i64)> {
    vec![
        (ev(EventType::Acquired, "s-zed", 1, t + HOUR), 0),
        (ev(EventType::Released, "s-zed", 0, t + 2 * HOUR), 0),
    ]
}

/// The figures of [`acme_morning`] over [T, T + 4h).
fn assert_acme(l: &LicenseUsage, t: i64) {
    assert_eq!((l.license.as_str(), l.seats_total), ("acme", 3));
    assert_eq!((l.peak_seats, l.peak_at_ms), (3, Some(t + 30 * MIN)));
    assert_eq!(l.seat_ms, 530 * MIN);
    assert_eq!(l.seat_hours, 8.833);
    let denials: Vec<(&str, u64)> = l.denials.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    assert_eq!(
        denials,
        [
            ("LICENSE_EXPIRED", 1),
            ("NO_SEATS_AVAILABLE", 1),
            ("QUEUE_TIMEOUT", 1),
            ("RATE_LIMITED", 1)
        ]
    );
    assert_eq!(l.denials_total, 4);
    assert_eq!(
        l.queue_waits,
        Waits {
            count: 2,
            p50_ms: Some(10 * MIN),
            p95_ms: Some(20 * MIN),
            max_ms: Some(20 * MIN),
        }
    );
    let users: Vec<(Option<&str>, u64, i64)> = l
        .users
        .iter()
        .map(|u| (u.name.as_deref(), u.holds, u.seat_ms))
        .collect();
    assert_eq!(
        users,
        [
            (Some("erin@example.com"), 1, 3 * HOUR),
            (Some("ann@example.com"), 1, 170 * MIN),
            (Some("bob@example.com"), 1, 2 * HOUR),
            // Held since before the period: counted from its start, the
            // user found in the events before it.
            (Some("early@example.com"), 1, HOUR),
            // The denials, whose events carry no user yet.
            (None, 0, 0),
        ]
    );
}

#[tokio::test]
async fn known_events_give_exact_figures_as_a_table_as_csv_and_as_json() {
    let TestApp(redis, mut s, mut con) = spawn_app().await;
    s.stream.shards = 2;
    let (acme, beta) = on_two_shards(2);
    // A whole hour two days ago, so the period lies inside the retention.
    let t = (redis_ms(&mut con).await - 48 * HOUR) / HOUR * HOUR;
    // Something else on a stream is skipped, not fatal.
    let _: String = redis::cmd("XADD")
        .arg(s.events_stream_for(&beta))
        .arg(format!("{}-0", t + 20 * MIN))
        .arg("hello")
        .arg("world")
        .query_async(&mut con)
        .await
        .unwrap();
    write_events(&s, &acme, 3, &acme_morning(t)).await;
    write_events(&s, &beta, 1, &beta_morning(t)).await;

    let (since, until) = (rfc3339(t), rfc3339(t + 4 * HOUR));
    let run = |format: &str| {
        let mut cmd = seatgate_cmd(
            &redis.url(),
            &["report", "--since", &since, "--until", &until, "--format", format],
        );
        cmd.env("SEATGATE__STREAM__SHARDS", "2");
        output(cmd)
    };

    let json = run("json").await;
    assert!(json.status.success(), "{json:?}");
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["since_ms"], t);
    assert_eq!(report["until_ms"], t + 4 * HOUR);
    // The period's events: 11 of acme, 2 of beta (not the foreign entry).
    assert_eq!(report["events"], 13);
    assert_eq!(report["first_event_ms"], t + 10 * MIN);
    let licenses = report["licenses"].as_array().unwrap();
    assert_eq!(licenses.len(), 2, "both shards were read");
    let a = &licenses[0];
    assert_eq!(a["license"], "acme");
    assert_eq!(
        (a["peak_seats"].as_i64(), a["peak_at_ms"].as_i64()),
        (Some(3), Some(t + 30 * MIN))
    );
    assert_eq!(
        (a["seat_ms"].as_i64(), a["seat_hours"].as_f64()),
        (Some(530 * MIN), Some(8.833))
    );
    assert_eq!(
        a["denials"],
        serde_json::json!({"LICENSE_EXPIRED": 1, "NO_SEATS_AVAILABLE": 1, "QUEUE_TIMEOUT": 1, "RATE_LIMITED": 1})
    );
    assert_eq!(
        a["queue_waits"],
        serde_json::json!({"count": 2, "p50_ms": 600000, "p95_ms": 1200000, "max_ms": 1200000})
    );
    // The denials of these events carry no user (the events before the
    // events contract): they count for nobody in particular.
    assert_eq!(
        a["users"],
        serde_json::json!([
            {"name": "erin@example.com", "holds": 1, "seat_ms": 10800000, "seat_hours": 3.0, "denials": 0},
            {"name": "ann@example.com", "holds": 1, "seat_ms": 10200000, "seat_hours": 2.833, "denials": 0},
            {"name": "bob@example.com", "holds": 1, "seat_ms": 7200000, "seat_hours": 2.0, "denials": 0},
            {"name": "early@example.com", "holds": 1, "seat_ms": 3600000, "seat_hours": 1.0, "denials": 0},
            {"name": null, "holds": 0, "seat_ms": 0, "seat_hours": 0.0, "denials": 4},
        ])
    );
    assert_eq!(a["unattributed_ms"], 0);
    assert_eq!(a["capacity_ms"], 3 * 4 * HOUR);
    assert_eq!(a["utilisation_pct"], 73.61);
    let b = &licenses[1];
    assert_eq!(b["license"], beta.as_str());
    assert_eq!(
        (b["peak_seats"].as_i64(), b["seat_ms"].as_i64()),
        (Some(1), Some(HOUR))
    );
    assert_eq!(b["denials_total"], 0);
    assert_eq!(
        b["users"],
        serde_json::json!([{"name": null, "holds": 1, "seat_ms": 3600000, "seat_hours": 1.0, "denials": 0}])
    );

    let csv = run("csv").await;
    assert!(csv.status.success(), "{csv:?}");
    let csv = String::from_utf8(csv.stdout).unwrap();
    let peak_at = rfc3339(t + 30 * MIN);
    let acme_rows = [
        "license,metric,key,value".to_owned(),
        "acme,seats_total,,3".to_owned(),
        "acme,peak_seats,,3".to_owned(),
        format!("acme,peak_at,,{peak_at}"),
        "acme,seat_hours,,8.833".to_owned(),
        "acme,denials,LICENSE_EXPIRED,1".to_owned(),
        "acme,denials,NO_SEATS_AVAILABLE,1".to_owned(),
        "acme,denials,QUEUE_TIMEOUT,1".to_owned(),
        "acme,denials,RATE_LIMITED,1".to_owned(),
        "acme,queue_waits,count,2".to_owned(),
        "acme,queue_waits,p50_ms,600000".to_owned(),
        "acme,queue_waits,p95_ms,1200000".to_owned(),
        "acme,queue_waits,max_ms,1200000".to_owned(),
        "acme,user_seat_hours,erin@example.com,3.000".to_owned(),
        "acme,user_seat_hours,ann@example.com,2.833".to_owned(),
        "acme,user_seat_hours,bob@example.com,2.000".to_owned(),
        "acme,user_seat_hours,early@example.com,1.000".to_owned(),
    ];
    let lines: Vec<&str> = csv.lines().collect();
    for row in &acme_rows {
        assert!(lines.contains(&row.as_str()), "{row} not in\n{csv}");
    }
    assert_eq!(lines[0], "license,metric,key,value");
    assert!(
        lines.contains(&format!("{beta},user_seat_hours,,1.000").as_str()),
        "{csv}"
    );

    let table = run("table").await;
    assert!(table.status.success(), "{table:?}");
    let table = String::from_utf8(table.stdout).unwrap();
    for line in [
        format!("usage from {since} to {until}"),
        "license acme (3 seats)".to_owned(),
        format!("  peak          3 seats at {peak_at}"),
        "  seat-hours    8.83".to_owned(),
        "  denials       4 (LICENSE_EXPIRED 1, NO_SEATS_AVAILABLE 1, QUEUE_TIMEOUT 1, RATE_LIMITED 1)"
            .to_owned(),
        "  queue waits   2  p50 10m00s  p95 20m00s  max 20m00s".to_owned(),
        format!("  {:<40} {:>10} {:>8} {:>8}", "erin@example.com", "3.00", 1, 0),
        format!("  {:<40} {:>10} {:>8} {:>8}", "early@example.com", "1.00", 1, 0),
        format!("license {beta} (1 seat)"),
        format!("  {:<40} {:>10} {:>8} {:>8}", "(none)", "1.00", 1, 0),
    ] {
        assert!(table.lines().any(|l| l == line), "{line:?} not in\n{table}");
    }

    // One license: only its shard, the same figures.
    let mut con = db(&s).await;
    let query = Query {
        license: Some("acme".to_owned()),
        since: Some(When::At(t)),
        until: Some(When::At(t + 4 * HOUR)),
    };
    let only: UsageReport = usage::usage(&mut con, &s, &query).await.unwrap();
    assert_eq!(only.licenses.len(), 1);
    assert_acme(&only.licenses[0], t);

    // An empty period is a usage error, said in one line.
    let empty = output(seatgate_cmd(
        &redis.url(),
        &["report", "--since", &until, "--until", &since],
    ))
    .await;
    assert_eq!(empty.status.code(), Some(2), "{empty:?}");
    assert!(String::from_utf8_lossy(&empty.stderr).contains("the period is empty"));
}

/// Events of `license` of type `kind`.
fn of_type<'a>(events: &'a [Entry], kind: &str) -> Vec<&'a Entry> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn at(e: &Entry) -> i64 {
    e["at_ms"].parse().unwrap()
}

/// A request policy that names only its user.
fn as_user(user: &str) -> seatgate_core::policy::RequestPolicy {
    seatgate_core::policy::RequestPolicy {
        user: Some(user.to_owned()),
        ..seatgate_core::policy::RequestPolicy::NONE
    }
}

#[tokio::test]
async fn a_run_through_real_workers_reports_what_its_events_say() {
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    // ann's third heartbeat is her fourth request in the window: refused.
    s.limits.session_requests = 3;
    put_license(&s, "lab", 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    let ann = |op: SeatOp| Call::new(op, "lab", "s-ann");
    let reply = c
        .call(
            &ann(SeatOp::Acquire)
                .with_meta(crate::support::json(r#"{"user_email":"ann@example.com"}"#))
                .with_policy(as_user("ann@example.com")),
            T,
        )
        .await
        .unwrap();
    assert_eq!(reply.status(), Status::Acquired);
    for expected in [
        Status::HeartbeatUpdated,
        Status::HeartbeatUpdated,
        Status::RateLimited,
    ] {
        assert_eq!(
            c.call(&ann(SeatOp::Heartbeat), T).await.unwrap().status(),
            expected
        );
    }
    let carl = c.call(&Call::acquire("lab", "s-carl"), T).await.unwrap();
    assert_eq!(carl.status(), Status::NoSeatsAvailable);
    // Refused without a reply_to: published all the same.
    add_request(
        &mut con,
        &s,
        &[
            ("op", "acquire"),
            ("license", "lab"),
            ("session", "s-dan"),
            ("lease", &crate::support::lease_of("s-dan")),
        ],
    )
    .await;
    let deadline = std::time::Instant::now() + T;
    while !events(&s, "lab").await.iter().any(|e| e["session"] == "s-dan") {
        assert!(std::time::Instant::now() < deadline, "no denied event for s-dan");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bob = client(&s).await;
    let bob_call = Call::acquire("lab", "s-bob")
        .with_meta(crate::support::json(
            r#"{"user_email":"bob@example.com","hardware_id":"hw-1"}"#,
        ))
        .with_policy(as_user("bob@example.com"))
        .with_wait(std::time::Duration::from_millis(10_000));
    let bob_id = bob.send(&bob_call).await.unwrap();
    assert_eq!(bob.wait_for(&bob_id, T).await.unwrap().status(), Status::Queued);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        c.call(&ann(SeatOp::Release), T).await.unwrap().status(),
        Status::Released
    );
    let granted = bob.wait_for(&bob_id, T).await.unwrap();
    assert_eq!(granted.status(), Status::Granted);
    let nope = c.call(&Call::acquire("nope", "s-eve"), T).await.unwrap();
    assert_eq!(nope.status(), Status::LicenseNotFound);
    let bob_release = bob.call(&Call::release("lab", "s-bob"), T).await.unwrap();
    assert_eq!(bob_release.status(), Status::Released);
    worker.stop().await;

    // The events carry what the report needs: `user` is the request's
    // `user` field (issue 23: no longer meta.user_email), on every event of
    // the session; `seq` counts the license's events from 1.
    let all = events(&s, "lab").await;
    let ev: Vec<Entry> = all.iter().filter(|e| e["license"] == "lab").cloned().collect();
    let seqs: Vec<String> = ev.iter().map(|e| e["seq"].clone()).collect();
    let gapless: Vec<String> = (1..=ev.len()).map(|i| i.to_string()).collect();
    assert_eq!(seqs, gapless);
    let acquired = of_type(&ev, "acquired");
    assert_eq!(acquired.len(), 1);
    assert_eq!(acquired[0]["user"], "ann@example.com");
    let granted_ev = of_type(&ev, "granted");
    assert_eq!(granted_ev.len(), 1);
    assert_eq!(granted_ev[0]["user"], "bob@example.com");
    assert_eq!(granted_ev[0]["waited_ms"], granted.get("waited_ms"));
    let waited: i64 = granted.int("waited_ms");
    assert!(waited >= 300, "{waited}");
    let denied: Vec<(&str, &str)> = of_type(&ev, "denied")
        .iter()
        .map(|e| (e["session"].as_str(), e["reason"].as_str()))
        .collect();
    assert_eq!(
        denied,
        [
            ("s-ann", "RATE_LIMITED"),
            ("s-carl", "NO_SEATS_AVAILABLE"),
            ("s-dan", "NO_SEATS_AVAILABLE")
        ]
    );
    assert_eq!(of_type(&ev, "queued")[0]["user"], "bob@example.com");
    let ann_denied = of_type(&ev, "denied");
    assert_eq!(
        ann_denied[0]["user"], "ann@example.com",
        "a heartbeat's denial too"
    );
    assert!(!ann_denied[1].fields.contains_key("user"), "carl sent no user");
    let released = of_type(&ev, "released");
    let (ann_from, ann_to) = (at(acquired[0]), at(released[0]));
    let (bob_from, bob_to) = (at(granted_ev[0]), at(released[1]));
    assert_eq!(ann_to, bob_from, "one script released and granted");

    let query = Query {
        license: None,
        since: Some(When::Ago(Duration::from_secs(3600))),
        until: None,
    };
    let report = usage::usage(&mut con, &s, &query).await.unwrap();
    assert_eq!(all.len(), ev.len() + 1, "lab's events and nope's denial");
    assert_eq!(report.events, all.len() as u64);
    let lab = &report.licenses[0];
    assert_eq!(lab.license, "lab");
    assert_eq!(
        (lab.seats_total, lab.peak_seats, lab.peak_at_ms),
        (1, 1, Some(ann_from))
    );
    // One seat from ann's acquire to bob's release, none after.
    assert_eq!(lab.seat_ms, bob_to - ann_from);
    let denials: Vec<(&str, u64)> = lab.denials.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    assert_eq!(denials, [("NO_SEATS_AVAILABLE", 2), ("RATE_LIMITED", 1)]);
    assert_eq!(
        lab.queue_waits,
        Waits {
            count: 1,
            p50_ms: Some(waited),
            p95_ms: Some(waited),
            max_ms: Some(waited)
        }
    );
    let mut users: Vec<(Option<&str>, u64, i64)> = lab
        .users
        .iter()
        .map(|u| (u.name.as_deref(), u.holds, u.seat_ms))
        .collect();
    users.sort();
    assert_eq!(
        users,
        [
            // The three denials, whose events carry no user yet.
            (None, 0, 0),
            (Some("ann@example.com"), 1, ann_to - ann_from),
            (Some("bob@example.com"), 1, bob_to - bob_from),
        ]
    );
    let nope = &report.licenses[1];
    assert_eq!(nope.license, "nope");
    assert_eq!(nope.denials.get("LICENSE_NOT_FOUND"), Some(&1));
}

/// issue 22: `license put lingertest --seats 1 --linger 5s`, acquire,
/// release after 3 s: the seat is in use from the acquire until the reaper
/// frees it as the linger ends (about 8 s), not for the whole period (the
/// default report, 30 days back, said 720 seat-hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_seat_is_reported_from_its_acquire_to_the_end_of_its_linger() {
    let TestApp(redis, s, _con) = spawn_app().await;
    let url = redis.url();
    let put = output(seatgate_cmd(
        &url,
        &["license", "put", "lingertest", "--seats", "1", "--linger", "5s"],
    ))
    .await;
    assert!(put.status.success(), "{put:?}");
    let worker = spawn_worker(s.clone(), "w1").await;
    let _reaper = reaping(&s).await;
    let c = client(&s).await;
    let call = |op: SeatOp| Call::new(op, "lingertest", "s-ann");
    // The user both ways: events name meta.user_email, or (the events
    // contract) the request's `user`.
    let ann = seatgate_core::policy::RequestPolicy {
        user: Some("ann@example.com".to_owned()),
        ..seatgate_core::policy::RequestPolicy::NONE
    };
    let acquired = c
        .call(
            &call(SeatOp::Acquire)
                .with_meta(crate::support::json(r#"{"user_email":"ann@example.com"}"#))
                .with_policy(ann),
            T,
        )
        .await
        .unwrap();
    assert_eq!(acquired.status(), Status::Acquired);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        c.call(&call(SeatOp::Release), T).await.unwrap().status(),
        Status::Released
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let ended = loop {
        let ev = events(&s, "lingertest").await;
        if let Some(e) = ev.iter().find(|e| e["type"] == "evicted") {
            break e.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the linger never ended: {ev:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    worker.stop().await;
    assert_eq!(ended["reason"], "linger_ended");
    let ev = events(&s, "lingertest").await;
    let from = at(of_type(&ev, "acquired")[0]);
    let released = at(of_type(&ev, "released")[0]);
    let to = at(&ended);
    assert!(to - released >= 5000, "the linger lasted {} ms", to - released);

    let report = output(seatgate_cmd(
        &url,
        &["report", "--license", "lingertest", "--format", "json"],
    ))
    .await;
    assert!(report.status.success(), "{report:?}");
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    let l = &report["licenses"][0];
    assert_eq!(l["seat_ms"], to - from, "{l:#}");
    assert!((8000..9500).contains(&(to - from)), "{}", to - from);
    assert_eq!(l["users"][0]["name"], "ann@example.com");
    assert_eq!(l["users"][0]["seat_ms"], to - from);
    assert_eq!(l["unattributed_ms"], 0);
    assert_eq!(l["full_ms"], to - from);
    let table = output(seatgate_cmd(&url, &["report", "--license", "lingertest"])).await;
    let table = String::from_utf8(table.stdout).unwrap();
    println!("{table}");
    let hours = format!("  seat-hours    {:.2}", (to - from) as f64 / 3_600_000.0);
    assert!(table.lines().any(|l| l == hours), "{hours:?} not in\n{table}");
}

/// A deleted license's seats end with the deletion: its seat time, and its
/// users', stop there, not at the end of the period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_licenses_holds_end_with_its_deletion() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    put_license(&s, "gone", 3).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    for (session, user) in [("s-ann", "ann@example.com"), ("s-bob", "bob@example.com")] {
        // The user both ways: events name meta.user_email, or (the events
        // contract) the request's `user`.
        let meta = format!(r#"{{"user_email":"{user}"}}"#);
        let policy = seatgate_core::policy::RequestPolicy {
            user: Some(user.to_owned()),
            ..seatgate_core::policy::RequestPolicy::NONE
        };
        let call = Call::acquire("gone", session)
            .with_meta(crate::support::json(&meta))
            .with_policy(policy);
        let r = c.call(&call, T).await.unwrap();
        assert_eq!(r.status(), Status::Acquired);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deleted = output(seatgate_cmd(
        &redis.url(),
        &["license", "delete", "gone", "--yes"],
    ))
    .await;
    assert!(deleted.status.success(), "{deleted:?}");
    worker.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ev = events(&s, "gone").await;
    let ends = of_type(&ev, "evicted");
    assert_eq!(ends.len(), 2, "{ev:?}");
    assert!(ends.iter().all(|e| e["reason"] == "license_deleted"));
    let starts: Vec<i64> = of_type(&ev, "acquired").iter().map(|e| at(e)).collect();
    let end = at(ends[0]);
    let report = crate::support::usage_last_hour(&mut con, &s, "gone").await;
    let l = &report.licenses[0];
    assert_eq!(l.seat_ms, (end - starts[0]) + (end - starts[1]), "{l:#?}");
    let mut users: Vec<(Option<&str>, i64)> =
        l.users.iter().map(|u| (u.name.as_deref(), u.seat_ms)).collect();
    users.sort();
    assert_eq!(
        users,
        [
            (Some("ann@example.com"), end - starts[0]),
            (Some("bob@example.com"), end - starts[1])
        ]
    );
    assert_eq!(l.unattributed_ms, 0);
    assert!(
        report.until_ms - end >= 500,
        "the period runs on past the deletion"
    );
}

const DAY: i64 = 24 * HOUR;

/// The figures of a license that rollups keep whole: all of them but the
/// wait quantiles (a rollup's own do not combine) and the holds (a hold
/// across midnight counts on each day it covers).
fn totals(l: &LicenseUsage) -> serde_json::Value {
    let users: Vec<_> = l.users.iter().map(|u| (&u.name, u.seat_ms, u.denials)).collect();
    serde_json::json!({
        "seat_ms": l.seat_ms, "capacity_ms": l.capacity_ms, "full_ms": l.full_ms,
        "utilisation_pct": l.utilisation_pct, "peak": [l.peak_seats, l.peak_at_ms],
        "hourly": l.peaks_hourly, "daily": l.peaks_daily, "denials": l.denials,
        "waits": [l.queue_waits.count, l.queue_waits.max_ms],
        "waiting": [l.queue_wait_ms, l.queue_wait_full_ms],
        "users": users, "unattributed_ms": l.unattributed_ms, "seats_total": l.seats_total,
    })
}

/// Trims every events shard of `s` to the events from `from_ms` on.
async fn trim_events(s: &Settings, con: &mut seatgate_core::db::Db, from_ms: i64) {
    for stream in seatgate_core::keys::shard_names(&s.events.stream, s.stream.shards) {
        let _: i64 = redis::cmd("XTRIM")
            .arg(&stream)
            .arg("MINID")
            .arg(from_ms)
            .query_async(con)
            .await
            .unwrap();
    }
}

/// A day rolled up stands in for its events once they are gone: the report
/// says it used the rollup, and its totals are the ones the raw events gave.
#[tokio::test]
async fn a_rolled_up_day_stands_in_for_its_events_once_they_are_gone() {
    use EventType::*;
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    s.stream.shards = 2;
    // The first roll-up starts with the oldest whole day events still cover.
    s.events.retention = Duration::from_secs(4 * 24 * 3600);
    let (acme, beta) = on_two_shards(2);
    let now = redis_ms(&mut con).await;
    let d = (now - 3 * DAY).div_euclid(DAY) * DAY;
    let acme_events = vec![
        (ev(Acquired, "s-ann", 1, d + HOUR).user("ann@example.com"), 0),
        (ev(Acquired, "s-bob", 2, d + 2 * HOUR).user("bob@example.com"), 0),
        (
            ev(Acquired, "s-cy", 3, d + 2 * HOUR + 30 * MIN).user("cy@example.com"),
            0,
        ),
        (
            ev(Denied, "s-dave", 3, d + 3 * HOUR)
                .user("dave@example.com")
                .reason("NO_SEATS_AVAILABLE"),
            0,
        ),
        (ev(Queued, "s-erin", 3, d + 3 * HOUR + 10 * MIN), 0),
        (ev(Released, "s-bob", 3, d + 4 * HOUR), 0),
        (
            ev(Granted, "s-erin", 3, d + 4 * HOUR)
                .waited(50 * MIN)
                .user("erin@example.com"),
            0,
        ),
        (
            ev(Evicted, "s-cy", 2, d + 5 * HOUR).reason("heartbeat_timeout"),
            0,
        ),
        (ev(Released, "s-erin", 1, d + 6 * HOUR), 0),
        // ann holds across midnight; her release names no user.
        (ev(Released, "s-ann", 0, d + DAY + 2 * HOUR), 0),
        (
            ev(Acquired, "s-cy", 1, d + DAY + 4 * HOUR).user("cy@example.com"),
            0,
        ),
        (
            ev(Evicted, "s-cy", 0, d + DAY + 6 * HOUR).reason("heartbeat_timeout"),
            0,
        ),
    ];
    write_events(&s, &acme, 3, &acme_events).await;
    let beta_events = vec![
        (ev(Acquired, "s-zed", 1, d + 20 * HOUR), 0),
        // At midnight: the raw events cover the second day from its start.
        (ev(Denied, "s-yan", 1, d + DAY).reason("RATE_LIMITED"), 0),
        (ev(Released, "s-zed", 0, d + DAY + 20 * HOUR), 0),
    ];
    write_events(&s, &beta, 1, &beta_events).await;
    let query = Query {
        license: None,
        since: Some(When::At(d)),
        until: Some(When::At(d + 2 * DAY)),
    };
    let raw = usage::usage(&mut con, &s, &query).await.unwrap();
    assert!(raw.sources.rollup_days.is_empty(), "{:?}", raw.sources);
    assert_eq!(raw.licenses.len(), 2);
    // 1h + 2 x 30m + 3 x 2h30m + 2 x 1h + 20h + 2h.
    assert_eq!(raw.licenses[0].seat_ms, 33 * HOUR + 30 * MIN);

    // A rollup of a day past report.rollup_retention goes at the next roll-up.
    let _: i64 = redis::cmd("HSET")
        .arg(seatgate_core::keys::Keys::new(s.keys.prefix.clone()).rollup(&acme))
        .arg("2020-01-01")
        .arg("{}")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut pass = usage_rollup(&s, &mut con).await;
    assert_eq!(pass.trimmed, 1, "{pass:?}");
    assert!(pass.days.len() >= 2, "{pass:?}");
    assert_eq!(pass.days[..2], [date(d), date(d + DAY)]);
    assert!(usage_rollup(&s, &mut con).await.days.is_empty(), "each day once");
    pass.days.clear();

    // The first day's events gone: its rollup stands in for them.
    trim_events(&s, &mut con, d + DAY).await;
    let half = usage::usage(&mut con, &s, &query).await.unwrap();
    assert_eq!(half.sources.rollup_days, [date(d)]);
    assert_eq!(half.sources.events_from_ms, d + DAY);
    // Every event gone: both days from their rollups.
    trim_events(&s, &mut con, d + 2 * DAY).await;
    let rolled = usage::usage(&mut con, &s, &query).await.unwrap();
    assert_eq!(rolled.sources.rollup_days, [date(d), date(d + DAY)]);
    for report in [&half, &rolled] {
        assert_eq!(report.licenses.len(), 2);
        for (got, want) in report.licenses.iter().zip(&raw.licenses) {
            assert_eq!(totals(got), totals(want), "{}", got.license);
        }
    }
    // ann's hold across midnight keeps her name after her acquire is gone.
    let ann = half.licenses[0]
        .users
        .iter()
        .find(|u| u.name.as_deref() == Some("ann@example.com"));
    assert_eq!(ann.map(|u| u.seat_ms), Some(25 * HOUR));
    let table = usage::render_table(&half);
    let said = format!(
        "from daily rollups for 1 day ({} .. {}), the raw events from {}",
        date(d),
        date(d),
        rfc3339(d + DAY)
    );
    assert!(table.lines().any(|l| l == said), "{said:?} not in\n{table}");
}

/// The UTC date of `ms`, as rollups name their days.
fn date(ms: i64) -> String {
    rfc3339(ms)[..10].to_owned()
}

async fn usage_rollup(s: &Settings, con: &mut seatgate_core::db::Db) -> seatgate::views::rollup::RollupPass {
    seatgate::views::rollup::roll_up(con, s).await.unwrap()
}

#[tokio::test]
async fn events_are_trimmed_by_their_own_age_not_by_count() {
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    s.events.retention = Duration::from_secs(60);
    let now = redis_ms(&mut con).await;
    let stream = s.events_stream_for("acme");
    // 300 events two hours old, then 5 of the last ten seconds.
    let mut old = Vec::new();
    for i in 0..300 {
        old.push((ev(EventType::Acquired, "s-old", 1, now - 2 * HOUR + i), 0));
    }
    write_events(&s, "acme", 1, &old).await;
    let young: Vec<(Ev, i64)> = (0..5)
        .map(|i| (ev(EventType::Released, "s-young", 0, now - 10_000 + i), 0))
        .collect();
    write_events(&s, "acme", 1, &young).await;
    // The seat script records its event, trimming (a license's first event
    // trims, and one in 16 after it: lua/includes/events.lua).
    crate::support::provision(&s, "acme", &crate::support::seats(1)).await;
    let acquired = crate::support::direct(&s, "acme", "s-new")
        .acquire(&mut con)
        .await;
    assert_eq!(acquired.status(), seatgate_core::status::Status::Acquired);
    let left = crate::support::stream_entries(&mut con, &stream).await;
    let old_left = left.iter().filter(|e| e["session"] == "s-old").count();
    let young_left = left.iter().filter(|e| e["session"] == "s-young").count();
    // `~` trims whole stream nodes (at most 100 entries): every event younger
    // than the retention stays, of the older ones at most a node's worth.
    assert_eq!(young_left, 5);
    assert!(old_left < 100, "{old_left} of 300 old events left");
    assert_eq!(left.last().unwrap()["session"], "s-new");
}

/// The memory of an events stream of typical events, as docs/configuration.md
/// ("Events: retention and memory") gives it: about 180 bytes an event.
#[tokio::test]
async fn an_event_costs_about_180_bytes_of_redis_memory() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let now = redis_ms(&mut con).await;
    const N: usize = 10_000;
    let licenses: Vec<String> = (0..200).map(|i| format!("lic-{i:04}")).collect();
    let sessions: Vec<String> = (0..N)
        .map(|i| {
            format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                i * 7919,
                i % 65536,
                i % 4096,
                (i * 31) % 4096,
                i * 104729
            )
        })
        .collect();
    let users: Vec<String> = (0..N)
        .map(|i| format!("user{:04}@example.com", i % 5000))
        .collect();
    let mut batch = Vec::new();
    for i in 0..N {
        // The mix of docs/configuration.md: 40 % acquired, 40 % released, 8 %
        // denied, 4 % queued, 4 % granted, 2 % evicted, 2 % queue_timeout.
        let kind = match i % 50 {
            0..=19 => EventType::Acquired,
            20..=39 => EventType::Released,
            40..=43 => EventType::Denied,
            44..=45 => EventType::Queued,
            46..=47 => EventType::Granted,
            48 => EventType::Evicted,
            _ => EventType::QueueTimeout,
        };
        let mut e = Event::new(
            kind,
            &licenses[i % 200],
            &sessions[i],
            (i % 49) as i64 + 1,
            50,
            now - (N - i) as i64,
        );
        match kind {
            EventType::Acquired => e.user = Some(users[i].clone()),
            EventType::Granted => {
                e.user = Some(users[i].clone());
                e.waited_ms = Some((i as i64 * 37) % 600_000);
            }
            EventType::QueueTimeout => e.waited_ms = Some((i as i64 * 37) % 600_000),
            EventType::Denied => e.reason = Some("NO_SEATS_AVAILABLE"),
            EventType::Evicted => e.reason = Some("heartbeat_timeout"),
            _ => {}
        }
        // As the scripts write it: the fields, the license's seq and the
        // epoch (one life of the function library: one epoch).
        let mut xadd = redis::cmd("XADD");
        xadd.arg(s.events_stream_for(e.license)).arg("*");
        for (field, value) in e.fields() {
            xadd.arg(field).arg(value);
        }
        xadd.arg("seq")
            .arg(i / 200 + 1)
            .arg("epoch")
            .arg("1796012600117263");
        batch.push(xadd);
        if batch.len() == 500 {
            let _: Vec<redis::Value> = con
                .query_all(std::mem::take(&mut batch))
                .await
                .unwrap()
                .into_iter()
                .map(|v| v.unwrap())
                .collect();
        }
    }
    if !batch.is_empty() {
        let _: Vec<redis::Value> = con
            .query_all(batch)
            .await
            .unwrap()
            .into_iter()
            .map(|v| v.unwrap())
            .collect();
    }
    let stream = s.events_stream_for("lic-0000");
    let len: usize = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(len, N);
    let bytes: usize = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&stream)
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut con)
        .await
        .unwrap();
    let per_event = bytes / N;
    eprintln!("{per_event} bytes an event ({bytes} for {N})");
    assert!(
        (150..=200).contains(&per_event),
        "{per_event} bytes an event ({bytes} for {N})"
    );
}

/// Issue 38, problem 7: the first usage rollup after a Redis restart
/// succeeds (it failed with "broken pipe": its first command met the
/// connection Redis closed; the retry runs on the reconnected one), and
/// `seatgate report` answers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_rollup_after_a_redis_restart_succeeds() {
    use seatgate::views::rollup;
    let TestApp(mut redis, settings, _) =
        crate::support::spawn_app_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    put_license(&settings, "cad", 1).await;
    let mut con = seatgate::connect(&settings).await.unwrap();
    let mut bare = seatgate::connect(&settings).await.unwrap();
    rollup::roll_up_retrying(&mut con, &settings)
        .await
        .expect("a rollup");
    rollup::roll_up(&mut bare, &settings).await.expect("a rollup");
    redis.shutdown().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.restart().await.expect("restart redis");
    // Without the retry, on a connection as old: what the service met.
    let unretried = rollup::roll_up(&mut bare, &settings).await;
    let pass = rollup::roll_up_retrying(&mut con, &settings).await;
    eprintln!(
        "first rollup after a restart: {:?} with the retry; {:?} without",
        pass.as_ref().map(|_| "ok"),
        unretried.as_ref().map(|_| "ok").map_err(|e| e.to_string())
    );
    pass.expect("the first rollup after the restart");
    let report = output(seatgate_cmd(
        &redis.url(),
        &["report", "--license", "cad", "--format", "json"],
    ))
    .await;
    assert_eq!(report.status.code(), Some(0), "{report:?}");
}
