//! The embedded Lua registry and one typed call per script.
//!
//! Each script under `lua/` is compiled into the binary and, when the
//! registry is first used, assembled with the helpers its `--- @include
//! "name"` lines name (`lua/includes/`) into one Redis function library
//! (scripts/includes.rs, [`includes::library`]): every helper defined once at
//! the library's top level, built when Redis loads it (`FUNCTION LOAD`), each
//! script one registered function, called with `FCALL` (issue 24; Redis 7.0
//! or later). The library's name carries the hash of its text, so two
//! builds of seatgate on one Redis never call each other's functions.
//! Each script has one method here, named after it, that
//! binds its KEYS and ARGV from a typed argument struct and returns a
//! [`ScriptCall`]: [`ScriptCall::run`] on its own (which loads the library
//! and calls again when Redis answers `Function not found`: after a restart
//! without persistence, a `FUNCTION FLUSH`, on a new cluster node), or
//! [`ScriptCall::cmd`] in a pipeline (which does not load: call
//! [`Scripts::load_all`] first, and re-run a call answered
//! [`is_not_loaded`] with [`ScriptCall::run`]). The replies are decoded in one
//! place, scripts/reply.rs. The runtime records the seed's two metrics
//! around each call.

mod includes;
mod reply;

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, ToRedisArgs, Value};
use strum::{EnumCount, EnumString, IntoStaticStr, VariantArray};

use crate::engine::keys::{DueKeys, EventKeys, LicenseKeys};
use crate::error::Error;

use includes::IncludeError;
pub(crate) use reply::decode_outcome;
pub use reply::{Decision, Deleted, Delivery, NoSeats, Note, OutboxCursor, Outcome, Reaped};

/// Every script under `lua/`, one variant each, named after its file: the
/// registry ([`Scripts`]) is indexed by it, and `runtime::metrics` derives
/// its `script_name` labels from it ([`ScriptName::is_seat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumCount, EnumString, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum ScriptName {
    /// lua/acquire.lua
    Acquire,
    /// lua/release.lua
    Release,
    /// lua/heartbeat.lua
    Heartbeat,
    /// lua/revoke.lua
    Revoke,
    /// lua/reap.lua
    Reap,
    /// lua/reply.lua
    Reply,
    /// lua/remove_consumer.lua
    RemoveConsumer,
    /// lua/unlock.lua
    Unlock,
    /// lua/renew.lua
    Renew,
    /// lua/due_claim.lua
    DueClaim,
    /// lua/due_settle.lua
    DueSettle,
    /// lua/delete_license.lua
    DeleteLicense,
    /// lua/put_license.lua
    PutLicense,
    /// lua/relay.lua
    Relay,
}

impl ScriptName {
    /// The script's name, its file's without `.lua`: the `script_name` of
    /// the metrics and the name in errors.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether this is a seat script, called through a [`ScriptCall`]: the
    /// runtime times it and counts its results (`script_name` of the seed's
    /// two metrics).
    pub fn is_seat(self) -> bool {
        matches!(
            self,
            ScriptName::Acquire
                | ScriptName::Release
                | ScriptName::Heartbeat
                | ScriptName::Revoke
                | ScriptName::Reap
                | ScriptName::DeleteLicense
        )
    }

    /// The script file, before its includes are resolved.
    fn text(self) -> &'static str {
        match self {
            ScriptName::Acquire => include_str!("../../lua/acquire.lua"),
            ScriptName::Release => include_str!("../../lua/release.lua"),
            ScriptName::Heartbeat => include_str!("../../lua/heartbeat.lua"),
            ScriptName::Revoke => include_str!("../../lua/revoke.lua"),
            ScriptName::Reap => include_str!("../../lua/reap.lua"),
            ScriptName::Reply => include_str!("../../lua/reply.lua"),
            ScriptName::RemoveConsumer => include_str!("../../lua/remove_consumer.lua"),
            ScriptName::Unlock => include_str!("../../lua/unlock.lua"),
            ScriptName::Renew => include_str!("../../lua/renew.lua"),
            ScriptName::DueClaim => include_str!("../../lua/due_claim.lua"),
            ScriptName::DueSettle => include_str!("../../lua/due_settle.lua"),
            ScriptName::DeleteLicense => include_str!("../../lua/delete_license.lua"),
            ScriptName::PutLicense => include_str!("../../lua/put_license.lua"),
            ScriptName::Relay => include_str!("../../lua/relay.lua"),
        }
    }

    /// The script as a script run on its own (EVAL) would be: its includes
    /// resolved in place. What the library's function for it runs, but for
    /// the helpers, which the library defines once for every function.
    #[cfg(test)]
    fn source(self) -> Result<String, IncludeError> {
        includes::resolve(&format!("{}.lua", self.as_str()), self.text())
    }
}

/// `source`, a script that is not one of seatgate's (a test's), with its
/// `--- @include` lines resolved from `lua/includes/` as the registry
/// resolves them: how a helper no script calls yet is tried on its own.
pub fn with_includes(source: &str) -> Result<String, Error> {
    includes::resolve("<caller's script>", source).map_err(|e| Error::Config(e.to_string()))
}

/// The function library, assembled (and hashed) once per process; its
/// functions are indexed by [`ScriptName`].
pub struct Scripts {
    /// The library's text, as FUNCTION LOAD takes it.
    library: String,
    /// Its name: `seatgate_` and the first 16 hex digits of the SHA1 of its
    /// text as assembled under the plain name.
    name: String,
    /// Each script's function: `<name>_<script>`.
    functions: [String; ScriptName::COUNT],
}

