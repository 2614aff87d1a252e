//! The embedded Lua registry and one typed call per script.
//!
//! Each script under `lua/` is compiled into the binary and, when the
//! registry is first used, assembled with the helpers its `--- @include
//! "name"` lines name (`lua/includes/`) into one Redis function library
//! (scripts/includes.rs, `includes::library`): every helper defined once at
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

use crate::error::Error;
use crate::keys::{DueKeys, EventKeys, LicenseKeys};
use crate::protocol::MAX_FIELDS;
use crate::request::guard::Guard;

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
    /// lua/group_map.lua
    GroupMap,
    /// lua/relay.lua
    Relay,
    /// lua/read.lua
    Read,
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

    /// Whether the script takes a license's keys and records its events
    /// (includes/keys.lua, includes/events.lua): the seat scripts, and the
    /// admin scripts that record the admin trail (put_license, group_map).
    pub fn takes_license_keys(self) -> bool {
        self.is_seat() || matches!(self, ScriptName::PutLicense | ScriptName::GroupMap)
    }

    /// The script file, before its includes are resolved.
    fn text(self) -> &'static str {
        match self {
            ScriptName::Acquire => include_str!("../lua/acquire.lua"),
            ScriptName::Release => include_str!("../lua/release.lua"),
            ScriptName::Heartbeat => include_str!("../lua/heartbeat.lua"),
            ScriptName::Revoke => include_str!("../lua/revoke.lua"),
            ScriptName::Reap => include_str!("../lua/reap.lua"),
            ScriptName::Reply => include_str!("../lua/reply.lua"),
            ScriptName::RemoveConsumer => include_str!("../lua/remove_consumer.lua"),
            ScriptName::Unlock => include_str!("../lua/unlock.lua"),
            ScriptName::Renew => include_str!("../lua/renew.lua"),
            ScriptName::DueClaim => include_str!("../lua/due_claim.lua"),
            ScriptName::DueSettle => include_str!("../lua/due_settle.lua"),
            ScriptName::DeleteLicense => include_str!("../lua/delete_license.lua"),
            ScriptName::PutLicense => include_str!("../lua/put_license.lua"),
            ScriptName::GroupMap => include_str!("../lua/group_map.lua"),
            ScriptName::Relay => include_str!("../lua/relay.lua"),
            ScriptName::Read => include_str!("../lua/read.lua"),
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

/// What Redis holds under the library's name ([`Scripts::library_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibraryState {
    /// This build's library.
    Ours,
    /// No library of that name (a fresh Redis, `FUNCTION FLUSH`): load it.
    Missing,
    /// A library of that name whose code is not this build's.
    Foreign,
}

/// The state of library `name` in a `FUNCTION LIST ... WITHCODE` reply: each
/// library is a list (RESP2) or map (RESP3) of `library_name`,
/// `library_code` and other fields; LIBRARYNAME is a pattern, so only an
/// exact name counts.
fn library_in(listed: &Value, name: &str, ours: &str) -> LibraryState {
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        _ => None,
    };
    let pairs = |lib: &Value| -> Vec<(String, Value)> {
        match lib {
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|kv| Some((text(kv.first()?)?, kv.get(1)?.clone())))
                .collect(),
            Value::Map(kvs) => kvs
                .iter()
                .filter_map(|(k, v)| Some((text(k)?, v.clone())))
                .collect(),
            _ => Vec::new(),
        }
    };
    let Value::Array(libraries) = listed else {
        return LibraryState::Missing;
    };
    for lib in libraries {
        let fields = pairs(lib);
        let field = |key: &str| fields.iter().find(|(k, _)| k == key).and_then(|(_, v)| text(v));
        if field("library_name").as_deref() == Some(name) {
            return if field("library_code").as_deref() == Some(ours) {
                LibraryState::Ours
            } else {
                LibraryState::Foreign
            };
        }
    }
    LibraryState::Missing
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
    } else if e.code() == Some("NOPERM") && e.detail().is_some_and(|d| d.contains("function|load")) {
        // Only the worker's ACL user may load the library (the shipped ACL):
        // an administrator's command on a Redis no worker has loaded it on.
        RedisError::from((
            redis::ErrorKind::Client,
            "the seat library is not loaded on this Redis, and this ACL user may not load it: start a worker (`seatgate run`), which loads it, then try again",
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
    /// `queue.claim_ms`: how long a session granted a seat from the queue has
    /// to claim it with a heartbeat (0 = no claim window).
    pub claim_ms: u64,
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
    /// The claim window (ms) of a grant made on the way, `queue.claim_ms`
    /// (lua/includes/queue.lua, claim_score; 0 = none).
    pub default_claim_ms: u64,
}

/// `ARGV[1..4]` and `ARGV[5..]` of lua/reap.lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReapArgs<'a> {
    /// Heartbeat timeout for a license without its own, ms.
    pub default_timeout_ms: u64,
    /// Claim window of a grant, `queue.claim_ms` (0 = none).
    pub default_claim_ms: u64,
    /// Most evictions, waiter removals, grants and re-delivered notes per step.
    pub limit: usize,
    /// Age after which an undelivered outbox note is handed out again, ms.
    pub redeliver_after_ms: u64,
    /// Where this pass stands in the outbox ([`OutboxCursor::start`] for its first step).
    pub outbox: &'a OutboxCursor,
    /// What the outage rule allows for (docs/failure-modes.md, "The outage rule").
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

/// One page of a requests stream for [`Scripts::read`].
#[derive(Debug, Clone, Copy)]
pub struct ReadPage<'a> {
    /// The requests stream.
    pub stream: &'a str,
    /// Its consumer group.
    pub group: &'a str,
    /// The consumer reading.
    pub consumer: &'a str,
    /// The most entries.
    pub count: usize,
    /// `limits.max_entry_bytes`.
    pub max_entry_bytes: usize,
    /// Which entries.
    pub from: ReadFrom<'a>,
}

/// Which entries a [`ReadPage`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom<'a> {
    /// Entries never delivered (XREADGROUP `>`).
    New,
    /// The consumer's own pending entries (XREADGROUP `0`).
    Pending,
    /// Entries pending with any consumer for at least `min_idle_ms`, from
    /// `cursor` on (XAUTOCLAIM).
    Claim {
        /// XAUTOCLAIM's min-idle-time.
        min_idle_ms: u64,
        /// Where this page of the sweep starts.
        cursor: &'a str,
    },
}

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

