//! The connection to Redis, one node or a cluster: the same commands either way.
//!
//! Everything but the blocking reads and the workers' doorbell
//! ([`Db::connect_tracking`]) goes through [`Db::connect`]: a managed,
//! multiplexed connection on one node (it reconnects by itself), or redis-rs's
//! async cluster connection, which routes each command to the master owning its
//! slot and follows MOVED/ASK and failovers. Blocking reads (`XREADGROUP BLOCK`,
//! `XREAD BLOCK`) get their own connection from [`Db::connect_blocking`], whose
//! response timeout is longer than any block: a timeout shorter than the block
//! would drop a reply the server still sends, leaving its entry pending unread.
//!
//! rediss:// URLs (one node or cluster seeds) use TLS through rustls, with the
//! CA and client certificate of `[redis]` ([`RedisSettings::tls_certificates`]).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture,
    TlsCertificates, Value,
};
use secrecy::ExposeSecret;

mod sentinel;
mod settings;

pub use crate::error::is_out_of_memory;
use crate::error::Error;
pub use sentinel::Failover;
pub use settings::{RedisSettings, SentinelSettings};

/// A connection usable anywhere a redis-rs async connection is.
#[derive(Clone)]
pub enum Db {
    /// One node, reconnecting by itself (scripts, replies, acks).
    Managed(ConnectionManager),
    /// One node, plain multiplexed (blocking reads).
    Plain(MultiplexedConnection),
    /// Redis Cluster.
    Cluster(ClusterConnection),
    /// The master Redis Sentinel names, followed through failovers.
    Sentinel(Failover),
}

