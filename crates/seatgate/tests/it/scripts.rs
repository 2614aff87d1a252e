//! The seat scripts called directly (the seed's own path), against a real
//! Redis, and the contracts of their replies and records.

use redis::AsyncCommands;
use seatgate::config::Settings;
use seatgate_core::db::Db;
use seatgate_core::license::LicenseSpec;
use seatgate_core::policy::RequestPolicy;
use seatgate_core::records::{parse_dedupe_record, SessionRecord, WaiterRecord};
use seatgate_core::request::{Guard, GuardPolicy};
use seatgate_core::scripts::{Decision, Delivery, NoSeats, OutboxCursor, Outcome, ReapArgs, Reaped, Scripts};
use seatgate_core::status::Status;

use crate::support::{
    db, direct, encoding, holders, keys, license_keys, listpack_values_as_ops_conf, outbox_len, provision,
    put_license, redis_ms, reply_stream, seats, seats_with_timeout, set_license_field, spawn_app,
    spawn_app_with, stream_entries, Direct, RedisServer, RedisServerExt, TestApp, META,
};

#[tokio::test]
async fn acquire_takes_a_seat_and_records_the_session() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 5).await;

    let o = direct(&settings, "lic", "s1").acquire(&mut con).await;
    assert_eq!(
        (o.status(), o.seats_used, o.seats_total),
        (Status::Acquired, 1, 5)
    );

    let k = license_keys(&settings, "lic");
    let beat: Option<i64> = con.zscore(&k.holders, "s1").await.unwrap();
    let record: String = con.hget(&k.sessions, "s1").await.unwrap();
    let acquired_at = beat.expect("holder has a heartbeat score");
    assert_eq!(record, format!("{acquired_at}:0:{META}"));
}

#[tokio::test]
async fn acquire_is_idempotent_per_session() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 5).await;
    assert_eq!(
        direct(&settings, "lic", "s1").acquire(&mut con).await.status(),
        Status::Acquired
    );
    let again = direct(&settings, "lic", "s1").acquire(&mut con).await;
    assert_eq!((again.status(), again.seats_used), (Status::AlreadyActive, 1));
}

#[tokio::test]
async fn no_seats_available_when_all_are_held() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    for s in ["a", "b"] {
        assert_eq!(
            direct(&settings, "lic", s).acquire(&mut con).await.status(),
            Status::Acquired
        );
    }
    let o = direct(&settings, "lic", "c").acquire(&mut con).await;
    assert_eq!(
        (o.status(), o.seats_used, o.seats_total),
        (Status::NoSeatsAvailable, 2, 2)
    );
    assert_eq!(holders(&settings, "lic").await, ["a", "b"]);
}

#[tokio::test]
async fn release_frees_only_the_sessions_own_seat() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    direct(&settings, "lic", "s1").acquire(&mut con).await;

    let o = direct(&settings, "lic", "someone-else").release(&mut con).await;
    assert_eq!((o.status(), o.seats_used), (Status::SessionNotFound, 1));
    let o = direct(&settings, "lic", "s1").release(&mut con).await;
    assert_eq!(
        (o.status(), o.seats_used, o.seats_total),
        (Status::Released, 0, 1)
    );
    let record: Option<String> = con
        .hget(license_keys(&settings, "lic").sessions, "s1")
        .await
        .unwrap();
    assert_eq!(record, None, "metadata removed with the seat");
    assert_eq!(
        direct(&settings, "lic", "s2").acquire(&mut con).await.status(),
        Status::Acquired,
        "the seat is free again"
    );
}

#[tokio::test]
async fn heartbeat_moves_the_clock_and_counts() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 3).await;
    let o = direct(&settings, "lic", "ghost").heartbeat(&mut con).await;
    assert_eq!(o.status(), Status::SessionNotActive);

    let s1 = direct(&settings, "lic", "s1");
    s1.acquire(&mut con).await;
    let k = license_keys(&settings, "lic");
    let before: i64 = con.zscore(&k.holders, "s1").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for n in 1..=2 {
        let o = s1.heartbeat(&mut con).await;
        assert_eq!(
            (o.decision, o.seats_used),
            (Decision::HeartbeatUpdated { heartbeats: n }, 1)
        );
    }
    let after: i64 = con.zscore(&k.holders, "s1").await.unwrap();
    assert!(after > before, "last heartbeat {after} should be after {before}");
    let record: String = con.hget(&k.sessions, "s1").await.unwrap();
    assert!(record.starts_with(&format!("{before}:2:")), "{record}");
}

/// HEARTBEAT_UPDATED carries the heartbeat timeout in force, the service's
/// or the license's, as it stands when the heartbeat (or its replay) runs;
/// the other heartbeat answers carry none.
#[tokio::test]
async fn a_heartbeat_and_its_replay_carry_the_timeout_in_force() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 1).await;
    let mut con = db(&settings).await;
    let default = settings.sessions.heartbeat_timeout_ms as i64;
    let ghost = direct(&settings, "lic", "ghost").heartbeat(&mut con).await;
    assert_eq!(
        (ghost.status(), ghost.heartbeat_timeout_ms),
        (Status::SessionNotActive, None)
    );

    direct(&settings, "lic", "s1").acquire(&mut con).await;
    let o = direct(&settings, "lic", "s1").heartbeat(&mut con).await;
    assert_eq!(
        (o.status(), o.heartbeat_timeout_ms),
        (Status::HeartbeatUpdated, Some(default))
    );

    provision(&settings, "lic", &seats_with_timeout(1, 30_000)).await;
    let g = redelivered(&settings, redis_ms(&mut con).await, 0, "s1");
    let guarded = || direct(&settings, "lic", "s1").with_guard(g.clone());
    let first = guarded().heartbeat(&mut con).await;
    assert_eq!(
        (first.status(), first.replayed, first.heartbeat_timeout_ms),
        (Status::HeartbeatUpdated, false, Some(30_000))
    );
    // Lowered since: the replay tells the timeout the holder must now meet.
    provision(&settings, "lic", &seats_with_timeout(1, 3_000)).await;
    let again = guarded().heartbeat(&mut con).await;
    assert_eq!(
        (again.status(), again.replayed, again.heartbeat_timeout_ms),
        (Status::HeartbeatUpdated, true, Some(3_000))
    );
}

#[tokio::test]
async fn license_state_is_checked_inside_the_script() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let spec = |seats_total, expires_at_ms, active| LicenseSpec {
        seats_total,
        expires_at_ms,
        active,
        heartbeat_timeout_ms: None,
    };
    // Table: (license, provisioning, expected status of a first acquire)
    let table = [
        ("missing", None, Status::LicenseNotFound),
        ("off", Some(spec(5, 0, false)), Status::LicenseInactive),
        ("old", Some(spec(5, now_ms - 1000, true)), Status::LicenseExpired),
        ("later", Some(spec(5, now_ms + 3_600_000, true)), Status::Acquired),
        ("zero", Some(spec(0, 0, true)), Status::NoSeatsAvailable),
    ];
    for (id, provisioning, expected) in table {
        if let Some(spec) = provisioning {
            provision(&settings, id, &spec).await;
        }
        let before = holders(&settings, id).await;
        let o = direct(&settings, id, "s1").acquire(&mut con).await;
        assert_eq!(o.status(), expected, "license {id}");
        if expected != Status::Acquired {
            assert_eq!(
                holders(&settings, id).await,
                before,
                "{id}: refusal changed state"
            );
        }
    }
}

#[tokio::test]
async fn lowering_seats_evicts_nobody_but_refuses_new_acquires() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 3).await;
    for s in ["a", "b", "c"] {
        direct(&settings, "lic", s).acquire(&mut con).await;
    }
    put_license(&settings, "lic", 2).await;
    assert_eq!(holders(&settings, "lic").await.len(), 3, "nobody evicted");
    let o = direct(&settings, "lic", "d").acquire(&mut con).await;
    assert_eq!(
        (o.status(), o.seats_used, o.seats_total),
        (Status::NoSeatsAvailable, 3, 2)
    );
    direct(&settings, "lic", "a").release(&mut con).await;
    assert_eq!(
        direct(&settings, "lic", "d").acquire(&mut con).await.status(),
        Status::NoSeatsAvailable,
        "2 of 2 still held"
    );
    direct(&settings, "lic", "b").release(&mut con).await;
    assert_eq!(
        direct(&settings, "lic", "d").acquire(&mut con).await.status(),
        Status::Acquired
    );
}

