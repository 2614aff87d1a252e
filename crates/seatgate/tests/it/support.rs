//! Test support: a real `redis-server` per test on a free loopback port with
//! its own temp dir, in-process workers and `seatgate run` processes, and the
//! one copy of every helper the test modules share.
//!
//! Key, stream and group names come from the test's [`Settings`] (see
//! [`RedisServerExt::settings`]), never from literals, so a test under its
//! own prefix (the cluster tests) uses the same helpers. Every wait is async:
//! a blocking sleep would stall the runtime thread that also drives the
//! test's workers and clients.

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use seatgate::config::Settings;
use seatgate::runtime::health::Readiness;
use seatgate::runtime::reaper::Reaper;
use seatgate::runtime::worker::Worker;
use seatgate_client::{Call, Client, Reply};
use seatgate_core::db::Db;
use seatgate_core::keys::{Keys, LicenseKeys};
use seatgate_core::license::{self, LicenseSpec};
use seatgate_core::policy::{LicensePolicy, RequestPolicy};
use seatgate_core::request::Guard;
use seatgate_core::request::{parse_request, session, AcquireArgs, EntryAt, Lane, RevokeArgs};
use seatgate_core::scripts::{Outcome, ScriptName, Scripts, SessionArgs};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use seatgate_testkit::{LocalCluster, LocalRedis as RedisServer};

/// How long a test waits for a reply.
pub const T: Duration = Duration::from_secs(5);

/// Session metadata the tests' acquires carry.
pub const META: &str = r#"{"user_email":"dev@example.com"}"#;

/// A loopback port nobody listens on (at the time of asking).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Conveniences for tests on top of the library's private Redis.
pub trait RedisServerExt {
    /// Starts a server with extra `--name value` arguments.
    async fn start_with(extra: &[&str]) -> RedisServer;
    /// Settings pointing at this server: no metrics endpoint, short blocks;
    /// for a TLS-only server, its CA and a client certificate.
    fn settings(&self) -> Settings;
}

impl RedisServerExt for RedisServer {
    async fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start(extra).await.expect("start redis-server")
    }

    fn settings(&self) -> Settings {
        let mut s = Settings::load(None).expect("default settings");
        s.redis.url = self.url();
        if let Some(tls) = self.tls() {
            tls.apply(&mut s.redis);
        }
        s.metrics.listen = String::new();
        s.stream.block_ms = 100;
        s
    }
}

/// One test's own world, zero2prod's `spawn_app`: a private Redis, the
/// settings pointing at it and a connection to it, from one call.
///
/// Tests take it apart, `let TestApp(redis, settings, mut con) =
/// spawn_app().await;`, naming the parts as they like (a tuple struct, so
/// the pattern stays on one line), with `_` for a connection they do not
/// use. The server must stay bound to the end, as `_redis` if unused (never
/// `_`): dropping it stops the server. Settings may still be changed after
/// the call: the connection only read `settings.redis`.
pub struct TestApp(
    /// The server, killed on drop.
    pub RedisServer,
    /// Settings pointing at it ([`RedisServerExt::settings`]).
    pub Settings,
    /// A connection to it, as seatgate makes one.
    pub Db,
);

/// A [`TestApp`] on a plain server.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// A [`TestApp`] on a server started with extra `--name value` arguments.
pub async fn spawn_app_with(extra: &[&str]) -> TestApp {
    let redis = RedisServer::start_with(extra).await;
    let settings = redis.settings();
    let con = db(&settings).await;
    TestApp(redis, settings, con)
}

/// The defaults for a shared Redis (a cluster, a Sentinel deployment)
/// whose `redis` settings the caller fills in: every key under `prefix`,
/// short blocks and claims, no metrics endpoint, no per-session rate limit.
pub fn prefixed_settings(prefix: &str) -> Settings {
    let mut s = Settings::load(None).expect("defaults");
    s.keys.prefix = prefix.into();
    s.stream.requests = format!("{prefix}:requests");
    s.stream.dead_letter = format!("{prefix}:requests:dead");
    s.events.stream = format!("{prefix}:events");
    s.stream.block_ms = 100;
    s.stream.claim_idle_ms = 1_000;
    s.metrics.listen = String::new();
    s.limits.session_requests = 0;
    s
}

