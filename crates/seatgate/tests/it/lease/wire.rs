//! The hardening through the wire protocol alone: raw `XADD`s to a worker,
//! replies read off the reply stream, records read with plain commands. This
//! file uses nothing the code before the hardening lacked, so it also runs
//! against that code, where each test here fails.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use seatgate::config::Settings;
use seatgate_core::db::Db;

use crate::support::{
    create_group, db, events, license_keys, output, put_license, reaper, reply_stream, request_xadd,
    seatgate_cmd, set_license_field, snapshot, spawn_app, spawn_worker, stream_entries, RedisServer, TestApp,
    WorkerHandle,
};

/// A lease as a client would make one (32 hex digits).
const LEASE: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
/// Another, equally valid lease.
const OTHER: &str = "ffffffffffffffffffffffffffffffff";

/// Sends one request (a unique `id` and `reply_to` are added) and returns
/// its first reply's fields.
async fn ask(
    con: &mut impl ConnectionLike,
    s: &Settings,
    fields: &[(&str, &str)],
) -> HashMap<String, String> {
    let id = send(con, s, fields).await;
    reply(con, s, &id).await
}

/// Sends one request without waiting; its request id.
async fn send(con: &mut impl ConnectionLike, s: &Settings, fields: &[(&str, &str)]) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = format!("w-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let mut xadd = request_xadd(s);
    xadd.arg("id")
        .arg(&id)
        .arg("reply_to")
        .arg(reply_stream(s, "wire"));
    for (k, v) in fields {
        xadd.arg(*k).arg(*v);
    }
    let _: String = xadd.query_async(con).await.unwrap();
    id
}

/// The last reply to request `id` (waits up to 5 s for one).
async fn reply(con: &mut impl ConnectionLike, s: &Settings, id: &str) -> HashMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let entries = stream_entries(con, &reply_stream(s, "wire")).await;
        if let Some(e) = entries
            .into_iter()
            .rev()
            .find(|e| e.fields.get("id").map(String::as_str) == Some(id))
        {
            return e.fields;
        }
        assert!(Instant::now() < deadline, "no reply to {id}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every seat key of `license` (holders, sessions, queue, ...) dumped: what
/// a refusal must leave as it was. (A decided request also writes its dedupe
/// record and counts in the rate windows; those are not seat state.)
async fn seat_state(con: &mut impl ConnectionLike, s: &Settings, license: &str) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for key in license_keys(s, license).all() {
        out.push(redis::cmd("DUMP").arg(key).query_async(con).await.unwrap());
    }
    out
}

/// `op` on `session` of `license`, carrying [`LEASE`] as a client sends
/// every acquire, heartbeat and release (`sessions.require_lease`).
fn op<'a>(op: &'a str, license: &'a str, session: &'a str) -> Vec<(&'a str, &'a str)> {
    with(bare(op, license, session), &[("lease", LEASE)])
}

/// `op` on `session` of `license`, with no lease.
fn bare<'a>(op: &'a str, license: &'a str, session: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![("op", op), ("license", license), ("session", session)]
}

fn with<'a>(mut fields: Vec<(&'a str, &'a str)>, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    fields.extend_from_slice(more);
    fields
}

/// `verb` on `session` of license "cad", carrying `lease`.
fn leased<'a>(verb: &'a str, session: &'a str, lease: &'a str) -> Vec<(&'a str, &'a str)> {
    with(bare(verb, "cad", session), &[("lease", lease)])
}

/// [`ask`], whose reply must have `status`.
async fn expect(
    con: &mut impl ConnectionLike,
    s: &Settings,
    fields: &[(&str, &str)],
    status: &str,
) -> HashMap<String, String> {
    let r = ask(con, s, fields).await;
    assert_eq!(r["status"], status, "{fields:?}: {r:?}");
    r
}

/// A redis-server with license "cad" of `seats` seats, a worker on it and a
/// connection to send it requests. Bind the server to a name (`_redis`, not
/// `_`): dropping it stops the server.
async fn serve_cad(seats: u64) -> (RedisServer, Settings, WorkerHandle, Db) {
    let TestApp(redis, s, con) = spawn_app().await;
    let worker = spawn_worker(s.clone(), "w1").await;
    put_license(&s, "cad", seats).await;
    (redis, s, worker, con)
}

