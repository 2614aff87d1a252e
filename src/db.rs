//! The connection to Redis, one node or a cluster: the same commands either way.
//!
//! Everything but the blocking reads goes through [`Db::connect`]: a managed,
//! multiplexed connection on one node (it reconnects by itself), or redis-rs's
//! async cluster connection, which routes each command to the master owning its
//! slot and follows MOVED/ASK and failovers. Blocking reads (`XREADGROUP BLOCK`,
//! `XREAD BLOCK`) get their own connection from [`Db::connect_blocking`], whose
//! response timeout is longer than any block: a timeout shorter than the block
//! would drop a reply the server still sends, leaving its entry pending unread.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisFuture, Value};
use secrecy::ExposeSecret;

use crate::config::RedisSettings;
use crate::error::Error;

/// A connection usable anywhere a redis-rs async connection is.
#[derive(Clone)]
pub enum Db {
    /// One node, reconnecting by itself (scripts, replies, acks).
    Managed(ConnectionManager),
    /// One node, plain multiplexed (blocking reads).
    Plain(MultiplexedConnection),
    /// Redis Cluster.
    Cluster(ClusterConnection),
}

impl Db {
    /// The shared connection for non-blocking commands.
    pub async fn connect(redis: &RedisSettings) -> Result<Db, Error> {
        let connect = Duration::from_millis(redis.connect_timeout_ms);
        let response = Duration::from_millis(redis.response_timeout_ms);
        if redis.is_cluster() {
            let client = cluster_client(redis)?
                .connection_timeout(connect)
                .response_timeout(response)
                .build()?;
            return Ok(Db::Cluster(client.get_async_connection().await?));
        }
        let client = redis::Client::open(connection_info(redis)?)?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response));
        Ok(Db::Managed(client.get_connection_manager_with_config(cfg).await?))
    }

    /// A dedicated connection for blocking reads of up to `block`.
    pub async fn connect_blocking(redis: &RedisSettings, block: Duration) -> Result<Db, Error> {
        let connect = Duration::from_millis(redis.connect_timeout_ms);
        if redis.is_cluster() {
            let client = cluster_client(redis)?.build()?;
            let cfg = ClusterConfig::new()
                .set_connection_timeout(connect)
                .set_response_timeout(block + Duration::from_secs(10));
            return Ok(Db::Cluster(client.get_async_connection_with_config(cfg).await?));
        }
        let client = redis::Client::open(connection_info(redis)?)?;
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(None);
        Ok(Db::Plain(
            client.get_multiplexed_async_connection_with_config(&cfg).await?,
        ))
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
}

/// `redis.url` with the configured user and password (from the environment
/// or a file) in place of the URL's own, if any.
fn connection_info(redis: &RedisSettings) -> Result<ConnectionInfo, Error> {
    let info = redis.url.as_str().into_connection_info()?;
    let mut login = info.redis_settings().clone();
    if !redis.username.is_empty() {
        login = login.set_username(&redis.username);
    }
    if let Some(password) = redis.password()? {
        login = login.set_password(password.expose_secret());
    }
    Ok(info.set_redis_settings(login))
}

/// A cluster client builder for the seed nodes, logging in as configured.
fn cluster_client(redis: &RedisSettings) -> Result<redis::cluster::ClusterClientBuilder, Error> {
    let mut builder = ClusterClient::builder(redis.cluster_nodes());
    if !redis.username.is_empty() {
        builder = builder.username(&redis.username);
    }
    if let Some(password) = redis.password()? {
        builder = builder.password(password.expose_secret());
    }
    Ok(builder)
}

impl ConnectionLike for Db {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Db::Managed(c) => c.req_packed_command(cmd),
            Db::Plain(c) => c.req_packed_command(cmd),
            Db::Cluster(c) => c.req_packed_command(cmd),
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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Db::Managed(c) => c.get_db(),
            Db::Plain(c) => c.get_db(),
            Db::Cluster(c) => c.get_db(),
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
