//! The request parser's tests: every op, every refusal, hostile entries.

use proptest::prelude::*;

use super::fields::MAX_ECHOED_OP_LEN;
use super::guard::GuardPolicy;
use super::*;
use crate::keys::Keys;
use crate::policy::{RequestPolicy, MAX_BORROW_MS, MAX_PRIORITY};
use crate::protocol::*;

/// The acquire `req` is, or a test failure.
fn acquire(req: &Request) -> &Acquire {
    match &req.action {
        Action::Acquire(a) => a,
        other => panic!("not an acquire: {other:?}"),
    }
}

fn entry(pairs: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect()
}

fn parse(pairs: &[(&str, &[u8])]) -> Result<Request, Invalid> {
    parse_request("1-0", &entry(pairs), &Rules::new("seat:reply:"))
}

#[test]
fn a_full_acquire_parses() {
    let req = parse(&[
        ("op", b"acquire"),
        ("id", b"r1"),
        ("license", b"acme"),
        ("session", b"s-1"),
        ("reply_to", b"seat:reply:c1"),
        ("meta", br#"{ "user_email": "a@b.c" }"#),
        ("wait_ms", b"1500"),
    ])
    .unwrap();
    assert_eq!(req.op(), Op::Acquire);
    assert_eq!(req.id, "r1");
    assert_eq!(acquire(&req).meta, r#"{"user_email":"a@b.c"}"#);
    assert_eq!(acquire(&req).wait_ms, 1500);
    assert_eq!(req.reply_to.as_deref(), Some("seat:reply:c1"));
}

#[test]
fn an_acquire_carries_who_asks() {
    let req = parse(&[
        ("op", b"acquire"),
        ("license", b"cad"),
        ("session", b"s-1"),
        ("user", b"ada@example.com"),
        ("group", b"eng"),
        ("priority", b"7"),
        ("borrow_ms", b"86400000"),
    ])
    .unwrap();
    assert_eq!(
        acquire(&req).policy,
        RequestPolicy {
            user: Some("ada@example.com".into()),
            group: Some("eng".into()),
            priority: 7,
            borrow_ms: 86_400_000,
        }
    );
    let plain = parse(&[("op", b"acquire"), ("license", b"cad"), ("session", b"s-1")]).unwrap();
    assert_eq!(acquire(&plain).policy, RequestPolicy::NONE);
}

#[test]
fn the_entry_id_stands_in_for_a_missing_request_id() {
    let req = parse(&[("op", b"release"), ("license", b"a"), ("session", b"s")]).unwrap();
    assert_eq!(req.id, "1-0");
    assert_eq!(req.reply_to, None);
}

#[test]
fn malformed_requests_name_the_field_and_keep_the_reply_address() {
    let long = vec![b'a'; 200];
    let deep = format!("{}{}", "{\"a\":".repeat(9) + "1", "}".repeat(9));
    let big_meta = format!("{{\"x\":\"{}\"}}", "y".repeat(MAX_META_LEN));
    type Case<'a> = (Vec<(&'a str, &'a [u8])>, &'a str);
    let cases: Vec<Case> = vec![
        (vec![("license", b"a"), ("session", b"s")], "op"),
        (vec![("op", b"steal"), ("license", b"a"), ("session", b"s")], "op"),
        (
            vec![("op", b"\xff\xfe"), ("license", b"a"), ("session", b"s")],
            "op",
        ),
        (vec![("op", b"acquire"), ("session", b"s")], "license"),
        (vec![("op", b"acquire"), ("license", b"a")], "session"),
        (
            vec![("op", b"acquire"), ("license", b"{a}"), ("session", b"s")],
            "license",
        ),
        (
            vec![("op", b"acquire"), ("license", b""), ("session", b"s")],
            "license",
        ),
        (
            vec![("op", b"acquire"), ("license", &long), ("session", b"s")],
            "license",
        ),
        (
            vec![("op", b"acquire"), ("license", b"a"), ("session", b"s p")],
            "session",
        ),
        (
            vec![("op", b"acquire"), ("license", b"a"), ("session", b"\xc3\x28")],
            "session",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("meta", b"{nope"),
            ],
            "meta",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("meta", b"[1,2]"),
            ],
            "meta",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("meta", deep.as_bytes()),
            ],
            "meta",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("meta", big_meta.as_bytes()),
            ],
            "meta",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("wait_ms", b"-1"),
            ],
            "wait_ms",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("wait_ms", b"99999999999"),
            ],
            "wait_ms",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("user", b"a b"),
            ],
            "user",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("group", b"{g}"),
            ],
            "group",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("priority", b"10"),
            ],
            "priority",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("priority", b"+1"),
            ],
            "priority",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("borrow_ms", b"31536000001"),
            ],
            "borrow_ms",
        ),
        (
            vec![
                ("op", b"release"),
                ("license", b"a"),
                ("session", b"s"),
                ("ttl_ms", b"0"),
            ],
            "ttl_ms",
        ),
        (
            vec![
                ("op", b"heartbeat"),
                ("license", b"a"),
                ("session", b"s"),
                ("ttl_ms", b"86400001"),
            ],
            "ttl_ms",
        ),
        (
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("ttl_ms", b"+5"),
            ],
            "ttl_ms",
        ),
        (
            // Checked before the op's own fields.
            vec![
                ("op", b"acquire"),
                ("license", b"a"),
                ("session", b"s"),
                ("ttl_ms", b"5s"),
                ("meta", b"[]"),
            ],
            "ttl_ms",
        ),
    ];
    for (mut pairs, field) in cases {
        pairs.push(("reply_to", b"seat:reply:c1"));
        pairs.push(("id", b"r9"));
        let bad = parse(&pairs).expect_err(field);
        assert_eq!(bad.field, field, "{pairs:?}: {}", bad.reason);
        assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:c1"));
        assert_eq!(bad.echo.id, "r9");
        assert!(!bad.reason.is_empty() && !bad.reason.contains('\n'));
    }
}