// ---------------------------------------------------------------------------
// 1. The license record is read strictly.

#[tokio::test]
async fn a_license_record_that_breaks_the_rules_hands_out_no_seat() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let far_past = "1000000000000"; // 2001-09-09
    for (field, value) in [
        ("seats_total", "5.5"),
        ("seats_total", "inf"),
        ("seats_total", "0x10"),
        ("seats_total", " 5"),
        ("seats_total", "1e3"),
        ("expires_at_ms", "soon"),
        ("active", "false"),
        ("heartbeat_timeout_ms", "0"),
        ("queue_max", "lots"),
    ] {
        let license = format!("bad-{field}-{}", value.trim());
        put_license(&s, &license, 5).await;
        set_license_field(&mut con, &s, &license, field, value).await;
        if field == "expires_at_ms" {
            // An expiry that is no number never came; one in the past did;
            // one written in seconds (1000 s) is no expiry in ms at all.
            expect(&mut con, &s, &op("acquire", &license, "probe"), "LICENSE_INVALID").await;
            set_license_field(&mut con, &s, &license, field, far_past).await;
            expect(&mut con, &s, &op("acquire", &license, "probe"), "LICENSE_EXPIRED").await;
            set_license_field(&mut con, &s, &license, field, "1000").await;
            let r = expect(&mut con, &s, &op("acquire", &license, "probe"), "LICENSE_INVALID").await;
            assert!(r["error"].contains("expires_at_ms = \"1000\""), "{r:?}");
            continue;
        }
        let before = seat_state(&mut con, &s, &license).await;
        for i in 0..7 {
            let r = ask(&mut con, &s, &op("acquire", &license, &format!("s{i}"))).await;
            assert_eq!(
                (r["status"].as_str(), r["ok"].as_str()),
                ("LICENSE_INVALID", "0"),
                "{field}={value:?}: {r:?}"
            );
            let want = format!("license field {field} = \"{value}\" is not ");
            assert!(r["error"].starts_with(&want), "{}", r["error"]);
        }
        assert_eq!(
            seat_state(&mut con, &s, &license).await,
            before,
            "{field}={value:?}: nothing changed"
        );
    }
    worker.stop().await;
}