/// A connection as seatgate makes one from `s` (one node or a cluster).
pub async fn db(s: &Settings) -> Db {
    Db::connect(&s.redis).await.expect("connect to test redis")
}

/// `key`'s encoding (`OBJECT ENCODING`): `listpack`, `hashtable`, `skiplist`.
pub async fn encoding(con: &mut impl ConnectionLike, key: &str) -> String {
    redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(key)
        .query_async(con)
        .await
        .expect("OBJECT ENCODING of an existing key")
}

/// How often Redis ran `command` (INFO commandstats counts the commands
/// scripts call, too).
pub async fn command_calls(con: &mut Db, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count of calls"))
}

/// Sets the test Redis's `hash-max-listpack-value` to ops/redis.conf's 256,
/// under which session records with metadata fit a listpack.
pub async fn listpack_values_as_ops_conf(con: &mut impl ConnectionLike) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("hash-max-listpack-value")
        .arg(256)
        .query_async(con)
        .await
        .unwrap();
}

/// Every key name under `s`'s prefix.
pub fn keys(s: &Settings) -> Keys {
    s.seat_keys()
}

/// The keys of `license` under `s`'s prefix.
pub fn license_keys(s: &Settings, license: &str) -> LicenseKeys {
    keys(s).license(license)
}

/// The reply stream `<replies.prefix><name>`: one a worker agrees to write to.
pub fn reply_stream(s: &Settings, name: &str) -> String {
    format!("{}{name}", s.replies.prefix)
}

// ---------------------------------------------------------------------------
// Licenses and seats.

/// `seats` seats, active, never expiring, the default heartbeat timeout.
pub fn seats(seats: u64) -> LicenseSpec {
    LicenseSpec {
        seats_total: seats,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms: None,
    }
}

/// `n` seats whose holders are evicted after `heartbeat_timeout_ms` without a heartbeat.
pub fn seats_with_timeout(n: u64, heartbeat_timeout_ms: u64) -> LicenseSpec {
    LicenseSpec {
        heartbeat_timeout_ms: Some(heartbeat_timeout_ms),
        ..seats(n)
    }
}

/// Creates or replaces `license` as `spec` says.
pub async fn provision(s: &Settings, license: &str, spec: &LicenseSpec) {
    license::put(&mut db(s).await, &keys(s), license, spec)
        .await
        .expect("put license");
}

/// Creates or replaces `license` with `n` seats under `policy`, as
/// `seatgate license put` does.
pub async fn provision_policy(s: &Settings, license: &str, n: u64, policy: &LicensePolicy) {
    provision(s, license, &seats(n)).await;
    put_policy(s, license, policy).await;
}

/// Sets the policy of the existing `license` (its seats unchanged).
pub async fn put_policy(s: &Settings, license: &str, policy: &LicensePolicy) {
    license::put_policy(&mut db(s).await, &keys(s), license, policy)
        .await
        .expect("put license policy");
}

/// Writes one field of `license`'s record by hand, as a billing system may.
pub async fn set_license_field(
    con: &mut impl ConnectionLike,
    s: &Settings,
    license: &str,
    field: &str,
    value: &str,
) {
    let _: () = redis::cmd("HSET")
        .arg(license_keys(s, license).license)
        .arg(field)
        .arg(value)
        .query_async(con)
        .await
        .unwrap();
}

/// `license`'s record as stored, every field.
pub async fn license_record(
    con: &mut impl ConnectionLike,
    s: &Settings,
    license: &str,
) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(license_keys(s, license).license)
        .query_async(con)
        .await
        .unwrap()
}

/// Provisions `license` with `n` seats, active, never expiring.
pub async fn put_license(s: &Settings, license: &str, n: u64) {
    provision(s, license, &seats(n)).await;
}

