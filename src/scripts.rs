//! The embedded Lua registry and the typed calls into it.
//!
//! Each script under `lua/` is compiled into the binary with `lua/includes/common.lua`
//! prepended, wrapped in a [`redis::Script`] once, and run with EVALSHA;
//! `invoke_async` re-loads it transparently when Redis answers NOSCRIPT (after
//! a restart or SCRIPT FLUSH). Methods are named after their scripts, and every
//! call records the seed's two metrics.

use std::sync::LazyLock;
use std::time::Instant;

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use crate::error::Error;
use crate::keys::LicenseKeys;
use crate::status::Status;
use crate::telemetry;

macro_rules! lua {
    ($name:literal) => {
        concat!(
            include_str!("../lua/includes/common.lua"),
            "\n",
            include_str!(concat!("../lua/", $name, ".lua"))
        )
    };
}

/// The scripts, built (and hashed) once per process.
pub struct Scripts {
    acquire: Script,
    release: Script,
    heartbeat: Script,
    reply: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(lua!("acquire")),
    release: Script::new(lua!("release")),
    heartbeat: Script::new(lua!("heartbeat")),
    // Not a seat script: no common helpers, no seat metrics.
    reply: Script::new(include_str!("../lua/reply.lua")),
});

/// What a seat script decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The decision.
    pub status: Status,
    /// Seats held after the script ran.
    pub seats_used: i64,
    /// The license's seat count (0 when there is no license).
    pub seats_total: i64,
    /// Heartbeat count (heartbeat script only).
    pub heartbeats: Option<i64>,
}

impl Scripts {
    /// The process-wide registry.
    pub fn get() -> &'static Scripts {
        &SCRIPTS
    }

    fn all(&self) -> [&Script; 4] {
        [&self.acquire, &self.release, &self.heartbeat, &self.reply]
    }

    /// The SHA1 of every script, as EVALSHA uses them.
    pub fn hashes(&self) -> Vec<&str> {
        [&self.acquire, &self.release, &self.heartbeat]
            .map(|s| s.get_hash())
            .to_vec()
    }

    /// Loads every script, so that pipelines (which do not retry NOSCRIPT) can use them.
    pub async fn load_all<C: ConnectionLike>(&self, con: &mut C) -> Result<(), Error> {
        for script in self.all() {
            script.prepare_invoke().load_async(con).await?;
        }
        Ok(())
    }

    /// lua/acquire.lua: take a seat for `session`, storing `meta` (a JSON object).
    pub async fn acquire<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        session: &str,
        meta: &str,
    ) -> Result<Outcome, Error> {
        let mut call = self.acquire.prepare_invoke();
        call.key(&keys.license) // KEYS[1] license record
            .key(&keys.holders) // KEYS[2] holders ZSET
            .key(&keys.sessions) // KEYS[3] session records
            .arg(session) // ARGV[1]
            .arg(meta); // ARGV[2]
        timed("acquire", call.invoke_async(con)).await
    }

    /// lua/release.lua: free `session`'s seat.
    pub async fn release<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        session: &str,
    ) -> Result<Outcome, Error> {
        let mut call = self.release.prepare_invoke();
        call.key(&keys.license) // KEYS[1]
            .key(&keys.holders) // KEYS[2]
            .key(&keys.sessions) // KEYS[3]
            .arg(session); // ARGV[1]
        timed("release", call.invoke_async(con)).await
    }

    /// lua/heartbeat.lua: restart `session`'s heartbeat clock.
    pub async fn heartbeat<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        session: &str,
    ) -> Result<Outcome, Error> {
        let mut call = self.heartbeat.prepare_invoke();
        call.key(&keys.license) // KEYS[1]
            .key(&keys.holders) // KEYS[2]
            .key(&keys.sessions) // KEYS[3]
            .arg(session); // ARGV[1]
        timed("heartbeat", call.invoke_async(con)).await
    }
}

impl Scripts {
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
}

/// Runs one script call, records `license_lua_script_*`, and decodes its reply.
async fn timed(
    script: &'static str,
    call: impl std::future::Future<Output = redis::RedisResult<Value>>,
) -> Result<Outcome, Error> {
    let started = Instant::now();
    let result = call.await;
    telemetry::script_latency(script, started.elapsed());
    let outcome = result.map_err(Error::from).and_then(|v| decode(script, v));
    telemetry::script_executed(
        script,
        match &outcome {
            Ok(o) if o.status.is_ok() => "success",
            Ok(_) => "failure",
            Err(_) => "error",
        },
    );
    outcome
}

/// Decodes `{status, seats_used, seats_total[, heartbeats]}`.
fn decode(script: &'static str, value: Value) -> Result<Outcome, Error> {
    let bad = |detail: String| Error::ScriptReply { script, detail };
    let Value::Array(items) = value else {
        return Err(bad(format!("expected an array, got {value:?}")));
    };
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(n)) => Ok(Some(*n)),
        None => Ok(None),
        Some(other) => Err(bad(format!("element {i} is not an integer: {other:?}"))),
    };
    let status = match items.first() {
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<Status>().ok())
            .ok_or_else(|| bad(format!("unknown status {:?}", String::from_utf8_lossy(b))))?,
        other => return Err(bad(format!("missing status: {other:?}"))),
    };
    Ok(Outcome {
        status,
        seats_used: int(1)?.unwrap_or(0),
        seats_total: int(2)?.unwrap_or(0),
        heartbeats: int(3)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_full_reply() {
        let v = Value::Array(vec![
            Value::BulkString(b"HEARTBEAT_UPDATED".to_vec()),
            Value::Int(2),
            Value::Int(5),
            Value::Int(7),
        ]);
        let o = decode("heartbeat", v).unwrap();
        assert_eq!(o.status, Status::HeartbeatUpdated);
        assert_eq!((o.seats_used, o.seats_total, o.heartbeats), (2, 5, Some(7)));
    }

    #[test]
    fn refuses_replies_outside_the_contract() {
        assert!(decode("acquire", Value::Int(1)).is_err());
        let unknown = Value::Array(vec![Value::BulkString(b"MAYBE".to_vec())]);
        assert!(decode("acquire", unknown).is_err());
    }

    #[test]
    fn every_script_carries_the_common_helpers() {
        let s = Scripts::get();
        for script in s.all() {
            assert_eq!(script.get_hash().len(), 40);
        }
        assert!(lua!("acquire").contains("local function now_ms"));
    }
}