fn rules(require_lease: bool, max_entry_bytes: usize) -> Rules<'static> {
    Rules {
        reply_prefix: "seat:reply:",
        require_lease,
        max_entry_bytes,
        ..Rules::new("seat:reply:")
    }
}

#[test]
fn oversized_entries_are_refused_on_their_lengths_and_still_answered() {
    let big = vec![b'x'; 9_000];
    let long_name = "n".repeat(MAX_FIELD_NAME_LEN + 1);
    let meta = format!("{{\"x\":\"{}\"}}", "y".repeat(MAX_META_LEN));
    type Case<'a> = (Vec<(&'a str, &'a [u8])>, usize, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        // The whole entry, even when each value is within its own limit.
        (
            vec![("a", &big[..4000]), ("b", &big[..4000]), ("c", &big[..4000])],
            10_000,
            "fields",
            "request entry is 1205",
        ),
        (
            vec![(long_name.as_str(), b"1")],
            DEFAULT_MAX_ENTRY_BYTES,
            "fields",
            "a field name is 65 bytes; at most 64",
        ),
        (
            vec![("note", &big)],
            DEFAULT_MAX_ENTRY_BYTES,
            "fields",
            "field `note` is longer than 8192 bytes",
        ),
        // `meta` on any op, not only acquire.
        (
            vec![("meta", meta.as_bytes())],
            DEFAULT_MAX_ENTRY_BYTES,
            "meta",
            "field `meta` is 4104 bytes; at most 4096",
        ),
    ];
    for op in [&b"release"[..], b"heartbeat", b"acquire"] {
        for (extra, max, field, reason) in &cases {
            let mut pairs: Vec<(&str, &[u8])> = vec![
                ("op", op),
                ("id", b"r9"),
                ("license", b"a"),
                ("session", b"s"),
                ("reply_to", b"seat:reply:c1"),
            ];
            pairs.extend(extra.iter().copied());
            let bad = parse_request("1-0", &entry(&pairs), &rules(false, *max)).unwrap_err();
            assert_eq!(bad.field, *field, "{}", bad.reason);
            assert!(bad.reason.starts_with(reason), "{}", bad.reason);
            assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:c1"));
            assert_eq!((bad.echo.id.as_str(), bad.echo.license.as_str()), ("r9", "a"));
        }
    }
}