/// Queue replies waiting in `license`'s outbox for a worker or the reaper.
pub async fn outbox_len(s: &Settings, license: &str) -> i64 {
    redis::cmd("HLEN")
        .arg(license_keys(s, license).outbox)
        .query_async(&mut db(s).await)
        .await
        .unwrap()
}

/// `session`'s session record on `license` as stored
/// (lua/includes/session_record.lua), if it has one.
pub async fn session_record(s: &Settings, license: &str, session: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(license_keys(s, license).sessions)
        .arg(session)
        .query_async(&mut db(s).await)
        .await
        .unwrap()
}

/// Sessions holding a seat of `license`, sorted.
pub async fn holders(s: &Settings, license: &str) -> Vec<String> {
    let mut v: Vec<String> = redis::cmd("ZRANGE")
        .arg(license_keys(s, license).holders)
        .arg(0)
        .arg(-1)
        .query_async(&mut db(s).await)
        .await
        .unwrap();
    v.sort();
    v
}

/// Every license key and its DUMP, to show that something changed nothing.
pub async fn snapshot(s: &Settings) -> Vec<(String, Vec<u8>)> {
    let mut con = db(s).await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{{*", s.keys.prefix))
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    let mut out = Vec::new();
    for k in keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query_async(&mut con).await.unwrap();
        out.push((k, dump));
    }
    out
}

/// The most holders any watched license had in one sample, and how many
/// samples were taken.
#[derive(Debug, Default)]
pub struct HolderWatch {
    /// Most holders seen at once, and of which license.
    pub most: (usize, String),
    /// Sweeps over the licenses that read at least one of them.
    pub samples: usize,
}

/// Samples the holders of every license in `licenses` until `stop`, for
/// "never overbooked" checks while things happen. Reads that fail (Redis
/// restarting, a master failing over) are skipped, not fatal.
pub fn watch_holders(
    s: &Settings,
    licenses: &[&str],
    stop: CancellationToken,
) -> tokio::task::JoinHandle<HolderWatch> {
    let s = s.clone();
    let licenses: Vec<String> = licenses.iter().map(|l| l.to_string()).collect();
    tokio::spawn(async move {
        let mut watch = HolderWatch::default();
        let mut con = None;
        while !stop.is_cancelled() {
            let Some(c) = con.as_mut() else {
                con = Db::connect(&s.redis).await.ok();
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let zcards = licenses
                .iter()
                .map(|l| {
                    let mut zcard = redis::cmd("ZCARD");
                    zcard.arg(license_keys(&s, l).holders);
                    zcard
                })
                .collect();
            if let Ok(counts) = c.query_all(zcards).await {
                let mut read = false;
                for (l, n) in licenses.iter().zip(counts) {
                    if let Ok(redis::Value::Int(n)) = n {
                        read = true;
                        if n as usize > watch.most.0 {
                            watch.most = (n as usize, l.clone());
                        }
                    }
                }
                watch.samples += usize::from(read);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        watch
    })
}

// ---------------------------------------------------------------------------
// The seat scripts called directly.

/// One session of one license, its seat scripts called directly (the seed's
/// path). Every test calls the seat scripts through here, so a change of the
/// script API lands in this one place.
pub struct Direct {
    /// The license's keys.
    keys: LicenseKeys,
    /// Dedupe and rate limits (none, those of a stream entry, or the test's own).
    guard: Guard,
    /// The session id.
    session: String,
    /// The metadata an acquire stores with the seat ([`META`] unless the test sets its own).
    meta: String,
    /// The queue limit for a license without its own `queue_max`, as a worker passes it.
    default_queue_max: u64,
    /// The heartbeat timeout for a license without its own, as a worker passes it.
    default_heartbeat_timeout_ms: u64,
    /// The claim window of a grant for a license without its own, as a worker passes it.
    default_claim_ms: u64,
    /// Who its acquires say is asking (user, group, priority, borrow).
    policy: RequestPolicy,
    /// The lease every call carries (`None`: none).
    lease: Option<String>,
    /// How long a revocation is remembered, and how many per license, as a worker passes them.
    revoke: seatgate::config::RevokeSettings,
}

/// `session` of `license` called directly: no redelivery dedupe, no rate limits.
pub fn direct(s: &Settings, license: &str, session: &str) -> Direct {
    Direct {
        keys: license_keys(s, license),
        guard: Guard::none(&keys(s), license, session),
        session: session.to_owned(),
        meta: META.to_owned(),
        default_queue_max: s.queue.max_length,
        default_heartbeat_timeout_ms: s.sessions.heartbeat_timeout_ms,
        default_claim_ms: s.queue.claim_ms,
        policy: RequestPolicy::NONE,
        lease: None,
        revoke: s.revoke.clone(),
    }
}

impl Direct {
    /// Guarded as a worker guards stream entry `entry_id` (dedupe, limits).
    pub fn for_entry(s: &Settings, entry_id: &str, license: &str, session: &str) -> Direct {
        Direct {
            guard: Guard::for_entry(&s.guard_policy(), &keys(s), entry_id, license, session),
            ..direct(s, license, session)
        }
    }

    /// Guarded as a worker guards the request of `fields` read from entry
    /// `entry_id` of the requests stream, the Redis clock reading `now_ms`:
    /// keyed by its `id` when it has one (engine::ops::Request::guard).
    pub fn for_request(s: &Settings, entry_id: &str, fields: &[(&str, &str)], now_ms: i64) -> Direct {
        let pairs: Vec<(String, Vec<u8>)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        // Parsed for its guard alone, which no lease changes.
        let rules = seatgate_core::protocol::Rules {
            require_lease: false,
            ..s.parse_rules()
        };
        let req = parse_request(entry_id, &pairs, &rules).expect("a valid request");
        let at = EntryAt {
            lane: Lane::Requests,
            stream: None,
            id: entry_id,
        };
        Direct {
            guard: req.guard(&s.guard_policy(), &keys(s), at, u64::try_from(now_ms).ok()),
            lease: req.lease().map(|lease| lease.as_str().to_owned()),
            ..direct(s, &req.license, &req.session)
        }
    }

    /// The same session under `guard` (a test's own limits or dedupe policy).
    pub fn with_guard(self, guard: Guard) -> Direct {
        Direct { guard, ..self }
    }

    /// The same session, its calls leaving their notes' queue replies in
    /// the outbox for a worker or the reaper to send, as on a Redis
    /// Cluster, rather than writing them to the reply streams themselves
    /// (one node): for tests of what happens to a note nobody delivered.
    pub fn via_outbox(mut self) -> Direct {
        self.keys.events.queue_replies = None;
        self
    }

    /// The same session, its acquires storing `meta` instead of [`META`].
    pub fn with_meta(self, meta: impl Into<String>) -> Direct {
        Direct {
            meta: meta.into(),
            ..self
        }
    }

    /// The same session, its acquires asked by `policy`'s user and group,
    /// at its priority, borrowing as it says.
    pub fn with_policy(self, policy: RequestPolicy) -> Direct {
        Direct { policy, ..self }
    }

    /// The same session, every call carrying `lease` (or none).
    pub fn with_lease(self, lease: Option<&str>) -> Direct {
        Direct {
            lease: lease.map(str::to_owned),
            ..self
        }
    }

    /// lua/acquire.lua, without waiting.
    pub async fn acquire(&self, con: &mut impl ConnectionLike) -> Outcome {
        self.queue(con, 0, "", "").await
    }

    /// lua/acquire.lua, waiting up to `wait_ms` in the queue as request
    /// `request_id` whose later reply goes to `reply_to`.
    pub async fn queue(
        &self,
        con: &mut impl ConnectionLike,
        wait_ms: u64,
        request_id: &str,
        reply_to: &str,
    ) -> Outcome {
        let args = AcquireArgs {
            session: &self.session,
            lease: self.lease.as_deref(),
            meta: &self.meta,
            wait_ms,
            request_id,
            reply_to,
            default_queue_max: self.default_queue_max,
            default_heartbeat_timeout_ms: self.default_heartbeat_timeout_ms,
            default_claim_ms: self.default_claim_ms,
            who: &self.policy,
        };
        args.call(Scripts::get(), &self.keys, &self.guard)
            .run(con)
            .await
            .expect("acquire.lua")
    }

    /// lua/release.lua.
    pub async fn release(&self, con: &mut impl ConnectionLike) -> Outcome {
        self.session_call(ScriptName::Release, con).await
    }

    /// lua/heartbeat.lua.
    pub async fn heartbeat(&self, con: &mut impl ConnectionLike) -> Outcome {
        self.session_call(ScriptName::Heartbeat, con).await
    }

    /// Release or heartbeat (`script`) of this session, with its lease.
    async fn session_call(&self, script: ScriptName, con: &mut impl ConnectionLike) -> Outcome {
        let args = SessionArgs {
            session: &self.session,
            lease: self.lease.as_deref(),
            default_heartbeat_timeout_ms: self.default_heartbeat_timeout_ms,
            default_claim_ms: self.default_claim_ms,
        };
        session::call(script, Scripts::get(), &self.keys, &self.guard, &args)
            .run(con)
            .await
            .unwrap_or_else(|e| panic!("{script:?}: {e}"))
    }

    /// lua/revoke.lua: an administrator `actor` revokes this session for
    /// `reason`, refusing its acquires for `cooldown_ms`.
    pub async fn revoke(
        &self,
        con: &mut impl ConnectionLike,
        reason: &str,
        actor: &str,
        cooldown_ms: u64,
    ) -> Outcome {
        let args = RevokeArgs {
            session: &self.session,
            reason,
            actor,
            cooldown_ms,
            user_wide: false,
            remember_ms: self.revoke.remember_ms,
            max_remembered: self.revoke.max_per_license,
            default_heartbeat_timeout_ms: self.default_heartbeat_timeout_ms,
            default_claim_ms: self.default_claim_ms,
        };
        args.call(Scripts::get(), &self.keys, &self.guard)
            .run(con)
            .await
            .expect("revoke.lua")
    }
}

/// The Redis clock (TIME), ms: the clock the scripts read.
pub async fn redis_ms(con: &mut impl ConnectionLike) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(con).await.unwrap();
    secs * 1000 + micros / 1000
}

/// The key [`run_out_of_memory`] fills.
const BALLAST: &str = "ballast";

/// Puts the server out of memory: an 8 MB ballast key, then `maxmemory
/// 4mb`. Started with `--maxmemory-policy noeviction`, it then refuses
/// every write (even an XADD) and evicts nothing, until [`free_memory`].
pub async fn run_out_of_memory(con: &mut impl ConnectionLike) {
    let _: i64 = redis::cmd("SETRANGE")
        .arg(BALLAST)
        .arg(8 * 1024 * 1024)
        .arg("x")
        .query_async(con)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("4mb")
        .query_async(con)
        .await
        .unwrap();
}

/// Frees what [`run_out_of_memory`] took: writes are accepted again.
pub async fn free_memory(con: &mut impl ConnectionLike) {
    let _: () = redis::cmd("DEL").arg(BALLAST).query_async(con).await.unwrap();
}

// ---------------------------------------------------------------------------
// Streams: requests, replies, events.

/// `XADD <requests stream> *` (the stream a client with these settings sends
/// to: its application's own when `client.name` is listed in
/// `stream.applications`), for the caller to add fields to.
pub fn request_xadd(s: &Settings) -> redis::Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(s.client_requests()).arg("*");
    cmd
}

/// A lease for `session` of a raw request, as a client would send with
/// every acquire, heartbeat and release of it (`sessions.require_lease` is
/// on by default): the session id's letters, digits, `_` and `-` (others
/// as `_`), padded with `0` to the 16 characters a lease needs at least.
pub fn lease_of(session: &str) -> String {
    let mut lease: String = format!("lease-{session}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    while lease.len() < 16 {
        lease.push('0');
    }
    lease
}

/// Adds a raw request entry with `fields`; its entry id.
pub async fn add_request(con: &mut impl ConnectionLike, s: &Settings, fields: &[(&str, &str)]) -> String {
    let mut cmd = request_xadd(s);
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    cmd.query_async(con).await.unwrap()
}

/// Creates the requests stream and its consumer group, as a worker would.
pub async fn create_group(s: &Settings) {
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&s.stream.requests)
        .arg(&s.stream.group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut db(s).await)
        .await
        .unwrap();
}

/// Delivers up to `count` new entries of the requests stream to `consumer`,
/// which then never acknowledges them (a worker that died); their ids.
pub async fn take(s: &Settings, consumer: &str, count: usize) -> Vec<String> {
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&s.stream.group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(&s.stream.requests)
        .arg(">")
        .query_async(&mut db(s).await)
        .await
        .unwrap();
    read.keys.into_iter().flat_map(|k| k.ids).map(|e| e.id).collect()
}

/// Entries of the requests stream still pending in the group.
pub async fn pending(s: &Settings) -> i64 {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(&s.stream.requests)
        .arg(&s.stream.group)
        .query_async(&mut db(s).await)
        .await
        .unwrap();
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        },
        _ => 0,
    }
}

