//! The records the seat scripts store in Redis, as Rust reads them back.
//!
//! Each record is built in one Lua include (named on its type) and decoded
//! here only; tests/it/scripts.rs runs the real scripts on a real Redis and
//! decodes what they stored, so a change on either side fails a test.

use redis::Value;
use serde::Deserialize;

use crate::error::Error;
use crate::scripts::{decode_outcome, Outcome};

/// A seat holder's record, the value of its session in `seat:{L}:sessions`,
/// written by lua/includes/session_record.lua:
/// `"<acquired_at_ms>:<heartbeats>:<meta>"`, or
/// `"<acquired_at_ms>:<heartbeats>:<lease_hash>:<meta>"` when the seat is
/// bound to a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// When the seat was taken or granted (Redis clock, ms).
    pub acquired_at_ms: i64,
    /// Heartbeats counted since.
    pub heartbeats: i64,
    /// The hash of the lease the seat is bound to (16 hex digits, never the
    /// lease itself: lua/includes/lease.lua); `None` when bound to none.
    pub lease_hash: Option<String>,
    /// The caller's metadata JSON object, as it sent it.
    pub meta: String,
}

/// Digits of a lease hash (lua/includes/lease.lua).
const LEASE_HASH_LEN: usize = 16;

impl SessionRecord {
    /// Reads a record; `None` when it is not of the scripts' form (the same
    /// rule as the Lua parser: two runs of digits, then perhaps 16 hex
    /// digits and a colon, then anything). Metadata always starts with `{`,
    /// so it is never taken for a lease hash.
    pub fn parse(raw: &str) -> Option<SessionRecord> {
        let mut parts = raw.splitn(3, ':');
        let mut number = || {
            parts
                .next()
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse().ok())
        };
        let acquired_at_ms = number()?;
        let heartbeats = number()?;
        let rest = parts.next()?;
        let (lease_hash, meta) = match rest.split_once(':') {
            Some((hash, meta))
                if hash.len() == LEASE_HASH_LEN && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                (Some(hash.to_owned()), meta)
            }
            _ => (None, rest),
        };
        Some(SessionRecord {
            acquired_at_ms,
            heartbeats,
            lease_hash,
            meta: meta.to_owned(),
        })
    }
}

/// A waiting session's record, the value of its session in
/// `seat:{L}:waiters`, written by lua/includes/queue.lua in its compact form:
/// `"<queued_at>.<id>\n<reply_to>\n<meta>"`, or
/// `"<queued_at>~<lease_hash><id>\n<reply_to>\n<meta>"` when the place is
/// bound to a lease; `queued_at` in base 36, the lease hash 16 hex digits,
/// the reply_to empty (none), `*<rest>` for `seat:reply:<rest>` or
/// `=<reply_to>`. Records written by earlier versions
/// read as well: the plain form `"<queued_at>:<lease_hash>:<id>\n<reply_to>\n<meta>"`
/// (decimal, hex, as is) and JSON, `{"id", "reply_to", "meta", "queued_at",
/// "lease_hash"?}`, which the scripts still write for an id or reply_to
/// holding a newline (the protocol never lets one through).
/// [`WaiterRecord::parse`] reads all three.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WaiterRecord {
    /// The request id its later GRANTED / QUEUE_TIMEOUT carries.
    pub id: String,
    /// Where that reply goes ("" = nowhere).
    pub reply_to: String,
    /// The metadata JSON object it queued with, as a string.
    pub meta: String,
    /// When it joined the queue (Redis clock, ms).
    pub queued_at: i64,
    /// The hash of the lease its place (and the seat granted from it) is
    /// bound to; `None` when bound to none.
    #[serde(default)]
    pub lease_hash: Option<String>,
}

/// The default `replies.prefix`, written `*` in a compact waiter record.
const DEFAULT_REPLY_PREFIX: &str = "seat:reply:";

impl WaiterRecord {
    /// Reads a record of any form; `None` when it is of none (the Lua
    /// parser's rules, lua/includes/queue.lua).
    pub fn parse(raw: &str) -> Option<WaiterRecord> {
        if raw.starts_with('{') {
            return serde_json::from_str(raw).ok();
        }
        Self::parse_compact(raw).or_else(|| Self::parse_plain(raw))
    }

