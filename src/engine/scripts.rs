//! The embedded Lua registry and the typed calls into it.
//!
//! Each seat script under `lua/` is compiled into the binary with
//! `lua/includes/common.lua` prepended, wrapped in a [`redis::Script`] once,
//! and run with EVALSHA; `invoke_async` re-loads it transparently when Redis
//! answers NOSCRIPT (after a restart or SCRIPT FLUSH). Methods are named after
//! their scripts. The runtime records the seed's two metrics around each call.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Script, ScriptInvocation, Value};

use crate::engine::keys::LicenseKeys;
use crate::engine::status::Status;
use crate::error::Error;

macro_rules! lua {
    ($name:literal) => {
        concat!(
            include_str!("../../lua/includes/common.lua"),
            "\n",
            include_str!(concat!("../../lua/", $name, ".lua"))
        )
    };
}

/// The scripts, built (and hashed) once per process.
pub struct Scripts {
    acquire: Script,
    release: Script,
    heartbeat: Script,
    reap: Script,
    reply: Script,
    remove_consumer: Script,
    unlock: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(lua!("acquire")),
    release: Script::new(lua!("release")),
    heartbeat: Script::new(lua!("heartbeat")),
    reap: Script::new(lua!("reap")),
    // Not a seat script: no common helpers, no seat metrics.
    reply: Script::new(include_str!("../../lua/reply.lua")),
    remove_consumer: Script::new(include_str!("../../lua/remove_consumer.lua")),
    unlock: Script::new(include_str!("../../lua/unlock.lua")),
});

/// Follow-up work a script reports: a waiter to tell about its seat or its timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// GRANTED or QUEUE_TIMEOUT.
    pub status: Status,
    /// The waiting session.
    pub session: String,
    /// The request id it queued with.
    pub request_id: String,
    /// The reply stream it queued with ("" = none).
    pub reply_to: String,
    /// How long it waited, ms.
    pub waited_ms: i64,
    /// Its field in the license's outbox, removed once delivered.
    pub note_id: String,
}

/// What a seat script decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The decision.
    pub status: Status,
    /// Seats held after the script ran.
    pub seats_used: i64,
    /// The license's seat count (0 when there is no license).
    pub seats_total: i64,
    /// Heartbeat count (HEARTBEAT_UPDATED only).
    pub heartbeats: Option<i64>,
    /// 1-based queue position (QUEUED only).
    pub position: Option<i64>,
    /// NO_SEATS_AVAILABLE because the queue is full.
    pub queue_full: bool,
    /// Whether the script changed state (false for a re-sent QUEUED acquire
    /// and for replays), so that an event is published once per change.
    pub changed: bool,
    /// The entry was decided before: this is the stored reply, replayed.
    pub replayed: bool,
    /// The Redis server's time when the script ran, ms.
    pub now_ms: i64,
    /// Waiters granted or timed out by this script.
    pub notes: Vec<Note>,
}

impl Outcome {
    /// An outcome for a request that could not be decided.
    pub fn failed(status: Status) -> Outcome {
        Outcome {
            status,
            seats_used: 0,
            seats_total: 0,
            heartbeats: None,
            position: None,
            queue_full: false,
            changed: false,
            replayed: false,
            now_ms: 0,
            notes: Vec::new(),
        }
    }
}

/// What one reap step did for one license.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// Seats held afterwards.
    pub seats_used: i64,
    /// The license's seat count.
    pub seats_total: i64,
    /// The Redis server's time, ms.
    pub now_ms: i64,
    /// Sessions evicted for a stale heartbeat.
    pub evicted: Vec<String>,
    /// Waiters granted or timed out.
    pub notes: Vec<Note>,
    /// More work is left for this license (the step hit its limit).
    pub more: bool,
    /// Sessions still waiting.
    pub queue_depth: i64,
    /// Outbox notes left undelivered (their deliverer died): deliver again.
    pub redeliver: Vec<Note>,
}

fn with_keys<'a>(script: &'a Script, keys: &LicenseKeys) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    for key in keys.all() {
        call.key(key); // KEYS[1..8] in the order of lua/includes/common.lua
    }
    call
}

