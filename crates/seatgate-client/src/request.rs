//! The request/reply client: what any service does in its own language, in Rust.
//!
//! A [`Client`] is cheap to clone, and every clone shares one connection for
//! requests and one reply stream. Any number of tasks call at once: each
//! request registers a waiter under its request id, is XADDed to its
//! license's shard (concurrent XADDs go out pipelined on the one multiplexed
//! connection), and is answered when the client's reply reader (one task,
//! `reader.rs`) reads the reply carrying that id. In-flight requests are
//! bounded (`client.max_in_flight`): past it, callers wait for a slot. The
//! CLI's `acquire`, `release` and `heartbeat` use it, and so do the tests
//! and the benchmark; `seatgate revoke` uses an admin client
//! ([`Client::connect_admin`]), which sends to the admin stream instead.
//!
//! Every acquire carries a lease, a random secret the seat is bound to
//! (docs/protocol.md, "Leases"): the client makes one per session (or takes
//! the caller's, [`Call::with_lease`]), remembers it per license and session
//! for all its clones, and sends it with that session's heartbeats, releases
//! and re-sent acquires, so that no other caller can keep alive or free the
//! seat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::leases::LeaseBook;
use super::reader::{Reader, ReaderCounters, READ_BLOCK};
use super::reply::Reply;
use super::waiters::{Waiters, Waiting};
use seatgate_core::db::{Db, RedisSettings};
use seatgate_core::error::Error;
use seatgate_core::keys::{shard_name, Keys, Topology};
use seatgate_core::policy::RequestPolicy;
use seatgate_core::protocol::Lease;
use seatgate_core::request::Op;
use seatgate_core::status::Status;

/// What a [`Call`] asks of a seat. A revoke is not among them: it is an
/// administrator's, sent with an [`AdminClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SeatOp {
    /// Take a seat, or a place in the queue for one.
    Acquire,
    /// Give the seat (or the place in the queue) back.
    Release,
    /// Keep the seat: the service evicts a seat whose heartbeats stop.
    Heartbeat,
}

impl SeatOp {
    /// The wire name (`op` field): `acquire`, `release` or `heartbeat`.
    pub fn as_str(self) -> &'static str {
        Op::from(self).as_str()
    }
}

impl std::fmt::Display for SeatOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<SeatOp> for Op {
    fn from(op: SeatOp) -> Op {
        match op {
            SeatOp::Acquire => Op::Acquire,
            SeatOp::Release => Op::Release,
            SeatOp::Heartbeat => Op::Heartbeat,
        }
    }
}

/// A request to send: an op on one session of one license, and what an
/// acquire asks besides (metadata, a wait in the queue, who asks, a lease).
/// Built with [`Call::acquire`], [`Call::release`] or [`Call::heartbeat`] and
/// the `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use seatgate_client::Call;
///
/// let call = Call::acquire("cad-pro", "ws-7")
///     .with_user("ada")
///     .with_group("eng")
///     .with_priority(2)
///     .with_wait(Duration::from_secs(60))
///     .with_meta(serde_json::json!({"host": "ws-7.example.com"}));
/// let names: Vec<&str> = call.fields().iter().map(|(name, _)| *name).collect();
/// assert_eq!(names, ["op", "license", "session", "meta", "wait_ms", "user", "group", "priority"]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// acquire, release or heartbeat.
    pub op: SeatOp,
    /// License id.
    pub license: String,
    /// Session id.
    pub session: String,
    /// Metadata (acquire): a JSON object, kept with the seat and shown to
    /// operators (the service refuses anything but an object).
    pub meta: Option<serde_json::Value>,
    /// How long to wait in the queue (acquire), ms.
    pub wait_ms: u64,
    /// The lease to send; `None` = the one the client holds for this
    /// session, or (acquire) a new random one.
    pub lease: Option<Lease>,
    /// Who asks (acquire): user, group, priority and borrow, for the
    /// license's policies; [`RequestPolicy::NONE`] sends none of them.
    pub policy: RequestPolicy,
    /// How long after it reaches Redis the request may still be decided, ms
    /// (`ttl_ms`); later the service answers REQUEST_EXPIRED and changes
    /// nothing. `None` sends none (the service's `requests.default_ttl_ms`
    /// applies).
    pub ttl_ms: Option<u64>,
}