/// One consumer of the group, as `XINFO CONSUMERS` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// Its name (a worker's `stream.consumer`).
    pub name: String,
    /// Entries it holds pending.
    pub pending: u64,
    /// Milliseconds since it last read or claimed.
    pub idle_ms: u64,
}

/// The consumers of the group on the requests stream.
pub async fn consumers(s: &Settings) -> Vec<Consumer> {
    let consumers: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(&s.stream.requests)
        .arg(&s.stream.group)
        .query_async(&mut db(s).await)
        .await
        .unwrap();
    consumers
        .into_iter()
        .map(|c| {
            let int = |k: &str| redis::from_redis_value::<u64>(c[k].clone()).unwrap();
            Consumer {
                name: redis::from_redis_value(c["name"].clone()).unwrap(),
                pending: int("pending"),
                idle_ms: int("idle"),
            }
        })
        .collect()
}

/// One stream entry: its id and its fields. Indexing by field name panics
/// with the whole entry when the field is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry id, `<ms>-<seq>`.
    pub id: String,
    /// Its fields, as text.
    pub fields: HashMap<String, String>,
}

impl Entry {
    /// The id as numbers, the order of the entries of one stream.
    pub fn position(&self) -> (u64, u64) {
        let (ms, seq) = self.id.split_once('-').expect("a stream entry id");
        (ms.parse().expect("ms"), seq.parse().expect("seq"))
    }
}

