//! `release`: give the session's seat back, granting it to the next waiter,
//! or leave the queue (lua/release.lua). Its one field of its own: `lease`.

use crate::engine::keys::LicenseKeys;
use crate::engine::protocol::{Lease, Rules};
use crate::engine::scripts::{Guard, ScriptName, Scripts, SeatCall, ServiceDefaults, SessionArgs};
use crate::engine::status::Status;

use super::fields::{parse_ignored_acquire_fields, Fields, Refusal};

/// The statuses a release can be answered with (lua/release.lua's header).
pub(super) const STATUSES: &[Status] = &[
    Status::Released,
    Status::SessionNotFound,
    Status::LeftQueue,
    Status::LicenseNotFound,
    Status::LeaseMismatch,
    Status::SessionRevoked,
    Status::RequestExpired,
    Status::Error,
];

/// A release's own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The lease the request carries: it must be the one the seat (or place)
    /// is bound to, if it is bound to one.
    pub lease: Option<Lease>,
}

impl Release {
    /// Reads a release's fields (and checks, without keeping them, those
    /// only an acquire uses: docs/protocol.md, "Invalid requests").
    pub(super) fn parse(fields: &Fields, rules: &Rules<'_>) -> Result<Release, Refusal> {
        let lease = parse_ignored_acquire_fields(fields, rules)?;
        Ok(Release { lease })
    }

    /// The lua/release.lua call for `session`.
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

/// lua/release.lua for `args` (it takes nothing beyond what every seat script
/// does): the worker calls it for a [`Release`], tests and the benchmark directly.
pub fn call<'s>(
    scripts: &'s Scripts,
    keys: &LicenseKeys,
    guard: &Guard,
    args: &SessionArgs<'_>,
) -> SeatCall<'s> {
    scripts.request(ScriptName::Release, keys, guard, args).finish()
}
