//! Typed settings, loaded in layers and validated at startup.
//!
//! config/default.toml is compiled in and documents every key; a `--config`
//! file and `SEATGATE__SECTION__KEY` environment variables override it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::error::Error;
use seatgate_client::{Client, ClientBuilder};
pub use seatgate_core::db::RedisSettings;
use seatgate_core::keys::{shard_name, shard_names, Keys, Topology};

/// The defaults, also the documentation of every key.
pub const DEFAULT_TOML: &str = include_str!("../../../config/default.toml");

/// The smallest `limits.max_entry_bytes`: a request with every field at its
/// longest but `meta` still fits (ids, `reply_to`, `lease`, names).
const MIN_ENTRY_BYTES: usize = 1024;

/// All settings of one seatgate process.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// How to reach Redis.
    pub redis: RedisSettings,
    /// Key namespace.
    pub keys: KeySettings,
    /// The requests stream and this process's place in its consumer group.
    pub stream: StreamSettings,
    /// How replies are written.
    pub replies: ReplySettings,
    /// Redelivery dedupe.
    pub dedupe: DedupeSettings,
    /// Requests that expire.
    pub requests: RequestSettings,
    /// Rate limits.
    pub limits: LimitSettings,
    /// What each application may use of a license, and who speaks for
    /// shared identities.
    pub tenancy: TenancySettings,
    /// The events stream.
    pub events: EventSettings,
    /// Session liveness.
    pub sessions: SessionSettings,
    /// Wait queues.
    pub queue: QueueSettings,
    /// Administrators' revocations.
    pub revoke: RevokeSettings,
    /// The scheduled reaper.
    pub reaper: ReaperSettings,
    /// The HTTP endpoint for Prometheus and health checks.
    pub metrics: MetricsSettings,
    /// The status page: on or off, where, for which Host names, what it shows.
    pub http: HttpSettings,
    /// Graceful shutdown.
    pub shutdown: ShutdownSettings,
    /// The caller's side: `seatgate acquire/release/heartbeat` and the Rust client.
    pub client: ClientSettings,
    /// Log output.
    pub log: LogSettings,
    /// Usage reports' daily rollups.
    pub report: ReportSettings,
    /// `seatgate gateway`: the HTTPS front door.
    pub gateway: seatgate_gateway::GatewaySettings,
}

/// `[keys]`
#[derive(Debug, Clone, Deserialize)]
pub struct KeySettings {
    /// Namespace prefix of every key.
    pub prefix: String,
}

/// `[stream]`
#[derive(Debug, Clone, Deserialize)]
pub struct StreamSettings {
    /// Requests stream key.
    pub requests: String,
    /// The admin stream: `op=revoke` only, read by the same workers and
    /// group, one stream however many shards the requests stream has. Its
    /// own key so that an ACL can let administrators write it and no service.
    pub admin_requests: String,
    /// Consumer group name.
    pub group: String,
    /// Consumer name; empty means hostname-pid.
    pub consumer: String,
    /// Shards of the requests (and events) stream; 1 = one unsharded stream.
    pub shards: usize,
    /// Applications with a requests stream of their own,
    /// `<requests>:app:<application>` (sharded like the requests stream), so
    /// that an ACL user may write its application's requests and no other's.
    /// Workers read every one; a client whose `client.name` is listed sends
    /// there. Empty = one requests stream shared by every client.
    #[serde(default)]
    pub applications: Vec<String>,
    /// XREADGROUP COUNT.
    pub batch_size: usize,
    /// Batches decided concurrently.
    pub max_in_flight: usize,
    /// The longest one read waits for new requests, ms.
    pub block_ms: u64,
    /// The longest a read with nothing new waits before looking again, ms.
    pub poll_ms: u64,
    /// XAUTOCLAIM min idle time, ms.
    pub claim_idle_ms: u64,
    /// Deliveries before dead-lettering.
    pub max_deliveries: u64,
    /// Dead-letter stream key.
    pub dead_letter: String,
    /// Approximate cap of the dead-letter stream.
    pub dead_letter_maxlen: usize,
    /// Most bytes of an entry's field names and values a dead letter keeps
    /// (its first ones; `dead_bytes` records the whole entry's size), so the
    /// dead-letter stream holds at most about `dead_letter_maxlen` times this.
    pub dead_letter_max_bytes: usize,
    /// Idle time after which an empty consumer is removed, ms.
    pub consumer_idle_ms: u64,
}

/// `[dedupe]`
#[derive(Debug, Clone, Deserialize)]
pub struct DedupeSettings {
    /// Guaranteed dedupe window, ms.
    pub window_ms: u64,
}

/// `[requests]`
#[derive(Debug, Clone, Deserialize)]
pub struct RequestSettings {
    /// The `ttl_ms` of a request that carries none, ms (0 = such requests
    /// never expire).
    pub default_ttl_ms: u64,
    /// The most a request's `ttl_ms` counts for, ms: at most
    /// `dedupe.window_ms`, so that no request is decided twice.
    pub max_ttl_ms: u64,
}

/// `[limits]`
#[derive(Debug, Clone, Deserialize)]
pub struct LimitSettings {
    /// Per-session requests per window (0 = off).
    pub session_requests: u64,
    /// Per-license requests per window (0 = off).
    pub license_requests: u64,
    /// Window, ms.
    pub window_ms: u64,
    /// Most bytes of field names and values in one request entry: a bigger
    /// one is refused before any of it is parsed.
    pub max_entry_bytes: usize,
    /// Invalid requests per application (reply namespace) per `window_ms`
    /// that may create a reply stream (0 = no limit). Past it an invalid
    /// request is answered only on a reply stream that exists already, and
    /// dead-lettered otherwise: a flood of invalid requests, each with a
    /// `reply_to` of its own, cannot fill Redis with reply streams.
    pub invalid_requests: u64,
}

/// `[tenancy]`: applications (`stream.applications`) sharing licenses.
/// Each request of an application's own stream is that application's
/// (`seatgate_core::tenancy`); these bound what one application may use of
/// one license, so that it cannot starve the others.
#[derive(Debug, Clone, Deserialize)]
pub struct TenancySettings {
    /// Applications trusted to speak for users and groups every
    /// application shares (the HTTPS gateway, a directory service): their
    /// requests' `user` and `group` are kept as sent, so they count with
    /// every other such application's; every other application's are its own.
    #[serde(default)]
    pub shared_identity: Vec<String>,
    /// Requests one application may send about one license per
    /// `limits.window_ms` (0 = no limit).
    pub application_requests: u64,
    /// Seats one application may hold of one license (0 = no limit).
    pub application_sessions: u64,
    /// Sessions one application may have waiting for one license (0 = no limit).
    pub application_waiters: u64,
}