impl std::ops::Index<&str> for Entry {
    type Output = String;

    fn index(&self, field: &str) -> &String {
        self.fields
            .get(field)
            .unwrap_or_else(|| panic!("entry {} has no field {field}: {:?}", self.id, self.fields))
    }
}

/// Every entry of `stream`, oldest first.
pub async fn stream_entries(con: &mut impl ConnectionLike, stream: &str) -> Vec<Entry> {
    let read: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(con)
        .await
        .unwrap();
    read.ids
        .into_iter()
        .map(|e| Entry {
            fields: e
                .map
                .into_iter()
                .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap()))
                .collect(),
            id: e.id,
        })
        .collect()
}

/// The usage report of `license` over the last hour, to now.
pub async fn usage_last_hour(
    con: &mut Db,
    s: &Settings,
    license: &str,
) -> seatgate::views::usage::UsageReport {
    use seatgate::views::usage::{usage, Query, When};
    let query = Query {
        license: Some(license.to_owned()),
        since: Some(When::Ago(Duration::from_secs(3600))),
        until: None,
    };
    usage(con, s, &query).await.unwrap()
}

/// Every seat event of `license` (on its events shard), oldest first.
pub async fn events(s: &Settings, license: &str) -> Vec<Entry> {
    stream_entries(&mut db(s).await, &s.events_stream_for(license)).await
}