#[tokio::test]
async fn holders_of_an_invalid_license_heartbeat_release_and_are_reaped_but_nobody_is_granted() {
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    s.sessions.heartbeat_timeout_ms = 300;
    let worker = spawn_worker(s.clone(), "w1").await;
    put_license(&s, "cad", 2).await;
    for who in ["stays", "goes"] {
        expect(&mut con, &s, &op("acquire", "cad", who), "ACQUIRED").await;
    }
    let r = ask(
        &mut con,
        &s,
        &with(op("acquire", "cad", "waits"), &[("wait_ms", "60000")]),
    )
    .await;
    assert_eq!(r["status"], "QUEUED");

    // Two and a half seats: read leniently that is three, a free one for the waiter.
    set_license_field(&mut con, &s, "cad", "seats_total", "2.5").await;
    let r = ask(&mut con, &s, &op("heartbeat", "cad", "stays")).await;
    assert_eq!(r["status"], "HEARTBEAT_UPDATED", "a holder keeps its seat alive");
    let r = ask(&mut con, &s, &op("release", "cad", "goes")).await;
    assert_eq!(r["status"], "RELEASED", "a seat can always be given back");
    assert_eq!(
        crate::support::holders(&s, "cad").await,
        ["stays"],
        "the freed seat went to nobody"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let r = ask(&mut con, &s, &op("heartbeat", "cad", "waits")).await;
    assert_eq!(r["status"], "QUEUED", "a waiter keeps its place alive");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let pass = reaper(&s).await.pass().await.unwrap();
    assert_eq!(
        (pass.evicted, pass.granted),
        (1, 0),
        "stale evicted, nobody granted: {pass:?}"
    );
    let waiting: Vec<String> = redis::cmd("ZRANGE")
        .arg(license_keys(&s, "cad").queue)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(waiting, ["waits"]);
    assert!(crate::support::holders(&s, "cad").await.is_empty());

    // Fixed: the next pass grants the waiter.
    set_license_field(&mut con, &s, "cad", "seats_total", "2").await;
    let pass = reaper(&s).await.pass().await.unwrap();
    assert_eq!(pass.granted, 1, "{pass:?}");
    worker.stop().await;
}

#[tokio::test]
async fn the_cli_refuses_to_write_an_invalid_record_and_flags_one_written_by_hand() {
    let TestApp(redis, s, _) = spawn_app().await;
    let cli = |args: &[&str]| output(seatgate_cmd(&redis.url(), args));
    for args in [
        &["license", "put", "big", "--seats", "1000001"][..],
        &[
            "license",
            "put",
            "quick",
            "--seats",
            "1",
            "--heartbeat-timeout",
            "0s",
        ],
    ] {
        let o = cli(args).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("license field"),
            "{o:?}"
        );
    }
    let o = cli(&["license", "list", "--json"]).await;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "[]",
        "nothing was written"
    );

    put_license(&s, "cad", 5).await;
    set_license_field(&mut db(&s).await, &s, "cad", "seats_total", "5.5").await;
    let show = cli(&["license", "show", "cad"]).await;
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("[INVALID: seats_total=\"5.5\"]"), "{text}");
    let list = cli(&["license", "list"]).await;
    assert!(String::from_utf8_lossy(&list.stdout).contains("[INVALID: seats_total=\"5.5\"]"));
    let json = cli(&["license", "show", "cad", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        (v["invalid"]["field"].as_str(), v["invalid"]["value"].as_str()),
        (Some("seats_total"), Some("5.5"))
    );
    let status = cli(&["status"]).await;
    assert!(String::from_utf8_lossy(&status.stdout).contains("[INVALID: seats_total=\"5.5\"]"));
    let status = cli(&["status", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["licenses"][0]["invalid"]["field"], "seats_total");
    assert!(v["licenses"][0]["invalid"]["error"]
        .as_str()
        .unwrap()
        .contains("\"5.5\""));
}

// ---------------------------------------------------------------------------
// 2. Only the holder of a lease heartbeats or releases.

#[tokio::test]
async fn only_the_lease_a_seat_was_acquired_with_heartbeats_or_releases_it() {
    let (_redis, s, worker, mut con) = serve_cad(1).await;
    let r = expect(&mut con, &s, &leased("acquire", "alice", LEASE), "ACQUIRED").await;
    assert!(
        !r.values().any(|v| v.contains(LEASE)),
        "a reply never carries the lease: {r:?}"
    );

    // Another lease: LEASE_MISMATCH; none: INVALID_REQUEST naming `lease`
    // (sessions.require_lease). Nothing changes.
    let before = seat_state(&mut con, &s, "cad").await;
    for (lease, status) in [(Some(OTHER), "LEASE_MISMATCH"), (None, "INVALID_REQUEST")] {
        for verb in ["heartbeat", "release", "acquire"] {
            let mut fields = bare(verb, "cad", "alice");
            if let Some(l) = lease {
                fields.push(("lease", l));
            }
            let r = ask(&mut con, &s, &fields).await;
            assert_eq!(
                (r["status"].as_str(), r["ok"].as_str()),
                (status, "0"),
                "{verb} {lease:?}: {r:?}"
            );
            assert!(r["error"].contains("lease"), "{r:?}");
        }
    }
    assert_eq!(
        seat_state(&mut con, &s, "cad").await,
        before,
        "refusals changed nothing"
    );

    // The holder's own lease works, a retried acquire included.
    expect(&mut con, &s, &leased("acquire", "alice", LEASE), "ALREADY_ACTIVE").await;
    let r = ask(&mut con, &s, &leased("heartbeat", "alice", LEASE)).await;
    assert_eq!(
        (r["status"].as_str(), r["heartbeats"].as_str()),
        ("HEARTBEAT_UPDATED", "1")
    );
    expect(&mut con, &s, &leased("release", "alice", LEASE), "RELEASED").await;

    worker.stop().await;

    // Where an operator turned sessions.require_lease off (clients moving
    // to leases), a session acquired without a lease answers any lease.
    let mut lenient = s.clone();
    lenient.sessions.require_lease = false;
    let worker = spawn_worker(lenient, "w2").await;
    expect(&mut con, &s, &bare("acquire", "cad", "bob"), "ACQUIRED").await;
    expect(
        &mut con,
        &s,
        &leased("heartbeat", "bob", OTHER),
        "HEARTBEAT_UPDATED",
    )
    .await;
    expect(&mut con, &s, &bare("release", "cad", "bob"), "RELEASED").await;
    worker.stop().await;
}

#[tokio::test]
async fn a_waiter_granted_a_seat_keeps_it_bound_to_its_lease() {
    let (_redis, s, worker, mut con) = serve_cad(1).await;
    expect(&mut con, &s, &leased("acquire", "holder", OTHER), "ACQUIRED").await;
    let queued = send(
        &mut con,
        &s,
        &with(leased("acquire", "waiter", LEASE), &[("wait_ms", "60000")]),
    )
    .await;
    assert_eq!(reply(&mut con, &s, &queued).await["status"], "QUEUED");

    // Its place is bound: a re-sent acquire or a release needs the lease.
    expect(
        &mut con,
        &s,
        &leased("release", "waiter", OTHER),
        "LEASE_MISMATCH",
    )
    .await;
    expect(
        &mut con,
        &s,
        &with(leased("acquire", "waiter", OTHER), &[("wait_ms", "60000")]),
        "LEASE_MISMATCH",
    )
    .await;
    let r = ask(
        &mut con,
        &s,
        &with(leased("acquire", "waiter", LEASE), &[("wait_ms", "60000")]),
    )
    .await;
    assert_eq!((r["status"].as_str(), r["position"].as_str()), ("QUEUED", "1"));
    // The re-send with the lease is the request the grant now answers.
    let resent = r["id"].clone();

    expect(&mut con, &s, &leased("release", "holder", OTHER), "RELEASED").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while reply(&mut con, &s, &resent).await["status"] != "GRANTED" {
        assert!(Instant::now() < deadline, "no GRANTED");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = ask(&mut con, &s, &leased("heartbeat", "waiter", OTHER)).await;
    assert_eq!(
        r["status"], "LEASE_MISMATCH",
        "the granted seat is bound to the queued lease"
    );
    expect(
        &mut con,
        &s,
        &leased("heartbeat", "waiter", LEASE),
        "HEARTBEAT_UPDATED",
    )
    .await;
    expect(&mut con, &s, &leased("release", "waiter", LEASE), "RELEASED").await;
    worker.stop().await;
}

// ---------------------------------------------------------------------------
// 3. An entry id far ahead of the Redis clock.

/// The dedupe buckets of `license` and their time to live, ms.
async fn dedupe_buckets(con: &mut impl ConnectionLike, s: &Settings, license: &str) -> Vec<(String, i64)> {
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{{{license}}}:done:*", s.keys.prefix))
        .query_async(con)
        .await
        .unwrap();
    let mut out = Vec::new();
    for name in names {
        let ttl: i64 = redis::cmd("PTTL").arg(&name).query_async(con).await.unwrap();
        out.push((name, ttl));
    }
    out
}

#[tokio::test]
async fn entries_far_ahead_of_the_clock_are_answered_deduplicated_and_forgotten_in_time() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let window = s.dedupe.window_ms as i64;
    put_license(&s, "cad", 5).await;
    // A fresh stream whose first id a caller chose far in the future: every
    // later `XADD *` reuses its millisecond.
    create_group(&s).await;
    let mut first = redis::cmd("XADD");
    first.arg(&s.stream.requests).arg("9999999999999-0");
    for (k, v) in [
        ("op", "acquire"),
        ("id", "far-1"),
        ("license", "cad"),
        ("session", "s1"),
        ("lease", LEASE),
        ("reply_to", &reply_stream(&s, "wire")),
    ] {
        first.arg(k).arg(v);
    }
    let _: String = first.query_async(&mut con).await.unwrap();
    let beat = send(&mut con, &s, &op("heartbeat", "cad", "s1")).await;

    let worker = spawn_worker(s.clone(), "w1").await;
    assert_eq!(reply(&mut con, &s, "far-1").await["status"], "ACQUIRED");
    assert_eq!(reply(&mut con, &s, &beat).await["heartbeats"], "1");
    let buckets = dedupe_buckets(&mut con, &s, "cad").await;
    assert_eq!(buckets.len(), 1, "both in one bucket of the clock's: {buckets:?}");
    for (name, ttl) in &buckets {
        assert!(
            *ttl > 0 && *ttl <= 2 * window,
            "{name} lives {ttl} ms, more than two windows"
        );
        assert!(
            !name.ends_with(&format!(":{}", 9_999_999_999_999 / window)),
            "{name}"
        );
    }

    // Delivered again within the window: the first replies, no second effect.
    let _: () = redis::cmd("XGROUP")
        .arg("SETID")
        .arg(&s.stream.requests)
        .arg(&s.stream.group)
        .arg("0")
        .query_async(&mut con)
        .await
        .unwrap();
    let replies = |e: &crate::support::Entry, id: &str| e.fields.get("id").map(String::as_str) == Some(id);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let all = stream_entries(&mut con, &reply_stream(&s, "wire")).await;
        if all.iter().filter(|e| replies(e, &beat)).count() == 2 {
            let again: Vec<_> = all.iter().filter(|e| replies(e, &beat)).collect();
            assert_eq!(again[1].fields, again[0].fields, "the same reply again");
            break;
        }
        assert!(Instant::now() < deadline, "no second reply");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = crate::support::session_record(&s, "cad", "s1")
        .await
        .expect("a record");
    assert!(record.contains(":1:"), "one heartbeat counted: {record}");
    let acquired = events(&s, "cad")
        .await
        .iter()
        .filter(|e| e["type"] == "acquired")
        .count();
    assert_eq!(acquired, 1);
    worker.stop().await;
}

// ---------------------------------------------------------------------------
// 4. Oversized entries.

#[tokio::test]
async fn oversized_entries_are_refused_whatever_the_op() {
    let (_redis, s, worker, mut con) = serve_cad(5).await;
    let chunk = "x".repeat(6_000);
    let long_name = "n".repeat(65);
    let meta = format!("{{\"pad\":\"{}\"}}", "p".repeat(5_000));
    for (what, extra, word) in [
        (
            "a 24 KB entry",
            vec![("a", chunk.as_str()), ("b", &chunk), ("c", &chunk), ("d", &chunk)],
            "limits.max_entry_bytes",
        ),
        (
            "a 65-byte field name",
            vec![(long_name.as_str(), "1")],
            "field name",
        ),
        ("meta on a release", vec![("meta", meta.as_str())], "`meta`"),
    ] {
        for verb in ["acquire", "release", "heartbeat"] {
            let before = snapshot(&s).await;
            let r = ask(&mut con, &s, &with(op(verb, "cad", "s"), &extra)).await;
            assert_eq!(r["status"], "INVALID_REQUEST", "{what} ({verb}): {r:?}");
            assert!(r["error"].contains(word), "{what}: {}", r["error"]);
            assert_eq!(snapshot(&s).await, before, "{what} ({verb}) changed nothing");
        }
    }
    // Unanswerable (no usable reply_to): acknowledged, never copied to the dead letters.
    let mut xadd = request_xadd(&s);
    xadd.arg("op")
        .arg("acquire")
        .arg("reply_to")
        .arg("orders:jobs")
        .arg("pad")
        .arg(&chunk)
        .arg("more")
        .arg(&chunk)
        .arg("end")
        .arg(&chunk);
    let _: String = xadd.query_async(&mut con).await.unwrap();
    let r = ask(&mut con, &s, &op("release", "cad", "s")).await;
    assert_eq!(r["status"], "SESSION_NOT_FOUND", "served what followed");
    let deadline = Instant::now() + Duration::from_secs(5);
    while crate::support::pending(&s).await > 0 {
        assert!(Instant::now() < deadline, "entries left pending");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dead = stream_entries(&mut con, &s.stream.dead_letter).await;
    assert!(dead.is_empty(), "{dead:?}");
    worker.stop().await;
}