/// `[replies]`
#[derive(Debug, Clone, Deserialize)]
pub struct ReplySettings {
    /// The namespace every `reply_to` must lie in, so that a request can never
    /// make a worker write, trim or expire another application's key, and one
    /// ACL key pattern per application covers its replies.
    pub prefix: String,
    /// How long a reply stays readable at least, ms: reply streams are trimmed
    /// by age, never by count, and expire after their last reply.
    pub ttl_ms: u64,
    /// No longer used (reply streams were capped by count); still accepted so
    /// that an old settings file loads, with a warning.
    #[serde(default)]
    pub maxlen: Option<usize>,
}

impl ReplySettings {
    /// The idle expiry a reply stream gets when a reply is written to it,
    /// ms: the ttl plus half of it. The worker's fast path writes without
    /// touching the expiry for at most a quarter ttl after setting it, so
    /// each reply still has more than a ttl to live (runtime::publish).
    pub fn expiry_ms(&self) -> u64 {
        self.ttl_ms.saturating_add(self.ttl_ms / 2)
    }
}

fn default_denials_window_ms() -> u64 {
    60_000
}

fn default_denials_per_window() -> u64 {
    100
}

/// `[client]`
#[derive(Debug, Clone, Deserialize)]
pub struct ClientSettings {
    /// The application's name, part of its reply streams' names
    /// (`<replies.prefix><name>:<unique>`), so that an ACL can give each
    /// application its own replies and nobody else's.
    pub name: String,
    /// Most requests one client has sent and not yet had answered; past it
    /// callers wait for a slot, so a burst cannot pile up without bound in
    /// the requests stream and the client's waiter table.
    pub max_in_flight: usize,
    /// The `ttl_ms` the CLI's requests and a seat handle's carry: past it
    /// the service answers REQUEST_EXPIRED and changes nothing, which is
    /// what makes re-sending a timed-out request under a new id safe.
    /// At most the reply timeout the caller waits, so that a request
    /// given up on can no longer be decided after it was sent again.
    pub ttl_ms: u64,
}

/// `[events]`
#[derive(Debug, Clone, Deserialize)]
pub struct EventSettings {
    /// Events stream key.
    pub stream: String,
    /// How long events are kept at least (`"30d"`): the stream is trimmed by
    /// age on the Redis clock, so usage reports can cover a fixed period
    /// whatever the event rate.
    #[serde(deserialize_with = "duration_text")]
    pub retention: Duration,
    /// No longer used (the events stream was capped by count); still
    /// accepted so that an old settings file loads, with a warning.
    #[serde(default)]
    pub maxlen: Option<usize>,
    /// The denial window, ms: per license and window, the first
    /// `denials_per_window` denials are recorded as `denied` events, the
    /// rest counted into the next one's `folded` (lua/includes/denial_sample.lua).
    #[serde(default = "default_denials_window_ms")]
    pub denials_window_ms: u64,
    /// Denials per license and window recorded one by one (0 = every one).
    #[serde(default = "default_denials_per_window")]
    pub denials_per_window: u64,
    /// Shards of the events stream; 0 = as many as the requests stream
    /// (`stream.shards`). Set to the old count while `stream.shards` grows
    /// online, so that every license's events stay where they were
    /// (docs/running.md, "Changing the topology").
    #[serde(default)]
    pub shards: usize,
}

/// A duration written for people, like `"30d"` or `"12h 30m"` (humantime).
fn duration_text<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(de)?;
    humantime::parse_duration(&text).map_err(|e| {
        serde::de::Error::custom(format!("{text:?} is not a duration like \"30d\" or \"12h\": {e}"))
    })
}

/// `[sessions]`
#[derive(Debug, Clone, Deserialize)]
pub struct SessionSettings {
    /// Default heartbeat timeout, ms.
    pub heartbeat_timeout_ms: u64,
    /// Every acquire, heartbeat and release must carry a `lease`, so that
    /// every seat is bound to its holder's secret (recommended in production).
    pub require_lease: bool,
}

/// `[queue]`
#[derive(Debug, Clone, Deserialize)]
pub struct QueueSettings {
    /// Default most waiters per license.
    pub max_length: u64,
    /// The longest an acquire may wait in a queue, ms: a larger `wait_ms`
    /// counts as this, so no waiter holds a place (and its memory) longer.
    pub max_wait_ms: u64,
    /// How long a session granted a seat from the queue has to claim it
    /// with a heartbeat before the seat goes to the next waiter, ms (0 = no
    /// claim window).
    pub claim_ms: u64,
}

/// `[revoke]`
#[derive(Debug, Clone, Deserialize)]
pub struct RevokeSettings {
    /// How long a revocation is remembered at least, ms: that long the
    /// revoked session's heartbeat and release hear SESSION_REVOKED (longer
    /// when its cooldown is longer).
    pub remember_ms: u64,
    /// Most revocations remembered per license: bounds the memory whatever
    /// an administrator's script does.
    pub max_per_license: u64,
}

/// `[report]`
#[derive(Debug, Clone, Deserialize)]
pub struct ReportSettings {
    /// How long each license's daily rollups (`seatgate report`'s figures
    /// per UTC day) are kept (`"400d"`): longer than `events.retention`, so a
    /// yearly report needs no raw events.
    #[serde(deserialize_with = "duration_text")]
    pub rollup_retention: Duration,
}

/// `[reaper]`
#[derive(Debug, Clone, Deserialize)]
pub struct ReaperSettings {
    /// Whether this process reaps.
    pub enabled: bool,
    /// 6-field cron expression.
    pub schedule: String,
    /// Most removals per script call.
    pub batch: usize,
    /// Licenses reaped concurrently.
    pub concurrency: usize,
    /// Pass lock lifetime, ms.
    pub lock_ms: u64,
    /// Outbox redelivery age, ms.
    pub redeliver_after_ms: u64,
    /// Licenses of the license index the repair sweep (and the seat census)
    /// looks at per pass, and a tenth of the keys of the keyspace it scans
    /// for licenses written as their hash alone: the bound on what a pass
    /// spends on finding licenses the due index lacks.
    pub sweep: usize,
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize)]
pub struct MetricsSettings {
    /// Listen address; empty disables the endpoint.
    pub listen: String,
    /// Most per-license series.
    pub license_series_limit: usize,
}