impl Call {
    /// A request `op` for `session` of `license`, without metadata or wait.
    pub fn new(op: SeatOp, license: impl Into<String>, session: impl Into<String>) -> Call {
        Call {
            op,
            license: license.into(),
            session: session.into(),
            meta: None,
            wait_ms: 0,
            lease: None,
            policy: RequestPolicy::NONE,
            ttl_ms: None,
        }
    }

    /// An acquire: a seat of `license` for `session`.
    pub fn acquire(license: impl Into<String>, session: impl Into<String>) -> Call {
        Call::new(SeatOp::Acquire, license, session)
    }

    /// A release of `session`'s seat (or place in the queue) of `license`.
    pub fn release(license: impl Into<String>, session: impl Into<String>) -> Call {
        Call::new(SeatOp::Release, license, session)
    }

    /// A heartbeat of `session`'s seat of `license`.
    pub fn heartbeat(license: impl Into<String>, session: impl Into<String>) -> Call {
        Call::new(SeatOp::Heartbeat, license, session)
    }

    /// The same request, to be decided within `ttl` of reaching Redis or
    /// not at all (REQUEST_EXPIRED). Rounded up to whole milliseconds.
    pub fn with_ttl(mut self, ttl: Duration) -> Call {
        self.ttl_ms = Some(duration_ms(ttl));
        self
    }

    /// The same request carrying `meta`, a JSON object (acquire).
    pub fn with_meta(mut self, meta: serde_json::Value) -> Call {
        self.meta = Some(meta);
        self
    }

    /// The same request willing to wait up to `wait` in the queue (acquire),
    /// in whole milliseconds, rounded up.
    pub fn with_wait(mut self, wait: Duration) -> Call {
        self.wait_ms = duration_ms(wait);
        self
    }

    /// The same request carrying `lease`: an acquire binds the seat to it
    /// (re-using one, say after a restart), a heartbeat or release proves
    /// the seat is the caller's. The client remembers it for the session.
    pub fn with_lease(mut self, lease: Lease) -> Call {
        self.lease = Some(lease);
        self
    }

    /// The same request asked by `policy`'s user and group, at its priority,
    /// borrowing as it says: every policy field at once.
    pub fn with_policy(mut self, policy: RequestPolicy) -> Call {
        self.policy = policy;
        self
    }

    /// The same request asked by `user` (per-user limits, `require_user`).
    pub fn with_user(mut self, user: impl Into<String>) -> Call {
        self.policy.user = Some(user.into());
        self
    }

    /// The same request asked for `group` (group limits and reservations).
    pub fn with_group(mut self, group: impl Into<String>) -> Call {
        self.policy.group = Some(group.into());
        self
    }

    /// The same request at queue priority `priority` (0-9, capped by the
    /// license's `max_priority`).
    pub fn with_priority(mut self, priority: u8) -> Call {
        self.policy.priority = priority;
        self
    }

    /// The same acquire borrowing the seat for `borrow` (offline use, up
    /// to the license's `max_borrow_ms`), in whole milliseconds, rounded up.
    pub fn with_borrow(mut self, borrow: Duration) -> Call {
        self.policy.borrow_ms = duration_ms(borrow);
        self
    }

    /// The request's own fields as they go on the wire, in order; the
    /// client adds `id` and `reply_to` (and fills in the lease). A new
    /// request field goes here only.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("op", self.op.as_str().to_owned()),
            ("license", self.license.clone()),
            ("session", self.session.clone()),
        ];
        if let Some(meta) = &self.meta {
            fields.push(("meta", meta.to_string()));
        }
        if self.wait_ms > 0 {
            fields.push(("wait_ms", self.wait_ms.to_string()));
        }
        if let Some(lease) = &self.lease {
            fields.push(("lease", lease.as_str().to_owned()));
        }
        let p = &self.policy;
        if let Some(user) = &p.user {
            fields.push(("user", user.clone()));
        }
        if let Some(group) = &p.group {
            fields.push(("group", group.clone()));
        }
        if p.priority > 0 {
            fields.push(("priority", p.priority.to_string()));
        }
        if p.borrow_ms > 0 {
            fields.push(("borrow_ms", p.borrow_ms.to_string()));
        }
        if let Some(ttl_ms) = self.ttl_ms {
            fields.push(("ttl_ms", ttl_ms.to_string()));
        }
        fields
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
    /// Whether the cooldown binds the session's user too
    /// (`cooldown_scope=user`): that user's acquires are refused whatever
    /// their session id.
    pub user_wide: bool,
}