/// The library's functions, as FUNCTION LIST names them.
async fn loaded_functions(con: &mut seatgate_core::db::Db) -> Vec<String> {
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(Scripts::get().library_name())
        .query_async(con)
        .await
        .unwrap();
    let mut names = Vec::new();
    fn walk(v: &redis::Value, names: &mut Vec<String>) {
        match v {
            redis::Value::Array(items) => {
                for pair in items.windows(2) {
                    if let (redis::Value::BulkString(k), redis::Value::BulkString(n)) = (&pair[0], &pair[1]) {
                        if k == b"name" {
                            names.push(String::from_utf8_lossy(n).into_owned());
                        }
                    }
                }
                for item in items {
                    walk(item, names);
                }
            }
            redis::Value::Map(items) => {
                for (k, n) in items {
                    if let (redis::Value::BulkString(k), redis::Value::BulkString(n)) = (k, n) {
                        if k == b"name" {
                            names.push(String::from_utf8_lossy(n).into_owned());
                        }
                    }
                    walk(n, names);
                }
            }
            _ => {}
        }
    }
    walk(&libraries, &mut names);
    names
}

#[tokio::test]
async fn scripts_reload_after_function_flush() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    direct(&settings, "lic", "s1").acquire(&mut con).await;
    let functions = loaded_functions(&mut con).await;
    for f in Scripts::get().functions() {
        assert!(functions.iter().any(|n| n == f), "{f} loaded: {functions:?}");
    }
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        loaded_functions(&mut con).await.is_empty(),
        "flush removed the library"
    );
    // FCALL answers `Function not found`; the call loads the library and succeeds.
    assert_eq!(
        direct(&settings, "lic", "s2").acquire(&mut con).await.status(),
        Status::Acquired
    );
    let o = direct(&settings, "lic", "s1").heartbeat(&mut con).await;
    assert_eq!(o.status(), Status::HeartbeatUpdated);
}

/// A worker that starts where the library is already loaded (a restart, a
/// second worker) loads nothing again: `FUNCTION LOAD` answers `already
/// exists` for the library of that name, which is the same text (the name
/// carries its hash), and the start goes on.
#[tokio::test]
async fn loading_the_library_again_where_it_is_loaded_succeeds() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    Scripts::get().load_all(&mut con).await.expect("first load");
    let err: redis::RedisError = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(Scripts::get().library())
        .query_async::<redis::Value>(&mut con)
        .await
        .expect_err("a second plain FUNCTION LOAD is refused by Redis");
    assert!(err.to_string().contains("already exists"), "{err}");
    Scripts::get()
        .load_all(&mut con)
        .await
        .expect("loading again is no error");
    put_license(&settings, "lic", 1).await;
    assert_eq!(
        direct(&settings, "lic", "s1").acquire(&mut con).await.status(),
        Status::Acquired
    );
}

/// A Redis without functions (before 7.0; here one whose FCALL and FUNCTION
/// are renamed away) is refused in one line that says why.
#[tokio::test]
async fn a_redis_without_functions_is_refused_in_one_clear_line() {
    let TestApp(_redis, _settings, mut con) = spawn_app_with(&[
        "--rename-command",
        "FCALL",
        "",
        "--rename-command",
        "FUNCTION",
        "",
    ])
    .await;
    let err = Scripts::get()
        .load_all(&mut con)
        .await
        .expect_err("no functions")
        .to_string();
    assert!(err.contains("seatgate needs Redis 7.0 or later"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // A call (which loads the library when Redis has not got it) says the same.
    let err = Scripts::get()
        .renew(&mut con, "lock", "token", 1_000)
        .await
        .expect_err("no FCALL");
    assert!(
        err.to_string().contains("seatgate needs Redis 7.0 or later"),
        "{err}"
    );
}

#[tokio::test]
async fn hundred_concurrent_acquirers_get_exactly_the_seats() {
    let TestApp(_redis, settings, _) = spawn_app().await;
    put_license(&settings, "load", 10).await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let settings = settings.clone();
        tasks.push(tokio::spawn(async move {
            let mut con = db(&settings).await;
            direct(&settings, "load", &format!("session-{i}"))
                .acquire(&mut con)
                .await
                .status()
        }));
    }
    let mut acquired = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            Status::Acquired => acquired += 1,
            Status::NoSeatsAvailable => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((acquired, refused), (10, 90));
    assert_eq!(holders(&settings, "load").await.len(), 10);
}

#[tokio::test]
async fn a_retried_acquire_keeps_its_answer_after_the_license_changes() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    assert_eq!(
        direct(&settings, "lic", "s1").acquire(&mut con).await.status(),
        Status::Acquired
    );
    let inactive = LicenseSpec {
        active: false,
        ..seats(2)
    };
    provision(&settings, "lic", &inactive).await;
    assert_eq!(
        direct(&settings, "lic", "s1").acquire(&mut con).await.status(),
        Status::AlreadyActive
    );
    assert_eq!(
        direct(&settings, "lic", "s2").acquire(&mut con).await.status(),
        Status::LicenseInactive
    );
}

// The script contracts: each seat script run on a real Redis, its reply and
// the records it stores decoded by the library's one decoder of each, so a
// change on either side fails here.

fn meta_of(session: &str) -> String {
    format!(r#"{{"user_email":"{session}@example.com","note":"a:b"}}"#)
}

/// One request of a contract table.
#[derive(Debug, Clone, Copy)]
enum Req<'a> {
    /// Session, wait_ms.
    Acquire(&'a str, u64),
    Release(&'a str),
    Heartbeat(&'a str),
}

impl Req<'_> {
    fn session(&self) -> &str {
        match self {
            Req::Acquire(s, _) | Req::Release(s) | Req::Heartbeat(s) => s,
        }
    }
}

/// Runs `req` on `license`, called directly (no dedupe, no rate limits).
async fn run(con: &mut Db, s: &Settings, license: &str, req: Req<'_>) -> Outcome {
    run_as(con, s, direct(s, license, req.session()), req).await
}

/// Runs `req` as `session`; an acquire carries the metadata [`meta_of`] its
/// session, request id `req-<session>` and reply_to [`reply_stream`]
/// `<session>`.
async fn run_as(con: &mut Db, s: &Settings, session: Direct, req: Req<'_>) -> Outcome {
    let session = session.with_meta(meta_of(req.session()));
    match req {
        Req::Acquire(name, wait_ms) => {
            session
                .queue(con, wait_ms, &format!("req-{name}"), &reply_stream(s, name))
                .await
        }
        Req::Release(_) => session.release(con).await,
        Req::Heartbeat(_) => session.heartbeat(con).await,
    }
}

/// What a contract table expects of an outcome (seats_total is 1 throughout).
struct Want {
    decision: Decision,
    seats_used: i64,
    changed: bool,
    granted: &'static [&'static str],
}

fn want(decision: Decision, seats_used: i64) -> Want {
    Want {
        decision,
        seats_used,
        changed: true,
        granted: &[],
    }
}

#[tokio::test]
async fn every_seat_script_answers_the_documented_outcome() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let k = license_keys(&settings, "lic");
    let _: () = con.hset(&k.license, "queue_max", 1).await.unwrap();
    use Req::{Acquire, Heartbeat, Release};
    let plain = Decision::Plain;
    let acquired = Decision::Acquired {
        borrowed_until_ms: None,
    };
    let queued_first = Decision::Queued {
        position: 1,
        priority: 0,
    };
    // Run in order: each row starts from the state the rows above left.
    let table = [
        (Acquire("a", 0), want(acquired, 1)),
        (Acquire("a", 0), want(plain(Status::AlreadyActive), 1)),
        (
            Heartbeat("a"),
            want(Decision::HeartbeatUpdated { heartbeats: 1 }, 1),
        ),
        (Heartbeat("ghost"), want(plain(Status::SessionNotActive), 1)),
        (
            Acquire("b", 0),
            want(Decision::NoSeatsAvailable(NoSeats::InUse), 1),
        ),
        (Acquire("b", 60_000), want(queued_first.clone(), 1)),
        (
            Acquire("b", 60_000),
            Want {
                changed: false,
                ..want(queued_first.clone(), 1)
            },
        ),
        (
            Heartbeat("b"),
            Want {
                changed: false,
                ..want(queued_first.clone(), 1)
            },
        ),
        (
            Acquire("c", 60_000),
            want(Decision::NoSeatsAvailable(NoSeats::QueueFull), 1),
        ),
        (
            Release("a"),
            Want {
                granted: &["b"],
                ..want(Decision::Released { linger_ms: None }, 1)
            },
        ),
        (Acquire("c", 60_000), want(queued_first, 1)),
        (Release("c"), want(plain(Status::LeftQueue), 1)),
        (Release("c"), want(plain(Status::SessionNotFound), 1)),
    ];
    for (req, want) in table {
        let before = redis_ms(&mut con).await;
        let o = run(&mut con, &settings, "lic", req).await;
        let after = redis_ms(&mut con).await;
        assert_eq!(
            (&o.decision, o.seats_used, o.seats_total),
            (&want.decision, want.seats_used, 1),
            "{req:?}"
        );
        assert_eq!((o.changed, o.replayed), (want.changed, false), "{req:?}");
        assert!(
            (before..=after).contains(&o.now_ms),
            "{req:?}: now_ms {} not the Redis clock",
            o.now_ms
        );
        let granted: Vec<&str> = o.notes.iter().map(|n| n.session.as_str()).collect();
        assert_eq!(granted, want.granted, "{req:?}");
        for n in &o.notes {
            assert_eq!(n.status, Status::Granted);
            assert_eq!(n.request_id, format!("req-{}", n.session));
            assert_eq!(n.reply_to, reply_stream(&settings, &n.session));
            assert_eq!(n.note_id, format!("GRANTED:{}:{}", n.session, o.now_ms));
            assert!(n.waited_ms >= 0 && n.waited_ms <= after - before + 60_000);
            // One node: the script wrote the waiter's GRANTED itself, in
            // the same step, and left nothing in the outbox for anyone to
            // send (on a cluster it would wait there: scripts::a_waiter_queued_*).
            assert_eq!(n.delivery, Delivery::Sent);
            let kept: bool = con.hexists(&k.outbox, &n.note_id).await.unwrap();
            assert!(!kept, "a note the script sent is not in the outbox");
            let replies = stream_entries(&mut con, &n.reply_to).await;
            let granted: Vec<(&str, &str)> = replies
                .iter()
                .map(|r| (r["status"].as_str(), r["id"].as_str()))
                .filter(|(status, _)| *status == "GRANTED")
                .collect();
            assert_eq!(granted, [("GRANTED", n.request_id.as_str())], "{replies:?}");
        }
    }
}