impl Db {
    /// The shared connection for non-blocking commands.
    pub async fn connect(redis: &RedisSettings) -> Result<Db, Error> {
        let connect = Duration::from_millis(redis.connect_timeout_ms);
        let response = Duration::from_millis(redis.response_timeout_ms);
        if redis.is_cluster() {
            let client = cluster_builder(redis)?
                .connection_timeout(connect)
                .response_timeout(response)
                .build()?;
            return match client.get_async_connection().await {
                Ok(con) => Ok(Db::Cluster(con)),
                Err(e) => Err(connect_error(redis, e).await),
            };
        }
        if redis.is_sentinel() {
            return Db::sentinel(redis, Some(response)).await;
        }
        let client = redis_client(redis)?;
        // The manager retries its first connection with backoff (about 10 s)
        // whatever the error. One attempt without retries first turns a
        // mistake in the settings (a plain URL against a TLS port, an
        // untrusted certificate) into an error at once; an unreachable Redis
        // still gets the retries.
        let once = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response));
        if let Err(e) = client.get_multiplexed_async_connection_with_config(&once).await {
            if let err @ Error::Connect { .. } = connect_error(redis, e).await {
                return Err(err);
            }
        }
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response));
        match client.get_connection_manager_with_config(cfg).await {
            Ok(con) => Ok(Db::Managed(con)),
            Err(e) => Err(connect_error(redis, e).await),
        }
    }

    /// Builds the client the settings describe without connecting: the URL
    /// (or the cluster seeds) parses, the password file and the TLS files
    /// can be read, and TLS files come with a rediss:// address
    /// (`seatgate check-config`).
    pub fn check(redis: &RedisSettings) -> Result<(), Error> {
        if redis.is_cluster() && !redis.sentinel.nodes().is_empty() {
            return Err(Error::Config(
                "both redis.cluster_urls and redis.sentinel.urls are set: a Redis Cluster fails over by itself, so set one of them".to_owned(),
            ));
        }
        if redis.is_sentinel() {
            Failover::new(redis, None)?;
        } else if redis.is_cluster() {
            cluster_builder(redis)?.build()?;
        } else {
            redis_client(redis)?;
        }
        Ok(())
    }

    /// A dedicated connection for blocking reads of up to `block`.
    pub async fn connect_blocking(redis: &RedisSettings, block: Duration) -> Result<Db, Error> {
        let connect = Duration::from_millis(redis.connect_timeout_ms);
        if redis.is_cluster() {
            let client = cluster_builder(redis)?.build()?;
            let cfg = ClusterConfig::new()
                .set_connection_timeout(connect)
                .set_response_timeout(block + Duration::from_secs(10));
            return match client.get_async_connection_with_config(cfg).await {
                Ok(con) => Ok(Db::Cluster(con)),
                Err(e) => Err(connect_error(redis, e).await),
            };
        }
        if redis.is_sentinel() {
            return Db::sentinel(redis, None).await;
        }
        let client = redis_client(redis)?;
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(None);
        match client.get_multiplexed_async_connection_with_config(&cfg).await {
            Ok(con) => Ok(Db::Plain(con)),
            Err(e) => Err(connect_error(redis, e).await),
        }
    }

    /// A connection Redis tells at once of every write to a key under one
    /// of `prefixes`: client-side caching's broadcast mode (`CLIENT TRACKING
    /// ON BCAST PREFIX …`, over RESP3), each write arriving on the returned
    /// channel as an `invalidate` push naming the keys written, and a
    /// `Disconnection` push when the connection drops (tracking ends with
    /// it: connect again). The workers' doorbell: what tells an idle read
    /// loop that its stream has new entries, without reading them. One node
    /// only; `None` on a cluster, whose nodes would each need their own.
    pub async fn connect_tracking(
        redis: &RedisSettings,
        prefixes: &[&str],
    ) -> Result<Option<(Db, tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>)>, Error> {
        if redis.is_cluster() {
            return Ok(None);
        }
        let (info, tls) = if redis.is_sentinel() {
            // The master as the Sentinels name it now; when it fails over
            // the connection drops, and the caller connects again.
            let master = Failover::new(redis, None)?.master().await?;
            // Its address carries the TLS files already.
            (master.get_connection_info().clone(), None)
        } else {
            (connection_info(redis, &redis.url)?, redis.tls_certificates()?)
        };
        let login = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = node_client(info.set_redis_settings(login), tls)?;
        let (pushes, received) = tokio::sync::mpsc::unbounded_channel();
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(redis.connect_timeout_ms)))
            .set_response_timeout(Some(Duration::from_millis(redis.response_timeout_ms)))
            .set_push_sender(pushes);
        let mut con = match client.get_multiplexed_async_connection_with_config(&cfg).await {
            Ok(con) => con,
            Err(e) => return Err(connect_error(redis, e).await),
        };
        let mut tracking = redis::cmd("CLIENT");
        tracking.arg("TRACKING").arg("ON").arg("BCAST");
        for prefix in prefixes {
            tracking.arg("PREFIX").arg(*prefix);
        }
        tracking.query_async::<()>(&mut con).await?;
        Ok(Some((Db::Plain(con), received)))
    }

    /// The connection to the master `[redis.sentinel]` names, connected
    /// once to check the settings; `response` `None` for blocking reads.
    async fn sentinel(redis: &RedisSettings, response: Option<Duration>) -> Result<Db, Error> {
        let failover = Failover::new(redis, response)?;
        let mut db = Db::Sentinel(failover);
        redis::cmd("PING").query_async::<()>(&mut db).await?;
        Ok(db)
    }

    /// Runs `cmds` and returns each one's result, in order. On one node they
    /// go out as one pipeline (one round trip); on a cluster, where a
    /// pipeline may not span slots, they are sent concurrently, and the
    /// cluster connection batches them per master.
    pub async fn query_all(&mut self, cmds: Vec<Cmd>) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        if self.is_cluster() {
            let this = &*self;
            let results = futures_util::future::join_all(cmds.iter().map(|cmd| {
                let mut con = this.clone();
                async move { cmd.query_async::<Value>(&mut con).await }
            }))
            .await;
            return Ok(results);
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for cmd in cmds {
            pipe.add_command(cmd);
        }
        pipe.query_async(self).await
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Db::Cluster(_))
    }

    /// The nodes holding keys, for commands that walk one node's keyspace
    /// (SCAN): `[None]`, the one node, or on a cluster one entry per master,
    /// named by a slot it serves (CLUSTER SLOTS), so [`Db::on_node`] reaches
    /// it through the cluster connection, failovers followed.
    pub async fn key_nodes(&mut self) -> redis::RedisResult<Vec<Option<u16>>> {
        if !self.is_cluster() {
            return Ok(vec![None]);
        }
        let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(self).await?;
        let mut masters: Vec<(Value, u16)> = Vec::new();
        for range in ranges {
            let Value::Array(parts) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Array(master))) = (parts.first(), parts.get(2)) else {
                continue;
            };
            let address = Value::Array(master.iter().take(2).cloned().collect());
            if let (Ok(slot), false) = (u16::try_from(*start), masters.iter().any(|(a, _)| *a == address)) {
                masters.push((address, slot));
            }
        }
        Ok(masters.into_iter().map(|(_, slot)| Some(slot)).collect())
    }

    /// Runs `cmd` on `node`, one of [`Db::key_nodes`].
    pub async fn on_node(&mut self, node: Option<u16>, cmd: Cmd) -> redis::RedisResult<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match (self, node) {
            (Db::Cluster(c), Some(slot)) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                c.route_command(cmd, RoutingInfo::SingleNode(route)).await
            }
            (con, _) => cmd.query_async(con).await,
        }
    }
}