impl Revoke {
    /// The request's own fields as they go on the wire, in order; the
    /// client adds `id` and `reply_to`.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("op", Op::Revoke.as_str().to_owned()),
            ("license", self.license.clone()),
            ("session", self.session.clone()),
            ("reason", self.reason.clone()),
            ("actor", self.actor.clone()),
        ];
        if self.cooldown_ms > 0 {
            fields.push(("cooldown_ms", self.cooldown_ms.to_string()));
        }
        if self.user_wide {
            fields.push(("cooldown_scope", "user".to_owned()));
        }
        fields
    }
}

/// The application name in an admin client's reply streams,
/// `<replies.prefix>admin:<unique>`: one ACL pattern (`seat:reply:admin:*`)
/// lets the admin user read its replies, whatever `client.name` says.
pub const ADMIN_CLIENT_NAME: &str = "admin";

/// A client: one request connection and one reply stream shared by every
/// clone. Dropping the last clone stops its reply reader and deletes its
/// reply stream (best effort; [`Client::close`] waits for it).
#[derive(Clone)]
pub struct Client {
    /// What the clones share.
    inner: Arc<Inner>,
}

/// The state every clone of a client shares.
struct Inner {
    /// The shared connection requests are XADDed on: multiplexed (concurrent
    /// requests are pipelined) and reconnecting by itself on one node,
    /// routing each XADD to its shard's master on a cluster.
    con: Db,
    /// The requests stream (the base name when sharded).
    requests: String,
    /// Shards of the requests stream.
    shards: usize,
    /// This client's reply stream, `<replies.prefix><client.name>:<unique>`:
    /// inside the reply namespace the workers answer in, and under the
    /// application's name, so that its ACL user may read it and no other.
    reply_to: String,
    /// Prefix of this client's request ids, unique per client instance.
    id_prefix: String,
    /// The next request id's sequence number.
    next_id: AtomicU64,
    /// Who waits for which reply; shared with the reader.
    waiters: Arc<Waiters>,
    /// In-flight slots: a request holds one from before its XADD until its
    /// first reply (or until its caller gives up).
    slots: Arc<Semaphore>,
    /// `client.max_in_flight`, for [`Stats::in_flight`].
    max_in_flight: usize,
    /// `client.ttl_ms`: the `ttl_ms` a seat handle's requests carry unless
    /// its options say otherwise.
    ttl: Duration,
    /// `sessions.heartbeat_timeout_ms`: the timeout a seat handle assumes
    /// when a grant does not say (a service older than that reply field).
    heartbeat_timeout: Duration,
    /// The reader's counters.
    counters: Arc<ReaderCounters>,
    /// The lease each (license, session) this client acquired is bound to,
    /// sent again with its heartbeats, releases and re-sent acquires by
    /// any clone; kept a while after the seat or place is given back, for
    /// that session's late calls (leases.rs).
    leases: Mutex<LeaseBook>,
    /// The reader task, for [`Client::close`] to wait on.
    reader: Mutex<Option<JoinHandle<Result<(), Error>>>>,
    /// Stops the reader when the last clone is dropped. (The reader holds
    /// the waiters, not the client: otherwise it would keep the client alive.)
    _stop: DropGuard,
}

/// A client's counters, for tests and the curious.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Requests sent (or about to be) and not answered yet.
    pub in_flight: usize,
    /// Waiters registered (in-flight requests, queued acquires waited on,
    /// `wait_for` calls).
    pub waiting: usize,
    /// Replies nobody waited for, kept for a later [`Client::wait_for`].
    pub unclaimed: usize,
    /// Unclaimed replies dropped: too many, or older than `replies.ttl_ms`.
    pub unclaimed_dropped: u64,
    /// Times the reply reader reconnected after a failed read.
    pub reconnects: u64,
}

/// A request sent, with its waiter: its replies come through it, QUEUED
/// first for a queued acquire, then GRANTED or QUEUE_TIMEOUT. Dropping it
/// stops waiting (a reply that comes later is kept unclaimed for a while).
pub struct Pending {
    /// The registered waiter.
    waiting: Waiting,
    /// Its client: kept alive (and its reply reader with it) while waiting,
    /// and asked for the lease each reply was sent with.
    client: Client,
}