#[tokio::test]
async fn a_rate_limited_request_gets_the_documented_outcome() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let mut limited = Guard::none(&keys(&settings), "lic", "a");
    limited.session_limit = 1;
    limited.window_ms = 60_000;
    let a = || direct(&settings, "lic", "a").with_guard(limited.clone());
    assert_eq!(
        run_as(&mut con, &settings, a(), Req::Acquire("a", 0))
            .await
            .status(),
        Status::Acquired
    );
    let o = run_as(&mut con, &settings, a(), Req::Heartbeat("a")).await;
    assert_eq!(
        (&o.decision, o.seats_used, o.seats_total, o.replayed),
        (&Decision::RateLimited { application: false }, 1, 2, false)
    );
    assert!(o.notes.is_empty());
    let record: String = con
        .hget(license_keys(&settings, "lic").sessions, "a")
        .await
        .unwrap();
    assert_eq!(
        SessionRecord::parse(&record).unwrap().heartbeats,
        0,
        "not counted"
    );
}

/// `o` as a dedupe record keeps it: without what a replay reads from the
/// license as it stands (the due time, the heartbeat timeout in force).
fn as_stored(o: &Outcome) -> Outcome {
    let mut stored = o.clone();
    stored.stale_ms = None;
    stored.due_ms = None;
    stored.heartbeat_timeout_ms = None;
    // Read from the holders when replayed, never stored.
    stored.held_since_ms = None;
    for note in &mut stored.notes {
        note.heartbeat_timeout_ms = None;
    }
    stored
}

/// The guard of a redelivery of entry `<now>-<n>` of `session` on license
/// `lic`: dedupe for a minute, no rate limits.
fn redelivered(settings: &Settings, now: i64, n: u32, session: &str) -> Guard {
    let policy = GuardPolicy {
        dedupe_window_ms: 60_000,
        session_limit: 0,
        license_limit: 0,
        rate_window_ms: 1_000,
        application: Default::default(),
    };
    let id = format!("{now}-{n}");
    let mut g = Guard::for_entry(&policy, &keys(settings), &id, "lic", session);
    g.redelivery = true;
    g
}

#[tokio::test]
async fn a_replayed_entry_answers_its_stored_outcome_and_the_dedupe_record_decodes_to_it() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let now = redis_ms(&mut con).await;
    let entry = |n: u32, session: &str| redelivered(&settings, now, n, session);
    use Req::{Acquire, Release};
    // a takes the seat, b queues, a releases and so grants b: a record
    // without notes, one with a detail, one with a note.
    let table = [
        (0, Acquire("a", 0), Status::Acquired),
        (1, Acquire("b", 60_000), Status::Queued),
        (2, Release("a"), Status::Released),
    ];
    let mut notes = 0;
    for (n, req, status) in table {
        let g = entry(n, req.session());
        let guarded = || direct(&settings, "lic", req.session()).with_guard(g.clone());
        let first = run_as(&mut con, &settings, guarded(), req).await;
        assert_eq!(first.status(), status);
        let again = run_as(&mut con, &settings, guarded(), req).await;
        // The same answer; the time is the replay's own (no reply carries it).
        let replayed = Outcome {
            changed: false,
            replayed: true,
            now_ms: again.now_ms,
            ..first.clone()
        };
        // A replay reports both due index times, read from the license as
        // it stands (its first delivery may have died before filing them):
        // someone holds a seat throughout.
        assert!(again.stale_ms.is_some(), "{req:?}");
        assert!(again.due_ms >= first.due_ms, "{req:?}");
        assert_eq!(
            Outcome {
                stale_ms: first.stale_ms,
                due_ms: first.due_ms,
                ..again.clone()
            },
            replayed,
            "{req:?}"
        );
        assert!(again.now_ms >= first.now_ms);
        let raw: String = con.hget(&g.done_key, &g.entry_id).await.unwrap();
        // A number for detail, notes or not: the plain form, no JSON.
        assert!(!raw.starts_with('['), "{req:?}: {raw}");
        assert_eq!(
            parse_dedupe_record(&raw, again.now_ms).unwrap(),
            as_stored(&replayed),
            "{req:?}: {raw}"
        );
        notes += first.notes.len();
    }
    assert_eq!(notes, 1, "the release granted b");
    assert_eq!(holders(&settings, "lic").await, ["b"], "replays changed nothing");
}

#[tokio::test]
async fn a_note_whose_request_id_holds_a_tab_is_stored_as_json_and_replays_the_same() {
    // The protocol refuses control characters in an id; a caller of the
    // scripts may not. The plain record's note line is tab-separated, so
    // such a note goes to the JSON form, and its replay still matches.
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let now = redis_ms(&mut con).await;
    assert_eq!(
        run(&mut con, &settings, "lic", Req::Acquire("a", 0))
            .await
            .status(),
        Status::Acquired
    );
    let b = direct(&settings, "lic", "b").with_meta(meta_of("b"));
    let queued = b
        .queue(&mut con, 60_000, "req\tb", &reply_stream(&settings, "b"))
        .await;
    assert_eq!(queued.status(), Status::Queued);
    let g = redelivered(&settings, now, 9, "a");
    let release = || direct(&settings, "lic", "a").with_guard(g.clone());
    let first = release().release(&mut con).await;
    assert_eq!(first.status(), Status::Released);
    assert_eq!(first.notes.len(), 1);
    assert_eq!(first.notes[0].request_id, "req\tb");
    let raw: String = con.hget(&g.done_key, &g.entry_id).await.unwrap();
    assert!(raw.starts_with('['), "{raw}");
    let again = release().release(&mut con).await;
    assert!(again.replayed);
    assert_eq!(again.notes, first.notes);
    assert_eq!(
        parse_dedupe_record(&raw, again.now_ms).unwrap().notes[0].request_id,
        "req\tb"
    );
    assert_eq!(
        holders(&settings, "lic").await,
        ["b"],
        "the replay changed nothing"
    );
}