/// Redelivery dedupe and rate limiting for one request: KEYS[9..11] and
/// ARGV[1..6] of the request scripts (lua/includes/common.lua).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// The stream entry id ("" = no dedupe, for direct calls).
    pub entry_id: String,
    /// KEYS[9]: the dedupe bucket of the entry.
    pub done_key: String,
    /// When that bucket may expire, unix ms.
    pub done_until_ms: u64,
    /// KEYS[10]: the session's rate window.
    pub session_rate_key: String,
    /// KEYS[11]: the license's rate window.
    pub license_rate_key: String,
    /// Most requests per session per window (0 = no limit).
    pub session_limit: u64,
    /// Most requests per license per window (0 = no limit).
    pub license_limit: u64,
    /// The rate window, ms.
    pub window_ms: u64,
    /// The entry is a redelivery: look up the reply it may have got before.
    pub redelivery: bool,
}

/// How requests are guarded: the dedupe window and the rate limits, as the
/// settings (`dedupe`, `limits`) give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardPolicy {
    /// Guaranteed redelivery dedupe window, ms.
    pub dedupe_window_ms: u64,
    /// Most requests per session per rate window (0 = no limit).
    pub session_limit: u64,
    /// Most requests per license per rate window (0 = no limit).
    pub license_limit: u64,
    /// The rate window, ms.
    pub rate_window_ms: u64,
}

impl Guard {
    /// The guard of stream entry `entry_id` under `policy`. The dedupe
    /// bucket comes from the entry id's time (the Redis clock at XADD), so
    /// every delivery of the entry looks in the same key; it lives until two
    /// windows after the bucket starts, so the guaranteed window is one.
    pub fn for_entry(
        policy: &GuardPolicy,
        keys: &crate::engine::keys::Keys,
        entry_id: &str,
        license: &str,
        session: &str,
    ) -> Guard {
        let window = policy.dedupe_window_ms;
        let added_ms: u64 = entry_id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        let bucket = added_ms / window;
        Guard {
            entry_id: entry_id.to_owned(),
            done_key: keys.dedupe(license, bucket),
            done_until_ms: bucket.saturating_add(2).saturating_mul(window),
            session_rate_key: keys.session_rate(license, session),
            license_rate_key: keys.license_rate(license),
            session_limit: policy.session_limit,
            license_limit: policy.license_limit,
            window_ms: policy.rate_window_ms,
            redelivery: false,
        }
    }

    /// No dedupe and no limits: the seed's direct script path.
    pub fn none(keys: &crate::engine::keys::Keys, license: &str, session: &str) -> Guard {
        Guard {
            entry_id: String::new(),
            done_key: keys.dedupe(license, 0),
            done_until_ms: 0,
            session_rate_key: keys.session_rate(license, session),
            license_rate_key: keys.license_rate(license),
            session_limit: 0,
            license_limit: 0,
            window_ms: 1,
            redelivery: false,
        }
    }
}

fn request_call<'a>(script: &'a Script, keys: &LicenseKeys, guard: &Guard) -> ScriptInvocation<'a> {
    let mut call = with_keys(script, keys);
    call.key(&guard.done_key) // KEYS[9]
        .key(&guard.session_rate_key) // KEYS[10]
        .key(&guard.license_rate_key) // KEYS[11]
        .arg(&guard.entry_id) // ARGV[1]
        .arg(guard.done_until_ms) // ARGV[2]
        .arg(guard.session_limit) // ARGV[3]
        .arg(guard.license_limit) // ARGV[4]
        .arg(guard.window_ms) // ARGV[5]
        .arg(if guard.redelivery { "1" } else { "0" }); // ARGV[6]
    call
}

/// One seat-script call, ready to run alone or in a pipeline.
pub struct SeatCall<'a> {
    /// Script name, for metrics and errors.
    name: &'static str,
    /// The EVALSHA invocation.
    invocation: ScriptInvocation<'a>,
}

impl SeatCall<'_> {
    /// The script's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The EVALSHA command, for a pipeline (which does not re-load on NOSCRIPT).
    pub fn cmd(&self) -> redis::Cmd {
        redis::Cmd::invoke_script(&self.invocation)
    }

    /// Runs the call on its own, re-loading the script on NOSCRIPT.
    pub async fn run<C: ConnectionLike>(&self, con: &mut C) -> Result<Outcome, Error> {
        let result = self.invocation.invoke_async(con).await;
        self.decode(result)
    }

    /// Decodes this call's answer (from [`SeatCall::run`] or a pipeline).
    pub fn decode(&self, result: redis::RedisResult<Value>) -> Result<Outcome, Error> {
        result.map_err(Error::from).and_then(|v| decode(self.name, v))
    }
}

