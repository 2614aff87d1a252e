//! The ops a request can ask for, one file each (as mini-redis keeps
//! `cmd/<command>.rs`; release and heartbeat, which take the same fields,
//! share `session.rs`): an op's file owns its request fields, their parsing,
//! the script call that decides it and the statuses it can answer with.
//! This file holds what they share: the [`Op`] names, the stream each is
//! accepted on, the [`Request`] (common fields plus one [`Action`]) and the
//! entry parser that dispatches to each op's own.
//!
//! Adding an op: its variant in [`Op`] and [`Action`], its file here, its
//! script under `lua/` (`crate::scripts`), its arm in [`Request::call`];
//! docs/protocol.md. The metric label sets and the parser's messages
//! follow from [`Op::ALL`] and [`Op::statuses`].

pub mod acquire;
mod fields;
pub mod guard;
pub mod revoke;
pub mod session;

use std::fmt;

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::keys::{Keys, LicenseKeys};
use crate::protocol::{Echo, Invalid, Lease, RequestField, Rules};
use crate::scripts::{ScriptName, Scripts, SeatCall, ServiceDefaults};
use crate::status::Status;
use fields::{
    check_sizes, check_unique, echo_valid_parts, parse_id, parse_reply_to, parse_request_id, parse_stored_id,
    parse_ttl_ms, salvage_echo, truncate, Fields, Refusal,
};
pub use guard::{deadline, ApplicationLimits, Guard, GuardPolicy};

pub use acquire::{Acquire, AcquireArgs};
pub use revoke::{Revoke, RevokeArgs, UNKNOWN_ACTOR};
pub use session::SessionFields;

/// What a request asks for.
///
/// The wire form, which is also the script's name, is the variant's name in
/// snake_case, derived; `FromStr` accepts exactly those strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Op {
    /// Take a seat (idempotent per session).
    Acquire,
    /// Give the session's seat back.
    Release,
    /// Keep the session's seat alive.
    Heartbeat,
    /// Take a session's seat (or place in the queue) away: an
    /// administrator's op, accepted on the admin stream only.
    Revoke,
}

impl Op {
    /// Every op, in declaration order, for metric labels, messages and tests.
    /// Derived: a new variant is in it without anyone remembering to add it.
    pub const ALL: &'static [Op] = <Op as VariantArray>::VARIANTS;

    /// The op as written on the wire (and used as the script name).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The op in a dedupe record's key (lua/includes/dedupe.lua): one
    /// letter, so that a record stays small.
    fn key_letter(self) -> char {
        match self {
            Op::Acquire => 'A',
            Op::Release => 'R',
            Op::Heartbeat => 'H',
            Op::Revoke => 'V',
        }
    }

    /// The stream an op is accepted on.
    pub fn lane(self) -> Lane {
        match self {
            Op::Acquire | Op::Release | Op::Heartbeat => Lane::Requests,
            Op::Revoke => Lane::Admin,
        }
    }

    /// Every status a request of this op can be answered with (its script's
    /// header lists the same), present at 0 in the request metrics from startup.
    pub fn statuses(self) -> &'static [Status] {
        match self {
            Op::Acquire => acquire::STATUSES,
            Op::Release => session::RELEASE_STATUSES,
            Op::Heartbeat => session::HEARTBEAT_STATUSES,
            Op::Revoke => revoke::STATUSES,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which stream an entry was read from: each takes its own ops, so that the
/// ACL that lets a service XADD requests does not let it revoke others' seats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The requests stream (`stream.requests`, or its shards): acquire,
    /// release, heartbeat.
    Requests,
    /// The admin stream (`stream.admin_requests`): revoke.
    Admin,
}

impl Lane {
    /// How messages name the stream.
    fn describe(self) -> &'static str {
        match self {
            Lane::Requests => "the requests stream (stream.requests)",
            Lane::Admin => "the admin stream (stream.admin_requests)",
        }
    }
}