impl Scripts {
    fn build() -> Result<Scripts, IncludeError> {
        let assemble = |prefix: &str| {
            let functions: [String; ScriptName::COUNT] =
                std::array::from_fn(|i| format!("{prefix}_{}", ScriptName::VARIANTS[i].as_str()));
            let files: Vec<String> = ScriptName::VARIANTS
                .iter()
                .map(|n| format!("{}.lua", n.as_str()))
                .collect();
            let entries: Vec<includes::Entry<'_>> = ScriptName::VARIANTS
                .iter()
                .enumerate()
                .map(|(i, name)| includes::Entry {
                    function: &functions[i],
                    file: &files[i],
                    text: name.text(),
                })
                .collect();
            includes::library(prefix, &entries).map(|text| (text, functions))
        };
        let (plain, _) = assemble("seatgate")?;
        let hash = redis::Script::new(&plain).get_hash().to_owned();
        let name = format!("seatgate_{}", &hash[..16]);
        let (library, functions) = assemble(&name)?;
        Ok(Scripts {
            library,
            name,
            functions,
        })
    }

    /// Script `name`'s function.
    fn function(&self, name: ScriptName) -> &str {
        // VARIANTS lists the variants in declaration order, which is also
        // their discriminants' (a test checks it), so `i` above is `name as usize`.
        &self.functions[name as usize]
    }

    /// A call of `name`, nothing bound yet.
    fn invoke(&self, name: ScriptName) -> Invocation<'_> {
        Invocation {
            scripts: self,
            name,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// The library's text, as FUNCTION LOAD takes it.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The library's name (`seatgate_<hash>`).
    pub fn library_name(&self) -> &str {
        &self.name
    }
}

// A broken include is a mistake in lua/, caught by this module's tests; the
// panic only names it should one ever ship.
static SCRIPTS: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::build().unwrap_or_else(|e| panic!("lua/ does not assemble: {e}")));

/// Whether `e` says Redis does not have the function called: the library is
/// not loaded there (a restart without persistence, `FUNCTION FLUSH`, a new
/// cluster node). Load it ([`Scripts::load_all`]) and call again.
pub fn is_not_loaded(e: &RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("Function not found"))
}

/// Whether `e` is `FUNCTION LOAD`'s answer for a library of that name
/// already loaded (on a cluster, by at least one master: the others loaded
/// it; a master that answered otherwise loads it at its first
/// `Function not found`).
pub fn is_already_loaded(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Library") && d.ends_with("already exists"))
}

/// `e`, or, when it says Redis does not know FCALL or FUNCTION, the one line
/// that says why: seatgate's scripts are a function library (Redis 7.0).
fn too_old(e: RedisError) -> RedisError {
    let unknown = e.code() == Some("ERR")
        && e.detail().is_some_and(|d| {
            d.starts_with("unknown command") && (d.contains("'FCALL'") || d.contains("'FUNCTION'"))
                || d.starts_with("unknown command 'fcall'")
                || d.starts_with("unknown command 'function'")
        });
    if unknown {
        RedisError::from((
            redis::ErrorKind::Client,
            "seatgate needs Redis 7.0 or later (FUNCTION LOAD, FCALL)",
            e.to_string(),
        ))
    } else {
        e
    }
}

/// One function call being bound: its KEYS and ARGV.
pub(crate) struct Invocation<'a> {
    /// The library it is a function of (loaded again when Redis lost it).
    scripts: &'a Scripts,
    /// Which script.
    name: ScriptName,
    /// KEYS, in order.
    keys: Vec<Vec<u8>>,
    /// ARGV, in order.
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    /// Adds the next KEYS.
    fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds the next ARGV.
    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The FCALL command.
    fn cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(self.scripts.function(self.name)).arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(key.as_slice());
        }
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }

    /// Runs the call, loading the library and calling once more when Redis
    /// does not have it.
    async fn invoke_async<T: FromRedisValue, C: ConnectionLike>(&self, con: &mut C) -> redis::RedisResult<T> {
        match self.cmd().query_async(con).await {
            Err(e) if is_not_loaded(&e) => {
                self.scripts.load(con).await?;
                self.cmd().query_async(con).await.map_err(too_old)
            }
            other => other.map_err(too_old),
        }
    }
}

/// Redelivery dedupe, expiry and rate limiting for one request:
/// `KEYS[3..4]`, `ARGV[1..3]`, `ARGV[6]` and part of `ARGV[7]` of the request scripts
/// (lua/includes/request.lua; revoke reads the dedupe and expiry parts only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// `ARGV[1]`: the request's key, the field of its dedupe record ("" = no
    /// dedupe, for direct calls): the stream entry id, with its stream's tag
    /// ([`Guard::for_entry`] and engine::ops), or the caller's request id
    /// ([`Guard::for_request`]).
    pub entry_id: String,
    /// `KEYS[3]`: the dedupe bucket the entry's reply is stored in.
    pub done_key: String,
    /// `KEYS[4]`: the bucket before it, where an earlier delivery may have
    /// stored the reply when the entry's placement moves with the clock
    /// ([`Guard::for_entry_at`]); `done_key` again when it cannot have.
    pub done_before_key: String,
    /// When the bucket may expire, unix ms (the script caps it at its own
    /// clock plus two windows).
    pub done_until_ms: u64,
    /// The dedupe window, ms: the cap above.
    pub dedupe_window_ms: u64,
    /// Most requests per session per window (0 = no limit).
    pub session_limit: u64,
    /// Most requests per license per window (0 = no limit).
    pub license_limit: u64,
    /// The rate window, ms.
    pub window_ms: u64,
    /// The entry is a redelivery: look up the reply it may have got before.
    pub redelivery: bool,
    /// The key is the caller's request id ([`Guard::for_request`]): the
    /// script prefixes the lease hash to it, and always looks in both buckets.
    pub by_request: bool,
    /// `ARGV[6]`: the Redis time (unix ms) after which the request is no
    /// longer decided but answered REQUEST_EXPIRED ([`deadline`]); 0 = none.
    pub deadline_ms: u64,
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