#[tokio::test]
async fn the_session_and_waiter_records_decode_in_rust() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let k = license_keys(&settings, "lic");
    let took = run(&mut con, &settings, "lic", Req::Acquire("a", 0)).await;
    let raw: String = con.hget(&k.sessions, "a").await.unwrap();
    let record = SessionRecord {
        acquired_at_ms: took.now_ms,
        heartbeats: 0,
        lease_hash: None,
        meta: meta_of("a"),
    };
    assert_eq!(SessionRecord::parse(&raw), Some(record.clone()), "{raw}");
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for _ in 0..2 {
        run(&mut con, &settings, "lic", Req::Heartbeat("a")).await;
    }
    let raw: String = con.hget(&k.sessions, "a").await.unwrap();
    let beaten = SessionRecord {
        heartbeats: 2,
        ..record
    };
    assert_eq!(SessionRecord::parse(&raw), Some(beaten), "{raw}");

    let queued = run(&mut con, &settings, "lic", Req::Acquire("b", 60_000)).await;
    let raw: String = con.hget(&k.waiters, "b").await.unwrap();
    let waiter = WaiterRecord {
        id: "req-b".into(),
        reply_to: reply_stream(&settings, "b"),
        meta: meta_of("b"),
        queued_at: queued.now_ms,
        lease_hash: None,
    };
    assert_eq!(
        raw,
        format!("{}.req-b\n*b\n{}", base36(queued.now_ms), meta_of("b")),
        "the compact form, under the default reply prefix"
    );
    assert_eq!(WaiterRecord::parse(&raw), Some(waiter), "{raw}");
    let leased = direct(&settings, "lic", "c")
        .with_lease(Some(LEASE))
        .with_meta(meta_of("c"))
        .queue(&mut con, 60_000, "req-c", "")
        .await;
    let raw: String = con.hget(&k.waiters, "c").await.unwrap();
    let hash = sha1_16(&mut con, LEASE).await;
    assert_eq!(
        raw,
        format!("{}~{hash}req-c\n\n{}", base36(leased.now_ms), meta_of("c")),
        "the compact form, bound to a lease, replying nowhere"
    );
    let waiter = WaiterRecord {
        id: "req-c".into(),
        reply_to: String::new(),
        meta: meta_of("c"),
        queued_at: leased.now_ms,
        lease_hash: Some(hash),
    };
    assert_eq!(WaiterRecord::parse(&raw), Some(waiter), "{raw}");

    // `seatgate status` reads them through the same types. The acquires
    // named no `user`: the metadata's email is shown as such, not as the user.
    let status = seatgate::views::status::license_status(&mut con, &keys(&settings), "lic")
        .await
        .unwrap();
    let h = &status.holders[0];
    assert_eq!(
        (
            h.session.as_str(),
            h.acquired_at_ms,
            h.heartbeats,
            h.user_email.as_deref()
        ),
        ("a", took.now_ms, 2, Some("a@example.com"))
    );
    assert_eq!(h.user, None);
    let w = &status.queue[0];
    assert_eq!(
        (w.session.as_str(), w.queued_at_ms, w.user_email.as_deref()),
        ("b", queued.now_ms, Some("b@example.com"))
    );
    assert_eq!(w.user, None);
}

/// A lease for the tests that bind a place to one.
const LEASE: &str = "lease-0123456789abcdef";

/// What lua/includes/lease.lua stores for `lease`: the first 16 hex digits
/// of its SHA-1, as Redis computes it.
async fn sha1_16(con: &mut Db, lease: &str) -> String {
    let hex: String = redis::cmd("EVAL")
        .arg("return redis.sha1hex(ARGV[1])")
        .arg(0)
        .arg(lease)
        .query_async(con)
        .await
        .unwrap();
    hex[..16].to_owned()
}

/// `ms` in base 36, as the compact waiter record writes its queued_at.
fn base36(mut ms: i64) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(char::from_digit((ms % 36) as u32, 36).unwrap());
        ms /= 36;
        if ms == 0 {
            return digits.iter().rev().collect();
        }
    }
}

/// The waiter records of earlier versions, which an upgrade leaves in Redis.
#[derive(Clone, Copy, Debug)]
enum OldForm {
    /// `{"id", "reply_to", "meta", "queued_at", "lease_hash"?}`
    Json,
    /// `<queued_at>:<lease_hash>:<id>\n<reply_to>\n<meta>`
    Plain,
}

/// Puts waiter `session` in the license's queue at `arrival`, waiting until
/// `deadline` (ms), with `raw` as its waiter record: what enqueue writes,
/// with a record a test chooses.
async fn place_waiter(
    con: &mut Db,
    k: &seatgate_core::keys::LicenseKeys,
    session: &str,
    arrival: i64,
    deadline: i64,
    raw: &str,
) {
    let _: () = redis::pipe()
        .zadd(&k.queue, session, arrival)
        .zadd(&k.deadlines, session, deadline)
        .hset(&k.waiters, session, raw)
        .query_async(con)
        .await
        .unwrap();
}

/// Queues `session` on `license` as a worker of an earlier version did: its
/// record in `form`, its place and deadline as enqueue makes them, queued at
/// and waiting until the two times given (ms). Returns the record.
async fn queue_in_old_form(
    form: OldForm,
    con: &mut Db,
    s: &Settings,
    license: &str,
    session: &str,
    lease_hash: Option<&str>,
    (queued_at, deadline): (i64, i64),
) -> WaiterRecord {
    let k = license_keys(s, license);
    let record = WaiterRecord {
        id: format!("req-{session}"),
        reply_to: reply_stream(s, session),
        meta: meta_of(session),
        queued_at,
        lease_hash: lease_hash.map(str::to_owned),
    };
    let raw = match form {
        OldForm::Json => {
            let mut json = serde_json::json!({
                "id": record.id,
                "reply_to": record.reply_to,
                "meta": record.meta,
                "queued_at": queued_at,
            });
            if let Some(hash) = lease_hash {
                json["lease_hash"] = hash.into();
            }
            json.to_string()
        }
        OldForm::Plain => format!(
            "{queued_at}:{}:{}\n{}\n{}",
            lease_hash.unwrap_or(""),
            record.id,
            record.reply_to,
            record.meta
        ),
    };
    let arrival: i64 = con.incr(&k.queue_seq, 1).await.unwrap();
    place_waiter(con, &k, session, arrival, deadline, &raw).await;
    record
}

#[tokio::test]
async fn a_waiter_queued_in_the_json_form_is_granted_timed_out_and_revoked_as_before() {
    old_form_waiters_are_served_as_before(OldForm::Json).await;
}

#[tokio::test]
async fn a_waiter_queued_in_the_plain_form_is_granted_timed_out_and_revoked_as_before() {
    old_form_waiters_are_served_as_before(OldForm::Plain).await;
}

/// Waiters queued by an earlier version, their records in `form`, are
/// granted, timed out, revoked and redirected as they would have been.
async fn old_form_waiters_are_served_as_before(form: OldForm) {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let k = license_keys(&settings, "lic");
    run(&mut con, &settings, "lic", Req::Acquire("holder", 0)).await;
    let now = redis_ms(&mut con).await;
    let hash = sha1_16(&mut con, LEASE).await;
    // Queued before the upgrade: one bound to a lease, one to be revoked,
    // one that re-sends its acquire (and, below, one whose wait has run out).
    let old = queue_in_old_form(
        form,
        &mut con,
        &settings,
        "lic",
        "old",
        Some(&hash),
        (now - 1_000, now + 60_000),
    )
    .await;
    let revoked = queue_in_old_form(
        form,
        &mut con,
        &settings,
        "lic",
        "revoked",
        None,
        (now - 500, now + 60_000),
    )
    .await;
    let moved = queue_in_old_form(
        form,
        &mut con,
        &settings,
        "lic",
        "moved",
        Some(&hash),
        (now - 400, now + 60_000),
    )
    .await;
    let raw: String = con.hget(&k.waiters, "old").await.unwrap();
    match form {
        OldForm::Json => assert!(raw.starts_with('{'), "{raw}"),
        OldForm::Plain => assert!(raw.starts_with(&format!("{}:{hash}:", now - 1_000)), "{raw}"),
    }
    assert_eq!(
        WaiterRecord::parse(&raw),
        Some(old.clone()),
        "Rust reads the {form:?} form"
    );

    // Its lease is read from the old form: a re-send without it is refused.
    let wrong = direct(&settings, "lic", "old")
        .queue(&mut con, 60_000, "req-x", "")
        .await;
    assert_eq!(wrong.status(), Status::LeaseMismatch);
    // A re-send naming a new reply_to rewrites the record in the compact
    // form, keeping its time, lease and metadata.
    let again = direct(&settings, "lic", "moved")
        .with_lease(Some(LEASE))
        .queue(
            &mut con,
            60_000,
            "req-moved-2",
            &reply_stream(&settings, "moved-2"),
        )
        .await;
    assert_eq!(
        (again.decision, again.changed),
        (
            Decision::Queued {
                position: 3,
                priority: 0
            },
            false
        )
    );
    let raw: String = con.hget(&k.waiters, "moved").await.unwrap();
    assert!(
        raw.starts_with(&format!(
            "{}~{hash}req-moved-2\n*moved-2\n",
            base36(moved.queued_at)
        )),
        "{raw:?}"
    );
    assert_eq!(
        WaiterRecord::parse(&raw),
        Some(WaiterRecord {
            id: "req-moved-2".into(),
            reply_to: reply_stream(&settings, "moved-2"),
            ..moved
        })
    );

    let gone = direct(&settings, "lic", "revoked")
        .revoke(&mut con, "test", "admin", 0)
        .await;
    assert_eq!(gone.status(), Status::Revoked);
    let note = &gone.notes[0];
    assert_eq!(
        (
            note.status,
            note.request_id.as_str(),
            note.reply_to.as_str(),
            note.waited_ms
        ),
        (
            Status::SessionRevoked,
            revoked.id.as_str(),
            revoked.reply_to.as_str(),
            gone.now_ms - revoked.queued_at
        )
    );

    let late = queue_in_old_form(
        form,
        &mut con,
        &settings,
        "lic",
        "late",
        None,
        (now - 2_000, now - 1),
    )
    .await;
    // The holder leaves: the late one times out, the old one is granted,
    // each answered on the request and stream it queued with.
    // As on a cluster, the notes wait in the outbox (on one node the
    // script would send them itself).
    let holder = direct(&settings, "lic", "holder").via_outbox();
    let freed = run_as(&mut con, &settings, holder, Req::Release("holder")).await;
    let notes: Vec<_> = freed
        .notes
        .iter()
        .map(|n| {
            (
                n.status,
                n.session.as_str(),
                n.request_id.as_str(),
                n.reply_to.as_str(),
                n.waited_ms,
            )
        })
        .collect();
    assert_eq!(
        notes,
        [
            (
                Status::QueueTimeout,
                "late",
                late.id.as_str(),
                late.reply_to.as_str(),
                freed.now_ms - late.queued_at
            ),
            (
                Status::Granted,
                "old",
                old.id.as_str(),
                old.reply_to.as_str(),
                freed.now_ms - old.queued_at
            ),
        ]
    );
    let outbox: std::collections::HashMap<String, String> = con.hgetall(&k.outbox).await.unwrap();
    let granted: serde_json::Value = serde_json::from_str(&outbox[&freed.notes[1].note_id]).unwrap();
    assert_eq!(
        (granted["id"].as_str(), granted["reply_to"].as_str()),
        (Some(old.id.as_str()), Some(old.reply_to.as_str()))
    );
    // Its seat holds the metadata it queued with and is bound to its lease.
    let raw: String = con.hget(&k.sessions, "old").await.unwrap();
    assert_eq!(
        SessionRecord::parse(&raw),
        Some(SessionRecord {
            acquired_at_ms: freed.now_ms,
            heartbeats: 0,
            lease_hash: Some(hash),
            meta: old.meta,
        })
    );
    let unleased = direct(&settings, "lic", "old").heartbeat(&mut con).await;
    assert_eq!(unleased.status(), Status::LeaseMismatch);
    let beat = direct(&settings, "lic", "old")
        .with_lease(Some(LEASE))
        .heartbeat(&mut con)
        .await;
    assert_eq!(beat.status(), Status::HeartbeatUpdated);
}