#[test]
fn an_oversized_entry_reads_no_long_addressing_field() {
    // A reply_to beyond its own limit is not read at all: unanswered.
    let long_reply = format!("seat:reply:{}", "r".repeat(300));
    let pairs = entry(&[
        ("op", b"release"),
        ("reply_to", long_reply.as_bytes()),
        ("x", &[b'x'; 9_000]),
    ]);
    let bad = parse_request("1-0", &pairs, &Rules::new("seat:reply:")).unwrap_err();
    assert_eq!((bad.field, bad.echo.reply_to), ("fields", None));
    // Far more fields than allowed: refused before any is read.
    let many: Vec<(String, Vec<u8>)> = (0..10_000).map(|i| (format!("f{i}"), vec![0xff])).collect();
    let bad = parse_request("1-0", &many, &Rules::new("seat:reply:")).unwrap_err();
    assert!(
        bad.reason.starts_with("request has 10000 fields"),
        "{}",
        bad.reason
    );
}

#[test]
fn a_lease_is_checked_on_every_op_and_never_repeated() {
    let secret = "Secret_lease-0123456789";
    for op in [&b"acquire"[..], b"heartbeat", b"release"] {
        let ok = parse(&[
            ("op", op),
            ("license", b"a"),
            ("session", b"s"),
            ("lease", secret.as_bytes()),
        ])
        .unwrap();
        assert_eq!(ok.lease().map(Lease::as_str), Some(secret));
        assert!(!format!("{ok:?}").contains(secret), "Debug hides the lease");
        for bad in [
            &b"short"[..],
            b"has space in it....",
            b"sixteen+chars!!!!",
            &[b'a'; 129],
            b"\xff\xfe0123456789abcdef",
        ] {
            let refused =
                parse(&[("op", op), ("license", b"a"), ("session", b"s"), ("lease", bad)]).unwrap_err();
            assert_eq!(refused.field, "lease");
            assert!(
                !refused
                    .reason
                    .contains(std::str::from_utf8(bad).unwrap_or("\u{fffd}")),
                "{}",
                refused.reason
            );
        }
        assert_eq!(
            parse(&[("op", op), ("license", b"a"), ("session", b"s")])
                .unwrap()
                .lease(),
            None
        );
        let required = parse_request(
            "1-0",
            &entry(&[
                ("op", op),
                ("license", b"a"),
                ("session", b"s"),
                ("reply_to", b"seat:reply:c"),
            ]),
            &rules(true, DEFAULT_MAX_ENTRY_BYTES),
        )
        .unwrap_err();
        assert_eq!(required.field, "lease");
        assert!(
            required.reason.contains("sessions.require_lease"),
            "{}",
            required.reason
        );
        assert_eq!(required.echo.reply_to.as_deref(), Some("seat:reply:c"));
    }
    assert!(valid_lease(&"a".repeat(MIN_LEASE_LEN)) && valid_lease(&"Z".repeat(MAX_LEASE_LEN)));
    assert!(!valid_lease(&"a".repeat(MIN_LEASE_LEN - 1)));
}

#[test]
fn reply_to_outside_the_reply_namespace_is_refused_without_an_address() {
    let outside: [&[u8]; 7] = [
        b"orders:jobs",
        b"seat:{a}:holders",
        b"seat:requests",
        b"seat:reply:",
        b"seat:replyx:1",
        b"reply:c1",
        b"SEAT:REPLY:c1",
    ];
    for reply_to in outside {
        let bad = parse(&[
            ("op", b"acquire"),
            ("license", b"a"),
            ("session", b"s"),
            ("reply_to", reply_to),
        ])
        .unwrap_err();
        assert_eq!(bad.field, "reply_to");
        assert_eq!(bad.echo.reply_to, None, "no address to answer at");
        assert!(
            bad.reason.contains("`reply_to`") && bad.reason.contains("\"seat:reply:\""),
            "{}",
            bad.reason
        );
    }
    for malformed in [&b"seat:reply:a b"[..], b"seat:reply:\xff", b""] {
        let bad = parse(&[("op", b"release"), ("reply_to", malformed)]).unwrap_err();
        assert_eq!((bad.field, bad.echo.reply_to.as_deref()), ("reply_to", None));
    }
    let ok = parse(&[
        ("op", b"release"),
        ("license", b"a"),
        ("session", b"s"),
        ("reply_to", b"seat:reply:{app}:1"),
    ])
    .unwrap();
    assert_eq!(ok.reply_to.as_deref(), Some("seat:reply:{app}:1"));
}

