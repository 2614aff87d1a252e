//! `revoke`: an administrator takes a session's seat (or place in the queue)
//! away (lua/revoke.lua), accepted on the admin stream only. Its fields: the
//! audit trail's `reason` and `actor`, a `cooldown_ms` and its
//! `cooldown_scope` (the session alone, or its user too).

use super::guard::Guard;
use crate::keys::LicenseKeys;
use crate::protocol::{RequestField, MAX_ACTOR_LEN, MAX_COOLDOWN_MS, MAX_REASON_LEN};
use crate::scripts::{ScriptName, Scripts, SeatCall, ServiceDefaults, SessionArgs};
use crate::status::Status;

use super::fields::{parse_policy, parse_text, parse_wait_ms, Fields, Refusal};

/// The `actor` of a revoke sent without one: the audit trail still names
/// the gap rather than an empty string.
pub const UNKNOWN_ACTOR: &str = "unknown";

/// The statuses a revoke can be answered with (lua/revoke.lua's header).
pub(super) const STATUSES: &[Status] = &[
    Status::Revoked,
    Status::SessionNotFound,
    Status::RequestExpired,
    Status::Error,
];

/// A revoke's own fields: who revokes, why, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoke {
    /// Why: told to the revoked session and published in the `revoked` event.
    pub reason: String,
    /// Who revokes ([`UNKNOWN_ACTOR`] when the entry named nobody).
    pub actor: String,
    /// How long the session's acquires are refused afterwards, ms (0 = not at all).
    pub cooldown_ms: u64,
    /// Whether the cooldown binds the session's user too (`cooldown_scope=user`).
    pub user_wide: bool,
}

impl Revoke {
    /// Reads a revoke's fields. A revoke is the administrator's way around
    /// a lease: it carries none, whatever `sessions.require_lease` says.
    /// `wait_ms` and who asks are checked as for every op, and not kept.
    pub(super) fn parse(fields: &Fields) -> Result<Revoke, Refusal> {
        parse_wait_ms(fields)?;
        let reason = parse_text(fields, RequestField::Reason, MAX_REASON_LEN)?.ok_or_else(|| {
            Refusal::new(
                RequestField::Reason,
                "missing field `reason`: a revoke must say why (it is told to the session and published)",
            )
        })?;
        let actor = parse_text(fields, RequestField::Actor, MAX_ACTOR_LEN)?.unwrap_or(UNKNOWN_ACTOR);
        let cooldown_ms = parse_cooldown_ms(fields)?;
        let user_wide = parse_cooldown_scope(fields, cooldown_ms)?;
        parse_policy(fields)?;
        Ok(Revoke {
            reason: reason.to_owned(),
            actor: actor.to_owned(),
            cooldown_ms,
            user_wide,
        })
    }

    /// The lua/revoke.lua call for `session`.
    pub(super) fn call<'s>(
        &self,
        scripts: &'s Scripts,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
        defaults: &ServiceDefaults,
    ) -> SeatCall<'s> {
        RevokeArgs {
            session,
            reason: &self.reason,
            actor: &self.actor,
            cooldown_ms: self.cooldown_ms,
            user_wide: self.user_wide,
            remember_ms: defaults.revoke_remember_ms,
            max_remembered: defaults.revoke_max_per_license,
            default_heartbeat_timeout_ms: defaults.heartbeat_timeout_ms,
            default_claim_ms: defaults.claim_ms,
        }
        .call(scripts, keys, guard)
    }
}

/// lua/revoke.lua's arguments: `ARGV[4]` and part of `ARGV[7]` (the
/// session, the service's heartbeat timeout; no lease: a revoke goes around
/// the one the seat is bound to) and its own `ARGV[8..13]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevokeArgs<'a> {
    /// The session whose seat (or place in the queue) is taken away.
    pub session: &'a str,
    /// Why (validated by the caller), told to the session and published.
    pub reason: &'a str,
    /// Who revokes (validated by the caller), told and published likewise.
    pub actor: &'a str,
    /// How long the session's acquires are refused, ms (0 = not at all).
    pub cooldown_ms: u64,
    /// Whether the cooldown binds the session's user (its owner record's) too.
    pub user_wide: bool,
    /// How long the revocation is remembered at least, ms (`revoke.remember_ms`).
    pub remember_ms: u64,
    /// Most revocations remembered per license (`revoke.max_per_license`).
    pub max_remembered: u64,
    /// The heartbeat timeout (ms) when the license sets none: what a GRANTED
    /// made on the way carries, and what the license's stale time is
    /// reckoned with.
    pub default_heartbeat_timeout_ms: u64,
    /// The claim window (ms) of a grant made on the way (`queue.claim_ms`).
    pub default_claim_ms: u64,
}

impl RevokeArgs<'_> {
    /// lua/revoke.lua: take the session's seat away (granting it to the
    /// next waiter) or its place in the queue, and remember why.
    pub fn call<'s>(&self, scripts: &'s Scripts, keys: &LicenseKeys, guard: &Guard) -> SeatCall<'s> {
        let shared = SessionArgs {
            session: self.session,
            lease: None,
            default_heartbeat_timeout_ms: self.default_heartbeat_timeout_ms,
            default_claim_ms: self.default_claim_ms,
        };
        scripts
            .request(ScriptName::Revoke, keys, guard, &shared)
            .arg(self.reason) // ARGV[8]
            .arg(self.actor) // ARGV[9]
            .arg(self.cooldown_ms) // ARGV[10]
            .arg(self.remember_ms) // ARGV[11]
            .arg(self.max_remembered) // ARGV[12]
            .arg(if self.user_wide { "1" } else { "0" }) // ARGV[13]
            .finish()
    }
}

/// `cooldown_scope`: `session` (or absent) binds the session alone, `user`
/// its user too, which only a cooldown can do.
fn parse_cooldown_scope(fields: &Fields, cooldown_ms: u64) -> Result<bool, Refusal> {
    let refuse = |reason: &str| Err(Refusal::new(RequestField::CooldownScope, reason.to_owned()));
    match fields.text(RequestField::CooldownScope) {
        None | Some(Ok("session")) => Ok(false),
        Some(Ok("user")) if cooldown_ms > 0 => Ok(true),
        Some(Ok("user")) => refuse("field `cooldown_scope` user needs a `cooldown_ms` above 0"),
        Some(_) => refuse("field `cooldown_scope` must be `session` or `user`"),
    }
}

/// `cooldown_ms`, 0 when absent.
fn parse_cooldown_ms(fields: &Fields) -> Result<u64, Refusal> {
    let refuse = |reason: String| Refusal::new(RequestField::CooldownMs, reason);
    match fields.text(RequestField::CooldownMs) {
        None => Ok(0),
        Some(Ok(s)) => s
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms <= MAX_COOLDOWN_MS)
            .ok_or_else(|| {
                refuse(format!(
                    "field `cooldown_ms` must be a whole number of milliseconds from 0 to {MAX_COOLDOWN_MS}"
                ))
            }),
        Some(Err(_)) => Err(refuse("field `cooldown_ms` is not UTF-8".to_owned())),
    }
}