// ---------------------------------------------------------------------------
// Requests through seatgate.

/// A request/reply client sending where `s` says.
pub async fn client(s: &Settings) -> Client {
    s.client().connect().await.expect("client connects")
}

/// An acquire with [`META`], queueing up to `wait_ms` (0 = answer at once).
pub fn acquire(license: &str, session: &str, wait_ms: u64) -> Call {
    Call::acquire(license, session)
        .with_meta(json(META))
        .with_wait(std::time::Duration::from_millis(wait_ms))
}

/// Sends an acquire that may queue, from a client of its own; returns the
/// first reply, the request id (a later GRANTED carries it) and the client.
pub async fn queue_up(s: &Settings, license: &str, session: &str, wait_ms: u64) -> (Reply, String, Client) {
    send_alone(s, &acquire(license, session, wait_ms)).await
}

/// Sends `request` from a client of its own; returns the first reply, the
/// request id (a later GRANTED carries it) and the client (which holds the
/// lease of a seat it is granted).
pub async fn send_alone(s: &Settings, request: &Call) -> (Reply, String, Client) {
    let c = client(s).await;
    let id = c.send(request).await.unwrap();
    let first = c.wait_for(&id, T).await.unwrap();
    (first, id, c)
}

/// Heartbeats waiting `session` of `license` through `c` (the client that
/// queued it, which holds its lease) every `every` while the answer is
/// QUEUED, until the guard drops: a waiter that shows it is alive keeps its
/// place (docs/protocol.md, "Waiter liveness"). It stops at the first other
/// answer, so that a granted seat it never claims goes stale as any other.
pub fn keep_waiting(c: &Client, license: &str, session: &str, every: Duration) -> DropGuard {
    let (c, call) = (c.clone(), Call::heartbeat(license, session));
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        while !token.is_cancelled() {
            match c.call(&call, T).await {
                Ok(r) if r.status() == seatgate_core::status::Status::Queued => {}
                _ => break,
            }
            tokio::select! {
                _ = token.cancelled() => {}
                _ = tokio::time::sleep(every) => {}
            }
        }
    });
    stop.drop_guard()
}