/// `[http]`: the status page.
#[derive(Debug, Clone, Deserialize)]
pub struct HttpSettings {
    /// Whether the page is served at all.
    pub page: bool,
    /// A listener of the page's own; empty = on `metrics.listen`.
    pub page_listen: String,
    /// Host header values answered besides the loopback names and the
    /// listen address (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Whether user, hardware and session ids reach the page.
    pub page_personal: bool,
    /// One Redis read per this many ms, shared by every viewer.
    pub page_refresh_ms: u64,
}

/// Where the status page is served, as [`Settings::page_at`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageAt {
    /// Off (`http.page = false`, or no listener to share).
    Off,
    /// On the metrics listener.
    Metrics,
    /// On a listener of its own.
    Own(SocketAddr),
}

/// `[shutdown]`
#[derive(Debug, Clone, Deserialize)]
pub struct ShutdownSettings {
    /// Bound on draining in-flight work, ms.
    pub grace_ms: u64,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize)]
pub struct LogSettings {
    /// Line format of the logs on stderr.
    pub format: LogFormat,
    /// Most log lines per minute of one kind that a client can repeat at
    /// will (dead letters, invalid requests, unwritable replies); past it
    /// they are counted, and one line reports how many were held back
    /// (0 = no limit).
    pub repeats_per_minute: u32,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

impl Settings {
    /// Loads defaults, then `file` (if any), then `SEATGATE__*` variables, and validates.
    pub fn load(file: Option<&Path>) -> Result<Settings, Error> {
        let mut builder = config::Config::builder()
            .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml));
        if let Some(path) = file {
            if !path.exists() {
                return Err(Error::Config(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("SEATGATE")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("redis.cluster_urls")
                .with_list_parse_key("redis.sentinel.urls")
                .with_list_parse_key("stream.applications")
                .with_list_parse_key("tenancy.shared_identity")
                .with_list_parse_key("http.allowed_hosts")
                .with_list_parse_key("gateway.allowed_hosts")
                .with_list_parse_key("gateway.cors_allowed_origins")
                .with_list_parse_key("gateway.borrow.previous_key_files"),
        );
        let mut settings: Settings = builder.build().and_then(|c| c.try_deserialize())?;
        // Parsing the environment turns "0012" into the number 12: credentials
        // are taken verbatim instead.
        if let Some(raw) = std::env::var_os("SEATGATE__REDIS__PASSWORD") {
            let raw = raw
                .into_string()
                .map_err(|_| Error::Config("SEATGATE__REDIS__PASSWORD is not UTF-8".into()))?;
            settings.redis.password = SecretString::from(raw);
        }
        if let Some(raw) = std::env::var_os("SEATGATE__REDIS__USERNAME") {
            settings.redis.username = raw
                .into_string()
                .map_err(|_| Error::Config("SEATGATE__REDIS__USERNAME is not UTF-8".into()))?;
        }
        settings.validate()?;
        if settings.replies.maxlen.is_some() {
            tracing::warn!("replies.maxlen is no longer used: reply streams are trimmed by age (replies.ttl_ms); remove it from your settings");
        }
        if settings.events.maxlen.is_some() {
            tracing::warn!("events.maxlen is no longer used: the events stream is trimmed by age (events.retention); remove it from your settings");
        }
        Ok(settings)
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |msg: &str| Err(Error::Config(msg.to_owned()));
        self.gateway.validate().map_err(Error::Config)?;
        if self.stream.poll_ms == 0 || self.stream.poll_ms > 1_000 {
            return bad("stream.poll_ms must be between 1 and 1000");
        }
        if self.stream.batch_size == 0 || self.stream.batch_size > 10_000 {
            return bad("stream.batch_size must be between 1 and 10000");
        }
        if self.stream.requests.is_empty() || self.stream.group.is_empty() {
            return bad("stream.requests and stream.group must not be empty");
        }
        if self.keys.prefix.is_empty() || self.keys.prefix.contains(['{', '}']) {
            return bad("keys.prefix must be non-empty and contain no braces");
        }
        if self.replies.ttl_ms == 0 {
            return bad("replies.ttl_ms must be positive");
        }
        if self.events.retention < Duration::from_secs(60) {
            return bad("events.retention must be at least 1m (usage reports read the events it keeps)");
        }
        if self.report.rollup_retention < Duration::from_secs(24 * 3600) {
            return bad("report.rollup_retention must be at least 1d (a rollup holds a day)");
        }
        if self.events.denials_window_ms == 0 {
            return bad("events.denials_window_ms must be positive");
        }
        let inside = format!("{}:", self.keys.prefix);
        let reply_prefix = &self.replies.prefix;
        if reply_prefix.len() <= inside.len() || !reply_prefix.starts_with(&inside) {
            return Err(Error::Config(format!(
                "replies.prefix must start with keys.prefix and a colon and go on (like \"{inside}reply:\"), so that one ACL pattern covers every seatgate key"
            )));
        }
        if reply_prefix.contains(['{', '}', '*', '?', '[', ']', '\\'])
            || !reply_prefix.bytes().all(|b| b.is_ascii_graphic())
        {
            return bad(
                "replies.prefix must be printable ASCII without braces or glob characters (* ? [ ] \\)",
            );
        }
        let keys = Keys::new(self.keys.prefix.clone());
        let mut own: Vec<(&str, String)> = self
            .request_streams()
            .into_iter()
            .map(|k| ("stream.requests", k))
            .collect();
        own.push(("stream.admin_requests", self.stream.admin_requests.clone()));
        own.push(("stream.dead_letter", self.stream.dead_letter.clone()));
        own.extend(self.events_streams().into_iter().map(|k| ("events.stream", k)));
        own.push(("keys.prefix", keys.license_index()));
        own.push(("keys.prefix", keys.reaper_lock()));
        own.push(("keys.prefix", keys.deployment()));
        for i in 0..self.stream.shards {
            let shard = keys.due_index(i);
            own.extend([("keys.prefix", shard.stale), ("keys.prefix", shard.due)]);
        }
        // Each stream is read (or written) for one purpose only: a revoke on a
        // requests shard would be refused, a request on the admin stream too.
        for (i, (name, key)) in own.iter().enumerate() {
            if let Some((other, _)) = own[..i].iter().find(|(_, k)| k == key) {
                if other != name {
                    return Err(Error::Config(format!(
                        "{name} and {other} must be different streams ({key})"
                    )));
                }
            }
        }
        for (name, key) in &own {
            if !key.starts_with(&inside) {
                return Err(Error::Config(format!(
                    "{name} must start with keys.prefix and a colon (like \"{inside}...\")"
                )));
            }
            if key.starts_with(reply_prefix.as_str()) {
                return Err(Error::Config(format!(
                    "{name} ({key}) must not lie inside replies.prefix ({reply_prefix}), so that no reply_to can name it"
                )));
            }
        }
        if !seatgate_core::tenancy::valid_application(&self.client.name) {
            return bad("client.name must be 1 to 64 characters of A-Z a-z 0-9 . _ -");
        }
        for (i, app) in self.stream.applications.iter().enumerate() {
            if !seatgate_core::tenancy::valid_application(app) {
                return Err(Error::Config(format!(
                    "stream.applications: {app:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ -"
                )));
            }
            if app == seatgate_client::ADMIN_CLIENT_NAME {
                return Err(Error::Config(format!(
                    "stream.applications may not name {app:?}: {}{app}:* holds the admin tools' replies",
                    self.replies.prefix
                )));
            }
            if self.stream.applications[..i].contains(app) {
                return Err(Error::Config(format!("stream.applications names {app:?} twice")));
            }
        }
        for app in &self.tenancy.shared_identity {
            if !self.stream.applications.contains(app) {
                return Err(Error::Config(format!(
                    "tenancy.shared_identity names {app:?}, which is not one of stream.applications"
                )));
            }
        }
        if self.client.max_in_flight == 0 {
            return bad("client.max_in_flight must be at least 1");
        }
        if self.client.ttl_ms == 0 {
            return bad("client.ttl_ms must be positive");
        }
        if self.dedupe.window_ms == 0 || self.limits.window_ms == 0 || self.stream.claim_idle_ms == 0 {
            return bad("dedupe.window_ms, limits.window_ms and stream.claim_idle_ms must be positive");
        }
        let r = &self.requests;
        if r.max_ttl_ms == 0 || r.default_ttl_ms > r.max_ttl_ms || r.max_ttl_ms > self.dedupe.window_ms {
            return Err(Error::Config(format!(
                "requests.max_ttl_ms ({}) must be at least 1 and requests.default_ttl_ms ({}), and at most \
                 dedupe.window_ms ({}): a request may live no longer than its dedupe record",
                r.max_ttl_ms, r.default_ttl_ms, self.dedupe.window_ms
            )));
        }
        if self.stream.shards == 0 || self.stream.shards > 1024 {
            return bad("stream.shards must be between 1 and 1024");
        }
        if self.events.shards > 1024 {
            return bad("events.shards must be between 0 (as stream.shards) and 1024");
        }
        if self.stream.max_in_flight == 0 {
            return bad("stream.max_in_flight must be at least 1");
        }
        if self.stream.max_deliveries == 0 {
            return bad("stream.max_deliveries must be at least 1");
        }
        if self.stream.dead_letter_max_bytes < 256 {
            return bad("stream.dead_letter_max_bytes must be at least 256");
        }
        if self.queue.max_wait_ms == 0 || self.queue.max_wait_ms > seatgate_core::protocol::MAX_WAIT_MS {
            return bad("queue.max_wait_ms must be between 1 and 86400000 (one day)");
        }
        if self.queue.claim_ms != 0 && self.queue.claim_ms < 1000 {
            return bad("queue.claim_ms must be 0 (no claim window) or at least 1000 (a second)");
        }
        if self.revoke.remember_ms == 0 || self.revoke.max_per_license == 0 {
            return bad("revoke.remember_ms and revoke.max_per_license must be positive");
        }
        if self.sessions.heartbeat_timeout_ms == 0 {
            return bad("sessions.heartbeat_timeout_ms must be positive");
        }
        if self.limits.max_entry_bytes < MIN_ENTRY_BYTES {
            return Err(Error::Config(format!(
                "limits.max_entry_bytes must be at least {MIN_ENTRY_BYTES}, room for a full request"
            )));
        }
        if self.reaper.batch == 0
            || self.reaper.concurrency == 0
            || self.reaper.lock_ms == 0
            || self.reaper.sweep == 0
        {
            return bad("reaper.batch, reaper.concurrency, reaper.lock_ms and reaper.sweep must be positive");
        }
        if self.reaper.schedule.split_whitespace().count() < 6 {
            return bad("reaper.schedule needs a seconds field: 6 fields, e.g. \"*/5 * * * * *\"");
        }
        self.metrics_addr()?;
        self.page_at()?;
        if self.http.page_refresh_ms < 100 {
            return bad("http.page_refresh_ms must be at least 100");
        }
        if let Some(host) = self
            .http
            .allowed_hosts
            .iter()
            .find(|h| h.is_empty() || h.chars().any(|c| c.is_whitespace() || c == '/' || c == '@'))
        {
            return Err(Error::Config(format!(
                "http.allowed_hosts {host:?} is not a host name or host:port"
            )));
        }
        self.redis.tls_certificates()?;
        Ok(())
    }

    /// Where this deployment's requests go and its replies come back
    /// (`stream.requests`, `stream.shards`, `stream.applications`,
    /// `stream.admin_requests`, `replies.prefix`); the workers record it
    /// for clients to find.
    pub fn topology(&self) -> Topology {
        Topology {
            requests: self.stream.requests.clone(),
            shards: self.stream.shards,
            applications: self.stream.applications.clone(),
            admin_requests: self.stream.admin_requests.clone(),
            replies_prefix: self.replies.prefix.clone(),
        }
    }

    /// A client of this deployment as these settings describe it: their
    /// Redis, `client.name` as the application, their streams (not read
    /// from Redis: a process holding the settings knows them), the
    /// `[client]` limits and ttl, `replies.ttl_ms` and the default
    /// heartbeat timeout.
    pub fn client(&self) -> ClientBuilder {
        Client::builder()
            .redis(self.redis.clone())
            .application(self.client.name.clone())
            .key_prefix(self.keys.prefix.clone())
            .topology(self.topology())
            .max_in_flight(self.client.max_in_flight)
            .ttl(Duration::from_millis(self.client.ttl_ms))
            .reply_ttl(Duration::from_millis(self.replies.ttl_ms))
            .heartbeat_timeout(Duration::from_millis(self.sessions.heartbeat_timeout_ms))
    }

    /// The deployment as `seatgate gateway` serves it: these settings'
    /// Redis, streams, shared identities and events, and their client.
    pub fn gateway_deployment(&self) -> seatgate_gateway::Deployment {
        seatgate_gateway::Deployment {
            redis: self.redis.clone(),
            client: self.client(),
            topology: self.topology(),
            shared_identity: self.tenancy.shared_identity.clone(),
            key_prefix: self.keys.prefix.clone(),
            events_stream: self.events.stream.clone(),
            events_shards: self.events_shards(),
        }
    }

    /// Every requests stream shard ([`Topology::request_streams`]).
    pub fn request_streams(&self) -> Vec<String> {
        self.topology().request_streams()
    }

    /// Every requests stream the workers read ([`Topology::read_streams`]).
    pub fn read_streams(&self) -> Vec<String> {
        self.topology().read_streams()
    }

    /// The requests stream of application `app` (unsharded name):
    /// `<stream.requests>:app:<app>`.
    pub fn app_requests(&self, app: &str) -> String {
        self.topology().app_requests(app)
    }

    /// The requests stream this process sends its requests to as a client
    /// (unsharded name): its application's own when `client.name` is one
    /// of `stream.applications`, else the shared `stream.requests`.
    pub fn client_requests(&self) -> String {
        self.topology().client_requests(&self.client.name)
    }

    /// The shared requests stream's shard that serves `license`.
    pub fn request_stream_for(&self, license: &str) -> String {
        shard_name(&self.stream.requests, self.stream.shards, license)
    }

    /// The application whose own requests stream (or shard of it) `stream` is.
    pub fn application_of(&self, stream: &str) -> Option<String> {
        self.topology().application_of(stream).map(str::to_owned)
    }

    /// Whether application `app` speaks for shared users and groups
    /// (`tenancy.shared_identity`).
    pub fn shared_identity(&self, app: &str) -> bool {
        self.tenancy.shared_identity.iter().any(|a| a == app)
    }

    /// The reply namespace of requests read from `stream` ([`Topology::reply_prefix_for`]).
    pub fn reply_prefix_for(&self, stream: &str) -> String {
        self.topology().reply_prefix_for(stream)
    }

    /// What tells requests stream `stream` apart in the dedupe key of an
    /// entry read there ([`Topology::stream_tag`]).
    pub fn stream_tag(&self, stream: &str) -> Option<String> {
        self.topology().stream_tag(stream)
    }

    /// How many ways the events stream is sharded: `events.shards`, or
    /// the requests stream's `stream.shards` when that is 0.
    pub fn events_shards(&self) -> usize {
        match self.events.shards {
            0 => self.stream.shards,
            n => n,
        }
    }

    /// Every events stream shard.
    pub fn events_streams(&self) -> Vec<String> {
        shard_names(&self.events.stream, self.events_shards())
    }

    /// The events stream shard that carries `license`'s events.
    pub fn events_stream_for(&self, license: &str) -> String {
        shard_name(&self.events.stream, self.events_shards(), license)
    }

    /// The consumer name: configured, or `<hostname>-<pid>`.
    pub fn consumer_name(&self) -> String {
        if self.stream.consumer.is_empty() {
            let host = gethostname::gethostname().to_string_lossy().into_owned();
            format!("{host}-{}", std::process::id())
        } else {
            self.stream.consumer.clone()
        }
    }

    /// The metrics listen address, `None` when disabled.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, Error> {
        if self.metrics.listen.is_empty() {
            return Ok(None);
        }
        self.metrics.listen.parse().map(Some).map_err(|_| {
            Error::Config(format!(
                "metrics.listen {:?} is not an address like 127.0.0.1:9464",
                self.metrics.listen
            ))
        })
    }

    /// Where the status page is served: off, on the metrics listener, or on
    /// `http.page_listen`.
    pub fn page_at(&self) -> Result<PageAt, Error> {
        if !self.http.page {
            return Ok(PageAt::Off);
        }
        if self.http.page_listen.is_empty() {
            return Ok(if self.metrics.listen.is_empty() {
                PageAt::Off
            } else {
                PageAt::Metrics
            });
        }
        self.http.page_listen.parse().map(PageAt::Own).map_err(|_| {
            Error::Config(format!(
                "http.page_listen {:?} is not an address like 127.0.0.1:9465",
                self.http.page_listen
            ))
        })
    }

    /// The rules the request parser obeys: the reply namespace, whether a
    /// lease is required, the entry size limit.
    pub fn parse_rules(&self) -> seatgate_core::protocol::Rules<'_> {
        seatgate_core::protocol::Rules {
            reply_prefix: &self.replies.prefix,
            require_lease: self.sessions.require_lease,
            max_entry_bytes: self.limits.max_entry_bytes,
            default_ttl_ms: self.requests.default_ttl_ms,
            max_ttl_ms: self.requests.max_ttl_ms,
        }
    }

