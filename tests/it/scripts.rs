//! The seat scripts called directly (the seed's own path), against a real Redis.

use redis::AsyncCommands;
use seatgate::engine::keys::Keys;
use seatgate::engine::license::{self, LicenseSpec};
use seatgate::engine::scripts::{Guard, Outcome, Scripts};
use seatgate::engine::status::Status;

use crate::support::{put_license, RedisServer, RedisServerExt};

fn keys(license: &str) -> seatgate::engine::keys::LicenseKeys {
    Keys::new("seat").license(license)
}

/// The seed's direct path: no redelivery dedupe, no rate limits.
fn guard(license: &str, session: &str) -> Guard {
    Guard::none(&Keys::new("seat"), license, session)
}

async fn acquire(con: &mut redis::aio::MultiplexedConnection, license: &str, session: &str) -> Outcome {
    Scripts::get()
        .acquire(
            con,
            &keys(license),
            &guard(license, session),
            session,
            r#"{"user_email":"dev@example.com"}"#,
            0,
            "req",
            "",
            1000,
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn acquire_takes_a_seat_and_records_the_session() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 5).await;
    let mut con = redis.con().await;

    let o = acquire(&mut con, "lic", "s1").await;
    assert_eq!((o.status, o.seats_used, o.seats_total), (Status::Acquired, 1, 5));

    let k = keys("lic");
    let beat: Option<i64> = con.zscore(&k.holders, "s1").await.unwrap();
    let record: String = con.hget(&k.sessions, "s1").await.unwrap();
    let acquired_at = beat.expect("holder has a heartbeat score");
    assert_eq!(
        record,
        format!(r#"{acquired_at}:0:{{"user_email":"dev@example.com"}}"#)
    );
}

#[tokio::test]
async fn acquire_is_idempotent_per_session() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 5).await;
    let mut con = redis.con().await;
    assert_eq!(acquire(&mut con, "lic", "s1").await.status, Status::Acquired);
    let again = acquire(&mut con, "lic", "s1").await;
    assert_eq!((again.status, again.seats_used), (Status::AlreadyActive, 1));
}

#[tokio::test]
async fn no_seats_available_when_all_are_held() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 2).await;
    let mut con = redis.con().await;
    for s in ["a", "b"] {
        assert_eq!(acquire(&mut con, "lic", s).await.status, Status::Acquired);
    }
    let o = acquire(&mut con, "lic", "c").await;
    assert_eq!(
        (o.status, o.seats_used, o.seats_total),
        (Status::NoSeatsAvailable, 2, 2)
    );
    assert_eq!(crate::support::holders(&redis, "lic").await, ["a", "b"]);
}

#[tokio::test]
async fn release_frees_only_the_sessions_own_seat() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 1).await;
    let mut con = redis.con().await;
    acquire(&mut con, "lic", "s1").await;
    let s = Scripts::get();

    let o = s
        .release(
            &mut con,
            &keys("lic"),
            &guard("lic", "someone-else"),
            "someone-else",
        )
        .await
        .unwrap();
    assert_eq!((o.status, o.seats_used), (Status::SessionNotFound, 1));
    let o = s
        .release(&mut con, &keys("lic"), &guard("lic", "s1"), "s1")
        .await
        .unwrap();
    assert_eq!((o.status, o.seats_used, o.seats_total), (Status::Released, 0, 1));
    let record: Option<String> = con.hget(&keys("lic").sessions, "s1").await.unwrap();
    assert_eq!(record, None, "metadata removed with the seat");
    assert_eq!(
        acquire(&mut con, "lic", "s2").await.status,
        Status::Acquired,
        "the seat is free again"
    );
}