/// The client for one node as `redis` configures it: `redis.url` with the
/// configured login and, over TLS, the configured CA and client certificate.
fn redis_client(redis: &RedisSettings) -> Result<redis::Client, Error> {
    node_client(connection_info(redis, &redis.url)?, redis.tls_certificates()?)
}

/// `url` with the configured user and password (from the environment or a
/// file) in place of the URL's own, if any.
fn connection_info(redis: &RedisSettings, url: &str) -> Result<ConnectionInfo, Error> {
    let info = url.into_connection_info()?;
    let mut login = info.redis_settings().clone();
    if !redis.username.is_empty() {
        login = login.set_username(&redis.username);
    }
    if let Some(password) = redis.password()? {
        login = login.set_password(password.expose_secret());
    }
    Ok(info.set_redis_settings(login))
}

/// A redis-rs client for one node at `info` (its address, and the user and
/// password to log in with); with `tls` (a CA, a client certificate) when
/// given, which needs a rediss:// address. The login travels inside the TLS
/// connection like over a plain one.
pub fn node_client(
    info: impl IntoConnectionInfo,
    tls: Option<TlsCertificates>,
) -> Result<redis::Client, Error> {
    let info = info.into_connection_info()?;
    let over_tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    if over_tls {
        use_ring_for_tls();
    }
    match tls {
        None => Ok(redis::Client::open(info)?),
        Some(_) if !over_tls => Err(tls_files_need_rediss("redis.url")),
        Some(certs) => Ok(redis::Client::build_with_tls(info, certs)?),
    }
}

/// The cluster client's builder for the seed URLs, logging in as configured,
/// with the TLS files when set.
fn cluster_builder(redis: &RedisSettings) -> Result<ClusterClientBuilder, Error> {
    let nodes = redis.cluster_nodes();
    if nodes.iter().any(|u| is_tls_url(u)) {
        use_ring_for_tls();
    }
    let mut builder = ClusterClient::builder(nodes.clone());
    if !redis.username.is_empty() {
        builder = builder.username(&redis.username);
    }
    if let Some(password) = redis.password()? {
        builder = builder.password(password.expose_secret());
    }
    match redis.tls_certificates()? {
        None => Ok(builder),
        Some(_) if !nodes.iter().all(|u| is_tls_url(u)) => Err(tls_files_need_rediss("redis.cluster_urls")),
        Some(certs) => Ok(builder.certs(certs)),
    }
}

fn is_tls_url(url: &str) -> bool {
    url.trim_start().starts_with("rediss://")
}

fn tls_files_need_rediss(key: &str) -> Error {
    Error::Config(format!(
        "redis.tls_* files are set but {key} is not a rediss:// URL; use rediss:// for TLS, or unset the files"
    ))
}