#[test]
fn an_invalid_id_is_still_answered_under_the_entry_id() {
    let bad = parse(&[("op", b"acquire"), ("id", b""), ("reply_to", b"seat:reply:c1")]).unwrap_err();
    assert_eq!((bad.field, bad.echo.id.as_str()), ("id", "1-0"));
    assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:c1"));
}

#[test]
fn untrusted_text_in_errors_stays_on_one_line() {
    let long = vec![b'z'; MAX_FIELD_LEN + 1];
    let bad = parse(&[("\n", &long)]).unwrap_err();
    assert!(!bad.reason.contains('\n'), "{}", bad.reason);
    assert_eq!(truncate(&"x".repeat(40)), format!("{}…", "x".repeat(32)));
}

#[test]
fn duplicate_fields_are_refused() {
    let bad = parse(&[
        ("op", b"acquire"),
        ("license", b"a"),
        ("session", b"s"),
        ("op", b"release"),
    ])
    .unwrap_err();
    assert_eq!(bad.field, "fields");
    assert!(bad.reason.contains("`op`"), "{}", bad.reason);
}

#[test]
fn a_bad_op_still_echoes_license_and_session() {
    let bad = parse(&[("op", b"steal"), ("license", b"a"), ("session", b"s")]).unwrap_err();
    assert_eq!((bad.echo.license.as_str(), bad.echo.session.as_str()), ("a", "s"));
}

#[test]
fn too_many_fields_are_refused() {
    let names: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
    let mut pairs: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"x"[..])).collect();
    pairs.push(("op", b"acquire"));
    assert_eq!(parse(&pairs).unwrap_err().field, "fields");
}

#[test]
fn reply_fields_carry_ok_and_optional_parts() {
    let reply = Reply {
        id: "r1".into(),
        op: "heartbeat".into(),
        status: Status::HeartbeatUpdated,
        license: "a".into(),
        session: "s".into(),
        seats_used: 1,
        seats_total: 5,
        heartbeats: Some(3),
        position: None,
        waited_ms: None,
        heartbeat_timeout_ms: None,
        held_since_ms: None,
        priority: None,
        linger_ms: None,
        borrowed_until_ms: None,
        error: None,
    };
    let f = reply.fields();
    assert!(f.contains(&("ok", "1".into())));
    assert!(f.contains(&("heartbeats", "3".into())));
    assert!(!f
        .iter()
        .any(|(k, _)| *k == "error" || *k == "heartbeat_timeout_ms"));
    let acquired = Reply {
        status: Status::Acquired,
        heartbeats: None,
        heartbeat_timeout_ms: Some(90_000),
        ..reply
    };
    assert!(acquired
        .fields()
        .contains(&("heartbeat_timeout_ms", "90000".into())));
}

/// The documented wire form of every op. A match without a wildcard, so
/// a new op does not compile until it has its row here.
fn documented(op: Op) -> &'static str {
    match op {
        Op::Acquire => "acquire",
        Op::Release => "release",
        Op::Heartbeat => "heartbeat",
        Op::Revoke => "revoke",
    }
}

#[test]
fn every_op_round_trips_through_its_wire_form() {
    for &op in Op::ALL {
        assert_eq!(op.as_str(), documented(op));
        assert_eq!(op.to_string(), documented(op));
        assert_eq!(documented(op).parse::<Op>(), Ok(op));
    }
    assert!("Acquire".parse::<Op>().is_err());
}

