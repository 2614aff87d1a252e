//! Generated hostile request entries: arbitrary field maps, byte strings and
//! sizes. One generator for two tests: the parser's property test next to the
//! parser (`engine::ops`), and the integration test that feeds such
//! entries through a real worker (tests/it/invalid.rs includes this file by
//! path, since an integration test cannot see the library's test code).

use proptest::prelude::*;

/// Field names: the real ones, near misses and junk.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "op",
            "license",
            "session",
            "meta",
            "wait_ms",
            "id",
            "x",
            "OP",
            "op ",
            "user",
            "group",
            "priority",
            "borrow_ms",
            "reason",
            "actor",
            "cooldown_ms"
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
            "revoke",
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

/// One request entry: up to 11 fields, repeats and all.
pub fn entry() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    prop::collection::vec((field_name(), field_value()), 0..12)
}
