//! What every request handler shares: the deployment, Redis, who is who
//! (tokens, OIDC), one seatgate client per application, the events hub, the
//! borrow signer and the rate limits.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use seatgate_client::{Client, ClientBuilder, Topology};
use seatgate_core::db::{Db, RedisSettings};
use seatgate_core::keys::shard_name;
use tokio::sync::Mutex;

use crate::auth::{Authenticator, Caller};
use crate::borrow::BorrowSigner;
use crate::config::GatewaySettings;
use crate::events::EventHub;
use crate::problem::Problem;

/// The deployment the gateway serves, as the seatgate settings describe it.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// How to reach Redis (the gateway's own ACL user).
    pub redis: RedisSettings,
    /// The clients' template (`Settings::client`); the gateway sets each
    /// application's name on it.
    pub client: ClientBuilder,
    /// The streams (`stream.*`, `replies.prefix`).
    pub topology: Topology,
    /// `tenancy.shared_identity`.
    pub shared_identity: Vec<String>,
    /// `keys.prefix`.
    pub key_prefix: String,
    /// `events.stream` (unsharded).
    pub events_stream: String,
    /// How many ways the events stream is sharded (`events.shards`, or `stream.shards`).
    pub events_shards: usize,
}

impl Deployment {
    /// Whether requests of `app` go on an application stream of its own
    /// (so its sessions and users are kept as `<app>/<id>`).
    pub(crate) fn app_stream(&self, app: &str) -> bool {
        self.topology.applications.iter().any(|a| a == app)
    }

    /// The name the events give `session` of `app`.
    pub(crate) fn kept_session(&self, app: &str, session: &str) -> String {
        if self.app_stream(app) {
            format!("{app}/{session}")
        } else {
            session.to_owned()
        }
    }

    /// The name the events give `user` of `app`.
    pub(crate) fn kept_user(&self, app: &str, user: &str) -> String {
        if self.app_stream(app) && !self.shared_identity.iter().any(|a| a == app) {
            format!("{app}/{user}")
        } else {
            user.to_owned()
        }
    }

    /// The events stream (shard) of `license`.
    pub(crate) fn events_stream_for(&self, license: &str) -> String {
        shard_name(&self.events_stream, self.events_shards, license)
    }

    /// Whether a credential of `app` may be served: with application
    /// streams, only one of them (else its requests would land on the
    /// shared stream, whose identities are taken as sent).
    pub(crate) fn serves(&self, app: &str) -> bool {
        self.topology.applications.is_empty() || self.app_stream(app)
    }
}

/// One seatgate client per application, made when first needed.
pub(crate) struct Clients {
    template: ClientBuilder,
    clients: Mutex<HashMap<String, Client>>,
}

impl Clients {
    pub(crate) fn new(template: ClientBuilder) -> Clients {
        Clients {
            template,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The client of `app`.
    pub(crate) async fn of(&self, app: &str) -> Result<Client, seatgate_client::Error> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(app) {
            return Ok(c.clone());
        }
        let client = self.template.clone().application(app).connect().await?;
        clients.insert(app.to_owned(), client.clone());
        Ok(client)
    }

    /// Every client made, to close at shutdown.
    pub(crate) async fn take(&self) -> Vec<Client> {
        self.clients.lock().await.drain().map(|(_, c)| c).collect()
    }
}

/// Request rates: per credential (GCRA, governor), and failed
/// authentications per client address in fixed one-minute windows.
pub(crate) struct Limits {
    per_credential: Option<DefaultKeyedRateLimiter<String>>,
    failures_per_minute: u32,
    failures: std::sync::Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// Most client addresses whose failures are remembered at once.
const FAILURE_ADDRESSES_MAX: usize = 100_000;
const MINUTE: Duration = Duration::from_secs(60);

impl Limits {
    pub(crate) fn new(settings: &GatewaySettings) -> Limits {
        let per_credential = NonZeroU32::new(settings.rate_per_second).map(|rate| {
            let burst = NonZeroU32::new(settings.rate_burst).unwrap_or(rate);
            RateLimiter::keyed(Quota::per_second(rate).allow_burst(burst))
        });
        Limits {
            per_credential,
            failures_per_minute: settings.auth_failures_per_minute,
            failures: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Counts a request of `caller`; a 429 past its rate.
    pub(crate) fn check(&self, caller: &Caller) -> Result<(), Problem> {
        let Some(limiter) = &self.per_credential else {
            return Ok(());
        };
        limiter.check_key(&caller.credential).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            Problem::rate_limited(
                "too many requests with this credential (gateway.rate_per_second): slow down and retry after Retry-After seconds",
                wait.as_secs_f64().ceil() as u64,
            )
        })
    }

    /// Whether `addr` may try to authenticate now: `Err(seconds to wait)`
    /// once it failed `gateway.auth_failures_per_minute` times this minute.
    pub(crate) fn may_try(&self, addr: IpAddr) -> Result<(), u64> {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        match failures.get(&addr) {
            Some((since, n)) if *n >= self.failures_per_minute && since.elapsed() < MINUTE => {
                Err(MINUTE.saturating_sub(since.elapsed()).as_secs().max(1))
            }
            _ => Ok(()),
        }
    }

    /// Counts a failed authentication from `addr`.
    pub(crate) fn failed(&self, addr: IpAddr) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() >= FAILURE_ADDRESSES_MAX {
            failures.retain(|_, (since, _)| since.elapsed() < MINUTE);
            if failures.len() >= FAILURE_ADDRESSES_MAX {
                failures.clear();
            }
        }
        let entry = failures.entry(addr).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= MINUTE {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }
}

/// Shared by every handler.
pub(crate) struct Gateway {
    pub(crate) settings: GatewaySettings,
    pub(crate) deployment: Deployment,
    pub(crate) db: Db,
    pub(crate) auth: Authenticator,
    pub(crate) clients: Clients,
    pub(crate) hub: Arc<EventHub>,
    pub(crate) signer: Option<BorrowSigner>,
    pub(crate) limits: Limits,
    /// The deployment's gateway secret, from which a request with an
    /// `Idempotency-Key` gets the same session and lease every time.
    pub(crate) secret: [u8; 32],
}

impl Gateway {
    pub(crate) fn reply_timeout(&self) -> Duration {
        Duration::from_millis(self.settings.reply_timeout_ms)
    }
}