/// Where the reply of an entry added at `added_ms` is stored, `window` ms
/// buckets, when the Redis clock reads `now_ms` (if known): the bucket to
/// write and look in, and the one before it to look in too (the same bucket
/// when no earlier delivery can have written elsewhere).
///
/// The entry's time is capped at one window ahead of the clock: an entry
/// whose id lies further ahead (a caller chose it, or the stream's last id is
/// stuck in the future so that every later `XADD *` reuses its millisecond)
/// is placed in the bucket one window ahead of the clock instead, so no
/// bucket keeps growing while the ids stay stuck. The capped time only grows
/// with the clock, and by at most a window within one, so a delivery within a
/// window of an earlier one finds its reply in its own bucket or the one
/// before. An entry that is not ahead of the clock is placed by its own time,
/// the same for every delivery, and looks in one bucket only.
fn placement(added_ms: u64, window: u64, now_ms: Option<u64>) -> (u64, u64) {
    let window = window.max(1);
    match now_ms {
        Some(now) if added_ms > now => {
            let capped = added_ms.min(now.saturating_add(window));
            let bucket = capped / window;
            (bucket, bucket.saturating_sub(1))
        }
        _ => (added_ms / window, added_ms / window),
    }
}

/// The milliseconds part of stream entry id `entry_id` (0 when it has none).
fn entry_ms(entry_id: &str) -> u64 {
    entry_id
        .split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

/// The deadline (`ARGV[6]`) of a request read from stream entry `entry_id`
/// with `ttl_ms` (0 = no deadline: 0), `window` the dedupe window, when the
/// Redis clock reads about `redis_now_ms` (if known).
///
/// The entry id is the Redis clock at its XADD, so no client clock is
/// trusted and an entry delivered again (redelivered, claimed from a dead
/// worker) keeps its deadline. An id further ahead of the clock than a
/// window (a caller chose it) counts as added one window ahead of the clock,
/// as its dedupe placement does ([`placement`]): a chosen id buys no more
/// than that.
pub fn deadline(entry_id: &str, ttl_ms: u64, window: u64, redis_now_ms: Option<u64>) -> u64 {
    if ttl_ms == 0 {
        return 0;
    }
    let added = entry_ms(entry_id);
    let from = match redis_now_ms {
        Some(now) => added.min(now.saturating_add(window)),
        None => added,
    };
    from.saturating_add(ttl_ms)
}

impl Guard {
    /// The guard of stream entry `entry_id` under `policy`, the Redis clock
    /// unknown: the dedupe bucket comes from the entry id's time (the Redis
    /// clock at XADD), so every delivery of the entry looks in the same key;
    /// it lives until two windows after the bucket starts, so the guaranteed
    /// window is one. See [`Guard::for_entry_at`] for ids ahead of the clock.
    pub fn for_entry(
        policy: &GuardPolicy,
        keys: &crate::engine::keys::Keys,
        entry_id: &str,
        license: &str,
        session: &str,
    ) -> Guard {
        Guard::for_entry_at(policy, keys, entry_id, license, session, None)
    }

    /// [`Guard::for_entry`] with the Redis clock known to read about
    /// `redis_now_ms`: an entry id far ahead of it (chosen by a caller) is
    /// placed by the clock instead ([`placement`]), so nothing derived from
    /// the id lives far beyond the dedupe window. (`_session` is no longer
    /// bound: the script derives the session's rate key itself.)
    pub fn for_entry_at(
        policy: &GuardPolicy,
        keys: &crate::engine::keys::Keys,
        entry_id: &str,
        license: &str,
        _session: &str,
        redis_now_ms: Option<u64>,
    ) -> Guard {
        let window = policy.dedupe_window_ms.max(1);
        let (bucket, before) = placement(entry_ms(entry_id), window, redis_now_ms);
        Guard {
            entry_id: entry_id.to_owned(),
            done_key: keys.dedupe(license, bucket),
            done_before_key: keys.dedupe(license, before),
            done_until_ms: bucket.saturating_add(2).saturating_mul(window),
            dedupe_window_ms: window,
            session_limit: policy.session_limit,
            license_limit: policy.license_limit,
            window_ms: policy.rate_window_ms,
            redelivery: false,
            by_request: false,
            deadline_ms: 0,
        }
    }

    /// The guard of a request the caller gave an id, keyed by `key`
    /// (`<op>|<session>|<id>`, engine::ops; the script prefixes the lease
    /// hash) and read from stream entry `entry_id`.
    ///
    /// Its record is placed by the Redis clock (`redis_now_ms`), not by the
    /// entry: the same request may arrive as two entries (an XADD whose
    /// acknowledgement was lost, sent again), and whichever is decided
    /// second, within a window of the first, must find the first's answer.
    /// A decision a window later falls in the next bucket at most, and the
    /// script always looks in the bucket before too. While the clock is not
    /// known (a direct call), the entry's time stands in for it; the script
    /// caps the bucket's expiry by its own clock either way.
    pub fn for_request(
        policy: &GuardPolicy,
        keys: &crate::engine::keys::Keys,
        key: &str,
        entry_id: &str,
        license: &str,
        session: &str,
        redis_now_ms: Option<u64>,
    ) -> Guard {
        let window = policy.dedupe_window_ms.max(1);
        let bucket = redis_now_ms.unwrap_or_else(|| entry_ms(entry_id)) / window;
        let mut guard = Guard::for_entry_at(policy, keys, entry_id, license, session, redis_now_ms);
        guard.entry_id = key.to_owned();
        guard.done_key = keys.dedupe(license, bucket);
        guard.done_before_key = keys.dedupe(license, bucket.saturating_sub(1));
        guard.done_until_ms = bucket.saturating_add(2).saturating_mul(window);
        guard.by_request = true;
        guard
    }

    /// No dedupe and no limits: the seed's direct script path.
    /// (`_session` as in [`Guard::for_entry_at`].)
    pub fn none(keys: &crate::engine::keys::Keys, license: &str, _session: &str) -> Guard {
        let done_key = keys.dedupe(license, 0);
        Guard {
            entry_id: String::new(),
            done_before_key: done_key.clone(),
            done_key,
            done_until_ms: 0,
            dedupe_window_ms: 1,
            session_limit: 0,
            license_limit: 0,
            window_ms: 1,
            redelivery: false,
            by_request: false,
            deadline_ms: 0,
        }
    }
}

/// What the service's settings tell a seat script call beyond the request:
/// the defaults for a license that sets none of its own, and the revocation
/// memory. Handed in, so that the engine reads no settings itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceDefaults {
    /// `queue.max_length`: the queue length limit when the license sets no `queue_max`.
    pub queue_max: u64,
    /// `sessions.heartbeat_timeout_ms`: the heartbeat timeout when the
    /// license sets none.
    pub heartbeat_timeout_ms: u64,
    /// `revoke.remember_ms`: how long a revocation is remembered at least.
    pub revoke_remember_ms: u64,
    /// `revoke.max_per_license`: most revocations remembered per license.
    pub revoke_max_per_license: u64,
    /// `queue.max_wait_ms`: the longest an acquire waits; a larger `wait_ms`
    /// counts as this.
    pub max_wait_ms: u64,
}

