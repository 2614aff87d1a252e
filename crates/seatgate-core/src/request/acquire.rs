//! `acquire`: take a seat, or wait in the license's queue for one
//! (lua/acquire.lua). Its fields: `meta`, `wait_ms`, `lease` and who asks
//! (`user`, `group`, `priority`, `borrow_ms`).

use super::guard::Guard;
use crate::keys::LicenseKeys;
use crate::policy::RequestPolicy;
use crate::protocol::{Lease, RequestField, Rules, MAX_META_DEPTH};
use crate::scripts::{ScriptName, Scripts, SeatCall, ServiceDefaults, SessionArgs};
use crate::status::Status;

use super::fields::{parse_lease, parse_policy, parse_wait_ms, Fields, Refusal};

/// The statuses an acquire can be answered with (lua/acquire.lua's header).
pub(super) const STATUSES: &[Status] = &[
    Status::Acquired,
    Status::AlreadyActive,
    Status::NoSeatsAvailable,
    Status::Queued,
    Status::LicenseNotFound,
    Status::LicenseInactive,
    Status::LicenseExpired,
    Status::LicenseInvalid,
    Status::LeaseMismatch,
    Status::RateLimited,
    Status::LimitReached,
    Status::SessionRevoked,
    Status::RequestExpired,
    Status::Error,
];

/// An acquire's own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    /// Session metadata, a compact JSON object (`{}` when none was sent).
    pub meta: String,
    /// How long to wait in the queue for a seat, in ms (0 = do not wait).
    pub wait_ms: u64,
    /// Who asks: user and group for the license's per-user and per-group
    /// policies, queue priority, borrow.
    pub policy: RequestPolicy,
    /// The lease the seat (or place in the queue) is bound to.
    pub lease: Option<Lease>,
}

impl Acquire {
    /// Reads an acquire's fields, in the documented order: `meta`,
    /// `wait_ms`, `lease`, then who asks.
    pub(super) fn parse(fields: &Fields, rules: &Rules<'_>) -> Result<Acquire, Refusal> {
        let meta = parse_meta(fields)?;
        let wait_ms = parse_wait_ms(fields)?;
        let lease = parse_lease(fields, rules.require_lease)?;
        let policy = parse_policy(fields)?;
        Ok(Acquire {
            meta,
            wait_ms,
            policy,
            lease,
        })
    }

    /// The lua/acquire.lua call for `session`; `(request_id, reply_to)` is
    /// what a later GRANTED or QUEUE_TIMEOUT is addressed with.
    pub(super) fn call<'s>(
        &self,
        scripts: &'s Scripts,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
        (request_id, reply_to): (&str, &str),
        defaults: &ServiceDefaults,
    ) -> SeatCall<'s> {
        AcquireArgs {
            session,
            lease: self.lease.as_ref().map(Lease::as_str),
            meta: &self.meta,
            // The service's cap: no waiter keeps its place (and its memory) longer.
            wait_ms: self.wait_ms.min(defaults.max_wait_ms),
            request_id,
            reply_to,
            default_queue_max: defaults.queue_max,
            default_heartbeat_timeout_ms: defaults.heartbeat_timeout_ms,
            default_claim_ms: defaults.claim_ms,
            who: &self.policy,
        }
        .call(scripts, keys, guard)
    }
}

/// lua/acquire.lua's arguments: `ARGV[4..5]` (session, lease), the
/// service's heartbeat timeout (in `ARGV[7]`) and its own `ARGV[8..13]`; the worker
/// builds them from an [`Acquire`], tests and the benchmark directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    /// The session asking for a seat (validated by the caller).
    pub session: &'a str,
    /// The lease the seat (or place in the queue) is bound to, validated by
    /// the caller; the script stores only its hash. `None` binds it to none.
    pub lease: Option<&'a str>,
    /// Its metadata, a JSON object (validated by the caller), stored with the seat.
    pub meta: &'a str,
    /// 0 = answer at once; more = wait in the queue up to this long, ms.
    pub wait_ms: u64,
    /// The request id a later GRANTED / QUEUE_TIMEOUT carries.
    pub request_id: &'a str,
    /// Where that later reply goes ("" = nowhere).
    pub reply_to: &'a str,
    /// The queue length limit when the license sets no `queue_max`.
    pub default_queue_max: u64,
    /// The heartbeat timeout (ms) when the license sets no
    /// `heartbeat_timeout_ms`: the one an ACQUIRED reply then carries, and
    /// the one the license's next due time is reckoned with.
    pub default_heartbeat_timeout_ms: u64,
    /// The claim window (ms) of a grant made on the way (`queue.claim_ms`).
    pub default_claim_ms: u64,
    /// Who asks: the user and group (the per-user and per-group policies),
    /// the priority in the queue and the borrow ([`RequestPolicy::NONE`]:
    /// nobody in particular).
    pub who: &'a RequestPolicy,
}

impl AcquireArgs<'_> {
    /// lua/acquire.lua: take a seat for `session`, or queue it for up to
    /// `wait_ms` when none is free.
    pub fn call<'s>(&self, scripts: &'s Scripts, keys: &LicenseKeys, guard: &Guard) -> SeatCall<'s> {
        let shared = SessionArgs {
            session: self.session,
            lease: self.lease,
            default_heartbeat_timeout_ms: self.default_heartbeat_timeout_ms,
            default_claim_ms: self.default_claim_ms,
        };
        scripts
            .request(ScriptName::Acquire, keys, guard, &shared)
            .arg(self.meta) // ARGV[8]
            .arg(self.wait_ms) // ARGV[9]
            .arg(self.request_id) // ARGV[10]
            .arg(self.reply_to) // ARGV[11]
            .arg(self.default_queue_max) // ARGV[12]
            .arg(self.who.script_arg()) // ARGV[13]
            .finish()
    }
}

/// The session metadata, re-serialised compactly so that what is stored is
/// exactly what was validated. The other ops ignore `meta` without
/// validating it (beyond its size, which every entry's is checked for).
fn parse_meta(fields: &Fields) -> Result<String, Refusal> {
    let refuse = |reason: String| Refusal::new(RequestField::Meta, reason);
    let raw = match fields.text(RequestField::Meta) {
        Some(Ok(raw)) => raw,
        Some(Err(_)) => return Err(refuse("field `meta` is not UTF-8".to_owned())),
        None => return Ok("{}".to_owned()),
    };
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| refuse(format!("field `meta` is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(refuse("field `meta` must be a JSON object".to_owned()));
    }
    if json_depth(&value) > MAX_META_DEPTH {
        return Err(refuse(format!(
            "field `meta` nests deeper than {MAX_META_DEPTH} levels"
        )));
    }
    Ok(value.to_string())
}

/// Depth of the deepest object/array nesting in a JSON value.
fn json_depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(items) => 1 + items.iter().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}