impl Pending {
    /// The request id; every reply to the request carries it.
    pub fn id(&self) -> &str {
        self.waiting.id()
    }

    /// The next reply, waiting up to `timeout`. A timeout leaves the request
    /// registered: its reply may still be waited for.
    pub async fn reply(&mut self, timeout: Duration) -> Result<Reply, Error> {
        match tokio::time::timeout(timeout, self.waiting.next()).await {
            Ok(Some(reply)) => Ok(self.client.with_lease(reply)),
            Ok(None) => Err(stopped()),
            Err(_) => Err(Error::ReplyTimeout(timeout)),
        }
    }

    /// The next reply, however long it takes; `None` once the client
    /// stopped reading replies. (Cancel-safe: dropping the future loses no
    /// reply.)
    pub(super) async fn next_reply(&mut self) -> Option<Reply> {
        let reply = self.waiting.next().await?;
        Some(self.client.with_lease(reply))
    }

    /// The final reply (anything but QUEUED), waiting up to `timeout` in all.
    /// QUEUED replies on the way (a redelivered request repeats its QUEUED)
    /// are skipped.
    pub async fn final_reply(&mut self, timeout: Duration) -> Result<Reply, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let reply = self
                .reply(deadline.saturating_duration_since(Instant::now()))
                .await
                .map_err(|e| match e {
                    Error::ReplyTimeout(_) => Error::ReplyTimeout(timeout),
                    other => other,
                })?;
            if reply.is_final() {
                return Ok(reply);
            }
        }
    }
}

/// The error of a wait whose client stopped reading replies.
fn stopped() -> Error {
    Error::Client("the reply reader stopped".into())
}

/// How to reach a deployment and who is asking: the Redis to connect to and
/// the application's name. Made by [`Client::builder`]; everything else
/// (the requests stream, its shards, the reply namespace) is read from the
/// deployment, where the workers record it, unless [`ClientBuilder::topology`]
/// gives it.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    /// How to reach Redis.
    redis: RedisSettings,
    /// The application: its requests stream (when the deployment gives it one)
    /// and its reply streams' names.
    application: String,
    /// The deployment's key prefix, where its HASH of settings is found.
    key_prefix: String,
    /// The streams, when given rather than read from the deployment.
    topology: Option<Topology>,
    /// Most requests sent and not yet answered.
    max_in_flight: usize,
    /// The `ttl_ms` a seat handle's requests carry by default.
    ttl: Duration,
    /// How long a reply nobody waits for yet is kept.
    reply_ttl: Duration,
    /// The heartbeat timeout a seat handle assumes when a grant does not say.
    heartbeat_timeout: Duration,
}

impl Default for ClientBuilder {
    /// The shipped defaults (config/default.toml): Redis on
    /// `redis://127.0.0.1:6379`, application `seatgate`, key prefix `seat`,
    /// 1,000 requests in flight, a 5 s `ttl_ms`.
    fn default() -> ClientBuilder {
        ClientBuilder {
            redis: RedisSettings::default(),
            application: "seatgate".to_owned(),
            key_prefix: "seat".to_owned(),
            topology: None,
            max_in_flight: 1000,
            ttl: Duration::from_secs(5),
            reply_ttl: Duration::from_secs(300),
            heartbeat_timeout: Duration::from_secs(90),
        }
    }
}

impl ClientBuilder {
    /// The Redis to connect to: `redis://host:port` or `rediss://` for TLS,
    /// with `user:password@` if its ACL asks for them.
    pub fn url(mut self, url: impl Into<String>) -> ClientBuilder {
        self.redis.url = url.into();
        self
    }

    /// The seed nodes of a Redis Cluster (the URL is then unused).
    pub fn cluster<I: IntoIterator<Item = S>, S: Into<String>>(mut self, nodes: I) -> ClientBuilder {
        self.redis.cluster_urls = nodes.into_iter().map(Into::into).collect();
        self
    }