impl Scripts {
    /// lua/acquire.lua as a [`SeatCall`].
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_call(
        &self,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
        meta: &str,
        wait_ms: u64,
        request_id: &str,
        reply_to: &str,
        default_queue_max: u64,
    ) -> SeatCall<'_> {
        let mut call = request_call(&self.acquire, keys, guard);
        call.arg(session) // ARGV[7]
            .arg(meta) // ARGV[8]
            .arg(wait_ms) // ARGV[9]
            .arg(request_id) // ARGV[10]
            .arg(reply_to) // ARGV[11]
            .arg(default_queue_max); // ARGV[12]
        SeatCall {
            name: "acquire",
            invocation: call,
        }
    }

    /// lua/release.lua as a [`SeatCall`].
    pub fn release_call(&self, keys: &LicenseKeys, guard: &Guard, session: &str) -> SeatCall<'_> {
        let mut call = request_call(&self.release, keys, guard);
        call.arg(session); // ARGV[7]
        SeatCall {
            name: "release",
            invocation: call,
        }
    }

    /// lua/heartbeat.lua as a [`SeatCall`].
    pub fn heartbeat_call(&self, keys: &LicenseKeys, guard: &Guard, session: &str) -> SeatCall<'_> {
        let mut call = request_call(&self.heartbeat, keys, guard);
        call.arg(session); // ARGV[7]
        SeatCall {
            name: "heartbeat",
            invocation: call,
        }
    }
}

impl Scripts {
    /// The process-wide registry.
    pub fn get() -> &'static Scripts {
        &SCRIPTS
    }

    fn all(&self) -> [&Script; 6] {
        [
            &self.acquire,
            &self.release,
            &self.heartbeat,
            &self.reap,
            &self.reply,
            &self.unlock,
        ]
    }

    /// The SHA1 of every script, as EVALSHA uses them.
    pub fn hashes(&self) -> Vec<&str> {
        self.all().map(|s| s.get_hash()).to_vec()
    }

    /// Loads every script, so that pipelines (which do not retry NOSCRIPT) can use them.
    pub async fn load_all<C: ConnectionLike>(&self, con: &mut C) -> Result<(), Error> {
        for script in self.all() {
            script.prepare_invoke().load_async(con).await?;
        }
        Ok(())
    }

    /// lua/acquire.lua: take a seat for `session` (storing `meta`, a JSON
    /// object), or queue it for up to `wait_ms` when none is free.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
        meta: &str,
        wait_ms: u64,
        request_id: &str,
        reply_to: &str,
        default_queue_max: u64,
    ) -> Result<Outcome, Error> {
        self.acquire_call(
            keys,
            guard,
            session,
            meta,
            wait_ms,
            request_id,
            reply_to,
            default_queue_max,
        )
        .run(con)
        .await
    }

    /// lua/release.lua: free `session`'s seat (granting it to the next
    /// waiter), or take `session` out of the queue.
    pub async fn release<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
    ) -> Result<Outcome, Error> {
        self.release_call(keys, guard, session).run(con).await
    }

    /// lua/heartbeat.lua: restart `session`'s heartbeat clock.
    pub async fn heartbeat<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
    ) -> Result<Outcome, Error> {
        self.heartbeat_call(keys, guard, session).run(con).await
    }

    /// lua/reap.lua: one bounded reaper step for one license.
    pub async fn reap<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        default_timeout_ms: u64,
        limit: usize,
        redeliver_after_ms: u64,
    ) -> Result<Reaped, Error> {
        let mut call = with_keys(&self.reap, keys);
        call.arg(default_timeout_ms).arg(limit).arg(redeliver_after_ms); // ARGV[1..3]
        let result = call.invoke_async(con).await;
        result.map_err(Error::from).and_then(decode_reaped)
    }

    /// lua/reply.lua: XADD `fields` to the caller's `stream` (capped at about
    /// `maxlen`) and set its expiry, refusing keys that are not streams.
    pub async fn reply<C: ConnectionLike>(
        &self,
        con: &mut C,
        stream: &str,
        maxlen: usize,
        ttl_ms: u64,
        fields: &[(&str, String)],
    ) -> redis::RedisResult<()> {
        let mut call = self.reply.prepare_invoke();
        call.key(stream).arg(maxlen).arg(ttl_ms); // KEYS[1]; ARGV[1], ARGV[2]
        for (field, value) in fields {
            call.arg(*field).arg(value); // ARGV[3..]
        }
        call.invoke_async::<Value>(con).await.map(|_| ())
    }

    /// lua/remove_consumer.lua: remove `consumer` from `group` of `stream`
    /// unless it holds pending entries. Returns whether it is gone.
    pub async fn remove_consumer<C: ConnectionLike>(
        &self,
        con: &mut C,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> redis::RedisResult<bool> {
        self.remove_consumer
            .key(stream) // KEYS[1]
            .arg(group) // ARGV[1]
            .arg(consumer) // ARGV[2]
            .invoke_async(con)
            .await
    }
}