    /// The dedupe window and rate limits requests are decided under.
    pub fn guard_policy(&self) -> seatgate_core::request::GuardPolicy {
        seatgate_core::request::GuardPolicy {
            dedupe_window_ms: self.dedupe.window_ms,
            session_limit: self.limits.session_requests,
            license_limit: self.limits.license_requests,
            rate_window_ms: self.limits.window_ms,
            application: seatgate_core::request::ApplicationLimits {
                requests: self.tenancy.application_requests,
                sessions: self.tenancy.application_sessions,
                waiters: self.tenancy.application_waiters,
            },
        }
    }

    /// The key names, each license's events recorded where this deployment's
    /// scripts record them: straight into the events shard on one node,
    /// through the license's own log and the relay on a cluster
    /// (lua/includes/events.lua); on one node, the request scripts writing
    /// their waiters' queue replies themselves (lua/includes/outbox.lua).
    pub fn seat_keys(&self) -> seatgate_core::keys::Keys {
        let keys = seatgate_core::keys::Keys::new(self.keys.prefix.clone())
            .with_events(
                &self.events.stream,
                self.events_shards(),
                self.redis.is_cluster(),
                u64::try_from(self.events.retention.as_millis()).unwrap_or(u64::MAX),
            )
            .with_denials(self.events.denials_window_ms, self.events.denials_per_window);
        if self.redis.is_cluster() {
            return keys;
        }
        keys.with_queue_replies(seatgate_core::keys::QueueReplies {
            prefix: self.replies.prefix.clone(),
            ttl_ms: self.replies.ttl_ms,
            expiry_ms: self.replies.expiry_ms(),
        })
    }

