//! Malformed requests: each answered INVALID_REQUEST naming the problem,
//! acknowledged, state unchanged, and the requests around them served.

use std::time::Duration;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use seatgate_client::Call;
use seatgate_core::status::Status;

use crate::support::{
    add_request, client, holders, http_get, license_keys, metric, pending, put_license, reply_stream,
    request_xadd, snapshot, spawn_app, spawn_worker, stream_entries, TestApp, WorkerProcess, T,
};

// Generated hostile entries; the parser's own property test over them lives
// next to the parser (crates/seatgate-core/src/protocol.rs), this file sends them through a worker.
#[path = "../../../seatgate-core/src/request/hostile.rs"]
mod hostile;

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
        (
            "ttl of zero",
            f(&[
                ("op", b"heartbeat"),
                ("license", b"lic"),
                ("session", b"holder"),
                ("ttl_ms", b"0"),
            ]),
            "ttl_ms",
        ),
        (
            "ttl not a number",
            f(&[
                ("op", b"release"),
                ("license", b"lic"),
                ("session", b"holder"),
                ("ttl_ms", b"5s"),
            ]),
            "ttl_ms",
        ),
    ]
}

#[tokio::test]
async fn every_malformed_request_is_answered_and_changes_nothing() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let client = client(&settings).await;
    let good = |session: &str| Call::acquire("lic", session);
    let r = client.call(&good("holder"), T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    let before = snapshot(&settings).await;

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
    add_request(
        &mut con,
        &settings,
        &[
            ("op", "acquire"),
            ("reply_to", &license_keys(&settings, "lic").holders),
        ],
    )
    .await;
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
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let not_a_stream = reply_stream(&settings, "not-a-stream");
    let _: () = redis::cmd("SET")
        .arg(&not_a_stream)
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    add_request(
        &mut con,
        &settings,
        &[
            ("op", "acquire"),
            ("license", "lic"),
            ("session", "s1"),
            ("reply_to", &not_a_stream),
        ],
    )
    .await;
    let client = client(&settings).await;
    let call = Call::acquire("lic", "s2");
    let r = client.call(&call, T).await.unwrap();
    assert_eq!(r.status(), Status::Acquired);
    worker.stop().await;
    assert_eq!(pending(&settings).await, 0);
}

#[tokio::test]
async fn a_reply_to_that_is_not_a_stream_is_left_untouched() {
    let TestApp(_redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let victim = reply_stream(&settings, "victim");
    let _: () = redis::cmd("SET")
        .arg(&victim)
        .arg("important")
        .query_async(&mut con)
        .await
        .unwrap();
    add_request(
        &mut con,
        &settings,
        &[
            ("op", "heartbeat"),
            ("license", "lic"),
            ("session", "s1"),
            ("reply_to", &victim),
        ],
    )
    .await;
    // A request sent after it is answered: the bad one has been read too.
    let client = client(&settings).await;
    let call = Call::acquire("lic", "s2");
    assert_eq!(client.call(&call, T).await.unwrap().status(), Status::Acquired);
    worker.stop().await;
    assert_eq!(
        pending(&settings).await,
        0,
        "acknowledged although its reply could not be written"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&victim)
        .query_async(&mut con)
        .await
        .unwrap();
    let value: String = redis::cmd("GET")
        .arg(&victim)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        (ttl, value.as_str()),
        (-1, "important"),
        "no expiry set on somebody else's key"
    );
}

/// Generated entries through a real worker: every one answered with a known
/// status, and every seat in Redis is one that some reply says was acquired.
#[tokio::test]
async fn generated_entries_through_a_worker_are_all_answered_and_change_nothing_unasked() {
    let TestApp(_redis, mut settings, mut con) = spawn_app().await;
    for l in ["s-1", "fuzz", "acquire"] {
        put_license(&settings, l, 3).await;
    }
    settings.limits.session_requests = 0;
    let worker = spawn_worker(settings.clone(), "w1").await;
    let fuzz_replies = reply_stream(&settings, "fuzz");
    let mut runner = TestRunner::deterministic();
    let n = 300;
    for i in 0..n {
        let fields = hostile::entry()
            .new_tree(&mut runner)
            .expect("generate")
            .current();
        let mut xadd = request_xadd(&settings);
        xadd.arg("id")
            .arg(format!("g{i}"))
            .arg("reply_to")
            .arg(&fuzz_replies);
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
        let read = stream_entries(&mut con, &fuzz_replies).await;
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

/// A `reply_to` outside `replies.prefix` (here another application's busy
/// stream) is refused: the request is not decided, the key is left exactly as
/// it was (no reply, no trim, no expiry), the entry goes to the dead-letter
/// stream with a reason naming `reply_to`, and the refusal is counted.
#[tokio::test]
async fn a_reply_to_outside_the_reply_namespace_is_dead_lettered_and_the_key_untouched() {
    let TestApp(redis, settings, mut con) = spawn_app().await;
    put_license(&settings, "lic", 2).await;
    let mut pipe = redis::pipe();
    for i in 0..1_000 {
        pipe.cmd("XADD")
            .arg("orders:jobs")
            .arg("*")
            .arg("order")
            .arg(i)
            .ignore();
    }
    let _: () = pipe.query_async(&mut con).await.unwrap();
    let dump = |con: &mut seatgate_core::db::Db| {
        let mut con = con.clone();
        async move {
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg("orders:jobs")
                .query_async(&mut con)
                .await
                .unwrap();
            let ttl: i64 = redis::cmd("TTL")
                .arg("orders:jobs")
                .query_async(&mut con)
                .await
                .unwrap();
            (dump, ttl)
        }
    };
    let before = dump(&mut con).await;
    assert_eq!(before.1, -1);

    let worker = WorkerProcess::start(&redis.url(), &[]).await;
    for op in ["acquire", "release"] {
        add_request(
            &mut con,
            &settings,
            &[
                ("op", op),
                ("id", &format!("hostile-{op}")),
                ("license", "lic"),
                ("session", "s1"),
                ("reply_to", "orders:jobs"),
            ],
        )
        .await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead = stream_entries(&mut con, &settings.stream.dead_letter).await;
        if dead.len() >= 2 && pending(&settings).await == 0 {
            break dead;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not dead-lettered: {dead:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dump(&mut con).await, before, "orders:jobs byte-identical, no TTL");
    assert!(holders(&settings, "lic").await.is_empty(), "not decided");
    let mut ids: Vec<&str> = dead.iter().map(|e| e["id"].as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["hostile-acquire", "hostile-release"]);
    for entry in &dead {
        assert_eq!(entry["reply_to"], "orders:jobs");
        let reason = &entry["dead_reason"];
        assert!(
            reason.contains("reply_to")
                && reason.contains("orders:jobs")
                && reason.contains(&settings.replies.prefix),
            "{reason}"
        );
    }
    let (_, text) = http_get(&worker.metrics, "/metrics").await.expect("metrics");
    let count = |series: &str| metric(&text, series).unwrap_or(0.0);
    assert_eq!(count("seatgate_refused_reply_to_total "), 2.0, "{text}");
    assert_eq!(count("seatgate_dead_lettered_total "), 2.0, "{text}");
}
