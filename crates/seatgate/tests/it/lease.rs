//! The hardening of the engine: strict license records, lease tokens,
//! entry ids ahead of the clock, oversized entries. `wire` drives a worker
//! with raw requests only; this file also uses the typed API (the scripts
//! called directly, the Rust client, the CLI's leases).

mod wire;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use seatgate_client::{Call, SeatOp};
use seatgate_core::license::{Field, StoredRecord, REFUSED_VALUES, TAKEN_VALUES};
use seatgate_core::protocol::Lease;
use seatgate_core::request::Guard;
use seatgate_core::scripts::Decision;
use seatgate_core::status::Status;

use crate::support::{
    acquire, add_request, client, db, direct, events, free_port, http_get, license_keys, output,
    printed_lease, put_license, redis_ms, reply_stream, seatgate_cmd, spawn_app, spawn_worker,
    stream_entries, Direct, Spawned, TestApp, BIN, T,
};

/// The record `license put` writes for 5 seats, then `field` = `value` (with
/// the `policy` flag on for a policy field, as `license put` writes one),
/// as a Rust reader and as the scripts see it.
async fn record_with(
    s: &seatgate::config::Settings,
    license: &str,
    field: Field,
    value: &str,
) -> StoredRecord {
    put_license(s, license, 5).await;
    let mut con = db(s).await;
    let key = license_keys(s, license).license;
    if field.is_policy() {
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg(Field::Policy.as_str())
            .arg("1")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(field.as_str())
        .arg(value)
        .query_async(&mut con)
        .await
        .unwrap();
    let names: Vec<&str> = Field::ALL.iter().map(|f| f.as_str()).collect();
    let values: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(&key)
        .arg(&names)
        .query_async(&mut con)
        .await
        .unwrap();
    StoredRecord::from_values(values)
}

#[tokio::test]
async fn the_license_rules_are_the_same_in_lua_and_in_rust() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    for (i, &(field, value)) in REFUSED_VALUES.iter().enumerate() {
        let license = format!("refused-{i}");
        let record = record_with(&s, &license, field, value).await;
        let rust = record.validate().expect_err(value);
        let o = direct(&s, &license, "probe").acquire(&mut con).await;
        assert_eq!(o.status(), Status::LicenseInvalid, "{field} = {value:?}");
        let Decision::LicenseInvalid(lua) = o.decision else {
            panic!("the script names the field: {o:?}")
        };
        assert_eq!(lua, rust, "{field} = {value:?}");
        assert_eq!(lua.to_string(), rust.to_string());
        assert!(crate::support::holders(&s, &license).await.is_empty());
        // The rule in Rust alone, as `license put` and `status` use it.
        assert!(field.check(value).is_err(), "{field} = {value:?}");
    }
    for (i, &(field, value, _)) in TAKEN_VALUES.iter().enumerate() {
        let license = format!("taken-{i}");
        let record = record_with(&s, &license, field, value).await;
        assert_eq!(record.validate(), Ok(()), "{field} = {value:?}");
        let o = direct(&s, &license, "probe").acquire(&mut con).await;
        assert_ne!(o.status(), Status::LicenseInvalid, "{field} = {value:?}");
        assert!(!matches!(o.decision, Decision::LicenseInvalid(_)));
    }
    // A record breaking two rules: both name the first, in the rules' order.
    let record = record_with(&s, "two", Field::QueueMax, "x").await;
    let _: () = redis::cmd("HSET")
        .arg(license_keys(&s, "two").license)
        .arg("active")
        .arg("yes")
        .query_async(&mut con)
        .await
        .unwrap();
    let o = direct(&s, "two", "probe").acquire(&mut con).await;
    let Decision::LicenseInvalid(invalid) = &o.decision else {
        panic!("{o:?}")
    };
    assert_eq!(invalid.field, Field::Active);
    assert_eq!(
        record.validate().unwrap_err().field,
        Field::QueueMax,
        "(read before active broke)"
    );
}