    /// The defaults a seat script call is handed for a license that sets
    /// none of its own, and the revocation memory.
    pub fn service_defaults(&self) -> seatgate_core::scripts::ServiceDefaults {
        seatgate_core::scripts::ServiceDefaults {
            queue_max: self.queue.max_length,
            heartbeat_timeout_ms: self.sessions.heartbeat_timeout_ms,
            revoke_remember_ms: self.revoke.remember_ms,
            revoke_max_per_license: self.revoke.max_per_license,
            max_wait_ms: self.queue.max_wait_ms,
            claim_ms: self.queue.claim_ms,
        }
    }

    /// XREADGROUP BLOCK as a duration.
    pub fn block(&self) -> Duration {
        Duration::from_millis(self.stream.block_ms)
    }
}

#[cfg(test)]
mod tests {
    /// A client program's defaults (`RedisSettings::default`,
    /// `Topology::default`, what `Client::builder()` starts from) are the
    /// shipped settings', so a program and a default service agree.
    #[test]
    fn the_clients_defaults_are_the_shipped_settings() {
        let s = Settings::load(None).unwrap();
        let d = RedisSettings::default();
        assert_eq!(
            (
                &d.url,
                d.response_timeout_ms,
                d.connect_timeout_ms,
                &d.cluster_urls,
                &d.username
            ),
            (
                &s.redis.url,
                s.redis.response_timeout_ms,
                s.redis.connect_timeout_ms,
                &s.redis.cluster_urls,
                &s.redis.username
            )
        );
        assert_eq!(Topology::default(), s.topology());
        assert_eq!(s.keys.prefix, "seat");
        assert_eq!(
            (
                s.client.name.as_str(),
                s.client.max_in_flight,
                s.client.ttl_ms,
                s.replies.ttl_ms,
                s.sessions.heartbeat_timeout_ms
            ),
            ("seatgate", 1000, 5000, 300_000, 90_000),
            "ClientBuilder::default's values (seatgate-client, request.rs)"
        );
    }