#[tokio::test]
async fn a_waiter_record_holds_its_time_in_base_36_at_every_width() {
    // Redirected JSON records carry any time: the compact form writes eight
    // digits (leading zeros included) up to 36^8 ms (2059), more past it.
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let k = license_keys(&settings, "lic");
    run(&mut con, &settings, "lic", Req::Acquire("holder", 0)).await;
    let now = redis_ms(&mut con).await;
    for (session, at, digits) in [
        ("zero", 0_i64, "00000000"),
        ("early", 35, "0000000z"),
        ("last", 2_821_109_907_455, "zzzzzzzz"),
        ("past", 2_821_109_907_456, "100000000"),
        ("far", 9_007_199_254_740_991, "2gosa7pa2gv"),
    ] {
        let json = format!(r#"{{"id":"req-1","reply_to":"","meta":"{{}}","queued_at":{at}}}"#);
        place_waiter(&mut con, &k, session, 1, now + 60_000, &json).await;
        let again = direct(&settings, "lic", session)
            .queue(&mut con, 60_000, "req-2", &reply_stream(&settings, session))
            .await;
        assert_eq!(again.status(), Status::Queued, "{session}");
        let raw: String = con.hget(&k.waiters, session).await.unwrap();
        assert_eq!(raw, format!("{digits}.req-2\n*{session}\n{{}}"), "{session}");
        assert_eq!(
            WaiterRecord::parse(&raw).map(|w| w.queued_at),
            Some(at),
            "{raw:?}"
        );
    }
}

#[tokio::test]
async fn a_foreign_json_waiter_record_is_redirected_in_the_json_form() {
    // A JSON record no script wrote (a time no clock gives), re-sent to: the
    // compact form cannot hold its time exactly (nor loop over a negative
    // one), so the redirect keeps it JSON, the time as it was.
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let k = license_keys(&settings, "lic");
    run(&mut con, &settings, "lic", Req::Acquire("holder", 0)).await;
    let now = redis_ms(&mut con).await;
    for (session, at) in [("negative", "-1500"), ("fraction", "1.5")] {
        let json = format!(r#"{{"id":"req-1","reply_to":"","meta":"{{}}","queued_at":{at}}}"#);
        place_waiter(&mut con, &k, session, 1, now + 60_000, &json).await;
        let again = direct(&settings, "lic", session)
            .queue(&mut con, 60_000, "req-2", &reply_stream(&settings, session))
            .await;
        assert_eq!(again.status(), Status::Queued, "{session}");
        let raw: String = con.hget(&k.waiters, session).await.unwrap();
        let record: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(
            (
                record["id"].as_str(),
                record["queued_at"].to_string(),
                record["reply_to"].as_str()
            ),
            (
                Some("req-2"),
                at.to_owned(),
                Some(reply_stream(&settings, session).as_str())
            ),
            "{raw}"
        );
    }
}

#[tokio::test]
async fn a_waiter_whose_request_id_holds_a_newline_is_kept_in_the_json_form() {
    // The protocol refuses such an id; a direct caller of the scripts may
    // still pass one, and its record must not be misread.
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 1).await;
    let k = license_keys(&settings, "lic");
    run(&mut con, &settings, "lic", Req::Acquire("holder", 0)).await;
    let id = "line one\nline two";
    let queued = direct(&settings, "lic", "w")
        .with_meta(meta_of("w"))
        .queue(&mut con, 60_000, id, &reply_stream(&settings, "w"))
        .await;
    assert_eq!(queued.status(), Status::Queued);
    let raw: String = con.hget(&k.waiters, "w").await.unwrap();
    assert!(raw.starts_with('{'), "{raw:?}");
    assert_eq!(
        WaiterRecord::parse(&raw),
        Some(WaiterRecord {
            id: id.into(),
            reply_to: reply_stream(&settings, "w"),
            meta: meta_of("w"),
            queued_at: queued.now_ms,
            lease_hash: None,
        })
    );
    let freed = run(&mut con, &settings, "lic", Req::Release("holder")).await;
    let note = &freed.notes[0];
    assert_eq!((note.status, note.request_id.as_str()), (Status::Granted, id));
}

/// One step of lua/reap.lua on `license`, its notes left in the outbox as
/// on a cluster (on one node the step writes their replies itself:
/// [`a_reap_step_on_one_node_writes_its_queue_replies_itself`]).
async fn reap(
    con: &mut Db,
    s: &Settings,
    license: &str,
    limit: usize,
    redeliver_after_ms: u64,
    outbox: &OutboxCursor,
) -> Reaped {
    let args = ReapArgs {
        default_timeout_ms: 90_000,
        default_claim_ms: 10_000,
        limit,
        redeliver_after_ms,
        outbox,
        outage: Default::default(),
    };
    let mut keys = license_keys(s, license);
    keys.events.queue_replies = None;
    Scripts::get().reap(&keys, &args).run(con).await.unwrap()
}

/// The reaper's work on `license` (1 seat, a 50 ms heartbeat timeout): "a"
/// holds the seat and has gone stale, "b" waits for a minute (and has just
/// shown it is alive), "c" for a millisecond that has passed.
async fn stale_holder_and_two_waiters(con: &mut Db, s: &Settings) {
    provision(s, "lic", &seats_with_timeout(1, 50)).await;
    run(con, s, "lic", Req::Acquire("a", 0)).await;
    run(con, s, "lic", Req::Acquire("b", 60_000)).await;
    run(con, s, "lic", Req::Acquire("c", 1)).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let alive = run(con, s, "lic", Req::Heartbeat("b")).await;
    assert_eq!(
        alive.decision,
        Decision::Queued {
            position: 1,
            priority: 0
        },
        "a waiter's heartbeat keeps its place"
    );
}

/// On one node a reaper step that evicts a holder and grants its seat, or
/// ends a wait, writes the waiter's GRANTED or QUEUE_TIMEOUT itself, in the
/// same step, and leaves nothing in the outbox: the reaper has nothing to
/// deliver, and nothing a crash could leave undelivered.
#[tokio::test]
async fn a_reap_step_on_one_node_writes_its_queue_replies_itself() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    stale_holder_and_two_waiters(&mut con, &settings).await;
    let args = ReapArgs {
        default_timeout_ms: 90_000,
        default_claim_ms: 10_000,
        limit: 10,
        redeliver_after_ms: 0,
        outbox: &OutboxCursor::start(),
        outage: Default::default(),
    };
    let k = license_keys(&settings, "lic");
    let step = Scripts::get().reap(&k, &args).run(&mut con).await.unwrap();
    assert_eq!(step.evicted, ["a"]);
    let got: Vec<(Status, &str, Delivery)> = step
        .notes
        .iter()
        .map(|n| (n.status, n.session.as_str(), n.delivery))
        .collect();
    assert_eq!(
        got,
        [
            (Status::QueueTimeout, "c", Delivery::Sent),
            (Status::Granted, "b", Delivery::Sent)
        ]
    );
    assert_eq!(
        outbox_len(&settings, "lic").await,
        0,
        "nothing left for the reaper to deliver"
    );
    for (session, status) in [("b", "GRANTED"), ("c", "QUEUE_TIMEOUT")] {
        let replies = stream_entries(&mut con, &reply_stream(&settings, session)).await;
        let answers: Vec<(&str, &str)> = replies
            .iter()
            .map(|r| (r["status"].as_str(), r["id"].as_str()))
            .collect();
        let id = format!("req-{session}");
        assert_eq!(answers, [(status, id.as_str())], "{session}");
    }
    let granted = stream_entries(&mut con, &reply_stream(&settings, "b")).await;
    assert_eq!(granted[0]["heartbeat_timeout_ms"], "50");
    assert_eq!(granted[0]["held_since_ms"], step.now_ms.to_string());
    // A second step finds nothing to hand out again.
    let again = Scripts::get().reap(&k, &args).run(&mut con).await.unwrap();
    assert!(again.redeliver.is_empty() && again.notes.is_empty());
}