/// Where a request was read: its stream and its entry there. Entry ids are
/// unique per stream only, so the dedupe key of a request without a caller
/// id names both ([`EntryAt::key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryAt<'a> {
    /// The stream's lane.
    pub lane: Lane,
    /// What tells the requests stream the entry was read from apart
    /// (`Settings::stream_tag`): its shard `<i>`, or `app:<app>` /
    /// `app:<app>:<i>` for an application's own stream (or shard); `None`
    /// for the base requests stream (the only one when unsharded) and the
    /// admin stream.
    pub stream: Option<&'a str>,
    /// The stream entry id.
    pub id: &'a str,
}

impl EntryAt<'_> {
    /// The dedupe key of a request read here without a caller id: the entry
    /// id as it is on the base requests stream (what every record was before
    /// shards and admin entries had to be told apart, and the smallest),
    /// `<shard>:<id>` on a shard, `app:<app>:<id>` (`app:<app>:<shard>:<id>`)
    /// on an application's stream (shard), `admin:<id>` on the admin stream:
    /// no entry of one stream can pass for another's, whatever id a client
    /// gives its XADD.
    pub fn key(&self) -> String {
        match (self.lane, self.stream) {
            (Lane::Admin, _) => format!("admin:{}", self.id),
            (Lane::Requests, Some(tag)) => format!("{tag}:{}", self.id),
            (Lane::Requests, None) => self.id.to_owned(),
        }
    }
}

/// A well-formed request: what every op carries, and the op with its own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The caller's request id, echoed in the reply; the stream entry id when
    /// the caller sent none.
    pub id: String,
    /// Whether the caller sent `id`: then the request is known by it (with
    /// its op, session and lease) whatever entry it arrives as, so the same
    /// request sent twice is decided once ([`Request::guard`]).
    pub id_sent: bool,
    /// How long after its stream entry was added the request may still be
    /// decided, ms (0 = no limit): its `ttl_ms`, at most
    /// `requests.max_ttl_ms`, or `requests.default_ttl_ms` without one.
    pub ttl_ms: u64,
    /// The license id (safe charset, no braces: it becomes a hash tag).
    pub license: String,
    /// The session id (safe charset), as the scripts key it: once the
    /// worker knows the request's application ([`Request::qualify`]),
    /// `<application>/<session>`.
    pub session: String,
    /// The application the request is from, as the server knows it (the
    /// stream it was read from), never as a field says; `None` for the
    /// shared stream and the admin stream ([`crate::tenancy`]).
    pub application: Option<String>,
    /// Stream key to XADD the reply to; `None` for fire-and-forget requests.
    pub reply_to: Option<String>,
    /// What to do, with the fields only that op has.
    pub action: Action,
}

/// An op with its own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Take a seat, or wait for one.
    Acquire(Acquire),
    /// Give the seat (or place in the queue) back.
    Release(SessionFields),
    /// Keep the seat alive.
    Heartbeat(SessionFields),
    /// An administrator takes the seat (or place) away.
    Revoke(Revoke),
}

impl Action {
    /// Which op this is.
    pub fn op(&self) -> Op {
        match self {
            Action::Acquire(_) => Op::Acquire,
            Action::Release(_) => Op::Release,
            Action::Heartbeat(_) => Op::Heartbeat,
            Action::Revoke(_) => Op::Revoke,
        }
    }
}

impl Request {
    /// Which op this is.
    pub fn op(&self) -> Op {
        self.action.op()
    }