#[test]
fn messages_and_the_protocol_document_list_every_op() {
    assert_eq!(op_choices(Lane::Requests), "acquire, release or heartbeat");
    assert_eq!(op_choices(Lane::Admin), "revoke");
    let doc = include_str!("../../../../docs/protocol.md");
    // The requests' field table and the admin stream's each have an `op` row.
    let rows: Vec<&str> = doc.lines().filter(|line| line.starts_with("| `op`")).collect();
    for &op in Op::ALL {
        assert!(op_choices(op.lane()).contains(op.as_str()));
        assert!(
            rows.iter().any(|row| row.contains(&format!("`{op}`"))),
            "docs/protocol.md: {rows:?}"
        );
    }
}

fn admin(pairs: &[(&str, &[u8])]) -> Result<Request, Invalid> {
    parse_entry(Lane::Admin, "1-0", &entry(pairs), &Rules::new("seat:reply:"))
}

#[test]
fn a_revoke_s_cooldown_scope_is_session_or_user_and_user_needs_a_cooldown() {
    let revoke = |scope: &[u8], cooldown: &[u8]| {
        admin(&[
            ("op", b"revoke"),
            ("license", b"cad"),
            ("session", b"s"),
            ("reason", b"r"),
            ("cooldown_ms", cooldown),
            ("cooldown_scope", scope),
        ])
    };
    let user_wide = |r: Result<Request, Invalid>| match r.unwrap().action {
        Action::Revoke(r) => r.user_wide,
        other => panic!("{other:?}"),
    };
    assert!(user_wide(revoke(b"user", b"1000")));
    assert!(!user_wide(revoke(b"session", b"1000")));
    for (scope, cooldown, says) in [
        (&b"user"[..], &b"0"[..], "needs a `cooldown_ms` above 0"),
        (b"users", b"1000", "must be `session` or `user`"),
    ] {
        let bad = revoke(scope, cooldown).unwrap_err();
        assert_eq!(bad.field, "cooldown_scope");
        assert!(bad.reason.contains(says), "{}", bad.reason);
    }
}

#[test]
fn a_revoke_parses_on_the_admin_stream_only() {
    let full: Vec<(&str, &[u8])> = vec![
        ("op", b"revoke"),
        ("id", b"r1"),
        ("license", b"cad"),
        ("session", b"alice"),
        (
            "reason",
            "seat shared outside the team — see ticket 42".as_bytes(),
        ),
        ("actor", b"ada"),
        ("cooldown_ms", b"60000"),
        ("reply_to", b"seat:reply:admin:1"),
    ];
    let req = admin(&full).unwrap();
    assert_eq!((req.op(), req.session.as_str()), (Op::Revoke, "alice"));
    assert_eq!(
        req.action,
        Action::Revoke(Revoke {
            reason: "seat shared outside the team — see ticket 42".into(),
            actor: "ada".into(),
            cooldown_ms: 60_000,
            user_wide: false,
        })
    );
    let bad = parse(&full).unwrap_err();
    assert_eq!((bad.field, bad.echo.op.as_str()), ("op", "revoke"));
    assert_eq!(
        bad.reason,
        "op `revoke` is not accepted on the requests stream (stream.requests), only on the admin stream (stream.admin_requests)"
    );
    assert_eq!(bad.echo.reply_to.as_deref(), Some("seat:reply:admin:1"));

    let bad = admin(&[("op", b"acquire"), ("license", b"cad"), ("session", b"s")]).unwrap_err();
    assert_eq!(bad.field, "op");
    assert!(
        bad.reason.contains("only on the requests stream"),
        "{}",
        bad.reason
    );
    let bad = admin(&[("op", b"steal")]).unwrap_err();
    assert_eq!(bad.reason, r#"unknown op "steal"; expected revoke"#);

    let minimal = admin(&[
        ("op", b"revoke"),
        ("license", b"cad"),
        ("session", b"s"),
        ("reason", b"r"),
    ])
    .unwrap();
    let Action::Revoke(fields) = minimal.action else {
        panic!("a revoke parses as one: {minimal:?}")
    };
    assert_eq!((fields.actor.as_str(), fields.cooldown_ms), (UNKNOWN_ACTOR, 0));
    assert_eq!(
        parse(&[("op", b"acquire"), ("license", b"a"), ("session", b"s")])
            .unwrap()
            .op(),
        Op::Acquire
    );
}

#[test]
fn a_revoke_must_say_why_in_one_line_and_bounded() {
    let long_reason = vec![b'r'; MAX_REASON_LEN + 1];
    let long_actor = vec![b'a'; MAX_ACTOR_LEN + 1];
    type Case<'a> = (Vec<(&'a str, &'a [u8])>, &'a str);
    let cases: Vec<Case> = vec![
        (vec![], "reason"),
        (vec![("reason", b"")], "reason"),
        (vec![("reason", &long_reason)], "reason"),
        (vec![("reason", b"two\nlines")], "reason"),
        (vec![("reason", b"\xff")], "reason"),
        (vec![("reason", b"r"), ("actor", b"")], "actor"),
        (vec![("reason", b"r"), ("actor", &long_actor)], "actor"),
        (vec![("reason", b"r"), ("actor", b"a\tb")], "actor"),
        (vec![("reason", b"r"), ("cooldown_ms", b"-1")], "cooldown_ms"),
        (
            vec![("reason", b"r"), ("cooldown_ms", b"604800001")],
            "cooldown_ms",
        ),
    ];
    for (extra, field) in cases {
        let mut pairs: Vec<(&str, &[u8])> = vec![("op", b"revoke"), ("license", b"cad"), ("session", b"s")];
        pairs.extend(extra);
        let bad = admin(&pairs).expect_err(field);
        assert_eq!(bad.field, field, "{pairs:?}: {}", bad.reason);
        assert!(!bad.reason.contains('\n'));
    }
    let longest = vec![b'r'; MAX_REASON_LEN];
    let at_the_limits = admin(&[
        ("op", b"revoke"),
        ("license", b"cad"),
        ("session", b"s"),
        ("reason", &longest),
        ("cooldown_ms", b"604800000"),
    ]);
    assert!(at_the_limits.is_ok());
}