#[tokio::test]
async fn reap_answers_the_documented_step() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    stale_holder_and_two_waiters(&mut con, &settings).await;

    let before = redis_ms(&mut con).await;
    let step = reap(&mut con, &settings, "lic", 10, 3_600_000, &OutboxCursor::start()).await;
    let after = redis_ms(&mut con).await;
    assert!((before..=after).contains(&step.now_ms));
    assert_eq!(step.evicted, ["a"]);
    let (reply_b, reply_c) = (reply_stream(&settings, "b"), reply_stream(&settings, "c"));
    let notes: Vec<(Status, &str, &str, &str)> = step
        .notes
        .iter()
        .map(|n| {
            (
                n.status,
                n.session.as_str(),
                n.request_id.as_str(),
                n.reply_to.as_str(),
            )
        })
        .collect();
    assert_eq!(
        notes,
        [
            (Status::QueueTimeout, "c", "req-c", reply_c.as_str()),
            (Status::Granted, "b", "req-b", reply_b.as_str())
        ],
        "the timeout first, then the grant"
    );
    for n in &step.notes {
        assert_eq!(n.note_id, format!("{}:{}:{}", n.status, n.session, step.now_ms));
        assert!(n.waited_ms >= 100, "{n:?}");
    }
    assert_eq!(
        (step.seats_used, step.seats_total, step.queue_depth, step.more),
        (1, 1, 0, false)
    );
    assert!(step.redeliver.is_empty(), "the notes it just made are not due");
    assert!(step.outbox.is_done());
    // The due index times: b's seat, granted now, goes stale after its 50
    // ms; the notes left in the outbox are due only after the hour given.
    assert_eq!(
        (step.stale_ms, step.due_ms, step.heartbeat_timeout_ms),
        (Some(step.now_ms + 51), Some(step.now_ms + 3_600_000), Some(50))
    );

    // Nobody delivered them: once due, a step hands both out again, as notes.
    let again = reap(&mut con, &settings, "lic", 10, 0, &OutboxCursor::start()).await;
    assert!(again.evicted.is_empty() && again.notes.is_empty());
    let mut redelivered = again.redeliver.clone();
    redelivered.sort_by(|x, y| x.note_id.cmp(&y.note_id));
    let mut made = step.notes.clone();
    made.sort_by(|x, y| x.note_id.cmp(&y.note_id));
    // The grant's seat is still held: its heartbeat clock starts again as
    // it is handed out, and the GRANTED says so.
    for note in &mut made {
        if note.status == Status::Granted {
            note.held_since_ms = Some(again.now_ms);
        }
    }
    assert_eq!(redelivered, made);
    assert!(!again.more && again.outbox.is_done());
    // A pass that has scanned the outbox through skips it.
    let through = reap(&mut con, &settings, "lic", 10, 0, &again.outbox).await;
    assert!(through.redeliver.is_empty());

    // More stale sessions than the limit: `more` until all are gone.
    provision(&settings, "big", &seats_with_timeout(3, 50)).await;
    for s in ["x", "y", "z"] {
        run(&mut con, &settings, "big", Req::Acquire(s, 0)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let first = reap(&mut con, &settings, "big", 2, 3_600_000, &OutboxCursor::start()).await;
    assert_eq!((first.evicted.len(), first.more, first.seats_used), (2, true, 1));
    let second = reap(&mut con, &settings, "big", 2, 3_600_000, &first.outbox).await;
    assert_eq!(
        (second.evicted.len(), second.more, second.seats_used),
        (1, false, 0)
    );
    assert_eq!(
        (second.stale_ms, second.due_ms),
        (None, None),
        "nothing left for the reaper"
    );
}

/// More undelivered outbox notes than a step's limit, under both hash
/// encodings (HSCAN pages a hashtable, and its pages grow over further
/// buckets as notes are deleted; it returns a listpack whole), with every
/// delivery succeeding (each note deleted after its step) or failing (left
/// in place): every note is handed out exactly once over several steps, none
/// more than the limit at a time, and the scan ends.
#[tokio::test]
async fn outbox_redelivery_is_bounded_per_step_and_reaches_every_note() {
    let mut cases = Vec::new();
    for extra in [&[][..], &["--hash-max-listpack-value", "256"][..]] {
        for delivered in [true, false] {
            let redis = RedisServer::start_with(extra).await;
            let settings = redis.settings();
            put_license(&settings, "lic", 0).await;
            let mut con = db(&settings).await;
            let outbox_key = license_keys(&settings, "lic").outbox;
            let sessions: Vec<String> = (0..20).map(|i| format!("w{i:02}")).collect();
            for s in &sessions {
                // Their notes left in the outbox, as on a cluster.
                let session = direct(&settings, "lic", s).via_outbox();
                let o = run_as(&mut con, &settings, session, Req::Acquire(s, 1)).await;
                assert_eq!(o.status(), Status::Queued);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            // The waits ran out (seen by later acquires or by this step) and
            // nobody delivered the timeouts: all 20 stay in the outbox.
            reap(&mut con, &settings, "lic", 100, 3_600_000, &OutboxCursor::start()).await;
            let mut want: Vec<String> = con.hkeys(&outbox_key).await.unwrap();
            assert_eq!(want.len(), 20);
            let outbox_encoding = encoding(&mut con, &outbox_key).await;
            let case = format!("{outbox_encoding}, delivered: {delivered}");

            let mut outbox = OutboxCursor::start();
            let mut seen = Vec::new();
            let mut steps = 0;
            loop {
                let step = reap(&mut con, &settings, "lic", 7, 0, &outbox).await;
                steps += 1;
                let n = step.redeliver.len();
                assert!(n <= 7, "{case}: {n} in one step");
                for note in step.redeliver {
                    if delivered {
                        let _: i64 = con.hdel(&outbox_key, &note.note_id).await.unwrap();
                    }
                    seen.push(note.note_id);
                }
                outbox = step.outbox;
                if !step.more {
                    break;
                }
                assert!(steps < 100, "{case}: the scan does not end");
            }
            assert!(outbox.is_done());
            assert!(steps >= 3, "{case}: 20 notes need at least 3 steps of 7");
            seen.sort();
            want.sort();
            assert_eq!(seen, want, "{case}: every note exactly once");
            cases.push(outbox_encoding);
        }
    }
    assert_eq!(cases, ["hashtable", "hashtable", "listpack", "listpack"]);
}

/// One step of lua/delete_license.lua ending at most one seat and one wait.
async fn delete_step(con: &mut Db, k: &seatgate_core::keys::LicenseKeys) -> seatgate_core::scripts::Deleted {
    Scripts::get()
        .delete_license(k, 1, "test")
        .run(con)
        .await
        .unwrap()
}

/// lua/delete_license.lua in steps of one: the record goes with the first,
/// each ends a seat and a wait (a LICENSE_NOT_FOUND note in the outbox, as
/// a QUEUE_TIMEOUT's), the last removes every other key; reap.lua ends a
/// license whose record was deleted behind seatgate's back the same way.
#[tokio::test]
async fn deleting_a_license_ends_its_seats_and_waits_in_bounded_steps() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "cad", 2).await;
    for (session, wait_ms) in [("a", 0), ("b", 0), ("w1", 60_000), ("w2", 60_000)] {
        run(&mut con, &settings, "cad", Req::Acquire(session, wait_ms)).await;
    }
    let k = license_keys(&settings, "cad");
    let first = delete_step(&mut con, &k).await;
    assert!(first.existed && first.more);
    assert_eq!(first.ended, ["a"]);
    let note = &first.notes[0];
    assert_eq!(
        (note.status, note.session.as_str(), note.request_id.as_str()),
        (Status::LicenseNotFound, "w1", "req-w1")
    );
    assert_eq!(note.reply_to, reply_stream(&settings, "w1"));
    assert_eq!(note.note_id, format!("LICENSE_NOT_FOUND:w1:{}", first.now_ms));
    // From the first step on, the license is gone for every request.
    let late = run(&mut con, &settings, "cad", Req::Acquire("late", 60_000)).await;
    assert_eq!(late.status(), Status::LicenseNotFound);

    let second = delete_step(&mut con, &k).await;
    assert!(!second.existed && second.more);
    assert_eq!(second.ended, ["b"]);
    assert_eq!(second.notes[0].session, "w2");
    let last = delete_step(&mut con, &k).await;
    assert!(!last.existed && !last.more && last.ended.is_empty() && last.notes.is_empty());
    // Only the outbox is left, holding the two final replies.
    for key in k.all() {
        let exists: bool = con.exists(key).await.unwrap();
        assert_eq!(exists, key == k.outbox, "{key}");
    }
    let outbox: usize = con.hlen(&k.outbox).await.unwrap();
    assert_eq!(outbox, 2);

    // Behind seatgate's back: a plain DEL of the record; the next reap step
    // ends the seat and the wait, and reports the outbox due.
    put_license(&settings, "lab", 1).await;
    run(&mut con, &settings, "lab", Req::Acquire("x", 0)).await;
    run(&mut con, &settings, "lab", Req::Acquire("y", 60_000)).await;
    let _: i64 = con.del(license_keys(&settings, "lab").license).await.unwrap();
    let gone = reap(&mut con, &settings, "lab", 10, 3_000, &OutboxCursor::start()).await;
    assert_eq!(gone.deleted, ["x"]);
    assert!(gone.evicted.is_empty());
    let notes: Vec<(Status, &str)> = gone
        .notes
        .iter()
        .map(|n| (n.status, n.session.as_str()))
        .collect();
    assert_eq!(notes, [(Status::LicenseNotFound, "y")]);
    assert_eq!(
        (
            gone.seats_used,
            gone.queue_depth,
            gone.more,
            gone.stale_ms,
            gone.due_ms
        ),
        (0, 0, false, None, Some(gone.now_ms + 3_000))
    );
}

