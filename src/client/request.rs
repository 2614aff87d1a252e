//! A request/reply client: what any service does in its own language, in Rust.
//!
//! It XADDs a request to the requests stream and XREADs its own reply stream
//! until the reply carrying its request id arrives. The CLI's `acquire`,
//! `release` and `heartbeat` use it, and so do the tests and the benchmark;
//! `seatgate revoke` uses an admin client ([`Client::connect_admin`]), which
//! sends to the admin stream instead.
//!
//! Every acquire carries a lease, a random secret the seat is bound to
//! (docs/protocol.md, "Leases"): the client makes one per session (or takes
//! the caller's, [`Call::with_lease`]), remembers it per license and session,
//! and sends it with that session's heartbeats, releases and re-sent
//! acquires, so that no other caller can keep alive or free the seat.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::config::Settings;
use crate::db::Db;
use crate::engine::protocol::{Lease, Op};
use crate::engine::status::Status;
use crate::error::Error;

/// A request to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// acquire, release or heartbeat.
    pub op: Op,
    /// License id.
    pub license: String,
    /// Session id.
    pub session: String,
    /// Metadata JSON object (acquire).
    pub meta: Option<String>,
    /// How long to wait in the queue (acquire), ms.
    pub wait_ms: u64,
    /// The lease to send; `None` = the one the client holds for this
    /// session, or (acquire) a new random one.
    pub lease: Option<Lease>,
}

impl Call {
    /// A request `op` for `session` of `license`, without metadata or wait.
    pub fn new(op: Op, license: impl Into<String>, session: impl Into<String>) -> Call {
        Call {
            op,
            license: license.into(),
            session: session.into(),
            meta: None,
            wait_ms: 0,
            lease: None,
        }
    }

    /// The same request carrying `meta` (a JSON object).
    pub fn with_meta(mut self, meta: impl Into<String>) -> Call {
        self.meta = Some(meta.into());
        self
    }

    /// The same request willing to wait `wait_ms` in the queue.
    pub fn with_wait(mut self, wait_ms: u64) -> Call {
        self.wait_ms = wait_ms;
        self
    }

    /// The same request carrying `lease`: an acquire binds the seat to it
    /// (re-using one, say after a restart), a heartbeat or release proves
    /// the seat is the caller's. The client remembers it for the session.
    pub fn with_lease(mut self, lease: Lease) -> Call {
        self.lease = Some(lease);
        self
    }
}

/// An administrator's revoke (sent on the admin stream). It carries no
/// lease: a revoke is the administrator's way around the one a seat is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoke {
    /// License id.
    pub license: String,
    /// The session whose seat (or place in the queue) is taken away.
    pub session: String,
    /// Why: told to the session and published in the `revoked` event.
    pub reason: String,
    /// Who revokes.
    pub actor: String,
    /// How long the session's acquires are refused afterwards, ms (0 = not at all).
    pub cooldown_ms: u64,
}

/// The application name in an admin client's reply streams,
/// `<replies.prefix>admin:<unique>`: one ACL pattern (`seat:reply:admin:*`)
/// lets the admin user read its replies, whatever `client.name` says.
pub const ADMIN_CLIENT_NAME: &str = "admin";

/// A reply as received: every field, plus typed accessors for the common
/// ones, and the lease the client sent the request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyMsg {
    /// The reply entry's fields.
    pub fields: BTreeMap<String, String>,
    /// The lease this client sent with the request (the reply never carries
    /// it): what the session's heartbeats and release must send.
    pub lease: Option<Lease>,
}

/// The reply's fields, and `lease` when the request carried one: the CLI's
/// `--json` output, so a script can pick up the lease it must send later.
impl Serialize for ReplyMsg {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (k, v) in &self.fields {
            if k != "lease" {
                map.serialize_entry(k, v)?;
            }
        }
        if let Some(lease) = &self.lease {
            map.serialize_entry("lease", lease.as_str())?;
        }
        map.end()
    }
}

impl ReplyMsg {
    /// The lease the request was sent with, if any.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// A field's value, or "" when absent.
    pub fn get(&self, field: &str) -> &str {
        self.fields.get(field).map(String::as_str).unwrap_or("")
    }