/// Reaper passes every 200 ms until the guard drops, so that a seat nobody
/// heartbeats is evicted soon after its timeout.
pub async fn reaping(s: &Settings) -> DropGuard {
    let reaper = reaper(s).await;
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        while !token.is_cancelled() {
            reaper.pass().await.expect("reaper pass");
            tokio::select! {
                _ = token.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    });
    stop.drop_guard()
}

/// A reaper as `s` configures it, on its own connection.
pub async fn reaper(s: &Settings) -> Reaper {
    Reaper::new(db(s).await, s)
}

// ---------------------------------------------------------------------------
// Workers: in-process and as processes.

/// An in-process worker; stopped (and awaited) by [`WorkerHandle::stop`].
pub struct WorkerHandle {
    /// Cancels its run loop.
    token: CancellationToken,
    /// The run loop, awaited on stop.
    task: tokio::task::JoinHandle<seatgate::Result<()>>,
    /// Its readiness flag, as `/ready` would report it.
    pub ready: Readiness,
}

impl WorkerHandle {
    /// Cancels the worker and waits for it to finish its batch.
    pub async fn stop(self) {
        self.token.cancel();
        self.task
            .await
            .expect("worker task panicked")
            .expect("worker failed");
    }
}

/// Starts a worker named `consumer` with `settings`.
pub async fn spawn_worker(mut settings: Settings, consumer: &str) -> WorkerHandle {
    settings.stream.consumer = consumer.to_owned();
    let ready = Readiness::default();
    let worker = Worker::connect(settings, ready.clone())
        .await
        .expect("worker connects");
    let token = CancellationToken::new();
    let task = tokio::spawn(worker.run(token.clone()));
    WorkerHandle { token, task, ready }
}

/// The lease `seatgate acquire` printed (`… lease=<lease>`) on its last
/// line: what its heartbeats and release must pass as `--lease`.
pub fn printed_lease(stdout: &str) -> String {
    stdout
        .lines()
        .last()
        .and_then(|line| line.split_whitespace().find_map(|w| w.strip_prefix("lease=")))
        .unwrap_or_else(|| panic!("no lease= in {stdout:?}"))
        .to_owned()
}

