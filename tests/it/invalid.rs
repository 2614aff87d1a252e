//! Malformed requests: each answered INVALID_REQUEST naming the problem,
//! acknowledged, state unchanged, and the requests around them served.

use std::time::Duration;

use seatgate::client::Call;
use seatgate::engine::protocol::Op;
use seatgate::engine::status::Status;

use crate::support::{
    client, db, holders, license_keys, pending, put_license, request_xadd, snapshot, spawn_worker,
    stream_entries, RedisServer, RedisServerExt, T,
};

/// (description, fields of the entry besides `id` and `reply_to`, word the error must mention)
type Case = (&'static str, Vec<(&'static str, Vec<u8>)>, &'static str);

fn cases() -> Vec<Case> {
    let f = |pairs: &[(&'static str, &[u8])]| pairs.iter().map(|(k, v)| (*k, v.to_vec())).collect::<Vec<_>>();
    let deep = format!("{}1{}", "{\"a\":".repeat(12), "}".repeat(12));
    vec![
        ("missing op", f(&[("license", b"lic"), ("session", b"x")]), "op"),
        (
            "unknown op",
            f(&[("op", b"steal"), ("license", b"lic"), ("session", b"x")]),
            "op",
        ),
        (
            "non-UTF-8 op",
            f(&[("op", b"\xff\xfe"), ("license", b"lic"), ("session", b"x")]),
            "op",
        ),
        (
            "missing license",
            f(&[("op", b"acquire"), ("session", b"x")]),
            "license",
        ),
        (
            "missing session",
            f(&[("op", b"acquire"), ("license", b"lic")]),
            "session",
        ),
        (
            "braces in license",
            f(&[("op", b"acquire"), ("license", b"{lic}"), ("session", b"x")]),
            "license",
        ),
        (
            "space in session",
            f(&[("op", b"acquire"), ("license", b"lic"), ("session", b"a b")]),
            "session",
        ),
        (
            "non-UTF-8 session",
            f(&[("op", b"acquire"), ("license", b"lic"), ("session", b"\xc3\x28")]),
            "session",
        ),
        (
            "oversized license",
            vec![
                ("op", b"acquire".to_vec()),
                ("license", vec![b'a'; 500]),
                ("session", b"x".to_vec()),
            ],
            "license",
        ),
        (
            "meta not JSON",
            f(&[
                ("op", b"acquire"),
                ("license", b"lic"),
                ("session", b"x"),
                ("meta", b"{oops"),
            ]),
            "meta",
        ),
        (
            "meta not an object",
            f(&[
                ("op", b"acquire"),
                ("license", b"lic"),
                ("session", b"x"),
                ("meta", b"\"str\""),
            ]),
            "meta",
        ),
        (
            "meta too deep",
            vec![
                ("op", b"acquire".to_vec()),
                ("license", b"lic".to_vec()),
                ("session", b"x".to_vec()),
                ("meta", deep.into_bytes()),
            ],
            "meta",
        ),
        (
            "meta too large",
            vec![
                ("op", b"acquire".to_vec()),
                ("license", b"lic".to_vec()),
                ("session", b"x".to_vec()),
                ("meta", format!("{{\"k\":\"{}\"}}", "v".repeat(5000)).into_bytes()),
            ],
            "meta",
        ),
        (
            "oversized field",
            vec![
                ("op", b"acquire".to_vec()),
                ("license", b"lic".to_vec()),
                ("session", b"x".to_vec()),
                ("junk", vec![b'j'; 10_000]),
            ],
            "junk",
        ),
        (
            "negative wait",
            f(&[
                ("op", b"acquire"),
                ("license", b"lic"),
                ("session", b"x"),
                ("wait_ms", b"-5"),
            ]),
            "wait_ms",
        ),
        (
            "wait not a number",
            f(&[
                ("op", b"acquire"),
                ("license", b"lic"),
                ("session", b"x"),
                ("wait_ms", b"soon"),
            ]),
            "wait_ms",
        ),
    ]
}

#[tokio::test]
async fn every_malformed_request_is_answered_and_changes_nothing() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut client = client(&settings).await;
    let good = |session: &str| Call::new(Op::Acquire, "lic", session);
    let r = client.call(&good("holder"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    let before = snapshot(&settings).await;

    let mut con = db(&settings).await;
    for (i, (what, fields, mention)) in cases().into_iter().enumerate() {
        let id = format!("bad-{i}");
        let mut xadd = request_xadd(&settings);
        xadd.arg("id").arg(&id).arg("reply_to").arg(client.reply_to());
        for (k, v) in &fields {
            xadd.arg(*k).arg(v.as_slice());
        }
        let _: String = xadd.query_async(&mut con).await.unwrap();
        let r = client
            .wait_for(&id, T)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.status(), Status::InvalidRequest, "{what}");
        assert_eq!(r.get("ok"), "0", "{what}");
        assert!(
            r.get("error").contains(mention),
            "{what}: error {:?} should name {mention}",
            r.get("error")
        );
    }
    assert_eq!(
        snapshot(&settings).await,
        before,
        "invalid requests changed seat state"
    );

    // A request without a usable reply address is still acknowledged; the worker lives on.
    let _: String = request_xadd(&settings)
        .arg("op")
        .arg("acquire")
        .arg("reply_to")
        .arg(license_keys(&settings, "lic").holders)
        .query_async(&mut con)
        .await
        .unwrap();
    let r = client.call(&good("second"), T).await.unwrap();
    assert_eq!(
        r.status(),
        Status::Acquired,
        "requests after the bad ones are served"
    );
    worker.stop().await;
    assert_eq!(pending(&settings).await, 0, "every entry acknowledged");
}

#[tokio::test]
async fn a_reply_stream_of_the_wrong_type_does_not_wedge_the_worker() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut con = db(&settings).await;
    let _: () = redis::cmd("SET")
        .arg("reply:not-a-stream")
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: String = request_xadd(&settings)
        .arg("op")
        .arg("acquire")
        .arg("license")
        .arg("lic")
        .arg("session")
        .arg("s1")
        .arg("reply_to")
        .arg("reply:not-a-stream")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut client = client(&settings).await;
    let call = Call::new(Op::Acquire, "lic", "s2");
    let r = client.call(&call, T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    worker.stop().await;
    assert_eq!(pending(&settings).await, 0);
}

#[tokio::test]
async fn a_reply_to_that_is_not_a_stream_is_left_untouched() {
    let redis = RedisServer::start_with(&[]).await;
    let settings = redis.settings();
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut con = db(&settings).await;
    let _: () = redis::cmd("SET")
        .arg("victim:key")
        .arg("important")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: String = request_xadd(&settings)
        .arg("op")
        .arg("heartbeat")
        .arg("license")
        .arg("lic")
        .arg("session")
        .arg("s1")
        .arg("reply_to")
        .arg("victim:key")
        .query_async(&mut con)
        .await
        .unwrap();
    // A request sent after it is answered: the bad one has been read too.
    let mut client = client(&settings).await;
    let call = Call::new(Op::Acquire, "lic", "s2");
    assert_eq!(client.call(&call, T).await.unwrap().status(), Status::Acquired);
    worker.stop().await;
    assert_eq!(
        pending(&settings).await,
        0,
        "acknowledged although its reply could not be written"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg("victim:key")
        .query_async(&mut con)
        .await
        .unwrap();
    let value: String = redis::cmd("GET")
        .arg("victim:key")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        (ttl, value.as_str()),
        (-1, "important"),
        "no expiry set on somebody else's key"
    );
}

// ---------------------------------------------------------------------------
// Hostile input, generated: arbitrary field maps, byte strings and sizes.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

/// Field names: the real ones, near misses and junk.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "op", "license", "session", "meta", "wait_ms", "id", "x", "OP", "op "
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,12}",
        prop::collection::vec(any::<u8>(), 0..20).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// Values: plausible ones, JSON-ish ones, random bytes, and big ones.
fn field_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            "acquire",
            "release",
            "heartbeat",
            "fuzz",
            "s-1",
            "{}",
            "[]",
            "-1",
            "10",
            "{\"a\":{}}"
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        "[A-Za-z0-9._:@{} -]{0,40}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..64),
        (0usize..20_000).prop_map(|n| vec![b'z'; n]),
    ]
}