    /// The parsed status (unknown statuses are reported as `Error`).
    pub fn status(&self) -> Status {
        self.get("status").parse().unwrap_or(Status::Error)
    }

    /// Whether the request got what it asked for.
    pub fn ok(&self) -> bool {
        self.get("ok") == "1"
    }

    /// An integer field, 0 when absent or malformed.
    pub fn int(&self, field: &str) -> i64 {
        self.get(field).parse().unwrap_or(0)
    }
}

/// A client with its own reply stream.
pub struct Client {
    /// One connection for XADD and the blocking XREAD. Its response timeout
    /// is longer than any wait (XREAD BLOCK legitimately takes long); every
    /// call is bounded by its own deadline instead.
    con: Db,
    /// The requests stream (the base name when sharded).
    requests: String,
    /// Shards of the requests stream.
    shards: usize,
    /// This client's reply stream, `<replies.prefix><client.name>:<unique>`:
    /// inside the reply namespace the workers answer in, and under the
    /// application's name, so that its ACL user may read it and no other.
    reply_to: String,
    /// Last reply entry id read.
    last_seen: String,
    /// Prefix of this client's request ids, unique per client instance.
    id_prefix: String,
    /// The lease each (license, session) this client acquired is bound to,
    /// sent again with its heartbeats, releases and re-sent acquires;
    /// forgotten once the session's seat or place is given back.
    leases: HashMap<(String, String), Lease>,
}

/// Longest a client call may wait (a queued acquire waits up to a day).
const LONGEST_WAIT: Duration = Duration::from_secs(86_400 + 120);

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(0);
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(0);

impl Client {
    /// Connects to one Redis at `url`, sending requests to the unsharded stream
    /// `requests`, with the default reply namespace and client name.
    pub async fn connect(url: &str, requests: &str) -> Result<Client, Error> {
        let mut settings = Settings::load(None)?;
        settings.redis.url = url.to_owned();
        settings.stream.requests = requests.to_owned();
        settings.stream.shards = 1;
        Self::connect_with(&settings).await
    }

    /// Connects as `settings` say: one node or a cluster, sharded or not.
    pub async fn connect_with(settings: &Settings) -> Result<Client, Error> {
        Self::connect_to(
            settings,
            settings.stream.requests.clone(),
            settings.stream.shards,
            &settings.client.name,
        )
        .await
    }

    /// Connects as `settings` say, as an administrator: requests go to the
    /// admin stream (`stream.admin_requests`, never sharded), replies come
    /// back on `<replies.prefix>admin:<unique>`.
    pub async fn connect_admin(settings: &Settings) -> Result<Client, Error> {
        Self::connect_to(
            settings,
            settings.stream.admin_requests.clone(),
            1,
            ADMIN_CLIENT_NAME,
        )
        .await
    }

    /// A client sending to `requests` (in `shards` shards), its replies on a
    /// stream of its own under `name`.
    async fn connect_to(
        settings: &Settings,
        requests: String,
        shards: usize,
        name: &str,
    ) -> Result<Client, Error> {
        let con = Db::connect_blocking(&settings.redis, LONGEST_WAIT).await?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        // A random part makes the reply stream's name and the request ids
        // unguessable: another caller (who may not list keys) cannot aim a
        // request's reply at this stream, nor pass one off as an answer here.
        // std's RandomState is keyed from the operating system's randomness.
        let random = {
            let mut hasher = RandomState::new().build_hasher();
            hasher.write_u128(nanos);
            hasher.finish()
        };
        let id_prefix = format!(
            "{nanos:x}-{}-{}-{random:016x}",
            std::process::id(),
            NEXT_CLIENT.fetch_add(1, Ordering::Relaxed)
        );
        let reply_to = format!("{}{name}:{id_prefix}", settings.replies.prefix);
        Ok(Client {
            con,
            requests,
            shards,
            reply_to,
            last_seen: "0".to_owned(),
            id_prefix,
            leases: HashMap::new(),
        })
    }