/// lua/put_license.lua writes only over the record as it was read: a stale
/// read writes nothing. So `license put`'s check of the merged record holds
/// for what it writes: of two changes that each fit alone but not together
/// (reservations beyond the seats), racing, one is written and the other,
/// re-read and re-checked, refused.
#[tokio::test]
async fn a_license_change_is_written_only_over_the_record_it_checked() {
    use seatgate_core::license::LicenseChange;
    use seatgate_core::policy::LicensePolicy;
    use seatgate_core::provision;
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "cas", 2).await;
    let lk = license_keys(&s, "cas");
    let key = lk.license.clone();
    let read: std::collections::HashMap<String, String> = con.hgetall(&key).await.unwrap();
    let (f, v) = ("max_per_user".to_owned(), "1".to_owned());
    let _: () = con.hset(&key, "queue_max", "5").await.unwrap();
    let stale: Vec<(&String, &String)> = read.iter().collect();
    let scripts = Scripts::get();
    let one = [(&f, &v)];
    let put = |read, set, remove| seatgate_core::scripts::PutLicense {
        actor: "test",
        before: "{}".to_owned(),
        after: "{}".to_owned(),
        read,
        set,
        remove,
    };
    assert!(!scripts
        .put_license(&mut con, &lk, &put(&stale, &one, &[]))
        .await
        .unwrap());
    let now: std::collections::HashMap<String, String> = con.hgetall(&key).await.unwrap();
    assert!(!now.contains_key("max_per_user"), "a stale read writes nothing");
    let fresh: Vec<(&String, &String)> = now.iter().collect();
    let queue_max = "queue_max".to_owned();
    assert!(scripts
        .put_license(&mut con, &lk, &put(&fresh, &one, &[&queue_max]))
        .await
        .unwrap());
    let now: std::collections::HashMap<String, String> = con.hgetall(&key).await.unwrap();
    assert_eq!(now.get("max_per_user"), Some(&v));
    assert!(!now.contains_key("queue_max"));

    let reserve = |group: &str| LicenseChange {
        policy: LicensePolicy {
            group_reserve: [(group.to_owned(), 2)].into(),
            ..LicensePolicy::default()
        },
        ..LicenseChange::default()
    };
    for round in 0..20 {
        let license = format!("race-{round}");
        put_license(&s, &license, 2).await;
        let (a, b) = (reserve("a"), reserve("b"));
        let (mut c1, mut c2) = (db(&s).await, db(&s).await);
        let k = keys(&s);
        let (ra, rb) = tokio::join!(
            provision::change(&mut c1, &k, &license, &a, "test"),
            provision::change(&mut c2, &k, &license, &b, "test")
        );
        assert_eq!(
            [ra.is_ok(), rb.is_ok()].iter().filter(|ok| **ok).count(),
            1,
            "round {round}: {ra:?} {rb:?}"
        );
        let record: std::collections::HashMap<String, String> =
            con.hgetall(license_keys(&s, &license).license).await.unwrap();
        let reserves = record.keys().filter(|f| f.starts_with("group_reserve:")).count();
        assert_eq!(reserves, 1, "round {round}: {record:?}");
    }
}

/// The names lua/includes/keys.lua derives from the license record's key
/// (issue 24: the scripts are handed one key and derive the others) are
/// engine::keys's, the one Rust source of key names, for every key a script
/// touches, under a prefix of the deployment's own and an id with every
/// character an id may hold.
#[tokio::test]
async fn the_scripts_derive_the_license_keys_engine_keys_names() {
    const SCRIPT: &str = r#"local rcall = redis.call
--- @include "keys"
local out = {}
for i, name in ipairs(ARGV) do
  if name == 'session_rate' then
    out[i] = K.license_rate .. ':' .. 'sess-1'
  else
    out[i] = K[name]
  end
end
return out
"#;
    let TestApp(_redis, _settings, mut con) = spawn_app().await;
    let script = redis::Script::new(&seatgate_core::scripts::with_includes(SCRIPT).unwrap());
    for (prefix, license) in [("seat", "acme-pro"), ("tenant.a:seat", "A.b_c-d:e@f9")] {
        let keys = seatgate_core::keys::Keys::new(prefix);
        let k = keys.license(license);
        let expected: Vec<(&str, String)> = vec![
            ("license", k.license.clone()),
            ("holders", k.holders.clone()),
            ("sessions", k.sessions.clone()),
            ("queue", k.queue.clone()),
            ("waiters", k.waiters.clone()),
            ("queue_by_group", k.queue_by_group.clone()),
            ("queue_by_user", k.queue_by_user.clone()),
            ("deadlines", k.deadlines.clone()),
            ("alive", k.alive.clone()),
            ("queue_seq", k.queue_seq.clone()),
            ("outbox", k.outbox.clone()),
            ("owners", k.owners.clone()),
            ("lingering", k.lingering.clone()),
            ("borrowed", k.borrowed.clone()),
            ("revoked", k.revoked.clone()),
            ("revocations", k.revocations.clone()),
            ("groups", k.groups.clone()),
            ("denials", keys.denials(license)),
            ("event_seq", k.events.seq.clone()),
            ("deleted", keys.deleted(license)),
            ("license_rate", keys.license_rate(license)),
            ("session_rate", keys.session_rate(license, "sess-1")),
            ("done", keys.dedupe(license, 29_933_565)),
            ("done_before", keys.dedupe(license, 29_933_564)),
        ];
        // Every key of LicenseKeys::all is among them.
        for key in k.all() {
            assert!(expected.iter().any(|(_, e)| e == key), "{key}");
        }
        let mut call = script.prepare_invoke();
        call.key(&k.license)
            .key(&k.events.target)
            .key(keys.dedupe(license, 29_933_565))
            .key(keys.dedupe(license, 29_933_564));
        for (name, _) in &expected {
            call.arg(*name);
        }
        let got: Vec<String> = call.invoke_async(&mut con).await.unwrap();
        let want: Vec<String> = expected.iter().map(|(_, e)| e.clone()).collect();
        assert_eq!(got, want, "{prefix} {license}");
    }
}