/// The scripts keep the rules' verdict on a license record from call to
/// call (lua/includes/license.lua) and a license's keys (keys.lua): an
/// operator's edit between two calls, even back to a value seen before,
/// is what the next call decides by.
#[tokio::test]
async fn an_edited_license_record_decides_the_very_next_call() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "edited", 1).await;
    put_license(&s, "twin", 1).await;
    let key = license_keys(&s, "edited").license;
    let shared = con.clone();
    let set = |field: &'static str, value: &'static str| {
        let key = key.clone();
        let mut con = shared.clone();
        async move {
            let _: () = redis::cmd("HSET")
                .arg(&key)
                .arg(field)
                .arg(value)
                .query_async(&mut con)
                .await
                .unwrap();
        }
    };
    let status = |session: &'static str| {
        let s = s.clone();
        let mut con = shared.clone();
        async move { direct(&s, "edited", session).acquire(&mut con).await.status() }
    };
    assert_eq!(status("a").await, Status::Acquired);
    assert_eq!(status("b").await, Status::NoSeatsAvailable);
    // The same record on another license is that license's own.
    assert_eq!(
        direct(&s, "twin", "a").acquire(&mut con).await.status(),
        Status::Acquired
    );
    set("seats_total", "2").await;
    assert_eq!(status("b").await, Status::Acquired);
    set("seats_total", "x").await;
    assert_eq!(status("c").await, Status::LicenseInvalid);
    set("seats_total", "3").await;
    assert_eq!(status("c").await, Status::Acquired);
    // Back to a value seen before: 2 seats, 3 holders.
    set("seats_total", "2").await;
    assert_eq!(status("d").await, Status::NoSeatsAvailable);
    set("seats_total", "4").await;
    set("active", "0").await;
    assert_eq!(status("d").await, Status::LicenseInactive);
    set("active", "1").await;
    set("expires_at_ms", "1000000000000").await; // 2001-09-09
    assert_eq!(status("d").await, Status::LicenseExpired);
    // An expiry written in seconds (next year's) is no expiry in ms: invalid.
    set("expires_at_ms", "1830000000").await;
    assert_eq!(status("d").await, Status::LicenseInvalid);
    set("expires_at_ms", "0").await;
    assert_eq!(status("d").await, Status::Acquired);
    assert_eq!(crate::support::holders(&s, "edited").await, ["a", "b", "c", "d"]);
    assert_eq!(crate::support::holders(&s, "twin").await, ["a"]);
}

/// A heartbeat rewrites the session record (its count) and keeps what
/// else it holds: the seat stays bound to its lease, its metadata and its
/// acquire time stay, however many heartbeats come.
#[tokio::test]
async fn heartbeats_keep_the_seat_bound_to_its_lease() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    put_license(&s, "bound", 1).await;
    let lease = "lease-0123456789abcdef";
    let holder = direct(&s, "bound", "s1").with_lease(Some(lease));
    let stranger = direct(&s, "bound", "s1");
    assert_eq!(holder.acquire(&mut con).await.status(), Status::Acquired);
    let before = crate::support::session_record(&s, "bound", "s1")
        .await
        .expect("a record");
    for n in 1..=3 {
        let o = holder.heartbeat(&mut con).await;
        assert_eq!(o.status(), Status::HeartbeatUpdated);
        assert_eq!(o.decision, Decision::HeartbeatUpdated { heartbeats: n });
        // The stranger's heartbeat, without the lease, is refused each time.
        assert_eq!(stranger.heartbeat(&mut con).await.status(), Status::LeaseMismatch);
    }
    let after = crate::support::session_record(&s, "bound", "s1")
        .await
        .expect("a record");
    // "<acquired_at>:<heartbeats>:<lease hash>:<meta>": only the count moved.
    let fields = |r: &str| r.splitn(4, ':').map(str::to_owned).collect::<Vec<_>>();
    let (b, a) = (fields(&before), fields(&after));
    assert_eq!(
        (a[0].as_str(), a[1].as_str()),
        (b[0].as_str(), "3"),
        "{before} -> {after}"
    );
    assert_eq!(a[2..], b[2..], "{before} -> {after}");
    assert_eq!(stranger.release(&mut con).await.status(), Status::LeaseMismatch);
    assert_eq!(holder.release(&mut con).await.status(), Status::Released);
}

