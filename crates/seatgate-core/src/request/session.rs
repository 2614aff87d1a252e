//! `release` and `heartbeat`, the two ops on a session that holds a seat
//! (or, for a release, waits for one): the same fields (one of their own,
//! `lease`), parsed the same way, each deciding with its own script.
//! `release` gives the seat back, granting it to the next waiter, or leaves
//! the queue (lua/release.lua); `heartbeat` restarts the session's heartbeat
//! clock, so that the reaper leaves its seat alone (lua/heartbeat.lua).

use super::fields::{parse_ignored_acquire_fields, Fields, Refusal};
use super::guard::Guard;
use crate::keys::LicenseKeys;
use crate::protocol::{Lease, Rules};
use crate::scripts::{ScriptName, Scripts, SeatCall, ServiceDefaults, SessionArgs};
use crate::status::Status;

/// The statuses a release can be answered with (lua/release.lua's header).
pub(super) const RELEASE_STATUSES: &[Status] = &[
    Status::Released,
    Status::SessionNotFound,
    Status::LeftQueue,
    Status::LeaseMismatch,
    Status::SessionRevoked,
    Status::RequestExpired,
    Status::Error,
];

/// The statuses a heartbeat can be answered with (lua/heartbeat.lua's header).
pub(super) const HEARTBEAT_STATUSES: &[Status] = &[
    Status::HeartbeatUpdated,
    Status::Queued,
    Status::SessionNotActive,
    Status::LeaseMismatch,
    Status::RateLimited,
    Status::SessionRevoked,
    Status::RequestExpired,
    Status::Error,
];

/// A release's or a heartbeat's own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFields {
    /// The lease the request carries: it must be the one the seat (or place)
    /// is bound to, if it is bound to one.
    pub lease: Option<Lease>,
}

impl SessionFields {
    /// Reads a release's or heartbeat's fields (and checks, without keeping
    /// them, those only an acquire uses: docs/protocol.md, "Invalid requests").
    pub(super) fn parse(fields: &Fields, rules: &Rules<'_>) -> Result<SessionFields, Refusal> {
        let lease = parse_ignored_acquire_fields(fields, rules)?;
        Ok(SessionFields { lease })
    }

    /// The `script` call (lua/release.lua or lua/heartbeat.lua) for `session`.
    pub(super) fn call<'s>(
        &self,
        script: ScriptName,
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
            default_claim_ms: defaults.claim_ms,
        };
        call(script, scripts, keys, guard, &args)
    }
}

/// lua/release.lua or lua/heartbeat.lua (`script`) for `args`: they take
/// nothing beyond what every seat script does. The worker calls it for a
/// release or heartbeat, tests and the benchmark directly.
pub fn call<'s>(
    script: ScriptName,
    scripts: &'s Scripts,
    keys: &LicenseKeys,
    guard: &Guard,
    args: &SessionArgs<'_>,
) -> SeatCall<'s> {
    scripts.request(script, keys, guard, args).finish()
}
