//! The seat scripts called directly (the seed's own path), against a real Redis.

use redis::AsyncCommands;
use seatgate::engine::license::LicenseSpec;
use seatgate::engine::scripts::Scripts;
use seatgate::engine::status::Status;

use crate::support::{
    db, direct, holders, license_keys, provision, put_license, seats, RedisServer, RedisServerExt, META,
};

#[tokio::test]
async fn acquire_takes_a_seat_and_records_the_session() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 5).await;
    let mut con = db(&settings).await;

    let o = direct(&settings, "lic", "s1").acquire(&mut con).await;
    assert_eq!((o.status, o.seats_used, o.seats_total), (Status::Acquired, 1, 5));

    let k = license_keys(&settings, "lic");
    let beat: Option<i64> = con.zscore(&k.holders, "s1").await.unwrap();
    let record: String = con.hget(&k.sessions, "s1").await.unwrap();
    let acquired_at = beat.expect("holder has a heartbeat score");
    assert_eq!(record, format!("{acquired_at}:0:{META}"));
}

#[tokio::test]
async fn acquire_is_idempotent_per_session() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 5).await;
    let mut con = db(&settings).await;
    assert_eq!(
        direct(&settings, "lic", "s1").acquire(&mut con).await.status,
        Status::Acquired
    );
    let again = direct(&settings, "lic", "s1").acquire(&mut con).await;
    assert_eq!((again.status, again.seats_used), (Status::AlreadyActive, 1));
}

#[tokio::test]
async fn no_seats_available_when_all_are_held() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 2).await;
    let mut con = db(&settings).await;
    for s in ["a", "b"] {
        assert_eq!(
            direct(&settings, "lic", s).acquire(&mut con).await.status,
            Status::Acquired
        );
    }
    let o = direct(&settings, "lic", "c").acquire(&mut con).await;
    assert_eq!(
        (o.status, o.seats_used, o.seats_total),
        (Status::NoSeatsAvailable, 2, 2)
    );
    assert_eq!(holders(&settings, "lic").await, ["a", "b"]);
}

#[tokio::test]
async fn release_frees_only_the_sessions_own_seat() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 1).await;
    let mut con = db(&settings).await;
    direct(&settings, "lic", "s1").acquire(&mut con).await;

    let o = direct(&settings, "lic", "someone-else").release(&mut con).await;
    assert_eq!((o.status, o.seats_used), (Status::SessionNotFound, 1));
    let o = direct(&settings, "lic", "s1").release(&mut con).await;
    assert_eq!((o.status, o.seats_used, o.seats_total), (Status::Released, 0, 1));
    let record: Option<String> = con
        .hget(license_keys(&settings, "lic").sessions, "s1")
        .await
        .unwrap();
    assert_eq!(record, None, "metadata removed with the seat");
    assert_eq!(
        direct(&settings, "lic", "s2").acquire(&mut con).await.status,
        Status::Acquired,
        "the seat is free again"
    );
}

#[tokio::test]
async fn heartbeat_moves_the_clock_and_counts() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 3).await;
    let mut con = db(&settings).await;
    let o = direct(&settings, "lic", "ghost").heartbeat(&mut con).await;
    assert_eq!(o.status, Status::SessionNotActive);

    let s1 = direct(&settings, "lic", "s1");
    s1.acquire(&mut con).await;
    let k = license_keys(&settings, "lic");
    let before: i64 = con.zscore(&k.holders, "s1").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for n in 1..=2 {
        let o = s1.heartbeat(&mut con).await;
        assert_eq!(
            (o.status, o.heartbeats, o.seats_used),
            (Status::HeartbeatUpdated, Some(n), 1)
        );
    }
    let after: i64 = con.zscore(&k.holders, "s1").await.unwrap();
    assert!(after > before, "last heartbeat {after} should be after {before}");
    let record: String = con.hget(&k.sessions, "s1").await.unwrap();
    assert!(record.starts_with(&format!("{before}:2:")), "{record}");
}

#[tokio::test]
async fn license_state_is_checked_inside_the_script() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    let mut con = db(&settings).await;
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
        assert_eq!(o.status, expected, "license {id}");
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
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 3).await;
    let mut con = db(&settings).await;
    for s in ["a", "b", "c"] {
        direct(&settings, "lic", s).acquire(&mut con).await;
    }
    put_license(&settings, "lic", 2).await;
    assert_eq!(holders(&settings, "lic").await.len(), 3, "nobody evicted");
    let o = direct(&settings, "lic", "d").acquire(&mut con).await;
    assert_eq!(
        (o.status, o.seats_used, o.seats_total),
        (Status::NoSeatsAvailable, 3, 2)
    );
    direct(&settings, "lic", "a").release(&mut con).await;
    assert_eq!(
        direct(&settings, "lic", "d").acquire(&mut con).await.status,
        Status::NoSeatsAvailable,
        "2 of 2 still held"
    );
    direct(&settings, "lic", "b").release(&mut con).await;
    assert_eq!(
        direct(&settings, "lic", "d").acquire(&mut con).await.status,
        Status::Acquired
    );
}

#[tokio::test]
async fn scripts_reload_after_script_flush() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 2).await;
    let mut con = db(&settings).await;
    direct(&settings, "lic", "s1").acquire(&mut con).await;
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
    assert_eq!(
        direct(&settings, "lic", "s2").acquire(&mut con).await.status,
        Status::Acquired
    );
    let o = direct(&settings, "lic", "s1").heartbeat(&mut con).await;
    assert_eq!(o.status, Status::HeartbeatUpdated);
}

#[tokio::test]
async fn hundred_concurrent_acquirers_get_exactly_the_seats() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "load", 10).await;
    let mut tasks = Vec::new();
    for i in 0..100 {
        let settings = settings.clone();
        tasks.push(tokio::spawn(async move {
            let mut con = db(&settings).await;
            direct(&settings, "load", &format!("session-{i}"))
                .acquire(&mut con)
                .await
                .status
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
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 2).await;
    let mut con = db(&settings).await;
    assert_eq!(
        direct(&settings, "lic", "s1").acquire(&mut con).await.status,
        Status::Acquired
    );
    let inactive = LicenseSpec {
        active: false,
        ..seats(2)
    };
    provision(&settings, "lic", &inactive).await;
    assert_eq!(
        direct(&settings, "lic", "s1").acquire(&mut con).await.status,
        Status::AlreadyActive
    );
    assert_eq!(
        direct(&settings, "lic", "s2").acquire(&mut con).await.status,
        Status::LicenseInactive
    );
}