    /// The Sentinels to ask for the master named `master_name` (the URL is
    /// then unused): the client follows the master through failovers.
    pub fn sentinel<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        sentinels: I,
        master_name: impl Into<String>,
    ) -> ClientBuilder {
        self.redis.sentinel.urls = sentinels.into_iter().map(Into::into).collect();
        self.redis.sentinel.master_name = master_name.into();
        self
    }

    /// Every connection setting at once: ACL user and password (or password
    /// file), TLS files, timeouts, cluster nodes.
    pub fn redis(mut self, redis: RedisSettings) -> ClientBuilder {
        self.redis = redis;
        self
    }

    /// The application asking: 1 to 64 characters of A-Z a-z 0-9 . _ -.
    /// When the deployment lists it among `stream.applications`, its
    /// requests go to its own stream; its replies come back on
    /// `<replies.prefix><application>:<unique>` either way, the key
    /// pattern its ACL user may read.
    pub fn application(mut self, name: impl Into<String>) -> ClientBuilder {
        self.application = name.into();
        self
    }

    /// The deployment's key prefix (`keys.prefix`, `seat` by default).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> ClientBuilder {
        self.key_prefix = prefix.into();
        self
    }

    /// The deployment's streams as given, instead of reading them from the
    /// deployment: for a program that holds the service's own settings.
    pub fn topology(mut self, topology: Topology) -> ClientBuilder {
        self.topology = Some(topology);
        self
    }

    /// Most requests sent and not yet answered (1,000): past it, callers
    /// wait for a slot. A queued acquire gives its slot back at QUEUED.
    pub fn max_in_flight(mut self, n: usize) -> ClientBuilder {
        self.max_in_flight = n.max(1);
        self
    }

    /// The `ttl_ms` a seat handle's requests carry unless their call or
    /// options say otherwise (5 s): a request not decided within it after
    /// it reached Redis is answered REQUEST_EXPIRED and changes nothing.
    pub fn ttl(mut self, ttl: Duration) -> ClientBuilder {
        self.ttl = ttl;
        self
    }

    /// How long a reply that no caller waits for yet is kept for a later
    /// [`Client::wait_for`] (5 minutes).
    pub fn reply_ttl(mut self, ttl: Duration) -> ClientBuilder {
        self.reply_ttl = ttl;
        self
    }

    /// The heartbeat timeout a seat handle assumes when a grant does not
    /// carry the license's (a service older than that reply field; 90 s).
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.heartbeat_timeout = timeout;
        self
    }

    /// Connects: one node or a cluster, reads the deployment's streams
    /// (unless given), opens the request connection and the reply reader's,
    /// and starts the reader inside the current tokio runtime.
    pub async fn connect(self) -> Result<Client, Error> {
        self.check_application()?;
        let con = Db::connect(&self.redis).await?;
        let topology = self.find_topology(&con).await?;
        let requests = topology.client_requests(&self.application);
        let (shards, name) = (topology.shards, self.application.clone());
        self.start(con, topology, requests, shards, &name).await
    }

    /// Connects as an administrator: requests go to the deployment's admin
    /// stream (never sharded), replies come back on
    /// `<replies.prefix>admin:<unique>`. Only an [`AdminClient`] revokes.
    pub async fn connect_admin(self) -> Result<AdminClient, Error> {
        let con = Db::connect(&self.redis).await?;
        let topology = self.find_topology(&con).await?;
        let requests = topology.admin_requests.clone();
        let client = self.start(con, topology, requests, 1, ADMIN_CLIENT_NAME).await?;
        Ok(AdminClient { client })
    }

    fn check_application(&self) -> Result<(), Error> {
        let name = &self.application;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(())
        } else {
            Err(Error::Usage(format!(
                "application {name:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ -"
            )))
        }
    }

    /// The given topology, else the one the deployment's HASH records (the
    /// defaults for what no worker has recorded yet).
    async fn find_topology(&self, con: &Db) -> Result<Topology, Error> {
        if let Some(topology) = &self.topology {
            return Ok(topology.clone());
        }
        let key = Keys::new(self.key_prefix.clone()).deployment();
        // One HGET per field in one pipeline: the shipped client ACL allows
        // HGET on the deployment's HASH and nothing else there.
        let mut pipe = redis::pipe();
        for field in Topology::FIELDS {
            pipe.cmd("HGET").arg(&key).arg(field);
        }
        let mut con = con.clone();
        let values: Vec<Option<String>> = pipe.query_async(&mut con).await?;
        Topology::from_recorded(&values)
            .map_err(|why| Error::Client(format!("the deployment's settings ({key}): {why}")))
    }

    /// A client sending to `requests` (in `shards` shards), its replies on a
    /// stream of its own under `name` in the topology's reply namespace.
    async fn start(
        self,
        con: Db,
        topology: Topology,
        requests: String,
        shards: usize,
        name: &str,
    ) -> Result<Client, Error> {
        let reading = Db::connect_blocking(&self.redis, READ_BLOCK).await?;
        // A random id makes the reply stream's name and the request ids
        // unguessable: another caller (who may not list keys) cannot aim a
        // request's reply at this stream, nor pass one off as an answer here.
        let id_prefix = uuid::Uuid::new_v4().simple().to_string();
        let reply_to = topology.reply_stream(name, &id_prefix);
        let waiters = Waiters::new(self.reply_ttl);
        let counters = Arc::new(ReaderCounters::default());
        let stop = CancellationToken::new();
        let reader = Reader {
            redis: self.redis.clone(),
            reply_to: reply_to.clone(),
            waiters: waiters.clone(),
            counters: counters.clone(),
        };
        let reader = tokio::spawn(reader.run(reading, con.clone(), stop.clone()));
        Ok(Client {
            inner: Arc::new(Inner {
                con,
                requests,
                shards,
                reply_to,
                id_prefix,
                next_id: AtomicU64::new(0),
                waiters,
                slots: Arc::new(Semaphore::new(self.max_in_flight)),
                max_in_flight: self.max_in_flight,
                ttl: self.ttl,
                heartbeat_timeout: self.heartbeat_timeout,
                counters,
                leases: Mutex::new(LeaseBook::default()),
                reader: Mutex::new(Some(reader)),
                _stop: stop.drop_guard(),
            }),
        })
    }
}