/// The repository's root (the workspace's), where ops/, config/, docs/ and
/// examples/ are: two levels above this crate.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file of the repository, by its path from the root.
pub fn repo_file(path: &str) -> std::path::PathBuf {
    repo_root().join(path)
}

/// The `seatgate` binary built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_seatgate");

/// `seatgate --redis <url> <args>`, logging warnings only.
pub fn seatgate_cmd(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--redis").arg(url).args(args).env("RUST_LOG", "warn");
    cmd
}

/// Runs `cmd` to its end, off the runtime's threads.
pub async fn output(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("run the command")
}

/// A child process, killed and reaped on drop so that a failing test leaves
/// nothing running. Signals go through the handle: a child's pid stays its
/// own until it is reaped, so they can never reach an unrelated process.
pub struct Spawned(pub Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `seatgate run` child process with its own metrics port, killed on drop.
pub struct WorkerProcess {
    /// The process.
    child: Spawned,
    /// host:port of its /metrics, /live and /ready.
    pub metrics: String,
}

impl WorkerProcess {
    /// Starts `seatgate run` against `url` with extra `SEATGATE__*` variables
    /// and waits until /ready answers 200.
    pub async fn start(url: &str, env: &[(&str, String)]) -> WorkerProcess {
        WorkerProcess::start_logging(url, env, Stdio::inherit()).await
    }

    /// As [`WorkerProcess::start`], its log (stderr, at `warn`, or as
    /// `RUST_LOG` in `env` says) going to `log`.
    pub async fn start_logging(url: &str, env: &[(&str, String)], log: impl Into<Stdio>) -> WorkerProcess {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.arg("--redis")
            .arg(url)
            .arg("run")
            .env("SEATGATE__METRICS__LISTEN", format!("127.0.0.1:{port}"))
            .env("SEATGATE__STREAM__BLOCK_MS", "100")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let worker = WorkerProcess {
            child: Spawned(cmd.spawn().expect("start seatgate run")),
            metrics: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while worker.status("/ready").await != Some(200) {
            assert!(Instant::now() < deadline, "worker did not become ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        worker
    }

    /// The status code of `path` on its HTTP endpoint (None: no answer).
    pub async fn status(&self, path: &str) -> Option<u16> {
        http_get(&self.metrics, path).await.map(|(code, _)| code)
    }

    /// Waits (at most `within`) until `/ready` answers `code`; how long it took.
    pub async fn ready_turns(&self, code: u16, within: Duration) -> Duration {
        let since = Instant::now();
        while self.status("/ready").await != Some(code) {
            assert!(
                since.elapsed() < within,
                "/ready did not turn {code} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        since.elapsed()
    }

    /// Its `/metrics` response ("" when it does not answer).
    pub async fn scrape(&self) -> String {
        http_get(&self.metrics, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Its peak resident memory so far (`VmHWM` of /proc/<pid>/status), KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.0.id()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/<pid>/status")
    }

    /// Sends it `kill -<name>` (STOP freezes it mid-read, CONT lets it go
    /// on), through the child's pid, which stays its own until reaped.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.0.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits (at most `within`) for it to exit on its own; its status.
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.0.try_wait().expect("wait for worker") {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill9(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
    }

    /// SIGTERM, then waits (at most `within`) for the exit status.
    pub async fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.child.0.id().to_string();
        tokio::task::spawn_blocking(move || Command::new("kill").arg("-TERM").arg(pid).status())
            .await
            .unwrap()
            .expect("run kill");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.0.try_wait().expect("wait for worker") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not stop on SIGTERM within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A minimal HTTP/1.0 GET, enough for /metrics and /ready on loopback; the
/// status code and the whole response. It runs off the runtime's threads.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let (addr, path) = (addr.to_owned(), path.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        let code = body.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body))
    })
    .await
    .expect("http_get task")
}

/// The value of one exact series (name and labels as rendered) in a
/// Prometheus exposition, if present.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

/// `text` as a JSON value, for a call's metadata.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("test metadata is JSON")
}