    /// The compact form: base-36 digits, `.` or `~` and 16 hex digits, the
    /// id, then two lines and the rest.
    fn parse_compact(raw: &str) -> Option<WaiterRecord> {
        let at_end = raw.find(|c: char| !(c.is_ascii_digit() || c.is_ascii_lowercase()))?;
        let (at, rest) = raw.split_at(at_end);
        if at.is_empty() {
            return None;
        }
        let (lease_hash, rest) = match rest.as_bytes().first()? {
            b'.' => (None, &rest[1..]),
            b'~' => {
                let hash = rest.get(1..=LEASE_HASH_LEN)?;
                if !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                (Some(hash.to_owned()), &rest[1 + LEASE_HASH_LEN..])
            }
            _ => return None,
        };
        let (id, rest) = rest.split_once('\n')?;
        let (reply_to, meta) = rest.split_once('\n')?;
        let reply_to = if reply_to.is_empty() {
            String::new()
        } else if let Some(tail) = reply_to.strip_prefix('*') {
            format!("{DEFAULT_REPLY_PREFIX}{tail}")
        } else {
            reply_to.strip_prefix('=')?.to_owned()
        };
        Some(WaiterRecord {
            id: id.to_owned(),
            reply_to,
            meta: meta.to_owned(),
            queued_at: i64::from_str_radix(at, 36).ok()?,
            lease_hash,
        })
    }

    /// The plain form of earlier versions: digits, a colon, nothing or 16
    /// hex digits, a colon, then two lines and the rest.
    fn parse_plain(raw: &str) -> Option<WaiterRecord> {
        let (queued_at, rest) = raw.split_once(':')?;
        if queued_at.is_empty() || !queued_at.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (lease, rest) = rest.split_once(':')?;
        let lease_hash = match lease.len() {
            0 => None,
            LEASE_HASH_LEN if lease.bytes().all(|b| b.is_ascii_hexdigit()) => Some(lease.to_owned()),
            _ => return None,
        };
        let (id, rest) = rest.split_once('\n')?;
        let (reply_to, meta) = rest.split_once('\n')?;
        Some(WaiterRecord {
            id: id.to_owned(),
            reply_to: reply_to.to_owned(),
            meta: meta.to_owned(),
            queued_at: queued_at.parse().ok()?,
            lease_hash,
        })
    }
}

/// A seat holder's or waiter's owner record, the value of field
/// `s:<session>` in `seat:{L}:owners`, written by lua/includes/owners.lua:
/// `"<user>|<group>|<borrow_ms>"`, empty parts for none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    /// The user the seat counts for, if the acquire carried one.
    pub user: Option<String>,
    /// The group the seat counts for, if the acquire carried one.
    pub group: Option<String>,
    /// The borrow the acquire asked for, ms (0 = none).
    pub borrow_ms: u64,
}

impl OwnerRecord {
    /// Reads a record; `None` when it is not of the scripts' form (the Lua
    /// parser's rule: two parts without `|`, then digits).
    pub fn parse(raw: &str) -> Option<OwnerRecord> {
        let mut parts = raw.split('|');
        let (user, group, borrow) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || borrow.is_empty() || !borrow.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let id = |s: &str| Some(s.to_owned()).filter(|s| !s.is_empty());
        Some(OwnerRecord {
            user: id(user),
            group: id(group),
            borrow_ms: borrow.parse().ok()?,
        })
    }
}

/// Decodes a dedupe record, the value of a stream entry id in
/// `seat:{L}:done:<bucket>`, written by lua/includes/dedupe.lua: what the
/// entry's outcome answered, either plain, `ACQUIRED:1:5:0` (status, seats
/// used, seats total, a number for detail), then a line per note, its eight
/// slots joined by tabs (`\nGRANTED\tw1\tr-1\tseat:reply:w1\t2749\t…`), or
/// as a JSON array of the outcome's first six slots,
/// `["NO_SEATS_AVAILABLE",5,5,"queue_full",1796013949007,{}]`.
/// Returns the outcome a replay of that entry at `now_ms` (the Redis clock)
/// answers (`changed` false, `replayed` true), as the Lua side rebuilds it,
/// but for what a replay reads from the license as it stands and the record
/// does not keep: the due index times and the heartbeat timeout (`None` here).
pub fn parse_dedupe_record(raw: &str, now_ms: i64) -> Result<Outcome, Error> {
    let bad = |detail: String| Error::ScriptReply {
        script: "dedupe",
        detail,
    };
    let mut slots = if raw.starts_with('[') {
        let json: serde_json::Value = serde_json::from_str(raw).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Value::Array(slots) = to_redis(&json).ok_or_else(|| bad(format!("not a record: {raw}")))? else {
            return Err(bad(format!("not an array: {raw}")));
        };
        if slots.len() != 6 {
            return Err(bad(format!("{} slots, not 6", slots.len())));
        }
        slots
    } else {
        plain_dedupe_slots(raw).ok_or_else(|| bad(format!("not a record: {raw}")))?
    };
    slots[4] = Value::Int(now_ms); // the replay's clock
    slots.push(Value::Int(0)); // changed
    slots.push(Value::Int(1)); // replayed
    slots.push(Value::Int(0)); // stale: not kept
    slots.push(Value::Int(0)); // due: not kept
    slots.push(Value::Int(0)); // heartbeat_timeout_ms: not kept
    decode_outcome("dedupe", Value::Array(slots))
}