    #[test]
    fn shards_are_named_and_chosen_stably() {
        let mut s = Settings::load(None).unwrap();
        assert_eq!(s.request_streams(), ["seat:requests"]);
        assert_eq!(s.read_streams(), ["seat:requests"]);
        assert_eq!(s.request_stream_for("acme"), "seat:requests");
        s.stream.shards = 4;
        assert_eq!(s.request_streams()[3], "seat:requests:{3}");
        assert_eq!(s.read_streams().len(), 5, "the shards and the base stream");
        assert_eq!(s.read_streams()[4], "seat:requests");
        // zlib.crc32(b"acme") == 0x05c4ba3e, so any client computes shard 0x05c4ba3e % 4 == 2.
        assert_eq!(crc32fast::hash(b"acme"), 0x05c4_ba3e);
        let shard = crc32fast::hash(b"acme") as usize % 4;
        assert_eq!(s.request_stream_for("acme"), format!("seat:requests:{{{shard}}}"));
        assert_eq!(s.events_stream_for("acme"), format!("seat:events:{{{shard}}}"));
        assert_eq!(seatgate_core::keys::shard_of("acme", 1), 0);
    }

    #[test]
    fn each_application_has_its_own_requests_streams_and_reply_namespace() {
        let mut s = Settings::load(None).unwrap();
        assert_eq!(
            s.client_requests(),
            "seat:requests",
            "no applications: the shared stream"
        );
        s.stream.applications = vec!["billing".into(), "cad".into()];
        assert_eq!(
            s.request_streams(),
            [
                "seat:requests",
                "seat:requests:app:billing",
                "seat:requests:app:cad"
            ]
        );
        assert_eq!(s.read_streams(), s.request_streams());
        assert_eq!(s.client_requests(), "seat:requests", "client.name is not listed");
        s.client.name = "cad".into();
        assert_eq!(s.client_requests(), "seat:requests:app:cad");
        assert_eq!(s.application_of("seat:requests:app:cad").as_deref(), Some("cad"));
        assert_eq!(s.application_of("seat:requests"), None);
        assert_eq!(s.reply_prefix_for("seat:requests:app:cad"), "seat:reply:cad:");
        assert_eq!(s.reply_prefix_for("seat:requests"), "seat:reply:");
        assert_eq!(s.stream_tag("seat:requests"), None);
        assert_eq!(s.stream_tag("seat:requests:app:cad").as_deref(), Some("app:cad"));
        s.validate().unwrap();

        s.stream.shards = 2;
        let streams = s.read_streams();
        assert_eq!(streams.len(), 9, "{streams:?}");
        assert!(streams.contains(&"seat:requests:app:billing:{1}".to_owned()));
        assert!(streams.contains(&"seat:requests:app:billing".to_owned()));
        assert_eq!(
            s.application_of("seat:requests:app:billing:{1}").as_deref(),
            Some("billing")
        );
        assert_eq!(s.stream_tag("seat:requests:{1}").as_deref(), Some("1"));
        assert_eq!(
            s.stream_tag("seat:requests:app:billing:{1}").as_deref(),
            Some("app:billing:1")
        );
        assert_eq!(
            s.stream_tag("seat:requests:app:billing").as_deref(),
            Some("app:billing")
        );
        assert_eq!(s.stream_tag("seat:requests").as_deref(), None);

        for bad in [
            vec!["a b".to_owned()],
            vec![String::new()],
            vec!["x".into(), "x".into()],
        ] {
            s.stream.applications = bad;
            assert!(s.validate().is_err(), "{:?}", s.stream.applications);
        }
    }

    use super::*;
    use secrecy::ExposeSecret;