/// A client on the administrators' stream: the one way to revoke a seat.
/// It sends nothing else (the admin stream accepts only revokes).
#[derive(Clone)]
pub struct AdminClient {
    /// The request/reply machinery, on the admin stream.
    client: Client,
}

impl AdminClient {
    /// Sends `revoke` and waits up to `timeout` for its reply.
    pub async fn revoke(&self, revoke: &Revoke, timeout: Duration) -> Result<Reply, Error> {
        let client = &self.client;
        client
            .first_reply(client.request_fields(&revoke.license, revoke.fields()), timeout)
            .await
    }

    /// Waits up to `timeout` for the next reply to request `id` on this
    /// client's reply stream (see [`Client::wait_for`]).
    pub async fn wait_for(&self, id: &str, timeout: Duration) -> Result<Reply, Error> {
        self.client.wait_for(id, timeout).await
    }

    /// This client's reply stream key.
    pub fn reply_to(&self) -> &str {
        self.client.reply_to()
    }

    /// Stops the reply reader and deletes the reply stream (see [`Client::close`]).
    pub async fn close(self) -> Result<(), Error> {
        self.client.close().await
    }
}

impl Client {
    /// A builder: `Client::builder().url("redis://…").application("cad").connect().await?`.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// The lease this client holds for `session` of `license` while its
    /// seat or place is held: the one its last acquire (or any call given
    /// one) carried. `None` once it is given back (the client still sends
    /// it with that session's late heartbeats and releases).
    pub fn lease(&self, license: &str, session: &str) -> Option<Lease> {
        self.leases()
            .live(&(license.to_owned(), session.to_owned()))
            .cloned()
    }

    /// `client.ttl_ms`, the ttl a seat handle's requests carry by default.
    pub(super) fn default_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// `sessions.heartbeat_timeout_ms`, what a seat handle assumes when a
    /// grant does not carry the license's heartbeat timeout.
    pub(super) fn default_heartbeat_timeout(&self) -> Duration {
        self.inner.heartbeat_timeout
    }

    /// This client's reply stream key.
    pub fn reply_to(&self) -> &str {
        &self.inner.reply_to
    }

    /// The requests stream (shard) this client sends `license`'s requests
    /// to: its application's stream or the shared one, sharded the way the
    /// deployment recorded when the client connected.
    pub fn requests_stream_for(&self, license: &str) -> String {
        seatgate_core::keys::shard_name(&self.inner.requests, self.inner.shards, license)
    }

    /// Sends `call` and waits up to `timeout` (including any wait for an
    /// in-flight slot) for its first reply. For a queued acquire that is
    /// QUEUED; [`Client::request`] waits for the final answer, or
    /// [`Client::wait_for`] with the reply's `id` collects it later.
    pub async fn call(&self, call: &Call, timeout: Duration) -> Result<Reply, Error> {
        self.first_reply(self.request(call), timeout).await
    }