#[tokio::test]
async fn require_lease_makes_the_lease_mandatory_on_every_op() {
    let TestApp(_redis, mut s, mut con) = spawn_app().await;
    s.sessions.require_lease = true;
    put_license(&s, "cad", 2).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let reply_to = reply_stream(&s, "bare");
    for verb in ["acquire", "heartbeat", "release"] {
        add_request(
            &mut con,
            &s,
            &[
                ("op", verb),
                ("id", verb),
                ("license", "cad"),
                ("session", "bare"),
                ("reply_to", &reply_to),
            ],
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let replies = loop {
        let replies = stream_entries(&mut con, &reply_to).await;
        if replies.len() == 3 {
            break replies;
        }
        assert!(Instant::now() < deadline, "{replies:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for r in &replies {
        assert_eq!(r["status"], "INVALID_REQUEST", "{r:?}");
        assert!(r["error"].contains("missing field `lease`"), "{r:?}");
    }
    assert!(crate::support::holders(&s, "cad").await.is_empty());

    // The Rust client always sends one.
    let c = client(&s).await;
    let got = c.call(&acquire("cad", "leased", 0), T).await.unwrap();
    assert_eq!(got.status(), Status::Acquired);
    let beat = c.call(&Call::heartbeat("cad", "leased"), T).await.unwrap();
    assert_eq!(beat.status(), Status::HeartbeatUpdated);
    let gone = c.call(&Call::release("cad", "leased"), T).await.unwrap();
    assert_eq!(gone.status(), Status::Released);
    worker.stop().await;
}

#[tokio::test]
async fn the_rust_client_binds_each_seat_to_a_lease_of_its_own() {
    let TestApp(_redis, s, _) = spawn_app().await;
    put_license(&s, "cad", 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let owner = client(&s).await;
    let stranger = client(&s).await;

    let got = owner.call(&acquire("cad", "laptop", 0), T).await.unwrap();
    assert_eq!(got.status(), Status::Acquired);
    let lease = got.lease().cloned().expect("the client made a lease");
    assert_eq!(owner.lease("cad", "laptop").as_ref(), Some(&lease));
    let again = owner.call(&acquire("cad", "laptop", 0), T).await.unwrap();
    assert_eq!(
        (again.status(), again.lease()),
        (Status::AlreadyActive, Some(&lease)),
        "retried with the same lease"
    );

    // A stranger's heartbeat and release without a lease are refused
    // (sessions.require_lease); with a lease of its own (its acquire
    // brings one) they are the wrong lease.
    for verb in [SeatOp::Heartbeat, SeatOp::Release] {
        let r = stranger.call(&Call::new(verb, "cad", "laptop"), T).await.unwrap();
        assert_eq!(r.status(), Status::InvalidRequest, "{verb} without a lease");
    }
    for verb in [SeatOp::Acquire, SeatOp::Heartbeat, SeatOp::Release] {
        let r = stranger.call(&Call::new(verb, "cad", "laptop"), T).await.unwrap();
        assert_eq!(r.status(), Status::LeaseMismatch, "{verb}");
    }
    let r = owner.call(&Call::heartbeat("cad", "laptop"), T).await.unwrap();
    assert_eq!(r.status(), Status::HeartbeatUpdated);
    // Whoever is given the lease may use it (a restarted process, say).
    let r = stranger
        .call(&Call::heartbeat("cad", "laptop").with_lease(lease.clone()), T)
        .await
        .unwrap();
    assert_eq!(r.status(), Status::HeartbeatUpdated);
    let r = owner.call(&Call::release("cad", "laptop"), T).await.unwrap();
    assert_eq!((r.status(), r.lease()), (Status::Released, Some(&lease)));
    assert_eq!(owner.lease("cad", "laptop"), None, "no longer held");
    // A late release still carries the lease, and hears the truth.
    let r = owner.call(&Call::release("cad", "laptop"), T).await.unwrap();
    assert_eq!(r.status(), Status::SessionNotFound, "{r:?}");
    let fresh = owner.call(&acquire("cad", "laptop", 0), T).await.unwrap();
    assert_ne!(fresh.lease(), Some(&lease), "a new seat, a new lease");
    worker.stop().await;
}

#[tokio::test]
async fn the_cli_prints_the_lease_and_takes_it_back() {
    let TestApp(redis, s, _) = spawn_app().await;
    put_license(&s, "cad", 1).await;
    let worker = spawn_worker(s.clone(), "w1").await;
    let cli = |args: &[&str]| output(seatgate_cmd(&redis.url(), args));
    let o = cli(&["acquire", "--license", "cad", "--session", "s"]).await;
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.starts_with("ACQUIRED") && text.contains(" lease="), "{text}");
    let lease = printed_lease(&text);
    let o = cli(&["heartbeat", "--license", "cad", "--session", "s"]).await;
    assert_eq!(o.status.code(), Some(1), "without the lease: {o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.starts_with("INVALID_REQUEST") && text.contains("`lease`"),
        "{o:?}"
    );
    let o = cli(&[
        "heartbeat",
        "--license",
        "cad",
        "--session",
        "s",
        "--lease",
        "short",
    ])
    .await;
    assert_eq!(
        o.status.code(),
        Some(2),
        "a malformed lease is a usage error: {o:?}"
    );
    let o = cli(&[
        "acquire",
        "--license",
        "cad",
        "--session",
        "s",
        "--lease",
        &lease,
        "--json",
    ])
    .await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["status"].as_str(), v["lease"].as_str()),
        (Some("ALREADY_ACTIVE"), Some(lease.as_str()))
    );
    let o = cli(&["release", "--license", "cad", "--session", "s", "--lease", &lease]).await;
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("RELEASED"),
        "{o:?}"
    );
    worker.stop().await;
}