    /// docs/configuration.md's settings table (one row per `[section]`) names
    /// every section and every key of config/default.toml, and no section the
    /// file lacks: a new setting without its line in the table fails here.
    #[test]
    fn the_settings_table_lists_every_setting_of_the_defaults() {
        let docs = include_str!("../../../docs/configuration.md");
        let rows: std::collections::HashMap<&str, &str> = docs
            .lines()
            .filter_map(|l| l.strip_prefix("| `["))
            .filter_map(|l| l.split_once("]` |"))
            .collect();
        let mut sections = Vec::new();
        let mut missing = Vec::new();
        let mut section = "";
        for line in DEFAULT_TOML.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name;
                sections.push(name);
                if !rows.contains_key(name) {
                    missing.push(format!("[{name}]"));
                }
            } else if let Some((key, _)) = line.split_once(" = ").filter(|_| !line.starts_with('#')) {
                let documented = rows
                    .get(section)
                    .is_some_and(|row| row.contains(&format!("`{key}`")));
                if !documented {
                    missing.push(format!("{section}.{key}"));
                }
            }
        }
        assert!(
            sections.len() >= 15,
            "the defaults' sections were read: {sections:?}"
        );
        assert!(
            missing.is_empty(),
            "not in docs/configuration.md's settings table: {missing:?}"
        );
        let extra: Vec<&&str> = rows.keys().filter(|r| !sections.contains(r)).collect();
        assert!(
            extra.is_empty(),
            "rows for sections config/default.toml lacks: {extra:?}"
        );
    }

    #[test]
    fn defaults_load_and_validate() {
        let s = Settings::load(None).unwrap();
        assert_eq!(
            s.parse_rules(),
            seatgate_core::protocol::Rules {
                require_lease: true,
                ..seatgate_core::protocol::Rules::new("seat:reply:")
            }
        );
        assert_eq!(s.stream.requests, "seat:requests");
        assert_eq!(s.keys.prefix, "seat");
        assert!(s.metrics_addr().unwrap().is_some());
    }

    #[test]
    fn a_request_may_live_no_longer_than_its_dedupe_record() {
        let s = Settings::load(None).unwrap();
        assert_eq!(
            (s.requests.default_ttl_ms, s.requests.max_ttl_ms),
            (60_000, 60_000)
        );
        assert!(s.requests.max_ttl_ms <= s.dedupe.window_ms);
        let with = |default_ttl_ms, max_ttl_ms, window_ms| {
            let mut s = s.clone();
            s.requests = RequestSettings {
                default_ttl_ms,
                max_ttl_ms,
            };
            s.dedupe.window_ms = window_ms;
            s.validate()
        };
        assert!(with(0, 60_000, 60_000).is_ok(), "0: no default deadline");
        assert!(with(5_000, 10_000, 60_000).is_ok());
        for (default, max, window) in [(0, 0, 60_000), (20_000, 10_000, 60_000), (0, 60_001, 60_000)] {
            let e = with(default, max, window).unwrap_err().to_string();
            assert!(e.contains("requests.max_ttl_ms"), "{e}");
        }
    }

    #[test]
    fn cluster_urls_come_from_the_environment_as_a_comma_list() {
        // The only test that sets this variable; cargo runs tests in threads,
        // but nothing else reads SEATGATE__REDIS__CLUSTER_URLS.
        std::env::set_var(
            "SEATGATE__REDIS__CLUSTER_URLS",
            "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
        );
        let s = Settings::load(None);
        std::env::remove_var("SEATGATE__REDIS__CLUSTER_URLS");
        let s = s.unwrap();
        assert_eq!(
            s.redis.cluster_urls,
            ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
        );
        assert!(s.redis.is_cluster());
    }

    /// The .deb's /etc/seatgate/seatgate.toml (ops/seatgate.toml) changes
    /// nothing as shipped, stays a short file of overrides (the defaults
    /// are built in), and every example in it, uncommented, is a real,
    /// valid setting.
    #[test]
    fn the_packaged_settings_file_is_overrides_only() {
        let shipped = include_str!("../../../ops/seatgate.toml");
        assert!(
            shipped.lines().count() < 40,
            "a short file of overrides, not the defaults"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seatgate.toml");
        std::fs::write(&path, shipped).unwrap();
        let s = Settings::load(Some(&path)).unwrap();
        assert_eq!(s.redis.url, Settings::load(None).unwrap().redis.url);
        // Uncommented: `# [section]` and `# key = value` lines become settings.
        let examples: String = shipped
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| l.starts_with('[') || l.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ')))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(examples.matches(" = ").count() >= 4, "{examples}");
        std::fs::write(&path, &examples).unwrap();
        let s = Settings::load(Some(&path)).unwrap_or_else(|e| panic!("{e}\n{examples}"));
        assert_eq!(s.redis.username, "seatgate-worker");
        assert_eq!(s.redis.sentinel.master_name, "seatgate");
        assert_eq!(s.redis.sentinel.urls.len(), 3);
    }

    #[test]
    fn a_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, "[stream]\nbatch_size = 7\n[metrics]\nlisten = \"\"\n").unwrap();
        let s = Settings::load(Some(&path)).unwrap();
        assert_eq!(s.stream.batch_size, 7);
        assert_eq!(s.metrics_addr().unwrap(), None);
    }

    #[test]
    fn the_page_is_on_the_metrics_listener_its_own_or_off() {
        let s = Settings::load(None).unwrap();
        assert!(s.http.page && !s.http.page_personal && s.http.allowed_hosts.is_empty());
        assert_eq!(s.page_at().unwrap(), PageAt::Metrics);
        let with = |f: &dyn Fn(&mut Settings)| {
            let mut s = s.clone();
            f(&mut s);
            s.validate().and_then(|()| s.page_at())
        };
        assert_eq!(with(&|s| s.http.page = false).unwrap(), PageAt::Off);
        assert_eq!(with(&|s| s.metrics.listen.clear()).unwrap(), PageAt::Off);
        assert_eq!(
            with(&|s| s.http.page_listen = "127.0.0.1:9465".into()).unwrap(),
            PageAt::Own("127.0.0.1:9465".parse().unwrap())
        );
        assert!(with(&|s| s.http.page_listen = "seats:80".into()).is_err());
        assert!(with(&|s| s.http.page_refresh_ms = 10).is_err());
        assert!(with(&|s| s.http.allowed_hosts = vec!["seats.example.com:8443".into()]).is_ok());
        for host in ["", "a b", "http://x", "u@x"] {
            assert!(
                with(&|s| s.http.allowed_hosts = vec![host.into()]).is_err(),
                "{host:?}"
            );
        }
    }

    #[test]
    fn every_seatgate_stream_must_stay_inside_the_namespace() {
        let dir = tempfile::tempdir().unwrap();
        for (section, key) in [
            ("stream", "requests"),
            ("stream", "admin_requests"),
            ("stream", "dead_letter"),
            ("events", "stream"),
        ] {
            let path = dir.path().join("s.toml");
            std::fs::write(&path, format!("[{section}]\n{key} = \"outside\"\n")).unwrap();
            let err = Settings::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains(&format!("{section}.{key}")), "{err}");
        }
    }

    #[test]
    fn the_reply_namespace_lies_inside_the_prefix_and_apart_from_seatgate_streams() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        for (toml, word) in [
            ("[replies]\nprefix = \"reply:\"\n", "replies.prefix"),
            ("[replies]\nprefix = \"seat:\"\n", "replies.prefix"),
            ("[replies]\nprefix = \"seat:{r}:\"\n", "replies.prefix"),
            ("[replies]\nprefix = \"seat:r*:\"\n", "replies.prefix"),
            ("[replies]\nprefix = \"seat:r\"\n", "stream.requests"),
            ("[replies]\nprefix = \"seat:e\"\n", "events.stream"),
            ("[replies]\nprefix = \"seat:licenses\"\n", "keys.prefix"),
            (
                "[stream]\ndead_letter = \"seat:reply:dead\"\n",
                "stream.dead_letter",
            ),
            (
                "[stream]\nadmin_requests = \"seat:reply:admin\"\n",
                "stream.admin_requests",
            ),
            (
                "[stream]\nadmin_requests = \"seat:requests\"\n",
                "stream.admin_requests",
            ),
            (
                "[stream]\nadmin_requests = \"seat:events\"\n",
                "stream.admin_requests",
            ),
            ("[client]\nname = \"a:b\"\n", "client.name"),
            ("[client]\nname = \"*\"\n", "client.name"),
        ] {
            std::fs::write(&path, toml).unwrap();
            let err = Settings::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains(word), "{toml}: {err}");
        }
        let s = Settings::load(None).unwrap();
        assert_eq!(
            (s.replies.prefix.as_str(), s.client.name.as_str()),
            ("seat:reply:", "seatgate")
        );
    }

    #[test]
    fn an_old_file_setting_replies_maxlen_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, "[replies]\nmaxlen = 100\nttl_ms = 1000\n").unwrap();
        let s = Settings::load(Some(&path)).unwrap();
        assert_eq!((s.replies.maxlen, s.replies.ttl_ms), (Some(100), 1000));
    }

    #[test]
    fn events_are_kept_by_age_and_an_old_maxlen_still_loads() {
        let s = Settings::load(None).unwrap();
        assert_eq!(s.events.retention, Duration::from_secs(30 * 24 * 3600));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, "[events]\nmaxlen = 100\nretention = \"7d 12h\"\n").unwrap();
        let s = Settings::load(Some(&path)).unwrap();
        assert_eq!(s.events.maxlen, Some(100));
        assert_eq!(s.events.retention, Duration::from_secs(7 * 24 * 3600 + 12 * 3600));
        for (value, word) in [("\"30\"", "not a duration"), ("\"10s\"", "at least 1m")] {
            std::fs::write(&path, format!("[events]\nretention = {value}\n")).unwrap();
            let err = Settings::load(Some(&path)).unwrap_err().to_string();
            assert!(err.contains(word), "{value}: {err}");
        }
    }

    #[test]
    fn the_password_comes_from_a_file_before_the_setting_and_never_prints() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        // The only test that sets these variables; no other test reads the password.
        std::env::set_var("SEATGATE__REDIS__PASSWORD", "0012");
        std::env::set_var("SEATGATE__REDIS__USERNAME", "007");
        let s = Settings::load(None);
        std::env::remove_var("SEATGATE__REDIS__PASSWORD");
        std::env::remove_var("SEATGATE__REDIS__USERNAME");
        let mut s = s.unwrap();
        assert_eq!(
            s.redis.password().unwrap().unwrap().expose_secret(),
            "0012",
            "verbatim"
        );
        assert_eq!(s.redis.username, "007");
        s.redis.password = SecretString::from("from-setting");
        assert_eq!(
            s.redis.password().unwrap().unwrap().expose_secret(),
            "from-setting"
        );
        assert!(!format!("{:?}", s.redis).contains("from-setting"));
        s.redis.password_file = file.display().to_string();
        assert_eq!(s.redis.password().unwrap().unwrap().expose_secret(), "from-file");
        s.redis.password_file = dir.path().join("missing").display().to_string();
        assert!(s
            .redis
            .password()
            .unwrap_err()
            .to_string()
            .contains("password_file"));
    }

    #[test]
    fn tls_files_are_checked_at_load_and_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let load = |redis: &str| {
            let path = dir.path().join("s.toml");
            std::fs::write(&path, format!("[redis]\n{redis}\n")).unwrap();
            Settings::load(Some(&path)).map(|s| s.redis)
        };
        let none = load("").unwrap();
        assert!(!none.has_tls_files() && none.tls_certificates().unwrap().is_none());

        let err = load("tls_cert_file = \"/c.pem\"").unwrap_err().to_string();
        assert!(err.contains("redis.tls_key_file is not"), "{err}");
        let err = load("tls_key_file = \"/k.pem\"").unwrap_err().to_string();
        assert!(err.contains("redis.tls_cert_file is not"), "{err}");

        let err = load("tls_ca_file = \"/nonexistent/ca.pem\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("redis.tls_ca_file \"/nonexistent/ca.pem\" cannot be read"),
            "{err}"
        );

        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "just text\n").unwrap();
        let err = load(&format!("tls_ca_file = {:?}", not_pem))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("redis.tls_ca_file") && err.contains("no PEM certificate"),
            "{err}"
        );

        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = load(&format!("tls_ca_file = {:?}", broken))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("redis.tls_ca_file") && err.contains("malformed"),
            "{err}"
        );

        // PEM around bytes that are no certificate.
        let cert = dir.path().join("c.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = load(&format!("tls_ca_file = {cert:?}")).unwrap_err().to_string();
        assert!(
            err.contains("redis.tls_ca_file") && err.contains("unusable CA certificate"),
            "{err}"
        );

        // A certificate file is no key file.
        let err = load(&format!("tls_cert_file = {cert:?}\ntls_key_file = {cert:?}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("redis.tls_key_file") && err.contains("no usable PEM private key"),
            "{err}"
        );
    }

    #[test]
    fn invalid_values_are_refused_with_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, "[stream]\nbatch_size = 0\n").unwrap();
        let err = Settings::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("batch_size"), "{err}");
        assert!(Settings::load(Some(Path::new("/nonexistent.toml"))).is_err());
    }
}