/// What lua/put_license.lua is asked to write ([`Scripts::put_license`]).
#[derive(Debug, Clone)]
pub struct PutLicense<'a> {
    /// Who makes the change (the `license_put` event's `actor`).
    pub actor: &'a str,
    /// The event's `before`: the changed fields as read, a JSON object.
    pub before: String,
    /// The event's `after`: the changed fields as written, a JSON object.
    pub after: String,
    /// Every field of the record as read (the compare-and-set's expectation).
    pub read: &'a [(&'a String, &'a String)],
    /// The fields to write.
    pub set: &'a [(&'a String, &'a String)],
    /// The fields to remove.
    pub remove: &'a [&'a String],
}

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
    let app = &guard.application;
    let mut settings = format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
        guard.session_limit,
        guard.license_limit,
        guard.window_ms,
        guard.dedupe_window_ms,
        args.default_heartbeat_timeout_ms,
        events.keep_ms,
        events.denials_window_ms,
        events.denials_per_window,
        app.requests,
        app.sessions,
        app.waiters,
        args.default_claim_ms
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
/// [`crate::keys::QueueReplies`]).
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

    /// What Redis holds under this library's name (`FUNCTION LIST
    /// LIBRARYNAME <name> WITHCODE`): this build's text, nothing, or another
    /// text under the same name. Another text means someone with
    /// `FUNCTION LOAD REPLACE` put their own code where the workers' calls
    /// go: the worker refuses to serve until it is this build's again.
    /// (On a cluster the node asked is the one redis-rs routes to.)
    pub async fn library_state<C: ConnectionLike>(&self, con: &mut C) -> Result<LibraryState, Error> {
        let listed: Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(&self.name)
            .arg("WITHCODE")
            .query_async(con)
            .await
            .map_err(too_old)?;
        Ok(library_in(&listed, &self.name, &self.library))
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
    /// service's settings, `ARGV[7]` (`service_settings`). Each op's
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
        call.arg(queue_replies_arg(&keys.events)) // ARGV[9]
            .arg(args.default_claim_ms); // ARGV[10]
        for id in &args.outbox.pending {
            call.arg(id); // ARGV[11..]
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
    /// `actor` is who deletes it, for the `license_deleted` event.
    pub fn delete_license(&self, keys: &LicenseKeys, limit: usize, actor: &str) -> DeleteLicenseCall<'_> {
        let mut call = license_keys(self, ScriptName::DeleteLicense, keys);
        call.arg(limit); // ARGV[1]
        bind_events(&mut call, &keys.events); // ARGV[2..3]
        call.arg(actor); // ARGV[4]
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

    /// lua/put_license.lua: writes `change.set` and removes `change.remove`
    /// in the license record of `keys` only if it still holds exactly
    /// `change.read` (every field, as read), and records the change's
    /// `license_put` event. Returns whether it wrote.
    pub async fn put_license<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        change: &PutLicense<'_>,
    ) -> redis::RedisResult<bool> {
        let mut call = license_keys(self, ScriptName::PutLicense, keys); // KEYS[1..2]
        bind_events(&mut call, &keys.events); // ARGV[1..2]
        call.arg(change.actor) // ARGV[3]
            .arg(&change.before) // ARGV[4]
            .arg(&change.after) // ARGV[5]
            .arg(change.read.len()); // ARGV[6]
        for (field, value) in change.read {
            call.arg(*field).arg(*value); // ARGV[7 .. 2n+6]
        }
        call.arg(change.set.len()); // ARGV[2n+7]
        for (field, value) in change.set {
            call.arg(*field).arg(*value); // ARGV[2n+8 .. 2n+2m+7]
        }
        for field in change.remove {
            call.arg(*field); // ARGV[2n+2m+8 ..]
        }
        let wrote: i64 = call.invoke_async(con).await?;
        Ok(wrote == 1)
    }

    /// lua/group_map.lua: puts `user` in `group` of the license's group map
    /// (`None`: takes the user out) and records the `groups_changed` event
    /// by `actor` when that changed the map. Returns the user's group before.
    pub async fn group_map<C: ConnectionLike>(
        &self,
        con: &mut C,
        keys: &LicenseKeys,
        actor: &str,
        user: &str,
        group: Option<&str>,
    ) -> redis::RedisResult<Option<String>> {
        let mut call = license_keys(self, ScriptName::GroupMap, keys); // KEYS[1..2]
        bind_events(&mut call, &keys.events); // ARGV[1..2]
        call.arg(actor) // ARGV[3]
            .arg(user) // ARGV[4]
            .arg(group.unwrap_or("")); // ARGV[5]
        call.invoke_async(con).await
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

    /// lua/read.lua: one page of `page.stream` for `page.consumer`, every
    /// entry over `page.max_entry_bytes` or [`MAX_FIELDS`] fields cut down
    /// to a stub ([`crate::protocol::OVERSIZE_FIELD`]). Returns what XREADGROUP (or, for
    /// [`ReadFrom::Claim`], XAUTOCLAIM) returns for the stream.
    pub async fn read<C: ConnectionLike>(
        &self,
        con: &mut C,
        page: &ReadPage<'_>,
    ) -> redis::RedisResult<Value> {
        let mut call = self.invoke(ScriptName::Read);
        call.key(page.stream) // KEYS[1]
            .arg(page.group) // ARGV[1]
            .arg(page.consumer) // ARGV[2]
            .arg(page.count) // ARGV[3]
            .arg(page.max_entry_bytes) // ARGV[4]
            .arg(MAX_FIELDS); // ARGV[5]
        match page.from {
            ReadFrom::New => call.arg("new"),
            ReadFrom::Pending => call.arg("pending"),
            ReadFrom::Claim { min_idle_ms, cursor } => call.arg("claim").arg(min_idle_ms).arg(cursor),
        };
        call.invoke_async(con).await
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
            assert_eq!(
                prologue[2] == "  bind_keys()",
                name.takes_license_keys(),
                "{name:?}"
            );
            assert_eq!(
                prologue[3] == "  bind_events()",
                name.takes_license_keys(),
                "{name:?}"
            );
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
            "heartbeat changes no queue"
        );
        assert!(heartbeat.contains("local function waiter_record"));
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
                script.takes_license_keys(),
                "{script:?}: a seat or admin script takes the license keys"
            );
        }
    }

    /// The statuses a script's header says it returns (its "Returns" block:
    /// each status that starts a line there, and those joined by ` | `).
    fn header_statuses(script: ScriptName) -> std::collections::BTreeSet<&'static str> {
        let text = script.text();
        let header = &text[..text.find("]]").unwrap_or(text.len())];
        let returns = header.find("Returns").map_or("", |at| &header[at..]);
        let mut found = std::collections::BTreeSet::new();
        for line in returns.lines().skip(1) {
            let line = line.trim_start();
            let first = line.split_whitespace().next().unwrap_or("");
            let mut words = vec![first];
            if line.contains(" | ") {
                words.extend(line.split(|c: char| c == '|' || c.is_whitespace()));
            }
            for word in words {
                if let Some(status) = crate::status::Status::ALL.iter().find(|s| s.as_str() == word) {
                    found.insert(status.as_str());
                }
            }
        }
        found
    }

    #[test]
    fn each_ops_statuses_are_the_ones_its_scripts_header_lists() {
        use crate::request::Op;
        use crate::status::Status;
        for &op in Op::ALL {
            let script = match op {
                Op::Acquire => ScriptName::Acquire,
                Op::Release => ScriptName::Release,
                Op::Heartbeat => ScriptName::Heartbeat,
                Op::Revoke => ScriptName::Revoke,
            };
            let mut listed = header_statuses(script);
            // ERROR is the worker's (a dead-lettered request), never a script's.
            listed.insert(Status::Error.as_str());
            let ours: std::collections::BTreeSet<&str> = op.statuses().iter().map(|s| s.as_str()).collect();
            assert_eq!(
                ours,
                listed,
                "{op}: the op's STATUSES against lua/{}.lua's header",
                script.as_str()
            );
        }
    }

    #[test]
    fn a_script_name_outside_the_registry_is_an_error() {
        assert!("nope".parse::<ScriptName>().is_err());
        for &name in ScriptName::VARIANTS {
            assert_eq!(name.as_str().parse::<ScriptName>(), Ok(name));
        }
    }
}