    /// Makes this request application `app`'s, as the server knows it (the
    /// stream it was read from): its session becomes `<app>/<session>`, and
    /// an acquire's user and group `<app>/<id>` unless `shared_identity`
    /// (the application is trusted to speak for users and groups every
    /// application shares, `tenancy.shared_identity`). Nothing a request
    /// says can name another application's session, user or group.
    pub fn qualify(&mut self, app: &str, shared_identity: bool) {
        self.session = crate::tenancy::qualify(app, &self.session);
        if let Action::Acquire(a) = &mut self.action {
            if !shared_identity {
                for id in [&mut a.policy.user, &mut a.policy.group].into_iter().flatten() {
                    *id = crate::tenancy::qualify(app, id);
                }
            }
        }
        self.application = Some(app.to_owned());
    }

    /// The session as its caller sent it, which its reply echoes.
    pub fn caller_session(&self) -> &str {
        match self.application {
            Some(_) => crate::tenancy::unqualified(&self.session),
            None => &self.session,
        }
    }

    /// The lease the request carries, if its op carries one: an acquire
    /// binds the seat to it, a heartbeat or release must carry the one bound.
    pub fn lease(&self) -> Option<&Lease> {
        match &self.action {
            Action::Acquire(a) => a.lease.as_ref(),
            Action::Release(s) | Action::Heartbeat(s) => s.lease.as_ref(),
            Action::Revoke(_) => None,
        }
    }

    /// The guard this request is decided under when read at `entry`, the
    /// Redis clock reading about `redis_now_ms` (if known): keyed by the
    /// caller's id when it sent one, else by its stream and entry; its
    /// deadline from the entry's time and its `ttl_ms`; always looking for
    /// an earlier answer (even a first delivery may have been decided by a
    /// worker that stalled past `claim_idle_ms` and had its batch claimed).
    pub fn guard(
        &self,
        policy: &GuardPolicy,
        keys: &Keys,
        entry: EntryAt<'_>,
        redis_now_ms: Option<u64>,
    ) -> Guard {
        let (license, session) = (self.license.as_str(), self.session.as_str());
        let mut guard = if self.id_sent {
            let key = format!("{}|{session}|{}", self.op().key_letter(), self.id);
            Guard::for_request(policy, keys, &key, entry.id, license, session, redis_now_ms)
        } else {
            // An entry id far ahead of the Redis clock is placed by the clock.
            let mut guard = Guard::for_entry_at(policy, keys, entry.id, license, session, redis_now_ms);
            guard.entry_id = entry.key();
            guard
        };
        guard.redelivery = true;
        guard.deadline_ms = deadline(entry.id, self.ttl_ms, policy.dedupe_window_ms, redis_now_ms);
        guard
    }

    /// The script call that decides this request on the license's `keys`,
    /// deduplicated and rate limited by `guard`.
    pub fn call<'s>(
        &self,
        scripts: &'s Scripts,
        keys: &LicenseKeys,
        guard: &Guard,
        defaults: &ServiceDefaults,
    ) -> SeatCall<'s> {
        let session = self.session.as_str();
        match &self.action {
            Action::Acquire(a) => {
                let reply_to = self.reply_to.as_deref().unwrap_or("");
                a.call(scripts, keys, guard, session, (&self.id, reply_to), defaults)
            }
            Action::Release(s) => s.call(ScriptName::Release, scripts, keys, guard, session, defaults),
            Action::Heartbeat(s) => s.call(ScriptName::Heartbeat, scripts, keys, guard, session, defaults),
            Action::Revoke(r) => r.call(scripts, keys, guard, session, defaults),
        }
    }
}

/// Parses one entry of the requests stream: [`parse_entry`] on [`Lane::Requests`].
pub fn parse_request(
    entry_id: &str,
    pairs: &[(String, Vec<u8>)],
    rules: &Rules<'_>,
) -> Result<Request, Invalid> {
    parse_entry(Lane::Requests, entry_id, pairs, rules)
}

