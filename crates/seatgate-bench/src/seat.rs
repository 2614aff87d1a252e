//! The benchmark's direct calls of the seat scripts: the seed's path, with
//! no stream, no redelivery dedupe and no rate limits. Every script call of
//! the benchmark goes through [`Seat::cmd`] or [`Seat::run`], so a change of
//! the script API lands here only.

use crate::Error;
use seatgate_core::db::Db;
use seatgate_core::keys::{Keys, LicenseKeys};
use seatgate_core::policy::RequestPolicy;
use seatgate_core::request::Guard;
use seatgate_core::request::{session, AcquireArgs};
use seatgate_core::scripts::{Outcome, ScriptName, Scripts, SeatCall, SessionArgs};

/// The queue limit a direct acquire passes for licenses without their own
/// `queue_max`: none of its own (only read when the acquire waits).
const DEFAULT_QUEUE_MAX: u64 = u64::MAX;

/// The heartbeat timeout a direct call passes for licenses without their
/// own: the service's default (config/default.toml).
const DEFAULT_HEARTBEAT_TIMEOUT_MS: u64 = 90_000;

/// One session of one license, called directly.
pub(super) struct Seat {
    /// The license's keys.
    keys: LicenseKeys,
    /// No dedupe, no limits.
    guard: Guard,
    /// The session id.
    session: String,
}

/// What to ask of a [`Seat`].
pub(super) enum Step<'a> {
    /// lua/acquire.lua without waiting, storing `meta`.
    Acquire {
        /// Session metadata (JSON object).
        meta: &'a str,
    },
    /// lua/acquire.lua queueing for up to `wait_ms` when no seat is free.
    Queue {
        /// Session metadata (JSON object).
        meta: &'a str,
        /// Longest wait in the queue, ms.
        wait_ms: u64,
        /// The request id a later GRANTED would carry.
        request_id: &'a str,
        /// The reply stream a later GRANTED would go to.
        reply_to: &'a str,
    },
    /// lua/acquire.lua without waiting, asked by `who` (user, group,
    /// priority, borrow: the license policies' inputs).
    AcquireAs {
        /// Session metadata (JSON object).
        meta: &'a str,
        /// Who asks.
        who: &'a RequestPolicy,
    },
    /// lua/release.lua.
    Release,
}

impl Seat {
    pub(super) fn new(keys: &Keys, license: &str, session: &str) -> Seat {
        Seat {
            keys: keys.license(license),
            guard: Guard::none(keys, license, session),
            session: session.to_owned(),
        }
    }

    /// The script call `step` makes: the one place the benchmark binds script arguments.
    fn call(&self, step: Step<'_>) -> SeatCall<'static> {
        let s = Scripts::get();
        let session = self.session.as_str();
        let acquire = |meta, wait_ms, request_id, reply_to, who| AcquireArgs {
            session,
            lease: None,
            meta,
            wait_ms,
            request_id,
            reply_to,
            default_queue_max: DEFAULT_QUEUE_MAX,
            default_heartbeat_timeout_ms: DEFAULT_HEARTBEAT_TIMEOUT_MS,
            default_claim_ms: 10_000,
            who,
        };
        let nobody = &RequestPolicy::NONE;
        match step {
            Step::Acquire { meta } => acquire(meta, 0, "", "", nobody).call(s, &self.keys, &self.guard),
            Step::Queue {
                meta,
                wait_ms,
                request_id,
                reply_to,
            } => acquire(meta, wait_ms, request_id, reply_to, nobody).call(s, &self.keys, &self.guard),
            Step::AcquireAs { meta, who } => acquire(meta, 0, "", "", who).call(s, &self.keys, &self.guard),
            Step::Release => session::call(
                ScriptName::Release,
                s,
                &self.keys,
                &self.guard,
                &SessionArgs {
                    session,
                    lease: None,
                    default_heartbeat_timeout_ms: DEFAULT_HEARTBEAT_TIMEOUT_MS,
                    default_claim_ms: 10_000,
                },
            ),
        }
    }

    /// `step` as one FCALL command, for a pipeline. Pipelines do not load
    /// the function library when Redis lost it: load it first (`Scripts::load_all`).
    pub(super) fn cmd(&self, step: Step<'_>) -> redis::Cmd {
        self.call(step).cmd()
    }

    /// `step` on its own (loading the library when Redis lost it), decoded.
    pub(super) async fn run(&self, con: &mut Db, step: Step<'_>) -> Result<Outcome, Error> {
        Ok(self.call(step).run(con).await?)
    }
}