    /// The lease this client holds for `session` of `license`: the one its
    /// last acquire (or any call given one) carried.
    pub fn lease(&self, license: &str, session: &str) -> Option<&Lease> {
        self.leases.get(&(license.to_owned(), session.to_owned()))
    }

    /// This client's reply stream key.
    pub fn reply_to(&self) -> &str {
        &self.reply_to
    }

    /// Sends `call` and waits up to `timeout` for its reply.
    ///
    /// The XADD and the first blocking XREAD go out as one pipeline: one
    /// round trip per request when the answer comes within the first read.
    /// (Redis runs a connection's commands in order, so the XREAD starts
    /// after the request is on the stream.)
    pub async fn call(&mut self, call: &Call, timeout: Duration) -> Result<ReplyMsg, Error> {
        let (id, xadd) = self.request(call);
        self.exchange(id, xadd, timeout).await
    }

    /// Sends `revoke` (on the admin stream: connect with
    /// [`Client::connect_admin`]) and waits up to `timeout` for its reply.
    pub async fn revoke(&mut self, revoke: &Revoke, timeout: Duration) -> Result<ReplyMsg, Error> {
        let (id, mut xadd) = self.xadd(&revoke.license, Op::Revoke, &revoke.session);
        xadd.arg("reason")
            .arg(&revoke.reason)
            .arg("actor")
            .arg(&revoke.actor);
        if revoke.cooldown_ms > 0 {
            xadd.arg("cooldown_ms").arg(revoke.cooldown_ms);
        }
        self.exchange(id, xadd, timeout).await
    }

    /// Sends `xadd` (request `id`) and waits up to `timeout` for its reply:
    /// in one pipeline with the first read on one node, one after the other
    /// on a cluster.
    async fn exchange(&mut self, id: String, xadd: redis::Cmd, timeout: Duration) -> Result<ReplyMsg, Error> {
        if self.con.is_cluster() {
            // The request stream and the reply stream live in different slots.
            let _: String = xadd.query_async(&mut self.con).await?;
            return self.wait_for(&id, timeout).await;
        }
        let deadline = Instant::now() + timeout;
        let (_, read): (String, redis::streams::StreamReadReply) = redis::pipe()
            .add_command(xadd)
            .add_command(self.read_cmd(timeout))
            .query_async(&mut self.con)
            .await?;
        if let Some(reply) = self.take_reply(&id, read) {
            return Ok(reply);
        }
        self.wait_for(&id, deadline.saturating_duration_since(Instant::now()))
            .await
            .map_err(|e| match e {
                Error::ReplyTimeout(_) => Error::ReplyTimeout(timeout),
                other => other,
            })
    }

    /// Sends `call` without waiting; returns its request id. Wait for the
    /// reply with [`Client::wait_for`].
    pub async fn send(&mut self, call: &Call) -> Result<String, Error> {
        let (id, xadd) = self.request(call);
        let _: String = xadd.query_async(&mut self.con).await?;
        Ok(id)
    }

    /// XREAD BLOCK on this client's reply stream after the last entry seen.
    fn read_cmd(&self, block: Duration) -> redis::Cmd {
        let block_ms = block.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT")
            .arg(100)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(&self.reply_to)
            .arg(&self.last_seen);
        read
    }