/// `ARGV[4..5]` of every seat script (lua/includes/request.lua): the
/// session and its lease, and the service's heartbeat timeout (in `ARGV[7]`). All release and heartbeat take; acquire and revoke add their
/// own (engine::ops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionArgs<'a> {
    /// The session releasing or heartbeating.
    pub session: &'a str,
    /// The lease the request carries: it must be the one the seat (or place)
    /// is bound to, if it is bound to one.
    pub lease: Option<&'a str>,
    /// The heartbeat timeout (ms) when the license sets none: what a GRANTED
    /// made on the way carries, and what the next due time is reckoned with.
    pub default_heartbeat_timeout_ms: u64,
}

/// `ARGV[1..4]` and `ARGV[5..]` of lua/reap.lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReapArgs<'a> {
    /// Heartbeat timeout for a license without its own, ms.
    pub default_timeout_ms: u64,
    /// Most evictions, waiter removals, grants and re-delivered notes per step.
    pub limit: usize,
    /// Age after which an undelivered outbox note is handed out again, ms.
    pub redeliver_after_ms: u64,
    /// Where this pass stands in the outbox ([`OutboxCursor::start`] for its first step).
    pub outbox: &'a OutboxCursor,
    /// What the outage rule allows for (docs/operations.md, "The outage rule").
    pub outage: Outage,
}

/// What a reaper pass allows for under the outage rule (lua/reap.lua):
/// time the service was away is not counted against heartbeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outage {
    /// The read watermark, Redis ms: the time of the oldest request not yet
    /// decided in any requests stream (a heartbeat waiting there was sent
    /// in time); `None` when none waits.
    pub watermark_ms: Option<i64>,
    /// When service last resumed after a gap (Redis away or restarted, no
    /// reaper), Redis ms: every holder gets a whole heartbeat timeout after
    /// it; `None` for none known.
    pub resumed_at_ms: Option<i64>,
}

/// The lowest score of a license claimed by a reaper pass in the due index
/// (lua/due_claim.lua): 2^52, above every due time the scripts report (a
/// Redis clock plus at most a 15-digit heartbeat timeout), and low enough
/// that a claim's end added to it is still an exact double.
pub const DUE_CLAIM_BASE: i64 = 1 << 52;

/// One script call, ready to run alone or in a pipeline, decoding to `T`.
pub struct ScriptCall<'a, T> {
    /// Script name, for metrics and errors.
    name: &'static str,
    /// The FCALL invocation, KEYS and ARGV bound.
    invocation: Invocation<'a>,
    /// The decoder of this script's reply.
    decoder: fn(&'static str, Value) -> Result<T, Error>,
}

/// A call of acquire, release, heartbeat or revoke.
pub type SeatCall<'a> = ScriptCall<'a, Outcome>;

/// A seat script call being bound: the shared part done
/// ([`Scripts::request`]), the op's own ARGV to add.
pub struct SeatCallBuilder<'a> {
    /// Which script.
    name: ScriptName,
    /// The invocation so far.
    call: Invocation<'a>,
}

impl<'a> SeatCallBuilder<'a> {
    /// Adds the next KEYS, after the shared `KEYS[1..4]`.
    pub fn key<T: redis::ToRedisArgs>(mut self, key: T) -> SeatCallBuilder<'a> {
        self.call.key(key);
        self
    }

    /// Adds the next ARGV.
    pub fn arg<T: redis::ToRedisArgs>(mut self, arg: T) -> SeatCallBuilder<'a> {
        self.call.arg(arg);
        self
    }

    /// The call, its reply decoded as an [`Outcome`].
    pub fn finish(self) -> SeatCall<'a> {
        ScriptCall {
            name: self.name.as_str(),
            invocation: self.call,
            decoder: reply::decode_outcome,
        }
    }
}

/// A call of reap.
pub type ReapCall<'a> = ScriptCall<'a, Reaped>;

/// A call of delete_license.
pub type DeleteLicenseCall<'a> = ScriptCall<'a, Deleted>;

impl<T> ScriptCall<'_, T> {
    /// The script's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The FCALL command, for a pipeline (which does not load the library
    /// when Redis lost it: [`is_not_loaded`]).
    pub fn cmd(&self) -> redis::Cmd {
        self.invocation.cmd()
    }

    /// Runs the call on its own, loading the library when Redis lost it.
    pub async fn run<C: ConnectionLike>(&self, con: &mut C) -> Result<T, Error> {
        let result = self.invocation.invoke_async(con).await;
        self.decode(result)
    }

    /// Decodes this call's answer (from [`ScriptCall::run`] or a pipeline).
    pub fn decode(&self, result: redis::RedisResult<Value>) -> Result<T, Error> {
        result
            .map_err(Error::from)
            .and_then(|v| (self.decoder)(self.name, v))
    }
}

/// `ARGV[7]` of the request scripts (lua/includes/request.lua, `service()`):
/// the service's settings a seat call needs, in one argument, the same for
/// every call of a deployment, which the library parses once and keeps.
///
/// On one node it ends with `|` and [`queue_replies_arg`]: the scripts then
/// write their notes' queue replies themselves.
fn service_settings(guard: &Guard, args: &SessionArgs<'_>, events: &EventKeys) -> String {
    let mut settings = format!(
        "{}|{}|{}|{}|{}|{}|{}|{}",
        guard.session_limit,
        guard.license_limit,
        guard.window_ms,
        guard.dedupe_window_ms,
        args.default_heartbeat_timeout_ms,
        events.keep_ms,
        events.denials_window_ms,
        events.denials_per_window
    );
    let replies = queue_replies_arg(events);
    if !replies.is_empty() {
        settings.push('|');
        settings.push_str(&replies);
    }
    settings
}

