//! `heartbeat`: restart the session's heartbeat clock, so that the reaper
//! leaves its seat alone (lua/heartbeat.lua). Its one field of its own: `lease`.

use crate::engine::keys::LicenseKeys;
use crate::engine::protocol::{Lease, Rules};
use crate::engine::scripts::{Guard, ScriptName, Scripts, SeatCall, ServiceDefaults, SessionArgs};
use crate::engine::status::Status;

use super::fields::{parse_ignored_acquire_fields, Fields, Refusal};

/// The statuses a heartbeat can be answered with (lua/heartbeat.lua's header).
pub(super) const STATUSES: &[Status] = &[
    Status::HeartbeatUpdated,
    Status::SessionNotActive,
    Status::LicenseNotFound,
    Status::LicenseInactive,
    Status::LicenseExpired,
    Status::LeaseMismatch,
    Status::RateLimited,
    Status::SessionRevoked,
    Status::RequestExpired,
    Status::Error,
];

/// A heartbeat's own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The lease the request carries: it must be the one the seat (or place)
    /// is bound to, if it is bound to one.
    pub lease: Option<Lease>,
}

impl Heartbeat {
    /// Reads a heartbeat's fields (and checks, without keeping them, those
    /// only an acquire uses: docs/protocol.md, "Invalid requests").
    pub(super) fn parse(fields: &Fields, rules: &Rules<'_>) -> Result<Heartbeat, Refusal> {
        let lease = parse_ignored_acquire_fields(fields, rules)?;
        Ok(Heartbeat { lease })
    }

    /// The lua/heartbeat.lua call for `session`.
    pub(super) fn call<'s>(
        &self,
        scripts: &'s Scripts,
        keys: &LicenseKeys,
        guard: &Guard,
        session: &str,
        defaults: &ServiceDefaults,
    ) -> SeatCall<'s> {
        let args = SessionArgs {
            session,
            lease: self.lease.as_ref().map(Lease::as_str),
            default_heartbeat_timeout_ms: defaults.heartbeat_timeout_ms,
        };
        call(scripts, keys, guard, &args)
    }
}

/// lua/heartbeat.lua for `args` (it takes nothing beyond what every seat script
/// does): the worker calls it for a [`Heartbeat`], tests and the benchmark directly.
pub fn call<'s>(
    scripts: &'s Scripts,
    keys: &LicenseKeys,
    guard: &Guard,
    args: &SessionArgs<'_>,
) -> SeatCall<'s> {
    scripts.request(ScriptName::Heartbeat, keys, guard, args).finish()
}