#[test]
fn an_unknown_op_is_echoed_only_when_short_and_made_of_id_characters() {
    let bad = parse(&[("op", b"steal"), ("license", b"a"), ("session", b"s")]).unwrap_err();
    assert_eq!(bad.echo.op, "steal");
    assert_eq!(
        bad.reason,
        r#"unknown op "steal"; expected acquire, release or heartbeat"#
    );
    let long = "x".repeat(MAX_ECHOED_OP_LEN + 1);
    let bad = parse(&[("op", long.as_bytes())]).unwrap_err();
    assert_eq!(bad.echo.op, "");
    let bad = parse(&[("op", b"st eal")]).unwrap_err();
    assert_eq!(bad.echo.op, "");
    let bad = parse(&[("license", b"a")]).unwrap_err();
    assert_eq!(bad.reason, "missing field `op` (acquire, release or heartbeat)");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// The parser never panics, and what it accepts is within the documented limits.
    #[test]
    fn the_parser_never_panics_and_accepts_only_valid_requests(fields in hostile::entry()) {
        for lane in [Lane::Requests, Lane::Admin] {
            match parse_entry(lane, "1-0", &fields, &Rules::new("seat:reply:")) {
                Ok(req) => {
                    prop_assert_eq!(req.op().lane(), lane);
                    prop_assert!(valid_id(&req.license));
                    prop_assert!(valid_id(&req.session));
                    prop_assert!(req.lease().is_none_or(|l| valid_lease(l.as_str())));
                    match &req.action {
                        Action::Acquire(a) => {
                            prop_assert!(a.meta.len() <= MAX_META_LEN);
                            prop_assert!(a.wait_ms <= MAX_WAIT_MS);
                            prop_assert!(a.policy.priority <= MAX_PRIORITY);
                            prop_assert!(a.policy.borrow_ms <= MAX_BORROW_MS);
                        }
                        Action::Revoke(r) => {
                            prop_assert!(r.reason.len() <= MAX_REASON_LEN && !r.reason.contains('\n'));
                            prop_assert!(r.cooldown_ms <= MAX_COOLDOWN_MS);
                        }
                        Action::Release(_) | Action::Heartbeat(_) => {}
                    }
                }
                Err(bad) => {
                    prop_assert!(!bad.reason.is_empty());
                    prop_assert!(!bad.reason.contains('\n'));
                }
            }
        }
    }
}