/// The queue reply settings of the scripts on one node,
/// `<reply ttl>|<reply expiry>|<replies.prefix>`, or `""` on a cluster
/// (lua/includes/outbox.lua, `reply_conf_of`;
/// [`crate::engine::keys::QueueReplies`]).
fn queue_replies_arg(events: &EventKeys) -> String {
    events
        .queue_replies
        .as_ref()
        .map(|r| format!("{}|{}|{}", r.ttl_ms, r.expiry_ms, r.prefix))
        .unwrap_or_default()
}

/// Binds the events' license id and retention ARGV (lua/includes/events.lua)
/// of reap and delete_license, before their variable part.
fn bind_events(call: &mut Invocation<'_>, events: &EventKeys) {
    call.arg(&events.license).arg(events.keep_ms);
}

/// Binds `KEYS[1..2]` of every seat script (lua/includes/keys.lua): the
/// license record and where its events go. The script derives the
/// license's other keys from the first (issue 24: Redis 7 lets it touch
/// keys of the declared keys' slot); tests/it/scripts.rs checks that it
/// derives the names engine::keys gives.
fn license_keys<'a>(scripts: &'a Scripts, name: ScriptName, keys: &LicenseKeys) -> Invocation<'a> {
    let mut call = scripts.invoke(name);
    call.key(&keys.license) // KEYS[1]
        .key(&keys.events.target); // KEYS[2]
    call
}