    /// The first reply to the request `pending` sends, within `timeout`
    /// (including any wait for an in-flight slot).
    async fn first_reply(
        &self,
        pending: impl std::future::Future<Output = Result<Pending, Error>>,
        timeout: Duration,
    ) -> Result<Reply, Error> {
        tokio::time::timeout(timeout, async {
            let mut pending = pending.await?;
            match pending.waiting.next().await {
                Some(reply) => Ok(self.with_lease(reply)),
                None => Err(stopped()),
            }
        })
        .await
        .map_err(|_| Error::ReplyTimeout(timeout))?
    }

    /// Sends `call` once an in-flight slot is free and returns its waiter,
    /// registered before the XADD (the reply may come before XADD returns).
    pub async fn request(&self, call: &Call) -> Result<Pending, Error> {
        let call = self.with_its_lease(call);
        self.request_fields(&call.license, call.fields()).await
    }

    /// [`Client::request`] for a request of `license` made of `fields`.
    async fn request_fields(
        &self,
        license: &str,
        fields: Vec<(&'static str, String)>,
    ) -> Result<Pending, Error> {
        let permit = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| stopped())?;
        let id = self.next_id();
        let waiting = self
            .inner
            .waiters
            .register(&id, Some(permit), false)
            .ok_or_else(|| Error::Client(format!("request id {id} is already in use")))?;
        // On failure `waiting` drops: the waiter and its slot go with it.
        self.xadd(&id, license, fields).await?;
        Ok(Pending {
            waiting,
            client: self.clone(),
        })
    }

    /// Sends `call` without waiting and without taking an in-flight slot;
    /// returns its request id, for [`Client::wait_for`]. Its reply is kept
    /// unclaimed until then (at most `replies.ttl_ms`, and the last 1024).
    pub async fn send(&self, call: &Call) -> Result<String, Error> {
        let id = self.next_id();
        let call = self.with_its_lease(call);
        self.xadd(&id, &call.license, call.fields()).await?;
        Ok(id)
    }

    /// Waits up to `timeout` for the next reply to request `id`: one kept
    /// unclaimed (a request from [`Client::send`], a GRANTED after the
    /// QUEUED that [`Client::call`] returned, a reply that came after its
    /// caller timed out), else the next to arrive.
    pub async fn wait_for(&self, id: &str, timeout: Duration) -> Result<Reply, Error> {
        let mut waiting = self
            .inner
            .waiters
            .register(id, None, true)
            .ok_or_else(|| Error::Client(format!("request {id} is already being waited for")))?;
        match tokio::time::timeout(timeout, waiting.next()).await {
            Ok(Some(reply)) => Ok(self.with_lease(reply)),
            Ok(None) => Err(stopped()),
            Err(_) => Err(Error::ReplyTimeout(timeout)),
        }
    }

    /// The client's counters.
    pub fn stats(&self) -> Stats {
        let counts = self.inner.waiters.counts();
        Stats {
            in_flight: self.inner.max_in_flight - self.inner.slots.available_permits(),
            waiting: counts.waiting,
            unclaimed: counts.unclaimed,
            unclaimed_dropped: counts.dropped,
            reconnects: self.inner.counters.reconnects.load(Ordering::Relaxed),
        }
    }

    /// Drops this handle; if it was the last, stops the reply reader and
    /// waits until it has deleted the reply stream. With other clones (or
    /// [`Pending`] requests) alive, they keep the stream and nothing stops.
    pub async fn close(self) -> Result<(), Error> {
        let Ok(inner) = Arc::try_unwrap(self.inner) else {
            return Ok(());
        };
        let reader = inner.reader.lock().ok().and_then(|mut r| r.take());
        // Dropping the last state cancels the reader.
        drop(inner);
        match reader {
            Some(reader) => reader
                .await
                .map_err(|e| Error::Client(format!("the reply reader failed: {e}")))?,
            None => Ok(()),
        }
    }