/// Makes `ring` rustls's process-wide crypto provider, once, before the first
/// TLS client is built. rustls would pick it by itself from its crate features
/// while ring is the only one enabled; saying so here keeps TLS working if
/// another dependency ever enables aws-lc-rs too (rustls then refuses to
/// guess). A provider the embedding program installed first is kept.
//
// rustls 0.23.48 deprecates its ring provider (no post-quantum key
// exchange); ring stays the choice here for the build's sake (aws-lc-rs
// costs cmake and most of a minute on 2 cores), and a Redis connection's
// key exchange is what the server offers. Hence the `allow`.
#[allow(deprecated)]
fn use_ring_for_tls() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The connection error, with a hint when its cause is a likely mismatch of
/// TLS settings, so that one line tells a person what to change.
///
/// The cluster client reports a failed first connection as text only, so
/// there one seed is tried on its own (once, within the connect timeout), and
/// that error, which keeps its cause, gives the hint.
async fn connect_error(redis: &RedisSettings, e: redis::RedisError) -> Error {
    let url = match redis.cluster_nodes().first() {
        Some(seed) => seed.clone(),
        None => redis.url.clone(),
    };
    let tls = is_tls_url(&url);
    let mut hint = tls_hint(&e, tls);
    if hint.is_none() && redis.is_cluster() {
        let once = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(redis.connect_timeout_ms)))
            .set_response_timeout(Some(Duration::from_millis(redis.response_timeout_ms)));
        let seed = connection_info(redis, &url).and_then(|info| node_client(info, redis.tls_certificates()?));
        if let Ok(client) = seed {
            if let Err(seed_error) = client.get_multiplexed_async_connection_with_config(&once).await {
                hint = tls_hint(&seed_error, tls);
            }
        }
    }
    match hint {
        Some(hint) => Error::Connect { source: e, hint },
        None => Error::Redis(e),
    }
}

fn tls_hint(e: &redis::RedisError, tls: bool) -> Option<&'static str> {
    use rustls::{AlertDescription, CertificateError};
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    if !tls {
        // A TLS-only port drops a connection whose first bytes are not a TLS
        // handshake; a plain server would have answered, or refused the TCP
        // connection.
        let dropped = matches!(
            io_error(e)?.kind(),
            ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe
        );
        return dropped
            .then_some("the server closed the connection at once: is it TLS-only? use a rediss:// URL");
    }
    if e.is_timeout() {
        // A plain server reads a TLS ClientHello as the start of an inline
        // command and waits for its end, so the handshake hangs until the
        // connect timeout; so does an unreachable host, hence both questions.
        return Some("no answer in time: is Redis reachable, and does this port speak TLS? a plain port needs a redis:// URL");
    }
    match io_error(e)?.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => Some("the server's certificate is not signed by a trusted CA: set redis.tls_ca_file to the CA that signed it"),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => Some("the server's certificate does not name the host in the URL: connect by a name or IP it lists"),
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::HandshakeFailure,
        ) => Some("the server requires a client certificate it trusts: set redis.tls_cert_file and redis.tls_key_file"),
        rustls::Error::InvalidMessage(_) => {
            Some("the server does not speak TLS on this port: is it a plain port? use a redis:// URL")
        }
        _ => None,
    }
}

/// The I/O error under a redis-rs error, if it kept one (behind an `Arc`,
/// which is what its `source()` hands out). Under a failed TLS connection it
/// wraps what rustls reported through tokio-rustls.
fn io_error(e: &redis::RedisError) -> Option<&std::io::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let source = std::error::Error::source(e)?;
    match source.downcast_ref::<Shared>() {
        Some(shared) => shared.downcast_ref::<std::io::Error>(),
        None => source.downcast_ref::<std::io::Error>(),
    }
}

impl ConnectionLike for Db {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Db::Managed(c) => c.req_packed_command(cmd),
            Db::Plain(c) => c.req_packed_command(cmd),
            Db::Cluster(c) => c.req_packed_command(cmd),
            Db::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Db::Managed(c) => c.req_packed_commands(pipeline, offset, count),
            Db::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            Db::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Db::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Db::Managed(c) => c.get_db(),
            Db::Plain(c) => c.get_db(),
            Db::Cluster(c) => c.get_db(),
            Db::Sentinel(c) => c.get_db(),
        }
    }
}

/// Errors worth retrying: the connection, a timeout, or a server that is
/// loading, failing over or out of memory. Everything else is permanent.
pub fn is_transient(e: &redis::RedisError) -> bool {
    e.is_timeout()
        || !matches!(e.retry_method(), redis::RetryMethod::NoRetry)
        || matches!(
            e.code(),
            Some(
                "OOM"
                    | "BUSY"
                    | "LOADING"
                    | "READONLY"
                    | "MASTERDOWN"
                    | "TRYAGAIN"
                    | "CLUSTERDOWN"
                    | "NOREPLICAS"
            )
        )
}
