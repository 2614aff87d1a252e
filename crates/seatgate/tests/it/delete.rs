//! Deleting a license ends everything on it: `seatgate license delete`, and
//! a record deleted behind seatgate's back (another system's `DEL`), which
//! the reaper notices. Real processes: a `seatgate run` with its reaper
//! every second, a holder over the stream, a waiter through the CLI binary.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use seatgate::config::Settings;
use seatgate_core::status::Status;

use crate::support::{
    acquire, client, events, license_keys, output, put_license, redis_ms, seatgate_cmd, spawn_app, Entry,
    Spawned, TestApp, WorkerProcess, T,
};

/// A `seatgate run` reaping every second.
async fn run_with_reaper(url: &str) -> WorkerProcess {
    WorkerProcess::start(url, &[("SEATGATE__REAPER__SCHEDULE", "* * * * * *".to_owned())]).await
}

/// `seatgate acquire <license> <session> --wait 60s`, its output piped.
fn cli_waiter(url: &str, license: &str, session: &str) -> Spawned {
    Spawned(
        seatgate_cmd(
            url,
            &[
                "acquire",
                "--license",
                license,
                "--session",
                session,
                "--wait",
                "60s",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start seatgate acquire"),
    )
}

/// Waits until `session` waits in `license`'s queue.
async fn until_queued(s: &Settings, license: &str, session: &str) {
    let mut con = crate::support::db(s).await;
    let deadline = Instant::now() + T;
    loop {
        let rank: Option<i64> = redis::cmd("ZRANK")
            .arg(license_keys(s, license).queue)
            .arg(session)
            .query_async(&mut con)
            .await
            .unwrap();
        if rank.is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "{session} never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The waiter's exit code and output, once it exits; panics when it is
/// still waiting after `within` (and the guard kills it).
async fn finished(mut waiter: Spawned, within: Duration) -> (Option<i32>, String) {
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = waiter.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter got no final reply within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut text = String::new();
    // A few short lines: they fit the pipes' buffers, read once it exited.
    for pipe in [
        waiter.0.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
        waiter.0.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut pipe = pipe;
        pipe.read_to_string(&mut text).unwrap();
    }
    (status.code(), text)
}

/// The events of `license` of type `kind` for `session`.
fn of<'a>(events: &'a [Entry], kind: &str, session: &str) -> Vec<&'a Entry> {
    events
        .iter()
        .filter(|e| e["type"] == kind && e["session"] == session)
        .collect()
}

/// Waits until `session`'s hold of `license` ends with an `evicted` event,
/// and returns it.
async fn hold_end(s: &Settings, license: &str, session: &str, within: Duration) -> Entry {
    let deadline = Instant::now() + within;
    loop {
        let all = events(s, license).await;
        if let Some(e) = of(&all, "evicted", session).first() {
            return (*e).clone();
        }
        assert!(
            Instant::now() < deadline,
            "no end of {session}'s hold within {within:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn deleting_a_license_answers_its_waiters_ends_its_holds_and_refuses_later_requests() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    put_license(&s, "cad", 1).await;
    let _worker = run_with_reaper(&redis.url()).await;
    let c = client(&s).await;
    let before_hold = redis_ms(&mut con).await;
    let held = c.call(&acquire("cad", "holder", 0), T).await.unwrap();
    assert_eq!(held.status(), Status::Acquired, "{held:?}");
    let waiter = cli_waiter(&redis.url(), "cad", "waiter");
    until_queued(&s, "cad", "waiter").await;

    let before = redis_ms(&mut con).await;
    let deleted = output(seatgate_cmd(&redis.url(), &["license", "delete", "cad", "--yes"])).await;
    assert!(deleted.status.success(), "{deleted:?}");
    let after = redis_ms(&mut con).await;

    // The waiter hears at once (well within one reaper period and its
    // delivery), and exits refused: the license was deleted.
    let (code, text) = finished(waiter, Duration::from_secs(3)).await;
    assert_eq!(code, Some(1), "{text}");
    let last = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    assert!(
        last.starts_with("LICENSE_NOT_FOUND") && last.contains("deleted"),
        "{text}"
    );

    // The hold ends in the events, at the delete, saying why.
    let end = hold_end(&s, "cad", "holder", T).await;
    assert_eq!(end["reason"], "license_deleted", "{end:?}");
    let at: i64 = end["at_ms"].parse().unwrap();
    assert!((before..=after).contains(&at), "{at} not in {before}..={after}");
    let all = events(&s, "cad").await;
    let waits = of(&all, "denied", "waiter");
    assert_eq!(waits.len(), 1, "{all:?}");
    assert_eq!(waits[0]["reason"], "LICENSE_NOT_FOUND");

    // The usage report ends the hold there: later time is not counted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let report = crate::support::usage_last_hour(&mut con, &s, "cad").await;
    let cad = &report.licenses[0];
    assert!(
        cad.seat_ms <= after - before_hold,
        "{} seat-ms counted, the hold lasted at most {}",
        cad.seat_ms,
        after - before_hold
    );

    // Nothing is left of the license, and later requests hear it is gone.
    let k = license_keys(&s, "cad");
    let left: i64 = redis::cmd("EXISTS")
        .arg(&k.all()[..])
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(left, 0);
    let later = c.call(&acquire("cad", "late", 0), T).await.unwrap();
    assert_eq!(later.status(), Status::LicenseNotFound, "{later:?}");
    assert_eq!(later.get("error"), "no such license");
}

#[tokio::test]
async fn a_license_record_deleted_behind_seatgates_back_is_ended_by_the_reaper() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    put_license(&s, "cad", 1).await;
    // A license with a holder only: nothing makes it due before its holder
    // goes stale (90 s), unless the reaper looks.
    put_license(&s, "lab", 1).await;
    let _worker = run_with_reaper(&redis.url()).await;
    let c = client(&s).await;
    for license in ["cad", "lab"] {
        let held = c.call(&acquire(license, "holder", 0), T).await.unwrap();
        assert_eq!(held.status(), Status::Acquired, "{held:?}");
    }
    let waiter = cli_waiter(&redis.url(), "cad", "waiter");
    until_queued(&s, "cad", "waiter").await;

    // A billing system deletes the records, and nothing else.
    let before = redis_ms(&mut con).await;
    for license in ["cad", "lab"] {
        let _: i64 = redis::cmd("DEL")
            .arg(license_keys(&s, license).license)
            .query_async(&mut con)
            .await
            .unwrap();
    }

    // Within a reaper period (1 s) and the waiter's delivery.
    let (code, text) = finished(waiter, Duration::from_secs(4)).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("LICENSE_NOT_FOUND") && text.contains("deleted"),
        "{text}"
    );
    for license in ["cad", "lab"] {
        let end = hold_end(&s, license, "holder", Duration::from_secs(4)).await;
        assert_eq!(end["reason"], "license_deleted", "{license}: {end:?}");
        assert!(end["at_ms"].parse::<i64>().unwrap() >= before);
        let k = license_keys(&s, license);
        let seats: i64 = redis::cmd("ZCARD")
            .arg(&k.holders)
            .query_async(&mut con)
            .await
            .unwrap();
        let queued: i64 = redis::cmd("ZCARD")
            .arg(&k.queue)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!((seats, queued), (0, 0), "{license}");
    }
    let later = c.call(&acquire("cad", "late", 0), T).await.unwrap();
    assert_eq!(later.status(), Status::LicenseNotFound, "{later:?}");
}
