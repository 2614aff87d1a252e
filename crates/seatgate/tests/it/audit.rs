//! `seatgate audit` against a real worker: the history it writes audits
//! clean (exit 0, one summary line), and the same history tampered with —
//! a made-up `acquired` beyond the seats, a deleted `released`, a deleted
//! `acquired` of a seat still held — is found (exit 1, the right line),
//! and clean again once the tampering is undone.

use std::time::{Duration, Instant};

use seatgate::views::audit::{self, Query, Rule};
use seatgate_client::{Call, SeatOp};
use seatgate_core::events::{Event, EventType};
use seatgate_core::keys::shard_of;
use seatgate_core::status::Status;

use crate::support::{
    client, events, output, put_license, redis_ms, seatgate_cmd, spawn_app, spawn_worker, Entry, TestApp, T,
};

/// Waits until `license` has `n` events on its shard; returns them.
async fn wait_for_events(s: &seatgate::config::Settings, license: &str, n: usize) -> Vec<Entry> {
    let deadline = Instant::now() + T;
    loop {
        let ev: Vec<Entry> = events(s, license)
            .await
            .into_iter()
            .filter(|e| e["license"] == license)
            .collect();
        if ev.len() >= n {
            return ev;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} events of {license}: {ev:?}",
            ev.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `seatgate audit` on `url`: exit code and stdout.
async fn run_audit(url: &str) -> (Option<i32>, String) {
    let out = output(seatgate_cmd(url, &["audit"])).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The line of `rule` for `session` of lab in `stdout`.
fn line(stdout: &str, rule: &str, session: &str) -> String {
    stdout
        .lines()
        .find(|l| {
            l.split_whitespace().nth(1) == Some(rule)
                && l.contains(&format!(" license=lab session={session} "))
        })
        .unwrap_or_else(|| panic!("no {rule} line for {session} in:\n{stdout}"))
        .to_owned()
}

/// The entry of `license`'s events of type `kind` for `session`.
fn entry<'a>(ev: &'a [Entry], kind: &str, session: &str) -> &'a Entry {
    ev.iter()
        .find(|e| e["type"] == kind && e["session"] == session)
        .unwrap_or_else(|| panic!("no {kind} of {session} in {ev:?}"))
}

#[tokio::test]
async fn a_real_history_audits_clean_and_tampering_is_found() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    put_license(&s, "lab", 1).await;
    put_license(&s, "two", 2).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    let call = |op: SeatOp, license: &str, session: &str| Call::new(op, license, session);

    // lab: ann holds, bob queues, carl is refused, ann releases (bob is
    // granted in the same step), bob releases, frank holds to the end.
    let ann = c.call(&call(SeatOp::Acquire, "lab", "ann"), T).await.unwrap();
    assert_eq!(ann.status(), Status::Acquired);
    let bob = client(&s).await;
    let bob_id = bob
        .send(&call(SeatOp::Acquire, "lab", "bob").with_wait(std::time::Duration::from_millis(10_000)))
        .await
        .unwrap();
    assert_eq!(bob.wait_for(&bob_id, T).await.unwrap().status(), Status::Queued);
    let carl = c.call(&call(SeatOp::Acquire, "lab", "carl"), T).await.unwrap();
    assert_eq!(carl.status(), Status::NoSeatsAvailable);
    let released = c.call(&call(SeatOp::Release, "lab", "ann"), T).await.unwrap();
    assert_eq!(released.status(), Status::Released);
    assert_eq!(bob.wait_for(&bob_id, T).await.unwrap().status(), Status::Granted);
    let released = bob.call(&call(SeatOp::Release, "lab", "bob"), T).await.unwrap();
    assert_eq!(released.status(), Status::Released);
    let frank = c.call(&call(SeatOp::Acquire, "lab", "frank"), T).await.unwrap();
    assert_eq!(frank.status(), Status::Acquired);
    // two: eve takes a seat first; dora, over a second later, holds hers
    // to the end (a hold whose start the window covers).
    let eve = c.call(&call(SeatOp::Acquire, "two", "eve"), T).await.unwrap();
    assert_eq!(eve.status(), Status::Acquired);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let dora = c.call(&call(SeatOp::Acquire, "two", "dora"), T).await.unwrap();
    assert_eq!(dora.status(), Status::Acquired);
    let released = c.call(&call(SeatOp::Release, "two", "eve"), T).await.unwrap();
    assert_eq!(released.status(), Status::Released);
    let lab = wait_for_events(&s, "lab", 7).await;
    let two = wait_for_events(&s, "two", 3).await;
    worker.stop().await;

    // Clean: exit 0 and one line.
    let (code, stdout) = run_audit(&redis.url()).await;
    assert_eq!(code, Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert!(
        lines[0].starts_with("audit clean: 2 license(s), 10 event(s), 5 hold(s) checked since "),
        "{stdout}"
    );
    let report = audit::audit(&mut con, &s, &Query::default()).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!((report.licenses, report.events, report.holds), (2, 10, 5));

    // A made-up acquire beyond lab's one seat.
    let stream = s.events_stream_for("lab");
    let now = redis_ms(&mut con).await;
    let fake = Event::new(EventType::Acquired, "lab", "mallory", 1, 1, now);
    let mut xadd = redis::cmd("XADD");
    xadd.arg(&stream).arg("*");
    for (name, value) in fake.fields() {
        xadd.arg(name).arg(value);
    }
    let fake_id: String = xadd.query_async(&mut con).await.unwrap();
    let (code, stdout) = run_audit(&redis.url()).await;
    assert_eq!(code, Some(1), "{stdout}");
    let above = line(&stdout, "above_seats", "mallory");
    assert!(above.contains(&format!("entry={stream}/{fake_id}")), "{above}");
    assert!(above.contains("2 seats held after it, of 1"), "{above}");
    line(&stdout, "never_ended", "mallory");
    assert!(
        stdout.lines().last().unwrap().starts_with("audit FAILED: "),
        "{stdout}"
    );
    let report = audit::audit(&mut con, &s, &Query::default()).await.unwrap();
    let rules: Vec<(Rule, &str)> = report
        .violations
        .iter()
        .map(|v| (v.rule, v.session.as_str()))
        .collect();
    assert!(rules.contains(&(Rule::AboveSeats, "mallory")), "{rules:?}");
    assert!(
        rules.iter().all(|(_, session)| ["mallory", ""].contains(session)),
        "{rules:?}"
    );
    // Undone: clean again.
    let _: i64 = redis::cmd("XDEL")
        .arg(&stream)
        .arg(&fake_id)
        .query_async(&mut con)
        .await
        .unwrap();
    let (code, stdout) = run_audit(&redis.url()).await;
    assert_eq!(code, Some(0), "{stdout}");
    // Clean, but the deletion is not forgotten.
    assert!(
        stdout.contains(&format!(
            "entries were deleted (XDEL) from {stream} (the last one {fake_id})"
        )),
        "{stdout}"
    );

    // bob's release deleted: by the events he holds his seat still.
    let bob_released = entry(&lab, "released", "bob").id.clone();
    let _: i64 = redis::cmd("XDEL")
        .arg(&stream)
        .arg(&bob_released)
        .query_async(&mut con)
        .await
        .unwrap();
    let (code, stdout) = run_audit(&redis.url()).await;
    assert_eq!(code, Some(1), "{stdout}");
    let never = line(&stdout, "never_ended", "bob");
    assert!(never.contains("Redis has no such holder"), "{never}");
    assert!(never.contains(&entry(&lab, "granted", "bob").id), "{never}");

    // dora's acquire deleted: a holder with no start event, on `two` alone;
    // eve's release after it then says one seat more than the events give.
    let dora_acquired = entry(&two, "acquired", "dora").id.clone();
    let two_stream = s.events_stream_for("two");
    let _: i64 = redis::cmd("XDEL")
        .arg(&two_stream)
        .arg(&dora_acquired)
        .query_async(&mut con)
        .await
        .unwrap();
    let out = output(seatgate_cmd(
        &redis.url(),
        &["audit", "--license", "two", "--json"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["licenses"], 1);
    let found: Vec<(&str, &str)> = json["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["rule"].as_str().unwrap(), v["session"].as_str().unwrap()))
        .collect();
    assert!(found.contains(&("no_start", "dora")), "{found:?}");
    // (With events carrying seq, eve's release also shows the gap.)
    for rule in &found {
        assert!(
            [("no_start", "dora"), ("seats_used", "eve"), ("seq_gap", "eve")].contains(rule),
            "{found:?}"
        );
    }
}

/// With `stream.shards`, every events shard is audited: two licenses on two
/// shards audit clean, and a release deleted from one shard is found there.
#[tokio::test]
async fn every_events_shard_is_audited() {
    let TestApp(redis, mut s, mut con) = spawn_app().await;
    s.stream.shards = 2;
    let one = "acme".to_owned();
    let other = (0..100)
        .map(|i| format!("beta{i}"))
        .find(|l| shard_of(l, 2) != shard_of(&one, 2))
        .unwrap();
    put_license(&s, &one, 1).await;
    put_license(&s, &other, 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let c = client(&s).await;
    for (license, op) in [
        (&one, SeatOp::Acquire),
        (&other, SeatOp::Acquire),
        (&other, SeatOp::Release),
    ] {
        let reply = c.call(&Call::new(op, license, "kim"), T).await.unwrap();
        assert!(reply.ok(), "{reply:?}");
    }
    wait_for_events(&s, &one, 1).await;
    let ev = wait_for_events(&s, &other, 2).await;
    worker.stop().await;
    let audit_cmd = || {
        let mut cmd = seatgate_cmd(&redis.url(), &["audit"]);
        cmd.env("SEATGATE__STREAM__SHARDS", "2");
        output(cmd)
    };
    let out = audit_cmd().await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout.starts_with("audit clean: 2 license(s), 3 event(s), 2 hold(s)"),
        "{stdout}"
    );

    let released = entry(&ev, "released", "kim").id.clone();
    let _: i64 = redis::cmd("XDEL")
        .arg(s.events_stream_for(&other))
        .arg(&released)
        .query_async(&mut con)
        .await
        .unwrap();
    let out = audit_cmd().await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let never = stdout
        .lines()
        .find(|l| l.contains(" never_ended "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        never.contains(&format!("license={other} session=kim "))
            && never.contains(&format!(" entry={}/", s.events_stream_for(&other))),
        "{never}"
    );
    assert!(!stdout.contains(&format!("license={one} ")), "{stdout}");
    // Run with the settings' one shard, it reads the two the workers recorded.
    let out = output(seatgate_cmd(&redis.url(), &["audit"])).await;
    let plain = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        plain.contains(&format!(" never_ended  license={other} session=kim ")),
        "{plain}"
    );
    assert!(
        plain.contains("events read from the 2 shard(s) this deployment records (seat:config, field events_shards), not the 1 of the settings"),
        "{plain}"
    );
}