/// The outcome slots of a plain dedupe record, `<STATUS>:<used>:<total>:<detail>`
/// and its note lines, as the script reads it (now_ms 0, to be set);
/// `None` for anything else.
fn plain_dedupe_slots(raw: &str) -> Option<Vec<Value>> {
    let mut lines = raw.split('\n');
    let mut parts = lines.next()?.split(':');
    let status = parts.next()?;
    let word = |c: char| c.is_ascii_uppercase() || c == '_';
    if !status.starts_with(|c: char| c.is_ascii_uppercase()) || !status.chars().all(word) {
        return None;
    }
    let mut slots = vec![Value::BulkString(status.as_bytes().to_vec())];
    for _ in 0..3 {
        let digits = parts.next()?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        slots.push(Value::Int(digits.parse().ok()?));
    }
    if parts.next().is_some() {
        return None;
    }
    slots.push(Value::Int(0)); // now_ms
    let notes = lines.map(dedupe_note).collect::<Option<Vec<Value>>>()?;
    slots.push(Value::Array(notes));
    Some(slots)
}

/// One note line of a plain dedupe record: kind, session, request id,
/// reply_to, waited_ms, note id, held_since_ms, delivery (empty when unset),
/// tab-separated, as the note's slots (lua/includes/outbox.lua).
fn dedupe_note(line: &str) -> Option<Value> {
    let f: Vec<&str> = line.split('\t').collect();
    let [kind, session, id, reply_to, waited, note_id, at, delivery] = f.as_slice() else {
        return None;
    };
    let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let mut note = vec![
        text(kind),
        text(session),
        text(id),
        text(reply_to),
        Value::Int(waited.parse().ok()?),
        text(note_id),
        Value::Int(at.parse().ok()?),
    ];
    if !delivery.is_empty() {
        note.push(Value::Int(delivery.parse().ok()?));
    }
    Some(Value::Array(note))
}