impl Scripts {
    /// The process-wide registry.
    pub fn get() -> &'static Scripts {
        &SCRIPTS
    }

    /// Every script's function, as FCALL names them, in [`ScriptName`] order.
    pub fn functions(&self) -> Vec<&str> {
        self.functions.iter().map(String::as_str).collect()
    }

    /// Loads the library (`FUNCTION LOAD`; on a cluster, on every master),
    /// so that pipelines (which do not load it) can use it. On a Redis without
    /// functions, the error says seatgate needs Redis 7.0.
    pub async fn load_all<C: ConnectionLike>(&self, con: &mut C) -> Result<(), Error> {
        Ok(self.load(con).await?)
    }

    /// `FUNCTION LOAD` without `REPLACE`: the library's name carries the
    /// hash of its text, so a library of that name already there is this
    /// one, and Redis answers `already exists` before compiling anything.
    /// With `REPLACE` every worker start, and every worker that saw
    /// `Function not found` at once, compiled the whole library again,
    /// Redis busy for all of it (about 29 million instructions, counted
    /// by ops/callgrind.sh).
    async fn load<C: ConnectionLike>(&self, con: &mut C) -> redis::RedisResult<()> {
        match redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(&self.library)
            .query_async::<Value>(con)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_already_loaded(&e) => Ok(()),
            Err(e) => Err(too_old(e)),
        }
    }

    /// A seat script call of `name` with what every seat script shares
    /// (lua/includes/request.lua): the license's `KEYS[1..2]`, the guard's
    /// `KEYS[3..4]`, `ARGV[1..3]` and `ARGV[6]`, `args`, `ARGV[4..5]`, and the
    /// service's settings, `ARGV[7]` ([`service_settings`]). Each op's
    /// file in engine::ops binds its own ARGV after these with
    /// [`SeatCallBuilder::arg`].
    pub fn request(
        &self,
        name: ScriptName,
        keys: &LicenseKeys,
        guard: &Guard,
        args: &SessionArgs<'_>,
    ) -> SeatCallBuilder<'_> {
        let mut call = license_keys(self, name, keys);
        call.key(&guard.done_key) // KEYS[3]
            .key(&guard.done_before_key) // KEYS[4]
            .arg(&guard.entry_id) // ARGV[1]
            .arg(guard.done_until_ms) // ARGV[2]
            .arg(match (guard.redelivery, guard.by_request) {
                (_, true) => "2",
                (true, false) => "1",
                (false, false) => "0",
            }) // ARGV[3]
            .arg(args.session) // ARGV[4]
            .arg(args.lease.unwrap_or("")) // ARGV[5]
            .arg(guard.deadline_ms) // ARGV[6]
            .arg(service_settings(guard, args, &keys.events)); // ARGV[7]
        SeatCallBuilder { name, call }
    }

    /// lua/reap.lua: one bounded reaper step for one license.
    pub fn reap(&self, keys: &LicenseKeys, args: &ReapArgs<'_>) -> ReapCall<'_> {
        let mut call = license_keys(self, ScriptName::Reap, keys);
        call.arg(args.default_timeout_ms) // ARGV[1]
            .arg(args.limit) // ARGV[2]
            .arg(args.redeliver_after_ms) // ARGV[3]
            .arg(&args.outbox.cursor) // ARGV[4]
            .arg(args.outage.watermark_ms.unwrap_or(0)) // ARGV[5]
            .arg(args.outage.resumed_at_ms.unwrap_or(0)); // ARGV[6]
        bind_events(&mut call, &keys.events); // ARGV[7..8]
        call.arg(queue_replies_arg(&keys.events)); // ARGV[9]
        for id in &args.outbox.pending {
            call.arg(id); // ARGV[10..]
        }
        ScriptCall {
            name: ScriptName::Reap.as_str(),
            invocation: call,
            decoder: reply::decode_reaped,
        }
    }

    /// lua/delete_license.lua: deletes the license record and ends up to
    /// `limit` of its seats and `limit` of its waits; call again while the
    /// step says `more`.
    pub fn delete_license(&self, keys: &LicenseKeys, limit: usize) -> DeleteLicenseCall<'_> {
        let mut call = license_keys(self, ScriptName::DeleteLicense, keys);
        call.arg(limit); // ARGV[1]
        bind_events(&mut call, &keys.events); // ARGV[2..3]
        ScriptCall {
            name: ScriptName::DeleteLicense.as_str(),
            invocation: call,
            decoder: reply::decode_deleted,
        }
    }

    /// lua/reply.lua: XADD `fields` to the caller's `stream`, trim replies
    /// older than `keep_ms` (by the server's clock, never by count) and set
    /// its expiry to `expire_ms`, refusing keys that are not streams.
    pub async fn reply<C: ConnectionLike>(
        &self,
        con: &mut C,
        stream: &str,
        keep_ms: u64,
        expire_ms: u64,
        fields: &[(&str, String)],
    ) -> redis::RedisResult<()> {
        let mut call = self.invoke(ScriptName::Reply);
        call.key(stream) // KEYS[1]
            .arg(keep_ms) // ARGV[1]
            .arg(expire_ms); // ARGV[2]
        for (field, value) in fields {
            call.arg(*field).arg(value); // ARGV[3..]
        }
        call.invoke_async::<Value, _>(con).await.map(|_| ())
    }

    /// lua/put_license.lua: writes `set` and removes `remove` in the license
    /// record `record` only if it still holds exactly `read` (every field,
    /// as read). Returns whether it wrote.
    pub async fn put_license<C: ConnectionLike>(
        &self,
        con: &mut C,
        record: &str,
        read: &[(&String, &String)],
        set: &[(&String, &String)],
        remove: &[&String],
    ) -> redis::RedisResult<bool> {
        let mut call = self.invoke(ScriptName::PutLicense);
        call.key(record) // KEYS[1]
            .arg(read.len()); // ARGV[1]
        for (field, value) in read {
            call.arg(*field).arg(*value); // ARGV[2 .. 2n+1]
        }
        call.arg(set.len()); // ARGV[2n+2]
        for (field, value) in set {
            call.arg(*field).arg(*value); // ARGV[2n+3 .. 2n+2m+2]
        }
        for field in remove {
            call.arg(*field); // ARGV[2n+2m+3 ..]
        }
        let wrote: i64 = call.invoke_async(con).await?;
        Ok(wrote == 1)
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
        self.invoke(ScriptName::RemoveConsumer)
            .key(stream) // KEYS[1]
            .arg(group) // ARGV[1]
            .arg(consumer) // ARGV[2]
            .invoke_async(con)
            .await
    }

    /// lua/relay.lua: appends `entries` of `events`'s license log (each its
    /// seq and its fields and values, alternating) to its shard, those above
    /// the shard's cursor only. Returns the cursor afterwards: the seq up to
    /// which the log's entries are on the shard.
    pub async fn relay<C: ConnectionLike>(
        &self,
        con: &mut C,
        events: &EventKeys,
        keep_ms: u64,
        entries: &[(i64, &[Vec<u8>])],
    ) -> Result<i64, Error> {
        let mut call = self.invoke(ScriptName::Relay);
        call.key(&events.shard) // KEYS[1]
            .key(&events.cursor) // KEYS[2]
            .arg(&events.license) // ARGV[1]
            .arg(keep_ms); // ARGV[2]
        for (seq, fields) in entries {
            call.arg(seq).arg(fields.len() / 2); // ARGV[3..]
            for item in fields.iter() {
                call.arg(item.as_slice());
            }
        }
        Ok(call.invoke_async(con).await?)
    }

    /// lua/unlock.lua: delete `lock` only while it still holds `token`.
    pub async fn unlock<C: ConnectionLike>(
        &self,
        con: &mut C,
        lock: &str,
        token: &str,
    ) -> redis::RedisResult<i64> {
        self.invoke(ScriptName::Unlock)
            .key(lock) // KEYS[1]
            .arg(token) // ARGV[1]
            .invoke_async(con)
            .await
    }

    /// lua/due_claim.lua: takes up to `limit` licenses of due index shard
    /// `index` due before `now_ms` (or whose claim ran out), claiming them
    /// until `claim_end_ms`. Returns the claim's marker and the licenses.
    pub async fn due_claim<C: ConnectionLike>(
        &self,
        con: &mut C,
        index: &DueKeys,
        now_ms: i64,
        limit: usize,
        claim_end_ms: i64,
    ) -> Result<(i64, Vec<String>), Error> {
        let reply: Vec<String> = self
            .invoke(ScriptName::DueClaim)
            .key(&index.stale) // KEYS[1]
            .key(&index.due) // KEYS[2]
            .arg(now_ms) // ARGV[1]
            .arg(limit) // ARGV[2]
            .arg(claim_end_ms) // ARGV[3]
            .arg(DUE_CLAIM_BASE) // ARGV[4]
            .invoke_async(con)
            .await?;
        let mut reply = reply.into_iter();
        let marker = reply
            .next()
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| Error::ScriptReply {
                script: ScriptName::DueClaim.as_str(),
                detail: "no marker".to_owned(),
            })?;
        Ok((marker, reply.collect()))
    }

    /// lua/due_settle.lua: files each license's times (stale, due; 0 =
    /// none) in due index shard `index`, where it still carries `marker`;
    /// keeps the earlier time where one was filed meanwhile. Returns how
    /// many entries left the index.
    pub async fn due_settle<C: ConnectionLike>(
        &self,
        con: &mut C,
        index: &DueKeys,
        marker: i64,
        times: &[(&str, i64, i64)],
    ) -> redis::RedisResult<i64> {
        let mut call = self.invoke(ScriptName::DueSettle);
        call.key(&index.stale) // KEYS[1]
            .key(&index.due) // KEYS[2]
            .arg(marker); // ARGV[1]
        for (license, stale, due) in times {
            call.arg(*license).arg(*stale).arg(*due); // ARGV[2..]
        }
        call.invoke_async(con).await
    }

    /// lua/renew.lua: take `lock` for `ttl_ms` if free, or keep it while it holds `token`.
    pub async fn renew<C: ConnectionLike>(
        &self,
        con: &mut C,
        lock: &str,
        token: &str,
        ttl_ms: u64,
    ) -> redis::RedisResult<bool> {
        self.invoke(ScriptName::Renew)
            .key(lock) // KEYS[1]
            .arg(token) // ARGV[1]
            .arg(ttl_ms) // ARGV[2]
            .invoke_async(con)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_builds_and_no_include_is_left_unresolved() {
        assert!(Scripts::build().is_ok());
        for &script in ScriptName::VARIANTS {
            let name = script.as_str();
            assert!(
                includes::header_is_closed_on_its_own_line(script.text()),
                "{name}.lua: a ]] inside the header"
            );
            let text = script.source().unwrap();
            assert!(!text.contains("@include"), "{name}");
            assert!(text.contains("local rcall = redis.call"), "{name}");
        }
    }

    #[test]
    fn the_registry_is_indexed_by_script_name() {
        let scripts = Scripts::build().unwrap();
        for (i, &name) in ScriptName::VARIANTS.iter().enumerate() {
            assert_eq!(name as usize, i, "{name:?}");
            let function = format!("{}_{}", scripts.library_name(), name.as_str());
            assert_eq!(scripts.function(name), function, "{name:?}");
            let registered = format!("redis.register_function('{function}', function(keys, args)\n");
            let at = scripts.library().find(&registered).expect("registered");
            // Its body is its own file's (its header names it: in the
            // function, or above it with the helpers defined once).
            let header = format!("--[[\n  {}: ", name.as_str());
            let per_call = name.text().lines().any(|l| l == "--- @per_call");
            assert_eq!(scripts.library()[at..].contains(&header), !per_call, "{name:?}");
            assert_eq!(scripts.library()[..at].contains(&header), per_call, "{name:?}");
            assert!(name.text().starts_with(&header), "{name:?}");
        }
        assert_eq!(scripts.functions().len(), ScriptName::COUNT);
    }

    #[test]
    fn the_library_defines_each_helper_once_and_binds_each_call() {
        let scripts = Scripts::build().unwrap();
        let library = scripts.library();
        assert!(library.starts_with(&format!("#!lua name={}\n", scripts.library_name())));
        assert!(!library.contains("@include") && !library.contains("@on_call"));
        for helper in [
            "local function now_ms",
            "local function run_request",
            "local function promote",
            "local function bind_keys",
            "local function bind_events",
            "local function owners()",
        ] {
            assert_eq!(library.matches(helper).count(), 1, "{helper}");
        }
        // The scripts' own helpers above their `--- @per_call` line are
        // defined once too, before any function, and never inside one.
        let functions_start = library.find("redis.register_function(").expect("functions");
        for helper in [
            "local function enqueue",
            "local function redirect_waiter",
            "local function cooldown_of",
            "local function count_heartbeat",
            "local function holder_lease_refusal",
            "local function remember_revocation",
        ] {
            assert_eq!(library.matches(helper).count(), 1, "{helper}");
            assert!(library.find(helper) < Some(functions_start), "{helper}");
        }
        assert!(!library[..functions_start].contains("local rcall = redis.call"));
        // Lua 5.1 allows 200 locals in a function, the library's main chunk
        // among them: each top-level `local` name counts (group helpers into
        // tables, as owners() and policy() do, should it come near).
        let top_level_locals: usize = library[..functions_start]
            .lines()
            .filter_map(|l| l.strip_prefix("local "))
            .map(|rest| {
                let names = rest.split('=').next().unwrap_or("");
                match names.strip_prefix("function ") {
                    Some(_) => 1,
                    None => names.split(',').count(),
                }
            })
            .sum();
        assert!(
            top_level_locals < 180,
            "{top_level_locals} top-level locals in the library"
        );
        // Every function binds the call first, then the builtins; the
        // license's keys and the events where its script uses them.
        let bodies: Vec<&str> = library.split("redis.register_function(").skip(1).collect();
        assert_eq!(bodies.len(), ScriptName::COUNT);
        for (body, &name) in bodies.iter().zip(ScriptName::VARIANTS) {
            let prologue: Vec<&str> = body.lines().skip(1).take(4).collect();
            assert_eq!(
                prologue[0], "  rcall, KEYS, ARGV = redis.call, keys, args",
                "{name:?}"
            );
            // The builtins, bound by the first call (includes.rs).
            assert!(
                prologue[1].starts_with("  if not tonumber then tonumber, "),
                "{name:?}"
            );
            assert_eq!(prologue[2] == "  bind_keys()", name.is_seat(), "{name:?}");
            assert_eq!(prologue[3] == "  bind_events()", name.is_seat(), "{name:?}");
        }
        // The name follows the text: another text, another library.
        let hash = redis::Script::new(library).get_hash().to_owned();
        assert!(scripts.library_name().starts_with("seatgate_"));
        assert_ne!(&hash[..16], &scripts.library_name()["seatgate_".len()..]);
    }

    #[test]
    fn each_script_carries_only_the_helpers_it_uses() {
        let source = |name: ScriptName| name.source().unwrap();
        let reap = source(ScriptName::Reap);
        for helper in [
            "local function replay",
            "local function remember",
            "local function rate_limited",
            "local function run_request",
        ] {
            assert!(!reap.contains(helper), "reap.lua carries {helper}");
        }
        assert!(reap.contains("local function promote"));
        assert!(
            !reap.contains("local function forget_revocation"),
            "reap takes no revocation keys"
        );
        let heartbeat = source(ScriptName::Heartbeat);
        assert!(
            !heartbeat.contains("local function promote"),
            "heartbeat touches no queue"
        );
        assert!(heartbeat.contains("local function count_heartbeat"));
        assert!(reap.contains("local function grant_if_valid"));
        for script in [
            ScriptName::Acquire,
            ScriptName::Release,
            ScriptName::Heartbeat,
            ScriptName::Revoke,
        ] {
            let name = script.as_str();
            let text = source(script);
            assert!(text.contains("local function run_request"), "{name}");
            assert!(text.contains("local function forget_revocation"), "{name}");
            // A revoke is the administrator's way around a lease: it checks none.
            assert_eq!(
                text.contains("local function lease_refusal"),
                name != "revoke",
                "{name}"
            );
            assert_eq!(
                text.matches("local function now_ms").count(),
                1,
                "{name}: one copy per helper"
            );
            // A script names only the helpers it calls (in the library every
            // helper is built once, at load; run on its own, a helper named
            // needlessly would cost a closure on every run).
            assert_eq!(
                text.contains("local function seat_lease_refusal"),
                name == "acquire" || name == "release",
                "{name}"
            );
            assert_eq!(
                text.contains("local function remember_revocation"),
                name == "revoke",
                "{name}"
            );
            assert_eq!(
                text.contains("local function count_heartbeat"),
                name == "heartbeat",
                "{name}"
            );
            for helper in [
                "local function enqueue",
                "local function redirect_waiter",
                "local function cooldown_of",
            ] {
                assert_eq!(text.contains(helper), name == "acquire", "{name}: {helper}");
            }
            // Acquire decides its own grants; heartbeat grants nothing.
            assert_eq!(
                text.contains("local function grant_if_valid"),
                name == "release" || name == "revoke",
                "{name}"
            );
            // One parser of the owner record, outside the owners() builder.
            assert_eq!(text.matches("'^([^|]*)|([^|]*)|(%d+)$'").count(), 1, "{name}");
        }
        for &script in ScriptName::VARIANTS {
            assert_eq!(
                source(script).contains("local function bind_keys"),
                script.is_seat(),
                "{script:?}: a seat script takes the license keys"
            );
        }
    }

    #[test]
    fn entries_ahead_of_the_clock_are_placed_by_the_clock() {
        const W: u64 = 60_000;
        // Not ahead, or the clock unknown: by the id, one bucket.
        assert_eq!(placement(5 * W + 7, W, Some(9 * W)), (5, 5));
        assert_eq!(placement(5 * W + 7, W, None), (5, 5));
        assert_eq!(placement(u64::MAX, W, None), (u64::MAX / W, u64::MAX / W));
        // A little ahead: still by the id, and the bucket before may hold a
        // delivery made while it was further ahead.
        assert_eq!(placement(5 * W + 7, W, Some(5 * W)), (5, 4));
        // Far ahead: one window ahead of the clock, whatever the id says.
        let now = 1_796_013_949_007;
        let (bucket, before) = placement(9_999_999_999_999, W, Some(now));
        assert_eq!((bucket, before), ((now + W) / W, (now + W) / W - 1));
        assert_eq!(placement(u64::MAX, W, Some(u64::MAX - 1)).0, u64::MAX / W);
        // A delivery within a window of another finds its bucket.
        for delay in [0, 1, W / 2, W - 1, W] {
            let first = placement(9_999_999_999_999, W, Some(now)).0;
            let (b, before) = placement(9_999_999_999_999, W, Some(now + delay));
            assert!(first == b || first == before, "{delay}");
        }
    }

    #[test]
    fn a_guard_never_keeps_a_bucket_past_two_windows_of_the_clock() {
        let policy = GuardPolicy {
            dedupe_window_ms: 60_000,
            session_limit: 0,
            license_limit: 0,
            rate_window_ms: 1,
        };
        let keys = crate::engine::keys::Keys::new("seat");
        let now = 1_796_013_949_007;
        let g = Guard::for_entry_at(&policy, &keys, "9999999999999-0", "l", "s", Some(now));
        assert!(g.done_until_ms <= now + 3 * 60_000, "{}", g.done_until_ms);
        assert_ne!(g.done_key, g.done_before_key);
        let normal = Guard::for_entry_at(&policy, &keys, &format!("{}-0", now - 5), "l", "s", Some(now));
        assert_eq!(normal.done_key, normal.done_before_key);
        // An id no u64 holds counts as 0, as before.
        let odd = Guard::for_entry(&policy, &keys, "99999999999999999999999-0", "l", "s");
        assert_eq!(odd.done_key, keys.dedupe("l", 0));
    }

    #[test]
    fn a_deadline_counts_from_the_entry_and_a_chosen_id_buys_at_most_a_window() {
        const W: u64 = 60_000;
        let now = 1_796_013_949_007;
        assert_eq!(
            deadline("1796013949000-0", 0, W, Some(now)),
            0,
            "no ttl, no deadline"
        );
        // A redelivery, a claim: whenever it is read, the entry's own time counts.
        assert_eq!(
            deadline("1796013949000-0", 5_000, W, Some(now)),
            1_796_013_954_000
        );
        assert_eq!(
            deadline("1796013949000-0", 5_000, W, Some(now + 3_600_000)),
            1_796_013_954_000
        );
        assert_eq!(deadline("1796013949000-0", 5_000, W, None), 1_796_013_954_000);
        // Far ahead of the clock: as if added a window ahead of it.
        assert_eq!(deadline("9999999999999-0", 5_000, W, Some(now)), now + W + 5_000);
        assert_eq!(deadline("18446744073709551615-0", 5_000, W, None), u64::MAX);
    }

    #[test]
    fn a_request_keyed_by_its_id_is_placed_by_the_clock() {
        let policy = GuardPolicy {
            dedupe_window_ms: 60_000,
            session_limit: 0,
            license_limit: 0,
            rate_window_ms: 1,
        };
        let keys = crate::engine::keys::Keys::new("seat");
        let now = 1_796_013_949_007;
        // Two entries of one request, decided within a window of each other,
        // whichever first: the later decision looks where the earlier wrote.
        for (first, second) in [(now, now + 59_999), (now + 59_999, now + 60_000)] {
            let a = Guard::for_request(&policy, &keys, "A|s|r", "1796013940000-0", "l", "s", Some(first));
            let b = Guard::for_request(&policy, &keys, "A|s|r", "1796013990000-0", "l", "s", Some(second));
            assert!(b.done_key == a.done_key || b.done_before_key == a.done_key);
            assert!(a.by_request && a.done_key != a.done_before_key);
            assert!(a.done_until_ms >= first + 60_000);
        }
        // The clock unknown: the entry's time.
        let blind = Guard::for_request(&policy, &keys, "A|s|r", "1796013940000-0", "l", "s", None);
        assert_eq!(blind.done_key, keys.dedupe("l", 1_796_013_940_000 / 60_000));
    }

    #[test]
    fn a_script_name_outside_the_registry_is_an_error() {
        assert!("nope".parse::<ScriptName>().is_err());
        for &name in ScriptName::VARIANTS {
            assert_eq!(name.as_str().parse::<ScriptName>(), Ok(name));
        }
    }
}
