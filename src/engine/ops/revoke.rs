//! `revoke`: an administrator takes a session's seat (or place in the queue)
//! away (lua/revoke.lua), accepted on the admin stream only. Its fields: the
//! audit trail's `reason` and `actor`, and a `cooldown_ms`.

use crate::engine::keys::LicenseKeys;
use crate::engine::protocol::{RequestField, MAX_ACTOR_LEN, MAX_COOLDOWN_MS, MAX_REASON_LEN};
use crate::engine::scripts::{Guard, RevokeArgs, Scripts, SeatCall, ServiceDefaults};
use crate::engine::status::Status;

use super::fields::{parse_policy, parse_text, parse_wait_ms, Fields, Refusal};

/// The `actor` of a revoke sent without one: the audit trail still names
/// the gap rather than an empty string.
pub const UNKNOWN_ACTOR: &str = "unknown";

/// The statuses a revoke can be answered with (lua/revoke.lua's header).
pub(super) const STATUSES: &[Status] = &[Status::Revoked, Status::SessionNotFound, Status::Error];

/// A revoke's own fields: who revokes, why, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoke {
    /// Why: told to the revoked session and published in the `revoked` event.
    pub reason: String,
    /// Who revokes ([`UNKNOWN_ACTOR`] when the entry named nobody).
    pub actor: String,
    /// How long the session's acquires are refused afterwards, ms (0 = not at all).
    pub cooldown_ms: u64,
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
        parse_policy(fields)?;
        Ok(Revoke {
            reason: reason.to_owned(),
            actor: actor.to_owned(),
            cooldown_ms,
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
        let args = RevokeArgs {
            session,
            reason: &self.reason,
            actor: &self.actor,
            cooldown_ms: self.cooldown_ms,
            remember_ms: defaults.revoke_remember_ms,
            max_remembered: defaults.revoke_max_per_license,
            default_heartbeat_timeout_ms: defaults.heartbeat_timeout_ms,
        };
        scripts.revoke(keys, guard, &args)
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