    /// A new request id: this client's unique prefix and a sequence number.
    fn next_id(&self) -> String {
        format!(
            "{}-{}",
            self.inner.id_prefix,
            self.inner.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn leases(&self) -> MutexGuard<'_, LeaseBook> {
        // Every use is one map operation: a poisoned lock is used as is.
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lease `call` goes with: its own, else the one held for its
    /// session, else (acquire) a new one; remembered for the session.
    fn lease_for(&self, call: &Call) -> Option<Lease> {
        let key = (call.license.clone(), call.session.clone());
        let mut leases = self.leases();
        // An acquire of an ended session takes a new lease: a new seat, a
        // new secret. A late heartbeat or release of one carries its old
        // lease without bringing it back to life.
        let acquire = call.op == SeatOp::Acquire;
        let lease = call
            .lease
            .clone()
            .or_else(|| leases.live(&key).cloned())
            .or_else(|| {
                if acquire {
                    new_lease()
                } else {
                    leases.get(&key).cloned()
                }
            })?;
        if acquire || call.lease.is_some() {
            leases.hold(key, lease.clone());
        }
        Some(lease)
    }

    /// `reply` with the lease its session's request was sent with; a
    /// session whose seat or place is now given back keeps it as ended.
    fn with_lease(&self, mut reply: Reply) -> Reply {
        let key = (reply.get("license").to_owned(), reply.get("session").to_owned());
        let mut leases = self.leases();
        reply.lease = match reply.status() {
            // Released under the license's linger_ms: the seat stays with the
            // session, bound to its lease, which takes it back on an acquire.
            Status::Released if reply.fields.contains_key("linger_ms") => leases.get(&key).cloned(),
            // Given back, taken away by an administrator, or never held.
            Status::Released | Status::LeftQueue | Status::SessionNotFound | Status::SessionRevoked => {
                leases.end(&key)
            }
            _ => leases.get(&key).cloned(),
        };
        reply
    }

    /// `call` with the lease it goes with ([`Client::lease_for`]).
    fn with_its_lease(&self, call: &Call) -> Call {
        Call {
            lease: self.lease_for(call),
            ..call.clone()
        }
    }

    /// XADDs request `id` of `license`, made of `fields`, to the license's shard.
    async fn xadd(&self, id: &str, license: &str, fields: Vec<(&'static str, String)>) -> Result<(), Error> {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(shard_name(&self.inner.requests, self.inner.shards, license))
            .arg("*")
            .arg("id")
            .arg(id)
            .arg("reply_to")
            .arg(&self.inner.reply_to);
        for (field, value) in fields {
            xadd.arg(field).arg(value);
        }
        let mut con = self.inner.con.clone();
        match xadd.query_async::<String>(&mut con).await {
            Ok(_) => Ok(()),
            // The managed connection learns that Redis went away (a restart)
            // only when a command fails on the dead socket, and reconnects
            // then: the request goes once more, on the new connection, under
            // the same id. Should the first one have reached Redis after all,
            // the request id is the idempotency key (docs/protocol.md,
            // "Sending a request again"): the second entry gets the first
            // one's answer, and its waiter takes the first reply.
            Err(e) if e.is_connection_dropped() => {
                let _: String = xadd.query_async(&mut con).await?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// `d` in whole milliseconds, rounded up (a 0.5 ms ttl is 1 ms, not 0).
pub(super) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A new random lease: a UUID v4 in its 32-hex-digit form, 122 random bits
/// from the operating system's generator.
/// (32 hex digits always form a lease; `None` cannot happen.)
pub(super) fn new_lease() -> Option<Lease> {
    Lease::parse(&uuid::Uuid::new_v4().simple().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_puts_its_own_fields_on_the_wire() {
        let plain = Call::release("lic", "s1");
        assert_eq!(
            plain.fields(),
            [
                ("op", "release".to_owned()),
                ("license", "lic".to_owned()),
                ("session", "s1".to_owned())
            ]
        );
        let lease = Lease::parse("abcdefghijklmnop").unwrap();
        let full = Call::acquire("lic", "s1")
            .with_meta(serde_json::json!({}))
            .with_wait(Duration::from_millis(500))
            .with_lease(lease)
            .with_ttl(Duration::from_micros(2_500_100));
        let names: Vec<&str> = full.fields().iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            ["op", "license", "session", "meta", "wait_ms", "lease", "ttl_ms"]
        );
        assert_eq!(
            (
                full.fields()[4].1.as_str(),
                full.fields()[5].1.as_str(),
                full.fields()[6].1.as_str()
            ),
            ("500", "abcdefghijklmnop", "2501"),
            "a ttl is sent in whole ms, rounded up"
        );
    }

    #[test]
    fn new_leases_are_valid_and_differ() {
        let a = new_lease().unwrap();
        let b = new_lease().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert_eq!(format!("{a:?}"), "Lease(<redacted>)");
    }
}