impl Scripts {
    /// lua/unlock.lua: delete `lock` only while it still holds `token`.
    pub async fn unlock<C: ConnectionLike>(
        &self,
        con: &mut C,
        lock: &str,
        token: &str,
    ) -> redis::RedisResult<i64> {
        self.unlock.key(lock).arg(token).invoke_async(con).await
    }
}

/// EVALSHA commands for pipelines (the benchmark's ceiling, bulk loads).
/// Pipelines do not re-load on NOSCRIPT: call [`Scripts::load_all`] first.
impl Scripts {
    /// lua/acquire.lua as one command, without waiting in the queue.
    pub fn acquire_cmd(&self, keys: &LicenseKeys, guard: &Guard, session: &str, meta: &str) -> redis::Cmd {
        self.acquire_wait_cmd(keys, guard, session, meta, 0, "", "")
    }

    /// lua/acquire.lua as one command, queueing for up to `wait_ms`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_wait_cmd(
        &self,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
        meta: &str,
        wait_ms: u64,
        request_id: &str,
        reply_to: &str,
    ) -> redis::Cmd {
        let mut call = request_call(&self.acquire, keys, guard);
        // ARGV[7..12]; the queue limit is the license's queue_max, else unbounded here.
        call.arg(session)
            .arg(meta)
            .arg(wait_ms)
            .arg(request_id)
            .arg(reply_to)
            .arg(i64::MAX);
        redis::Cmd::invoke_script(&call)
    }

    /// lua/release.lua as one command.
    pub fn release_cmd(&self, keys: &LicenseKeys, guard: &Guard, session: &str) -> redis::Cmd {
        let mut call = request_call(&self.release, keys, guard);
        call.arg(session); // ARGV[7]
        redis::Cmd::invoke_script(&call)
    }
}

fn bad(script: &'static str, detail: String) -> Error {
    Error::ScriptReply { script, detail }
}

fn int(script: &'static str, v: Option<&Value>, what: &str) -> Result<i64, Error> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(bad(script, format!("{what} is not an integer: {other:?}"))),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn decode_notes(script: &'static str, v: Option<&Value>) -> Result<Vec<Note>, Error> {
    let items = match v {
        Some(Value::Array(items)) => items,
        None => return Ok(Vec::new()),
        other => return Err(bad(script, format!("notes are not a list: {other:?}"))),
    };
    items
        .iter()
        .map(|item| {
            let Value::Array(f) = item else {
                return Err(bad(script, format!("note is not a list: {item:?}")));
            };
            let s = |i: usize| f.get(i).and_then(text).unwrap_or_default();
            let status = s(0)
                .parse::<Status>()
                .map_err(|e| bad(script, format!("note: {e}")))?;
            Ok(Note {
                status,
                session: s(1),
                request_id: s(2),
                reply_to: s(3),
                waited_ms: int(script, f.get(4), "waited_ms")?,
                note_id: s(5),
            })
        })
        .collect()
}