#[tokio::test]
async fn a_lease_shows_up_in_no_event_status_log_metric_or_dead_letter() {
    let TestApp(redis, s, mut con) = spawn_app().await;
    put_license(&s, "cad", 1).await;
    let lease = "Secret-lease_0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("worker.log");
    let port = free_port();
    let _worker = Spawned(
        std::process::Command::new(BIN)
            .arg("--redis")
            .arg(redis.url())
            .arg("run")
            .env("SEATGATE__METRICS__LISTEN", format!("127.0.0.1:{port}"))
            .env("SEATGATE__STREAM__BLOCK_MS", "100")
            .env("SEATGATE__STREAM__MAX_DELIVERIES", "1")
            .env("RUST_LOG", "info,seatgate=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let metrics = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(&metrics, "/ready").await.map(|(c, _)| c) != Some(200) {
        assert!(Instant::now() < deadline, "worker not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let c = client(&s).await;
    let mine = Lease::parse(lease).unwrap();
    let got = c
        .call(&acquire("cad", "s1", 0).with_lease(mine.clone()), T)
        .await
        .unwrap();
    assert_eq!(got.status(), Status::Acquired);
    let stranger = client(&s).await;
    let theirs = Lease::parse("a-lease-of-the-strangers-0001").unwrap();
    let r = stranger
        .call(&Call::heartbeat("cad", "s1").with_lease(theirs), T)
        .await
        .unwrap();
    assert_eq!(r.status(), Status::LeaseMismatch);
    let status = output(seatgate_cmd(&redis.url(), &["status", "--json"])).await;
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.contains("\"leased\":true"), "{status}");

    // A malformed lease (refused, and not repeated), an unanswerable request
    // carrying the lease (dead-lettered at once), a poison one (dead-lettered
    // after failing: its license's holders key is broken by hand).
    let bad = format!("{lease}!");
    add_request(
        &mut con,
        &s,
        &[
            ("op", "heartbeat"),
            ("license", "cad"),
            ("session", "s1"),
            ("lease", &bad),
            ("reply_to", &reply_stream(&s, "x")),
        ],
    )
    .await;
    add_request(
        &mut con,
        &s,
        &[
            ("op", "release"),
            ("license", "cad"),
            ("session", "s1"),
            ("lease", lease),
            ("reply_to", "orders:jobs"),
        ],
    )
    .await;
    let _: () = redis::cmd("SET")
        .arg(license_keys(&s, "poison").holders)
        .arg("oops")
        .query_async(&mut con)
        .await
        .unwrap();
    add_request(
        &mut con,
        &s,
        &[
            ("op", "acquire"),
            ("license", "poison"),
            ("session", "p"),
            ("lease", lease),
            ("reply_to", &reply_stream(&s, "p")),
        ],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead = stream_entries(&mut con, &s.stream.dead_letter).await;
        if dead.len() == 2 {
            break dead;
        }
        assert!(Instant::now() < deadline, "dead letters: {dead:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for d in &dead {
        assert_eq!(d["lease"], "redacted", "{d:?}");
        assert!(!d.fields.values().any(|v| v.contains(lease)), "{d:?}");
    }
    let r = c.call(&Call::release("cad", "s1"), T).await.unwrap();
    assert_eq!(r.status(), Status::Released);

    let all_events = events(&s, "cad").await;
    assert!(all_events.len() >= 2, "{all_events:?}");
    for e in &all_events {
        assert!(!e.fields.values().any(|v| v.contains(lease)), "{e:?}");
    }
    let (_, page) = http_get(&metrics, "/metrics").await.unwrap();
    assert!(
        page.contains("seatgate_invalid_requests_total{field=\"lease\"} 1"),
        "counted under its field"
    );
    assert!(!page.contains(lease));
    assert!(!status.contains(lease));
    let mut log = String::new();
    std::fs::File::open(&log_path)
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("dead-letter"), "the log was written: {log}");
    assert!(!log.contains(lease), "{log}");
}

#[tokio::test]
async fn a_lease_adds_about_16_bytes_per_held_seat() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let mut usage = Vec::new();
    for (license, lease) in [
        ("plain", None),
        ("leased", Some("0f1e2d3c4b5a69788796a5b4c3d2e1f0")),
    ] {
        put_license(&s, license, 1_000).await;
        for i in 0..1_000 {
            let o = direct(&s, license, &format!("laptop-{i:04}"))
                .with_meta(r#"{"user_email":"user1234@example.com","hardware_id":"hw-5f3a9c"}"#)
                .with_lease(lease)
                .acquire(&mut con)
                .await;
            assert_eq!(o.status(), Status::Acquired);
        }
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(license_keys(&s, license).sessions)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut con)
            .await
            .unwrap();
        usage.push(bytes);
    }
    let (plain, leased) = (usage[0], usage[1]);
    println!("MEMORY USAGE of the sessions hash, 1000 sessions: {plain} B without leases, {leased} B with");
    // 17 bytes more per record (`<16 hex digits>:`), in the allocator's size
    // classes: measured 16 B per seat on Redis 7.0.15 (144 B -> 160 B).
    let per_session = (leased - plain) as f64 / 1_000.0;
    assert!((8.0..=32.0).contains(&per_session), "{per_session} B per session");
}

/// A dedupe bucket's expiry is set by the write that makes the bucket
/// (dedupe.lua, its mark): every record of the bucket after it finds it set,
/// and a bucket deleted by hand (or flushed, or evicted) is made again with
/// its expiry, never left to live for ever.
#[tokio::test]
async fn a_dedupe_bucket_has_its_expiry_whoever_made_it() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let window = s.dedupe.window_ms as i64;
    put_license(&s, "cad", 5).await;
    crate::support::listpack_values_as_ops_conf(&mut con).await;
    let t = redis_ms(&mut con).await;
    let bucket = seatgate_core::keys::Keys::new(s.keys.prefix.clone()).dedupe("cad", (t / window) as u64);
    let expires = (t / window + 2) * window;
    let expiry = |mut con: seatgate_core::db::Db| {
        let bucket = bucket.clone();
        async move {
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&bucket)
                .query_async(&mut con)
                .await
                .unwrap();
            at
        }
    };
    let at = |n: u32, session: &str| {
        let mut g = Guard::for_entry(
            &s.guard_policy(),
            &crate::support::keys(&s),
            &format!("{t}-{n}"),
            "cad",
            session,
        );
        g.redelivery = true;
        direct(&s, "cad", session).with_guard(g)
    };
    assert_eq!(at(1, "s1").acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(expiry(con.clone()).await, expires);
    // A hashtable from its first record: a listpack is searched from its
    // start, and every new request's lookups miss. Its mark is '' again.
    assert_eq!(crate::support::encoding(&mut con, &bucket).await, "hashtable");
    let mark: String = redis::cmd("HGET")
        .arg(&bucket)
        .arg("_")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(mark, "");
    assert_eq!(at(2, "s1").release(&mut con).await.status(), Status::Released);
    assert_eq!(expiry(con.clone()).await, expires);
    let _: () = redis::cmd("DEL")
        .arg(&bucket)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(at(3, "s2").acquire(&mut con).await.status(), Status::Acquired);
    assert_eq!(expiry(con.clone()).await, expires, "made again, with its expiry");
    assert_eq!(
        crate::support::encoding(&mut con, &bucket).await,
        "hashtable",
        "made again a hashtable"
    );
    // The record is there: a redelivery replays it.
    let again = at(3, "s2").acquire(&mut con).await;
    assert_eq!((again.status(), again.replayed), (Status::Acquired, true));
    assert_eq!(crate::support::holders(&s, "cad").await, ["s2"]);
}

