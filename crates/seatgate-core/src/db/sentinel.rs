//! The master behind Redis Sentinel: asked of the Sentinels, connected to,
//! and asked again when it stops being the master.
//!
//! redis-rs's Sentinel client finds the master (it asks the Sentinels in
//! turn, and checks with `ROLE` that the node named is a master) but has no
//! connection that follows a failover. [`Failover`] is that connection: one
//! multiplexed connection to the master, shared by every clone, replaced
//! when a command fails in a way that says the master is gone or is no
//! longer the master (the connection dropped or timed out; `READONLY`,
//! `MASTERDOWN`, `LOADING`). The failing command's error goes back to its
//! caller, as a dropped connection's does on one node: the worker retries
//! the entry (its effect once, lua/includes/dedupe.lua), a client its
//! request. The next command asks the Sentinels again, so a promoted
//! replica is found as soon as a Sentinel names it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisResult, Value,
};
use secrecy::ExposeSecret;

use super::RedisSettings;
use crate::error::Error;

/// A connection to the master Sentinel names, following failovers. Clones
/// share the connection.
#[derive(Clone)]
pub struct Failover {
    inner: Arc<Inner>,
}

struct Inner {
    /// Who to ask, and how to log in to the master they name.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The connection in use and its generation: a failure forgets it only
    /// if no newer one replaced it meanwhile.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// The next connection's generation.
    generations: AtomicU64,
    /// Timeouts of the connection to the master.
    config: AsyncConnectionConfig,
    /// How long asking the Sentinels (and the `ROLE` check) may take.
    lookup_timeout: Duration,
}

impl Failover {
    /// The connection the settings describe, not yet connected: the first
    /// command asks the Sentinels. `response_timeout` of `None` is for
    /// blocking reads.
    pub fn new(redis: &RedisSettings, response_timeout: Option<Duration>) -> Result<Failover, Error> {
        let connect = Duration::from_millis(redis.connect_timeout_ms);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(response_timeout);
        Ok(Failover {
            inner: Arc::new(Inner {
                sentinels: tokio::sync::Mutex::new(sentinel_client(redis)?),
                current: Mutex::new(None),
                generations: AtomicU64::new(0),
                config,
                lookup_timeout: connect * 2 + Duration::from_millis(redis.response_timeout_ms),
            }),
        })
    }

    /// The master's client (its address and login), as the Sentinels name
    /// it now: for a connection the caller keeps (the doorbell's), which it
    /// makes again when it breaks, and so finds a new master.
    pub async fn master(&self) -> RedisResult<redis::Client> {
        let mut sentinels = self.inner.sentinels.lock().await;
        self.find_master(&mut sentinels).await
    }

    async fn find_master(&self, sentinels: &mut SentinelClient) -> RedisResult<redis::Client> {
        match tokio::time::timeout(self.inner.lookup_timeout, sentinels.async_get_client()).await {
            Ok(found) => found,
            Err(_) => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no Sentinel named a reachable master in time",
            ))),
        }
    }

    /// The shared connection, connecting first if there is none.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        // One lookup at a time: callers arriving meanwhile wait on the
        // Sentinel client's lock, then find the new connection.
        let mut sentinels = self.inner.sentinels.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let con = self
            .find_master(&mut sentinels)
            .await?
            .get_multiplexed_async_connection_with_config(&self.inner.config)
            .await?;
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed);
        *self.inner.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation, con.clone()));
        Ok((generation, con))
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets connection `generation` after `e`, if `e` says the master is
    /// gone or no longer the master.
    fn after_error(&self, generation: u64, e: &RedisError) {
        if !master_lost(e) {
            return;
        }
        let mut slot = self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }
}

/// Whether `e` means the connection's node is gone or no longer the
/// master, so the Sentinels must be asked again.
fn master_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

impl ConnectionLike for Failover {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut con) = self.connection().await?;
            let result = con.req_packed_command(cmd).await;
            if let Err(e) = &result {
                self.after_error(generation, e);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut con) = self.connection().await?;
            let result = con.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &result {
                self.after_error(generation, e);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// redis-rs's Sentinel client for `[redis.sentinel]`: the Sentinels with
/// their login, the master's name, and the master's login and TLS from
/// `[redis]`. rediss:// Sentinel URLs mean TLS to the Sentinels and to the
/// master alike.
fn sentinel_client(redis: &RedisSettings) -> Result<SentinelClient, Error> {
    let sentinel = &redis.sentinel;
    let master_name = sentinel.master_name.trim();
    if master_name.is_empty() {
        return Err(Error::Config(
            "redis.sentinel.urls is set but redis.sentinel.master_name is empty: name the master the Sentinels monitor".to_owned(),
        ));
    }
    let nodes = sentinel.nodes();
    let mut addrs = Vec::with_capacity(nodes.len());
    let mut url_login = None;
    for url in &nodes {
        let info = url
            .as_str()
            .into_connection_info()
            .map_err(|e| Error::Config(format!("redis.sentinel.urls: {url:?} is not a Redis URL: {e}")))?;
        url_login.get_or_insert_with(|| info.redis_settings().clone());
        addrs.push(info.addr().clone());
    }
    let tls: Vec<bool> = nodes.iter().map(|u| super::is_tls_url(u)).collect();
    if tls.iter().any(|t| *t) && !tls.iter().all(|t| *t) {
        return Err(Error::Config(
            "redis.sentinel.urls mixes redis:// and rediss://: the Sentinels are reached all over TLS or none".to_owned(),
        ));
    }
    let over_tls = tls.first().copied().unwrap_or(false);
    let mut builder = SentinelClientBuilder::new(addrs, master_name, SentinelServerType::Master)?;
    if !redis.username.is_empty() {
        builder = builder.set_client_to_redis_username(&redis.username);
    }
    if let Some(password) = redis.password()? {
        builder = builder.set_client_to_redis_password(password.expose_secret());
    }
    let sentinel_user = match sentinel.username.as_str() {
        "" => url_login.as_ref().and_then(|l| l.username().map(str::to_owned)),
        user => Some(user.to_owned()),
    };
    if let Some(user) = sentinel_user {
        builder = builder.set_client_to_sentinel_username(user);
    }
    let sentinel_password = match sentinel.password()? {
        Some(p) => Some(p.expose_secret().to_owned()),
        None => url_login.as_ref().and_then(|l| l.password().map(str::to_owned)),
    };
    if let Some(password) = sentinel_password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    match redis.tls_certificates()? {
        Some(_) if !over_tls => return Err(super::tls_files_need_rediss("redis.sentinel.urls")),
        Some(certs) => {
            super::use_ring_for_tls();
            builder = builder
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
        None if over_tls => {
            super::use_ring_for_tls();
            builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        }
        None => {}
    }
    Ok(builder.build()?)
}