/// JSON as a Lua script would hand the same data to Redis: strings as bulk
/// strings, integers as integers, arrays (and cjson's empty table `{}`) as arrays.
fn to_redis(json: &serde_json::Value) -> Option<Value> {
    use serde_json::Value as J;
    match json {
        J::String(s) => Some(Value::BulkString(s.clone().into_bytes())),
        J::Number(n) => n.as_i64().map(Value::Int),
        J::Array(items) => items
            .iter()
            .map(to_redis)
            .collect::<Option<_>>()
            .map(Value::Array),
        J::Object(map) if map.is_empty() => Some(Value::Array(Vec::new())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::{Decision, Delivery, NoSeats};
    use crate::status::Status;

    #[test]
    fn session_records_split_on_the_first_two_colons() {
        let r = SessionRecord::parse(r#"1796011191648:3:{"url":"http://x:1"}"#).unwrap();
        assert_eq!(
            (r.acquired_at_ms, r.heartbeats, r.meta.as_str()),
            (1796011191648, 3, r#"{"url":"http://x:1"}"#)
        );
        assert_eq!(r.lease_hash, None);
        let leased = SessionRecord::parse(r#"1796011191648:0:0123456789abcdef:{"a":"b:c"}"#).unwrap();
        assert_eq!(
            (leased.lease_hash.as_deref(), leased.meta.as_str()),
            (Some("0123456789abcdef"), r#"{"a":"b:c"}"#)
        );
        // Not 16 hex digits: part of the (foreign) metadata, not a lease.
        let odd = SessionRecord::parse("1:0:0123456789abcdeg:x").unwrap();
        assert_eq!((odd.lease_hash, odd.meta.as_str()), (None, "0123456789abcdeg:x"));
        for foreign in ["", "12", "12:3", "x:3:{}", "12:-3:{}", ":3:{}"] {
            assert_eq!(SessionRecord::parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn waiter_records_read_in_the_compact_form() {
        // 1796011839633 in base 36; the default reply prefix written '*'.
        let compact = WaiterRecord::parse("mx2r2snl.req: 1\n*c-1\n{\"a\":\"b:c\\nd\"}").unwrap();
        assert_eq!(
            compact,
            WaiterRecord {
                id: "req: 1".into(),
                reply_to: "seat:reply:c-1".into(),
                meta: r#"{"a":"b:c\nd"}"#.into(),
                queued_at: 1796011839633,
                lease_hash: None,
            }
        );
        // The same waiter in the plain form of the version before.
        assert_eq!(
            WaiterRecord::parse("1796011839633::req: 1\nseat:reply:c-1\n{\"a\":\"b:c\\nd\"}"),
            Some(compact)
        );
        // A lease hash; a reply_to outside the default prefix spelt out
        // after '='; an id that looks like the start of another form is
        // just an id.
        let raw = "1~0123456789abcdef9::x\n=app:r\n{}";
        let w = WaiterRecord::parse(raw).unwrap();
        assert_eq!(
            (
                w.queued_at,
                w.lease_hash.as_deref(),
                w.id.as_str(),
                w.reply_to.as_str(),
                w.meta.as_str()
            ),
            (1, Some("0123456789abcdef"), "9::x", "app:r", "{}"),
        );
        let nowhere = WaiterRecord::parse("z.\n\n{\n}").unwrap();
        assert_eq!(
            (
                nowhere.queued_at,
                nowhere.id.as_str(),
                nowhere.reply_to.as_str(),
                nowhere.meta.as_str()
            ),
            (35, "", "", "{\n}")
        );
        for foreign in [
            "mx2r2snl.r\nseat:reply:c\n{}", // a reply_to without its mark
            "mx2r2snl.r\n*c",               // one line short
            "mx2r2snl,r\n\n{}",
            "Mx2r2snl.r\n\n{}",
            ".r\n\n{}",
            "1~0123456789abcde\n\n{}",        // a lease hash short
            "1~0123456789abcdeg\n\n{}",       // not hex
            "zzzzzzzzzzzzzzzzzzzzzz.r\n\n{}", // past i64
        ] {
            assert_eq!(WaiterRecord::parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn waiter_records_of_earlier_versions_read_in_both_forms() {
        let plain =
            WaiterRecord::parse("1796011839633::req: 1\nseat:reply:c-1\n{\"a\":\"b:c\\nd\"}").unwrap();
        assert_eq!(
            plain,
            WaiterRecord {
                id: "req: 1".into(),
                reply_to: "seat:reply:c-1".into(),
                meta: r#"{"a":"b:c\nd"}"#.into(),
                queued_at: 1796011839633,
                lease_hash: None,
            }
        );
        // The metadata is the rest, newlines and all; nowhere to reply is empty.
        let leased = WaiterRecord::parse("1:0123456789abcdef:r\n\n{\n}").unwrap();
        assert_eq!(
            (
                leased.lease_hash.as_deref(),
                leased.reply_to.as_str(),
                leased.meta.as_str()
            ),
            (Some("0123456789abcdef"), "", "{\n}")
        );
        // Written before the plain form: the same record as JSON.
        let json = r#"{"id":"req: 1","reply_to":"seat:reply:c-1","meta":"{\"a\":\"b:c\\nd\"}","queued_at":1796011839633}"#;
        assert_eq!(WaiterRecord::parse(json), Some(plain));
        let json_leased =
            r#"{"id":"r","reply_to":"","meta":"{}","queued_at":1,"lease_hash":"0123456789abcdef"}"#;
        assert_eq!(
            WaiterRecord::parse(json_leased).and_then(|w| w.lease_hash),
            Some("0123456789abcdef".into())
        );
        for foreign in [
            "",
            "1::r\nseat:reply:c",
            "x::r\n\n{}",
            ":::r\n\n{}",
            "1:0123:r\n\n{}",
            "1:0123456789abcdeg:r\n\n{}",
            "1:r\n\n{}",
            "-1::r\n\n{}",
            "{\"id\":\"r\"}",
            "{",
        ] {
            assert_eq!(WaiterRecord::parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn owner_records_split_on_bars() {
        let r = OwnerRecord::parse("ada@example.com|cad|86400000").unwrap();
        assert_eq!(
            (r.user.as_deref(), r.group.as_deref(), r.borrow_ms),
            (Some("ada@example.com"), Some("cad"), 86_400_000)
        );
        let lingering = OwnerRecord::parse("||0").unwrap();
        assert_eq!(
            (lingering.user, lingering.group, lingering.borrow_ms),
            (None, None, 0)
        );
        for foreign in ["", "a|b", "a|b|", "a|b|c", "a|b|1|2", "a|b|-1"] {
            assert_eq!(OwnerRecord::parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn dedupe_records_decode_with_and_without_notes() {
        const NOW: i64 = 1796013999999;
        for raw in [r#"["QUEUED",1,1,2,1796013949007,{}]"#, "QUEUED:1:1:2"] {
            let o = parse_dedupe_record(raw, NOW).unwrap();
            assert_eq!(
                (&o.decision, o.seats_used, o.now_ms, o.changed, o.replayed),
                (
                    &Decision::Queued {
                        position: 2,
                        priority: 0
                    },
                    1,
                    NOW,
                    false,
                    true
                ),
                "{raw}"
            );
            assert!(o.notes.is_empty());
        }
        let full =
            parse_dedupe_record(r#"["NO_SEATS_AVAILABLE",5,5,"queue_full",1796013949007,{}]"#, NOW).unwrap();
        assert_eq!(full.decision, Decision::NoSeatsAvailable(NoSeats::QueueFull));
        let raw = r#"["RELEASED",1,1,0,1796013944505,[["GRANTED","w1","r-1","seat:reply:w1",2749,"GRANTED:w1:1796013944505"]]]"#;
        let o = parse_dedupe_record(raw, NOW).unwrap();
        assert_eq!(o.notes.len(), 1);
        assert_eq!((o.notes[0].status, o.notes[0].waited_ms), (Status::Granted, 2749));
        let raw = "RELEASED:1:1:0\nGRANTED\tw1\tr-1\tseat:reply:w1\t2749\tGRANTED:w1:1796013944505\t1796013944505\t1\n\
                   QUEUE_TIMEOUT\tw2\tr-2\t\t-3\tQUEUE_TIMEOUT:w2:1796013944505\t1796013944505\t";
        let o = parse_dedupe_record(raw, NOW).unwrap();
        assert_eq!(
            (&o.decision, o.replayed),
            (&Decision::Released { linger_ms: None }, true)
        );
        let n = &o.notes;
        assert_eq!(n.len(), 2);
        assert_eq!(
            (
                n[0].status,
                n[0].session.as_str(),
                n[0].request_id.as_str(),
                n[0].reply_to.as_str()
            ),
            (Status::Granted, "w1", "r-1", "seat:reply:w1")
        );
        assert_eq!(
            (
                n[0].waited_ms,
                n[0].note_id.as_str(),
                n[0].held_since_ms,
                n[0].delivery
            ),
            (
                2749,
                "GRANTED:w1:1796013944505",
                Some(1796013944505),
                Delivery::Sent
            )
        );
        assert_eq!(
            (n[1].status, n[1].reply_to.as_str(), n[1].waited_ms, n[1].delivery),
            (Status::QueueTimeout, "", -3, Delivery::Caller)
        );
        for foreign in [
            "ACQUIRED|1|1|0",
            "ACQUIRED:1:1",
            "ACQUIRED:1:1:0:",
            "ACQUIRED:1:1:0:1796013949007",
            "ACQUIRED:1:1:-1",
            "RELEASED:1:1:0\n",
            "RELEASED:1:1:0\nGRANTED\tw1\tr-1\tseat:reply:w1\t2749\tGRANTED:w1:1\t1",
            "RELEASED:1:1:0\nGRANTED\tw1\tr-1\tseat:reply:w1\tsoon\tGRANTED:w1:1\t1\t1",
            "acquired:1:1:0",
            ":1:1:0",
            "[]",
            r#"["ACQUIRED",1]"#,
            r#"{"a":1}"#,
        ] {
            assert!(parse_dedupe_record(foreign, NOW).is_err(), "{foreign}");
        }
    }
}