#[tokio::test]
async fn a_bucket_never_outlives_two_windows_of_the_redis_clock() {
    let TestApp(_redis, s, mut con) = spawn_app().await;
    let window = s.dedupe.window_ms;
    put_license(&s, "cad", 5).await;
    let entry = "9999999999999-0";
    // Placed by its id (the clock unknown to the caller): the script still caps the expiry.
    let blind = Direct::for_entry(&s, entry, "cad", "s1");
    assert_eq!(blind.acquire(&mut con).await.status(), Status::Acquired);
    let far_key =
        seatgate_core::keys::Keys::new(s.keys.prefix.clone()).dedupe("cad", 9_999_999_999_999 / window);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&far_key)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl as u64 <= 2 * window, "{ttl}");

    // Placed by the clock: a later delivery, a window on, still finds the reply.
    let now = redis_ms(&mut con).await as u64;
    let guard = |at: u64| {
        let mut g = Guard::for_entry_at(
            &s.guard_policy(),
            &crate::support::keys(&s),
            entry,
            "cad",
            "s2",
            Some(at),
        );
        g.redelivery = true;
        g
    };
    let first = direct(&s, "cad", "s2")
        .with_guard(guard(now))
        .acquire(&mut con)
        .await;
    assert_eq!((first.status(), first.replayed), (Status::Acquired, false));
    let later = direct(&s, "cad", "s2")
        .with_guard(guard(now + window))
        .acquire(&mut con)
        .await;
    assert_eq!(
        (later.status(), later.replayed),
        (Status::Acquired, true),
        "replayed, not ALREADY_ACTIVE"
    );
}