/// The license's holders, each with its session record, and nothing else in
/// either key.
async fn assert_holders_whole(con: &mut Db, s: &Settings, license: &str, want: usize) {
    let k = license_keys(s, license);
    let held: Vec<String> = con.zrange(&k.holders, 0, -1).await.unwrap();
    let records: std::collections::HashMap<String, String> = con.hgetall(&k.sessions).await.unwrap();
    assert_eq!((held.len(), records.len()), (want, want));
    for session in &held {
        let record = records.get(session).expect("every holder has its session record");
        assert!(SessionRecord::parse(record).is_some(), "{session}: {record}");
    }
}

#[tokio::test]
async fn a_license_with_many_holders_keeps_them_hashed_and_whole() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    listpack_values_as_ops_conf(&mut con).await;
    let k = license_keys(&s, "big");
    put_license(&s, "big", 40).await;
    // Each seat counted for its user (and its owner record): the owners hash.
    let as_user = |n: u32| {
        direct(&s, "big", &format!("s{n}")).with_policy(RequestPolicy {
            user: Some(format!("u{}", n % 4)),
            ..RequestPolicy::NONE
        })
    };
    for n in 1..=31 {
        let o = as_user(n).acquire(&mut con).await;
        assert_eq!((o.status(), o.seats_used), (Status::Acquired, i64::from(n)));
    }
    // Under 32 holders all three stay compact.
    assert_eq!(encoding(&mut con, &k.holders).await, "listpack");
    assert_eq!(encoding(&mut con, &k.sessions).await, "listpack");
    assert_eq!(encoding(&mut con, &k.owners).await, "listpack");
    let o = as_user(32).acquire(&mut con).await;
    assert_eq!((o.status(), o.seats_used), (Status::Acquired, 32));
    // The 32nd seat turns them into Redis's hashed encodings, for good.
    assert_eq!(encoding(&mut con, &k.holders).await, "skiplist");
    assert_eq!(encoding(&mut con, &k.sessions).await, "hashtable");
    assert_eq!(encoding(&mut con, &k.owners).await, "hashtable");
    assert_holders_whole(&mut con, &s, "big", 32).await;
    let owners: std::collections::HashMap<String, String> = con.hgetall(&k.owners).await.unwrap();
    assert_eq!(
        owners.len(),
        32 + 4,
        "an owner record a holder and a count a user, nothing else"
    );
    assert_eq!(owners["u:u1"], "8");
    for n in 20..=32 {
        let o = as_user(n).release(&mut con).await;
        assert_eq!(o.status(), Status::Released);
    }
    let owners: std::collections::HashMap<String, String> = con.hgetall(&k.owners).await.unwrap();
    assert_eq!(owners.len(), 19 + 4);
    assert_eq!(encoding(&mut con, &k.holders).await, "skiplist");
    assert_holders_whole(&mut con, &s, "big", 19).await;
    let o = direct(&s, "big", "s7").heartbeat(&mut con).await;
    assert_eq!(o.status(), Status::HeartbeatUpdated);

    // The 32nd seat given by a grant: 31 seats full, one waiter, one seat more.
    let q = license_keys(&s, "granted");
    put_license(&s, "granted", 31).await;
    for n in 1..=31 {
        direct(&s, "granted", &format!("s{n}")).acquire(&mut con).await;
    }
    let reply_to = reply_stream(&s, "waiter");
    let o = direct(&s, "granted", "w1")
        .queue(&mut con, 60_000, "req-w1", &reply_to)
        .await;
    assert_eq!(o.status(), Status::Queued);
    assert_eq!(encoding(&mut con, &q.holders).await, "listpack");
    set_license_field(&mut con, &s, "granted", "seats_total", "32").await;
    let o = direct(&s, "granted", "late").acquire(&mut con).await;
    assert_eq!((o.status(), o.seats_used), (Status::NoSeatsAvailable, 32));
    let held: Vec<String> = con.zrange(&q.holders, 0, -1).await.unwrap();
    assert!(held.contains(&"w1".to_owned()), "w1 granted");
    assert_eq!(encoding(&mut con, &q.holders).await, "skiplist");
    assert_eq!(encoding(&mut con, &q.sessions).await, "hashtable");
    assert_holders_whole(&mut con, &s, "granted", 32).await;
}

#[tokio::test]
async fn a_worker_user_that_may_not_run_object_encoding_still_decides_every_seat() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    // The worker's ACL as it was before the scripts called OBJECT ENCODING.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("legacy-worker")
        .arg("on")
        .arg(">legacy-secret")
        .arg("~*")
        .arg("+@all")
        .arg("-object")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut legacy = s.clone();
    legacy.redis.username = "legacy-worker".to_owned();
    legacy.redis.password = "legacy-secret".to_owned().into();
    let mut as_legacy = db(&legacy).await;
    let refused: redis::RedisResult<String> = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg("any")
        .query_async(&mut as_legacy)
        .await;
    assert!(refused.is_err(), "the user may not run OBJECT");
    put_license(&s, "big", 40).await;
    for n in 1..=33 {
        let o = direct(&s, "big", &format!("s{n}")).acquire(&mut as_legacy).await;
        assert_eq!((o.status(), o.seats_used), (Status::Acquired, n));
    }
    // Left as they were: compact, and whole.
    let k = license_keys(&s, "big");
    assert_eq!(encoding(&mut con, &k.holders).await, "listpack");
    assert_holders_whole(&mut con, &s, "big", 33).await;
    let o = direct(&s, "big", "s1").release(&mut as_legacy).await;
    assert_eq!(o.status(), Status::Released);
}

#[tokio::test]
async fn a_queue_past_128_waiters_keeps_its_waiters_hashed_and_served_in_order() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    listpack_values_as_ops_conf(&mut con).await;
    let k = license_keys(&s, "busy");
    put_license(&s, "busy", 1).await;
    assert_eq!(
        direct(&s, "busy", "h").acquire(&mut con).await.status(),
        Status::Acquired
    );
    let reply_to = reply_stream(&s, "waiters");
    let wait = |n: u32| direct(&s, "busy", &format!("w{n}"));
    for n in 1..=255 {
        let o = wait(n)
            .queue(&mut con, 600_000, &format!("req-{n}"), &reply_to)
            .await;
        assert_eq!(o.status(), Status::Queued, "w{n}");
    }
    // 255 arrivals: checked at the 128th (a queue of 128, compact) only.
    assert_eq!(encoding(&mut con, &k.queue).await, "skiplist");
    assert_eq!(encoding(&mut con, &k.waiters).await, "listpack");
    let o = wait(256).queue(&mut con, 600_000, "req-256", &reply_to).await;
    assert_eq!(o.status(), Status::Queued);
    assert_eq!(encoding(&mut con, &k.waiters).await, "hashtable");
    let records: std::collections::HashMap<String, String> = con.hgetall(&k.waiters).await.unwrap();
    assert_eq!(records.len(), 256, "every waiter's record, nothing else");
    assert!(records.values().all(|r| WaiterRecord::parse(r).is_some()));
    // Still served in order.
    assert_eq!(
        direct(&s, "busy", "h").release(&mut con).await.status(),
        Status::Released
    );
    assert_eq!(holders(&s, "busy").await, ["w1"]);
    let left: i64 = con.hlen(&k.waiters).await.unwrap();
    assert_eq!(left, 255);
}

#[tokio::test]
async fn past_4096_licenses_the_caches_start_afresh_and_every_call_decides_as_before() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    const LICENSES: usize = 4200;
    let mut provision = redis::pipe();
    for n in 0..LICENSES {
        provision
            .hset_multiple(
                license_keys(&s, &format!("l{n}")).license,
                &[("seats_total", "1"), ("active", "1")],
            )
            .ignore();
    }
    let _: () = provision.query_async(&mut con).await.unwrap();
    // One seat taken of each: the library's license caches (keys.lua,
    // license.lua) fill past their 4,096 and start afresh.
    for n in 0..LICENSES {
        let o = direct(&s, &format!("l{n}"), "a").acquire(&mut con).await;
        assert_eq!((o.status(), o.seats_used), (Status::Acquired, 1), "l{n}");
    }
    // Licenses first seen before the restart decide from Redis as before.
    for n in 0..10 {
        let o = direct(&s, &format!("l{n}"), "b").acquire(&mut con).await;
        assert_eq!((o.status(), o.seats_used), (Status::NoSeatsAvailable, 1), "l{n}");
    }
    set_license_field(&mut con, &s, "l0", "seats_total", "2").await;
    let o = direct(&s, "l0", "b").acquire(&mut con).await;
    assert_eq!(
        (o.status(), o.seats_used, o.seats_total),
        (Status::Acquired, 2, 2)
    );
    let last = format!("l{}", LICENSES - 1);
    assert_eq!(
        direct(&s, &last, "a").release(&mut con).await.status(),
        Status::Released
    );
    assert_eq!(holders(&s, &last).await, Vec::<String>::new());
}