#[test]
fn ttl_ms_defaults_and_is_capped_by_the_service() {
    let rules = Rules {
        default_ttl_ms: 30_000,
        max_ttl_ms: 45_000,
        ..Rules::new("seat:reply:")
    };
    let ttl = |pairs: &[(&str, &[u8])]| {
        let mut pairs = pairs.to_vec();
        pairs.extend_from_slice(&[("license", b"a"), ("session", b"s")]);
        parse_request("1-0", &entry(&pairs), &rules).unwrap().ttl_ms
    };
    assert_eq!(ttl(&[("op", b"acquire")]), 30_000, "the default");
    assert_eq!(ttl(&[("op", b"heartbeat"), ("ttl_ms", b"5000")]), 5_000);
    assert_eq!(
        ttl(&[("op", b"release"), ("ttl_ms", b"86400000")]),
        45_000,
        "the cap"
    );
    let revoke = parse_entry(
        Lane::Admin,
        "1-0",
        &entry(&[
            ("op", b"revoke"),
            ("reason", b"audit"),
            ("license", b"a"),
            ("session", b"s"),
            ("ttl_ms", b"700"),
        ]),
        &rules,
    )
    .unwrap();
    assert_eq!(revoke.ttl_ms, 700, "the admin stream's too");
    let never = Rules {
        default_ttl_ms: 0,
        ..rules
    };
    let req = parse_request(
        "1-0",
        &entry(&[("op", b"acquire"), ("license", b"a"), ("session", b"s")]),
        &never,
    );
    assert_eq!(req.unwrap().ttl_ms, 0, "no default: no deadline");
}

#[test]
fn a_request_is_keyed_by_its_callers_id_or_by_its_stream_and_entry() {
    let policy = GuardPolicy {
        dedupe_window_ms: 60_000,
        session_limit: 0,
        license_limit: 0,
        rate_window_ms: 1,
        application: Default::default(),
    };
    let keys = Keys::new("seat");
    let now = 1_796_013_949_007;
    let entry_id = "1796013949000-3";
    let at = |lane, stream| EntryAt {
        lane,
        stream,
        id: entry_id,
    };
    let with_id = parse(&[
        ("op", b"release"),
        ("id", b"r|1"),
        ("license", b"a"),
        ("session", b"s"),
    ])
    .unwrap();
    assert!(with_id.id_sent);
    let g = with_id.guard(&policy, &keys, at(Lane::Requests, Some("2")), Some(now));
    assert_eq!(
        g.entry_id, "R|s|r|1",
        "op, session, id; the script adds the lease hash"
    );
    assert!(g.by_request && g.redelivery);
    // Placed by the clock, looking in the bucket before too.
    assert_eq!(g.done_key, keys.dedupe("a", now / 60_000));
    assert_eq!(g.done_before_key, keys.dedupe("a", now / 60_000 - 1));
    assert_eq!(
        g.deadline_ms,
        1_796_013_949_000 + 60_000,
        "the entry's time plus the default ttl"
    );

    let bare = parse(&[("op", b"release"), ("license", b"a"), ("session", b"s")]).unwrap();
    assert!(!bare.id_sent);
    let key = |lane, shard| bare.guard(&policy, &keys, at(lane, shard), Some(now)).entry_id;
    assert_eq!(
        key(Lane::Requests, None),
        entry_id,
        "the base stream: the bare id, as before"
    );
    assert_eq!(key(Lane::Requests, Some("2")), format!("2:{entry_id}"));
    assert_eq!(
        key(Lane::Requests, Some("app:billing")),
        format!("app:billing:{entry_id}"),
        "an application's stream: the same id there is another entry"
    );
    assert_eq!(key(Lane::Admin, None), format!("admin:{entry_id}"));
    let g = bare.guard(&policy, &keys, at(Lane::Requests, None), Some(now));
    assert!(!g.by_request && g.redelivery);
}