/// Decodes `{status, seats_used, seats_total, detail, now_ms, notes}`.
fn decode(script: &'static str, value: Value) -> Result<Outcome, Error> {
    let Value::Array(items) = value else {
        return Err(bad(script, format!("expected an array, got {value:?}")));
    };
    let status = items
        .first()
        .and_then(text)
        .ok_or_else(|| bad(script, "missing status".into()))?
        .parse::<Status>()
        .map_err(|e| bad(script, e.to_string()))?;
    let detail = items.get(3);
    let detail_int = match detail {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    Ok(Outcome {
        status,
        seats_used: int(script, items.get(1), "seats_used")?,
        seats_total: int(script, items.get(2), "seats_total")?,
        heartbeats: detail_int.filter(|_| status == Status::HeartbeatUpdated),
        position: detail_int.filter(|_| status == Status::Queued),
        queue_full: detail.and_then(text).as_deref() == Some("queue_full"),
        changed: !matches!(items.get(6), Some(Value::Int(0))),
        replayed: matches!(items.get(7), Some(Value::Int(1))),
        now_ms: int(script, items.get(4), "now_ms")?,
        notes: decode_notes(script, items.get(5))?,
    })
}

/// Decodes `{seats_used, seats_total, now_ms, evicted, notes, more, queue_depth}`.
fn decode_reaped(value: Value) -> Result<Reaped, Error> {
    const S: &str = "reap";
    let Value::Array(items) = value else {
        return Err(bad(S, format!("expected an array, got {value:?}")));
    };
    let evicted = match items.get(3) {
        Some(Value::Array(v)) => v.iter().filter_map(text).collect(),
        other => return Err(bad(S, format!("evicted is not a list: {other:?}"))),
    };
    Ok(Reaped {
        seats_used: int(S, items.first(), "seats_used")?,
        seats_total: int(S, items.get(1), "seats_total")?,
        now_ms: int(S, items.get(2), "now_ms")?,
        evicted,
        notes: decode_notes(S, items.get(4))?,
        more: int(S, items.get(5), "more")? != 0,
        queue_depth: int(S, items.get(6), "queue_depth")?,
        redeliver: decode_notes(S, items.get(7))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_a_heartbeat_reply() {
        let v = Value::Array(vec![
            bulk("HEARTBEAT_UPDATED"),
            Value::Int(2),
            Value::Int(5),
            Value::Int(7),
            Value::Int(1_000),
            Value::Array(vec![]),
        ]);
        let o = decode("heartbeat", v).unwrap();
        assert_eq!(o.status, Status::HeartbeatUpdated);
        assert_eq!(
            (o.seats_used, o.seats_total, o.heartbeats, o.position),
            (2, 5, Some(7), None)
        );
    }

    #[test]
    fn decodes_notes_and_queue_details() {
        let note = Value::Array(vec![
            bulk("GRANTED"),
            bulk("s9"),
            bulk("r9"),
            bulk("reply:x"),
            Value::Int(1500),
            bulk("GRANTED:s9:1000"),
        ]);
        let v = Value::Array(vec![
            bulk("RELEASED"),
            Value::Int(1),
            Value::Int(1),
            Value::Int(0),
            Value::Int(1_000),
            Value::Array(vec![note]),
        ]);
        let o = decode("release", v).unwrap();
        assert_eq!(o.notes.len(), 1);
        assert_eq!((o.notes[0].status, o.notes[0].waited_ms), (Status::Granted, 1500));
        let full = Value::Array(vec![
            bulk("NO_SEATS_AVAILABLE"),
            Value::Int(1),
            Value::Int(1),
            bulk("queue_full"),
            Value::Int(1_000),
            Value::Array(vec![]),
        ]);
        assert!(decode("acquire", full).unwrap().queue_full);
    }

    #[test]
    fn refuses_replies_outside_the_contract() {
        assert!(decode("acquire", Value::Int(1)).is_err());
        let unknown = Value::Array(vec![bulk("MAYBE")]);
        assert!(decode("acquire", unknown).is_err());
        assert!(decode_reaped(Value::Array(vec![Value::Int(1)])).is_err());
    }

    #[test]
    fn every_script_carries_the_common_helpers() {
        let s = Scripts::get();
        for script in s.all() {
            assert_eq!(script.get_hash().len(), 40);
        }
        assert!(lua!("acquire").contains("local function now_ms"));
        assert!(lua!("reap").contains("local function promote"));
    }
}