/// Parses one stream entry read from `lane`. `entry_id` is the stream entry
/// id, used as the request id when the caller sent none. `rules` are the
/// settings the parser obeys (reply namespace, required lease, entry size).
pub fn parse_entry(
    lane: Lane,
    entry_id: &str,
    pairs: &[(String, Vec<u8>)],
    rules: &Rules<'_>,
) -> Result<Request, Invalid> {
    let mut echo = Echo {
        id: entry_id.to_owned(),
        ..Echo::default()
    };
    // Sizes first, read off the lengths alone: nothing of an oversized entry
    // is decoded, hashed or parsed, only its small addressing fields.
    if let Err(refusal) = check_sizes(pairs, rules.max_entry_bytes) {
        salvage_echo(pairs, rules.reply_prefix, &mut echo);
        return Err(refusal.answer(echo));
    }
    let fields = Fields::collect(pairs);
    parse_fields(lane, &fields, rules, &mut echo).map_err(|refusal| refusal.answer(echo))
}

/// The checks in their documented order (docs/protocol.md, "Invalid
/// requests"), after the sizes: the first problem found is the one
/// reported, so the order decides what a request with several problems is
/// told. Each step that passes adds to `echo` what a later refusal is
/// answered with. The common fields come first, then the op's own parser.
fn parse_fields(lane: Lane, fields: &Fields, rules: &Rules<'_>, echo: &mut Echo) -> Result<Request, Refusal> {
    // Reply address first, so that every later refusal can be answered.
    let reply_to = parse_reply_to(fields, rules.reply_prefix)?;
    echo.reply_to = reply_to.clone();
    let id_sent = if let Some(id) = parse_request_id(fields)? {
        echo.id = id.to_owned();
        true
    } else {
        false
    };
    check_unique(fields)?;
    echo_valid_parts(fields, echo);
    let op = parse_op(fields, lane)?;
    let license = parse_id(fields, RequestField::License)?;
    // A service names its own sessions; an administrator names any, an
    // application's as `<application>/<session>` (crate::tenancy).
    let session = match lane {
        Lane::Requests => parse_id(fields, RequestField::Session)?,
        Lane::Admin => parse_stored_id(fields, RequestField::Session)?,
    };
    let ttl_ms = parse_ttl_ms(fields, rules)?;
    let action = match op {
        Op::Acquire => Action::Acquire(Acquire::parse(fields, rules)?),
        Op::Release => Action::Release(SessionFields::parse(fields, rules)?),
        Op::Heartbeat => Action::Heartbeat(SessionFields::parse(fields, rules)?),
        Op::Revoke => Action::Revoke(Revoke::parse(fields)?),
    };
    Ok(Request {
        id: echo.id.clone(),
        id_sent,
        ttl_ms,
        license,
        session,
        application: None,
        reply_to,
        action,
    })
}

/// The op, by its wire form, if `lane` takes it; the messages list the ops
/// [`Op`] knows for that lane.
fn parse_op(fields: &Fields, lane: Lane) -> Result<Op, Refusal> {
    let op: Op = match fields.text(RequestField::Op) {
        None => {
            return Err(Refusal::new(
                RequestField::Op,
                format!("missing field `op` ({})", op_choices(lane)),
            ))
        }
        Some(Err(_)) => return Err(Refusal::new(RequestField::Op, "field `op` is not UTF-8")),
        Some(Ok(s)) => s.parse().map_err(|_| {
            Refusal::new(
                RequestField::Op,
                format!("unknown op {:?}; expected {}", truncate(s), op_choices(lane)),
            )
        })?,
    };
    if op.lane() != lane {
        return Err(Refusal::new(
            RequestField::Op,
            format!(
                "op `{op}` is not accepted on {}, only on {}",
                lane.describe(),
                op.lane().describe()
            ),
        ));
    }
    Ok(op)
}

/// The ops of `lane` as the messages list them: "acquire, release or heartbeat".
fn op_choices(lane: Lane) -> String {
    let ops: Vec<&str> = Op::ALL
        .iter()
        .filter(|op| op.lane() == lane)
        .map(|op| op.as_str())
        .collect();
    match ops.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod hostile;

#[cfg(test)]
mod tests;