#[tokio::test]
async fn heartbeat_moves_the_clock_and_counts() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 3).await;
    let mut con = redis.con().await;
    let s = Scripts::get();
    let o = s
        .heartbeat(&mut con, &keys("lic"), &guard("lic", "ghost"), "ghost")
        .await
        .unwrap();
    assert_eq!(o.status, Status::SessionNotActive);

    acquire(&mut con, "lic", "s1").await;
    let before: i64 = con.zscore(&keys("lic").holders, "s1").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for n in 1..=2 {
        let o = s
            .heartbeat(&mut con, &keys("lic"), &guard("lic", "s1"), "s1")
            .await
            .unwrap();
        assert_eq!(
            (o.status, o.heartbeats, o.seats_used),
            (Status::HeartbeatUpdated, Some(n), 1)
        );
    }
    let after: i64 = con.zscore(&keys("lic").holders, "s1").await.unwrap();
    assert!(after > before, "last heartbeat {after} should be after {before}");
    let record: String = con.hget(&keys("lic").sessions, "s1").await.unwrap();
    assert!(record.starts_with(&format!("{before}:2:")), "{record}");
}

#[tokio::test]
async fn license_state_is_checked_inside_the_script() {
    let redis = RedisServer::start_with(&[]);
    let mut con = redis.con().await;
    let ks = Keys::new("seat");
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
            license::put(&mut con, &ks, id, &spec).await.unwrap();
        }
        let before = crate::support::holders(&redis, id).await;
        let o = acquire(&mut con, id, "s1").await;
        assert_eq!(o.status, expected, "license {id}");
        if expected != Status::Acquired {
            assert_eq!(
                crate::support::holders(&redis, id).await,
                before,
                "{id}: refusal changed state"
            );
        }
    }
}

#[tokio::test]
async fn lowering_seats_evicts_nobody_but_refuses_new_acquires() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 3).await;
    let mut con = redis.con().await;
    for s in ["a", "b", "c"] {
        acquire(&mut con, "lic", s).await;
    }
    put_license(&redis, "lic", 2).await;
    assert_eq!(
        crate::support::holders(&redis, "lic").await.len(),
        3,
        "nobody evicted"
    );
    let o = acquire(&mut con, "lic", "d").await;
    assert_eq!(
        (o.status, o.seats_used, o.seats_total),
        (Status::NoSeatsAvailable, 3, 2)
    );
    let s = Scripts::get();
    s.release(&mut con, &keys("lic"), &guard("lic", "a"), "a")
        .await
        .unwrap();
    assert_eq!(
        acquire(&mut con, "lic", "d").await.status,
        Status::NoSeatsAvailable,
        "2 of 2 still held"
    );
    s.release(&mut con, &keys("lic"), &guard("lic", "b"), "b")
        .await
        .unwrap();
    assert_eq!(acquire(&mut con, "lic", "d").await.status, Status::Acquired);
}

#[tokio::test]
async fn scripts_reload_after_script_flush() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 2).await;
    let mut con = redis.con().await;
    acquire(&mut con, "lic", "s1").await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    let exists: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(Scripts::get().hashes())
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(exists.iter().all(|e| !e), "flush removed the scripts");
    // EVALSHA answers NOSCRIPT; the call re-loads and succeeds.
    assert_eq!(acquire(&mut con, "lic", "s2").await.status, Status::Acquired);
    let o = Scripts::get()
        .heartbeat(&mut con, &keys("lic"), &guard("lic", "s1"), "s1")
        .await
        .unwrap();
    assert_eq!(o.status, Status::HeartbeatUpdated);
}

#[tokio::test]
async fn hundred_concurrent_acquirers_get_exactly_the_seats() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "load", 10).await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let url = redis.url();
        tasks.push(tokio::spawn(async move {
            let mut con = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            acquire(&mut con, "load", &format!("session-{i}")).await.status
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
    assert_eq!(crate::support::holders(&redis, "load").await.len(), 10);
}

#[tokio::test]
async fn a_retried_acquire_keeps_its_answer_after_the_license_changes() {
    let redis = RedisServer::start_with(&[]);
    put_license(&redis, "lic", 2).await;
    let mut con = redis.con().await;
    assert_eq!(acquire(&mut con, "lic", "s1").await.status, Status::Acquired);
    let spec = LicenseSpec {
        seats_total: 2,
        expires_at_ms: 0,
        active: false,
        heartbeat_timeout_ms: None,
    };
    license::put(&mut con, &Keys::new("seat"), "lic", &spec)
        .await
        .unwrap();
    assert_eq!(acquire(&mut con, "lic", "s1").await.status, Status::AlreadyActive);
    assert_eq!(
        acquire(&mut con, "lic", "s2").await.status,
        Status::LicenseInactive
    );
}