    /// Consumes what an XREAD returned; the reply to `id`, if among it.
    fn take_reply(&mut self, id: &str, read: redis::streams::StreamReadReply) -> Option<ReplyMsg> {
        let mut found = None;
        for key in read.keys {
            for entry in key.ids {
                self.last_seen = entry.id.clone();
                if found.is_some() {
                    continue;
                }
                let fields: BTreeMap<String, String> = entry
                    .map
                    .into_iter()
                    .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap_or_default()))
                    .collect();
                if fields.get("id").map(String::as_str) == Some(id) {
                    found = Some(self.with_lease(fields));
                }
            }
        }
        found
    }

    /// The reply `fields`, with the lease its session's request was sent
    /// with; a lease whose seat or place is now given back is forgotten.
    fn with_lease(&mut self, fields: BTreeMap<String, String>) -> ReplyMsg {
        let key = (
            fields.get("license").cloned().unwrap_or_default(),
            fields.get("session").cloned().unwrap_or_default(),
        );
        let status = fields.get("status").and_then(|s| s.parse::<Status>().ok());
        let lease = match status {
            // Given back, taken away by an administrator, or never held:
            // nothing left to bind.
            Some(Status::Released | Status::LeftQueue | Status::SessionNotFound | Status::SessionRevoked) => {
                self.leases.remove(&key)
            }
            _ => self.leases.get(&key).cloned(),
        };
        ReplyMsg { fields, lease }
    }

    /// A new request id and the XADD that sends `call` under it, carrying
    /// the call's lease, else the one held for the session, else (acquire)
    /// a new one; the lease sent is remembered for the session.
    fn request(&mut self, call: &Call) -> (String, redis::Cmd) {
        let key = (call.license.clone(), call.session.clone());
        let lease = call
            .lease
            .clone()
            .or_else(|| self.leases.get(&key).cloned())
            .or_else(|| (call.op == Op::Acquire).then(new_lease).flatten());
        let (id, mut xadd) = self.xadd(&call.license, call.op, &call.session);
        if let Some(meta) = &call.meta {
            xadd.arg("meta").arg(meta);
        }
        if call.wait_ms > 0 {
            xadd.arg("wait_ms").arg(call.wait_ms);
        }
        if let Some(lease) = lease {
            xadd.arg("lease").arg(lease.as_str());
            self.leases.insert(key, lease);
        }
        (id, xadd)
    }

    /// A new request id and the XADD of request `op` for `session` of
    /// `license` under it, to the license's shard, with this client's
    /// `reply_to`; the op's own fields follow.
    fn xadd(&self, license: &str, op: Op, session: &str) -> (String, redis::Cmd) {
        let id = format!(
            "{}-{}",
            self.id_prefix,
            NEXT_REQUEST.fetch_add(1, Ordering::Relaxed)
        );
        let mut xadd = redis::cmd("XADD");
        xadd.arg(crate::engine::keys::shard_name(
            &self.requests,
            self.shards,
            license,
        ))
        .arg("*")
        .arg("op")
        .arg(op.as_str())
        .arg("id")
        .arg(&id)
        .arg("license")
        .arg(license)
        .arg("session")
        .arg(session)
        .arg("reply_to")
        .arg(&self.reply_to);
        (id, xadd)
    }

    /// Waits up to `timeout` for the reply to request `id`; replies to other
    /// ids on this stream are skipped.
    pub async fn wait_for(&mut self, id: &str, timeout: Duration) -> Result<ReplyMsg, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::ReplyTimeout(timeout));
            }
            let read: redis::streams::StreamReadReply =
                self.read_cmd(left).query_async(&mut self.con).await?;
            if let Some(reply) = self.take_reply(id, read) {
                return Ok(reply);
            }
        }
    }

    /// Deletes this client's reply stream.
    pub async fn close(mut self) -> Result<(), Error> {
        let _: i64 = redis::cmd("DEL")
            .arg(&self.reply_to)
            .query_async(&mut self.con)
            .await?;
        Ok(())
    }
}

/// A new random lease: a UUID v4 in its 32-hex-digit form, 122 random bits
/// from the operating system's generator.
/// (32 hex digits always form a lease; `None` cannot happen.)
fn new_lease() -> Option<Lease> {
    Lease::parse(&uuid::Uuid::new_v4().simple().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_leases_are_valid_and_differ() {
        let a = new_lease().unwrap();
        let b = new_lease().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert_eq!(format!("{a:?}"), "Lease(<redacted>)");
    }

    #[test]
    fn a_reply_serialises_with_the_lease_it_was_sent_with() {
        let lease = Lease::parse("abcdefghijklmnop").unwrap();
        let reply = ReplyMsg {
            fields: BTreeMap::from([("status".to_owned(), "ACQUIRED".to_owned())]),
            lease: Some(lease),
        };
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"status":"ACQUIRED","lease":"abcdefghijklmnop"}"#
        );
    }
}