fn entry() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    prop::collection::vec((field_name(), field_value()), 0..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// The parser never panics, and what it accepts is within the documented limits.
    #[test]
    fn the_parser_never_panics_and_accepts_only_valid_requests(fields in entry()) {
        match seatgate::engine::protocol::parse_request("1-0", &fields, |k| k.starts_with("seat:")) {
            Ok(req) => {
                prop_assert!(seatgate::engine::protocol::valid_id(&req.license));
                prop_assert!(seatgate::engine::protocol::valid_id(&req.session));
                prop_assert!(req.meta.len() <= seatgate::engine::protocol::MAX_META_LEN);
                prop_assert!(req.wait_ms <= seatgate::engine::protocol::MAX_WAIT_MS);
            }
            Err(bad) => {
                prop_assert!(!bad.reason.is_empty());
                prop_assert!(!bad.reason.contains('\n'));
            }
        }
    }
}

/// Generated entries through a real worker: every one answered with a known
/// status, and every seat in Redis is one that some reply says was acquired.
#[tokio::test]
async fn generated_entries_through_a_worker_are_all_answered_and_change_nothing_unasked() {
    let redis = RedisServer::start_with(&[]).await;
    let mut settings = redis.settings();
    for l in ["s-1", "fuzz", "acquire"] {
        put_license(&settings, l, 3).await;
    }
    settings.limits.session_requests = 0;
    settings.replies.maxlen = 10_000;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let mut con = db(&settings).await;
    let mut runner = TestRunner::deterministic();
    let n = 300;
    for i in 0..n {
        let fields = entry().new_tree(&mut runner).expect("generate").current();
        let mut xadd = request_xadd(&settings);
        xadd.arg("id")
            .arg(format!("g{i}"))
            .arg("reply_to")
            .arg("reply:fuzz");
        for (k, v) in fields
            .iter()
            .filter(|(k, _)| k != "id" && k != "reply_to" && !k.is_empty())
        {
            xadd.arg(k.as_str()).arg(v.as_slice());
        }
        let _: String = xadd.query_async(&mut con).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let replies = loop {
        let read = stream_entries(&mut con, "reply:fuzz").await;
        if read.len() >= n || std::time::Instant::now() > deadline {
            break read;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    worker.stop().await;
    assert_eq!(pending(&settings).await, 0, "every entry acknowledged");
    let mut answered = std::collections::HashSet::new();
    let mut acquired = std::collections::HashSet::new();
    let mut invalid = 0;
    for r in &replies {
        let get = |k: &str| r.fields.get(k).cloned().unwrap_or_default();
        let status: Status = get("status").parse().expect("a documented status");
        answered.insert(get("id"));
        match status {
            Status::InvalidRequest => invalid += 1,
            Status::Acquired | Status::Granted => {
                acquired.insert((get("license"), get("session")));
            }
            _ => {}
        }
    }
    assert_eq!(answered.len(), n, "one reply per entry");
    assert!(
        invalid > n / 2,
        "the generator mostly produces invalid requests ({invalid} of {n})"
    );
    for l in ["s-1", "fuzz", "acquire"] {
        for s in holders(&settings, l).await {
            assert!(
                acquired.contains(&(l.to_owned(), s.clone())),
                "{l}/{s} holds a seat no reply granted"
            );
        }
    }
}
