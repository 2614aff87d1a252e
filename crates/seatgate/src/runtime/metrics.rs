//! Every metric name, its help text, and the one function that records each.
//!
//! Labels are low-cardinality by construction: script names, ops, statuses
//! and field names are closed sets; a per-license series exists only where it
//! is bounded (`metrics.license_series_limit`), and session ids never become
//! labels. The Prometheus exporter and its buckets are set up in
//! `ops::telemetry`.
//!
//! Two kinds of series:
//! - **process series**, recorded into the global recorder as things happen
//!   (counters, histograms, this process's gauges);
//! - **snapshot series**, which describe state shared by every process (seats,
//!   queues, stream lag) or are bounded per license (denials). They are kept
//!   here as plain data and written out by [`record_snapshots`] at each scrape,
//!   into a recorder made for that scrape, because the `metrics` crate cannot
//!   delete a series: a license that leaves the top N, or a process that stops
//!   being the reaper leader, must stop exporting at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use strum::VariantArray;

use seatgate_core::protocol::RequestField;
use seatgate_core::request::Op;
use seatgate_core::scripts::ScriptName;
use seatgate_core::status::Status;

/// Seed metric: seat script executions by `script_name` and `result`
/// (`success`, `failure` = a refusal such as NO_SEATS_AVAILABLE, `error`).
pub const SCRIPT_EXECUTIONS: &str = "license_lua_script_executions_total";
/// Seed metric: seat script round-trip latency by `script_name`.
pub const SCRIPT_LATENCY: &str = "license_lua_script_latency_seconds";
/// Requests answered, by `op` and `status`.
pub const REQUESTS: &str = "seatgate_requests_total";
/// Requests refused as INVALID_REQUEST, by the offending `field`.
pub const INVALID_REQUESTS: &str = "seatgate_invalid_requests_total";
/// End-to-end latency, from the stream entry's id time to the reply, by `op`.
pub const REQUEST_DURATION: &str = "seatgate_request_duration_seconds";
/// Replies that could not be written (for example `reply_to` holds a non-stream key).
pub const REPLY_ERRORS: &str = "seatgate_reply_errors_total";
/// Redis errors met while reading or deciding requests, by `stage`.
pub const REDIS_ERRORS: &str = "seatgate_redis_errors_total";
/// Sessions evicted for a stale heartbeat.
pub const EVICTIONS: &str = "seatgate_evictions_total";
/// Lingering and borrowed seats freed by the reaper, by `reason`
/// (`linger_ended`, `borrow_ended`).
pub const POLICY_SEATS_FREED: &str = "seatgate_policy_seats_freed_total";
/// Sessions revoked by an administrator (seat or place in the queue taken away).
pub const REVOCATIONS: &str = "seatgate_revocations_total";
/// Waiters granted a seat.
pub const GRANTS: &str = "seatgate_grants_total";
/// Waiters whose wait ran out.
pub const QUEUE_TIMEOUTS: &str = "seatgate_queue_timeouts_total";
/// Time spent in a wait queue, by `outcome` (`granted`, `timeout`).
pub const QUEUE_WAIT: &str = "seatgate_queue_wait_seconds";
/// Duration of one reaper pass: the licenses due, and a slice of the census.
pub const REAPER_PASS: &str = "seatgate_reaper_pass_seconds";
/// Reaper passes this process completed successfully: staleness is judged by
/// its `increase()` over a window, whatever the scrape interval.
pub const REAPER_PASSES: &str = "seatgate_reaper_passes_total";
/// Pending entries claimed from other consumers (XAUTOCLAIM).
pub const CLAIMED: &str = "seatgate_claimed_requests_total";
/// Entries moved to the dead-letter stream.
pub const DEAD_LETTERED: &str = "seatgate_dead_lettered_total";
/// Requests not decided because their `reply_to` lies outside
/// `replies.prefix` (or is malformed): dead-lettered, never answered.
pub const REFUSED_REPLY_TO: &str = "seatgate_refused_reply_to_total";
/// Redelivered entries answered from the dedupe record (no second effect).
pub const REPLAYED: &str = "seatgate_replayed_requests_total";
/// Relays of a license's events to its events shard that failed (a Redis
/// Cluster, runtime::relay): the events wait in the license's log for the
/// next relay. The scripts record every event with its change, so nothing
/// else can fail to append one.
pub const EVENT_ERRORS: &str = "seatgate_event_errors_total";
/// Requests whose stream entry id was ahead of the Redis clock by more than
/// the dedupe window (a caller chose it: docs/failure-modes.md).
pub const FUTURE_ENTRY_IDS: &str = "seatgate_future_entry_ids_total";
/// Invalid requests past their application's budget (`limits.invalid_requests`
/// per `limits.window_ms`) whose reply stream did not exist: dead-lettered
/// instead of answered, so a flood creates no reply streams.
pub const INVALID_SHED: &str = "seatgate_invalid_requests_shed_total";
/// Log lines held back by `log.repeats_per_minute`, by `kind`.
pub const LOG_SUPPRESSED: &str = "seatgate_log_lines_suppressed_total";
/// Acquires whose `wait_ms` was cut to `queue.max_wait_ms`.
pub const WAIT_CAPPED: &str = "seatgate_wait_capped_total";
/// The kinds of rate-limited log lines (runtime::log_limit).
pub const LOG_KINDS: [&str; 6] = [
    "dead_letter",
    "refused_reply_to",
    "shed",
    "invalid_request",
    "reply_error",
    "redis_oom",
];
/// Always 1, labelled with the `version`: which build each process runs.
pub const BUILD_INFO: &str = "seatgate_build_info";
/// 1 while `/ready` answers 200.
pub const READY: &str = "seatgate_ready";
/// 1 while this process's last Redis probe (PING) was answered.
pub const REDIS_UP: &str = "seatgate_redis_up";
/// Redis's `used_memory` (INFO memory), bytes, as this process last read it.
pub const REDIS_MEMORY_USED: &str = "seatgate_redis_memory_used_bytes";
/// Redis's `maxmemory`, bytes (0: no limit), as this process last read it.
pub const REDIS_MAXMEMORY: &str = "seatgate_redis_maxmemory_bytes";
/// 1 while Redis refuses this process's writes for lack of memory (`OOM`).
pub const REDIS_OOM: &str = "seatgate_redis_oom";
/// This host's clock minus the Redis server's (`TIME`), seconds, as this
/// process last measured it: positive when this host is ahead.
pub const CLOCK_SKEW: &str = "seatgate_clock_skew_seconds";
/// 1 while the function library on Redis under this build's name is not this build's code.
pub const LIBRARY_FOREIGN: &str = "seatgate_library_foreign";
/// 1 while this process holds the reaper lock and exports the shared-state series.
pub const REAPER_LEADER: &str = "seatgate_reaper_leader";
/// Unix time of this process's last reaper pass that succeeded.
pub const REAPER_LAST_SUCCESS: &str = "seatgate_reaper_last_success_timestamp_seconds";
/// The service gap this process's last reaper pass allowed for under the
/// outage rule, seconds: the read lag, or the last gap between passes while
/// the holders' grace after it lasts (0: none).
pub const REAPER_GRACE: &str = "seatgate_reaper_grace_seconds";
/// Reaper passes that kept stale sessions from eviction under the outage rule.
pub const REAPER_HELD_PASSES: &str = "seatgate_reaper_held_passes_total";

/// Refusals answered, by `license` (bounded) and `reason` (snapshot series).
pub const DENIALS: &str = "seatgate_denials_total";
/// Seats held, per `license` (top N by utilisation, plus `_other`).
pub const SEATS_USED: &str = "seatgate_seats_used";
/// Seats of the license, per `license` (top N by utilisation, plus `_other`).
pub const SEATS_CAPACITY: &str = "seatgate_seats_capacity";
/// Sessions waiting, per `license` (top N by utilisation, plus `_other`).
pub const QUEUE_DEPTH: &str = "seatgate_queue_depth";
/// Of the seats held, those lingering after a release, per `license` (same licenses).
pub const SEATS_LINGERING: &str = "seatgate_seats_lingering";
/// Of the seats held, those borrowed (held without heartbeats), per `license` (same licenses).
pub const SEATS_BORROWED: &str = "seatgate_seats_borrowed";
/// When the license expires, unix seconds, per `license`: every license that
/// expires within [`EXPIRY_HORIZON_MS`] or has expired, whatever its
/// utilisation (at most [`EXPIRY_SERIES_LIMIT`], the soonest first).
pub const LICENSE_EXPIRY: &str = "seatgate_license_expiry_timestamp_seconds";
/// 1 per `license` whose `expires_at_ms` breaks the rule (every acquire is
/// refused LICENSE_INVALID), at most [`EXPIRY_SERIES_LIMIT`] of them.
pub const LICENSE_EXPIRY_INVALID: &str = "seatgate_license_expiry_invalid";
/// Licenses that expire within each window (`within`: `1d`, `7d`, `30d`,
/// cumulative), not yet expired: all of them, with series or not.
pub const LICENSES_EXPIRING: &str = "seatgate_licenses_expiring";
/// Licenses whose expiry has passed.
pub const LICENSES_EXPIRED: &str = "seatgate_licenses_expired";
/// Licenses whose `expires_at_ms` breaks the rule.
pub const LICENSES_EXPIRY_INVALID: &str = "seatgate_licenses_expiry_invalid";
/// Seats held over all licenses.
pub const FLEET_SEATS_USED: &str = "seatgate_fleet_seats_used";
/// Seats lingering over all licenses.
pub const FLEET_SEATS_LINGERING: &str = "seatgate_fleet_seats_lingering";
/// Seats borrowed over all licenses.
pub const FLEET_SEATS_BORROWED: &str = "seatgate_fleet_seats_borrowed";
/// Seats over all licenses.
pub const FLEET_SEATS_CAPACITY: &str = "seatgate_fleet_seats_capacity";
/// Sessions waiting over all licenses.
pub const QUEUED_SESSIONS: &str = "seatgate_queued_sessions";
/// Licenses in the license index, as the reaper's last complete census counted them.
pub const LICENSES: &str = "seatgate_licenses";
/// Entries delivered to a consumer and not yet acknowledged, per requests `stream`.
pub const STREAM_PENDING: &str = "seatgate_stream_pending";
/// Entries not yet delivered to the group, per requests `stream` (Redis ≥ 7.0).
pub const STREAM_LAG: &str = "seatgate_stream_lag";
/// Entries in the dead-letter stream.
pub const DEAD_LETTERS: &str = "seatgate_dead_letters";

/// The `license` label value holding the sum over every license without a series of its own.
pub const OTHER: &str = "_other";

/// The seat scripts, as `script_name`: those the runtime times and counts.
fn seat_scripts() -> impl Iterator<Item = &'static str> {
    ScriptName::VARIANTS
        .iter()
        .filter(|s| s.is_seat())
        .map(|s| s.as_str())
}
/// Script call results.
const RESULTS: [&str; 3] = ["success", "failure", "error"];
/// Why the reaper frees a seat held without heartbeats.
const POLICY_FREED_REASONS: [&str; 2] = ["linger_ended", "borrow_ended"];
/// The worker's Redis error stages.
const REDIS_STAGES: [&str; 5] = ["read", "script", "reply", "ack", "dead_letter"];
/// The statuses counted as denials: a request refused a seat
/// ([`Status::is_denial`], the one home of that list; usage reports count
/// the same from the events), in declaration order.
const DENIAL_REASONS: [Status; denial_count()] = denial_reasons();

const fn denial_count() -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < Status::ALL.len() {
        if Status::ALL[i].is_denial() {
            n += 1;
        }
        i += 1;
    }
    n
}

const fn denial_reasons() -> [Status; denial_count()] {
    let mut out = [Status::Error; denial_count()];
    let (mut i, mut n) = (0, 0);
    while i < Status::ALL.len() {
        if Status::ALL[i].is_denial() {
            out[n] = Status::ALL[i];
            n += 1;
        }
        i += 1;
    }
    out
}

/// Describes every metric (the `# HELP` lines) and creates the series whose
/// label sets are closed at 0, so a dashboard shows 0 rather than "no data"
/// and `rate()` sees the first increment. Called once, when the exporter is
/// installed; `license_series_limit` bounds every per-license label.
pub fn init(license_series_limit: usize) {
    LICENSE_SERIES_LIMIT.store(license_series_limit, Ordering::Relaxed);
    describe_counter!(
        SCRIPT_EXECUTIONS,
        "Seat script calls by script_name and result: success, failure (decided, but a refusal) or error (the call failed)."
    );
    describe_histogram!(
        SCRIPT_LATENCY,
        "Round trip of one seat script call (of its whole pipeline when pipelined), seconds."
    );
    describe_counter!(REQUESTS, "Requests answered, by op and status.");
    describe_counter!(
        INVALID_REQUESTS,
        "Requests refused as INVALID_REQUEST, by the offending field."
    );
    describe_histogram!(
        REQUEST_DURATION,
        "From the request entry's id time (Redis clock at XADD) to its reply (the Redis clock as the worker carries it on its monotonic clock), seconds, by op."
    );
    describe_counter!(
        REPLY_ERRORS,
        "Replies (and queue replies) that could not be written."
    );
    describe_counter!(
        REDIS_ERRORS,
        "Redis errors met by the worker, by stage; the entries concerned stay pending and are retried."
    );
    describe_counter!(EVICTIONS, "Sessions evicted for a stale heartbeat.");
    describe_counter!(
        POLICY_SEATS_FREED,
        "Lingering and borrowed seats the reaper freed, by reason (linger_ended, borrow_ended)."
    );
    describe_counter!(
        REVOCATIONS,
        "Sessions revoked by an administrator (seatgate revoke, the admin stream): a seat or a place in the queue taken away."
    );
    describe_counter!(GRANTS, "Waiters granted a seat.");
    describe_counter!(QUEUE_TIMEOUTS, "Waiters whose wait ran out.");
    describe_histogram!(
        QUEUE_WAIT,
        "Time spent waiting in a license's queue, seconds, by outcome (granted, timeout)."
    );
    describe_histogram!(
        REAPER_PASS,
        "Duration of one reaper pass (the licenses due, and the next reaper.sweep licenses of the census), seconds."
    );
    describe_counter!(
        REAPER_PASSES,
        "Reaper passes this process completed successfully (while leading)."
    );
    describe_counter!(
        CLAIMED,
        "Pending entries this worker claimed (XAUTOCLAIM) from a consumer that held them too long."
    );
    describe_counter!(
        DEAD_LETTERED,
        "Entries this worker moved to the dead-letter stream."
    );
    describe_counter!(
        REPLAYED,
        "Redelivered entries answered from their dedupe record, with no second effect."
    );
    describe_counter!(
        EVENT_ERRORS,
        "Relays of a license's events to its events shard that failed (Redis Cluster); the next relay moves them."
    );
    describe_counter!(
        REFUSED_REPLY_TO,
        "Requests not decided because their reply_to lies outside replies.prefix (or is malformed): dead-lettered and acknowledged."
    );
    describe_counter!(
        FUTURE_ENTRY_IDS,
        "Requests whose stream entry id was ahead of the Redis clock by more than the dedupe window (a caller chose the id; see docs/failure-modes.md)."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label says which build this process runs."
    );
    describe_gauge!(
        READY,
        "1 while /ready answers 200 (the worker can read and decide requests)."
    );
    describe_gauge!(REDIS_UP, "1 while this process's last Redis PING was answered.");
    describe_gauge!(
        REDIS_MEMORY_USED,
        "Redis's used_memory (INFO memory), bytes, read every 5 s: against seatgate_redis_maxmemory_bytes, how close Redis is to refusing writes (OOM)."
    );
    describe_gauge!(
        REDIS_MAXMEMORY,
        "Redis's maxmemory, bytes (0: no limit), read every 5 s."
    );
    describe_gauge!(
        REDIS_OOM,
        "1 while Redis refuses this process's writes for lack of memory (OOM: used_memory above maxmemory): /ready says not ready until a write succeeds."
    );
    describe_gauge!(
        CLOCK_SKEW,
        "This host's clock minus the Redis server's (TIME, taken halfway through its round trip), seconds, read every 5 s: positive when this host is ahead. Seatgate decides on the Redis clock; this host's shows in its logs."
    );
    describe_gauge!(
        LIBRARY_FOREIGN,
        "1 while the function library on Redis under this build's name holds other code: the worker serves nothing until it is this build's again."
    );
    describe_gauge!(
        REAPER_LEADER,
        "1 while this process holds the reaper lock: it runs the passes and exports the shared-state series."
    );
    describe_gauge!(
        REAPER_LAST_SUCCESS,
        "Unix time of this process's last successful reaper pass."
    );
    describe_gauge!(
        REAPER_GRACE,
        "Service gap (unread requests, or no reaper pass: Redis away) this process's last reaper pass did not count against heartbeats, seconds."
    );
    describe_counter!(
        INVALID_SHED,
        "Invalid requests past their application's budget (limits.invalid_requests per limits.window_ms) whose reply stream did not exist: dead-lettered instead of answered."
    );
    describe_counter!(
        LOG_SUPPRESSED,
        "Log lines held back by log.repeats_per_minute, by kind (dead_letter, refused_reply_to, shed, invalid_request, reply_error, redis_oom)."
    );
    describe_counter!(
        WAIT_CAPPED,
        "Acquires whose wait_ms was cut to queue.max_wait_ms."
    );
    describe_counter!(
        REAPER_HELD_PASSES,
        "Reaper passes that kept sessions stale by the heartbeat timeout from eviction under the outage rule."
    );

    // Each op's statuses (its file in engine::ops lists them), and `invalid`
    // for a request without a usable op.
    for &op in Op::ALL {
        for status in op.statuses() {
            counter!(REQUESTS, "op" => op.as_str(), "status" => status.as_str()).absolute(0);
        }
    }
    counter!(REQUESTS, "op" => "invalid", "status" => Status::InvalidRequest.as_str()).absolute(0);
    for script in seat_scripts() {
        for result in RESULTS {
            counter!(SCRIPT_EXECUTIONS, "script_name" => script, "result" => result).absolute(0);
        }
    }
    for field in RequestField::ALL {
        counter!(INVALID_REQUESTS, "field" => field.as_str()).absolute(0);
    }
    for stage in REDIS_STAGES {
        counter!(REDIS_ERRORS, "stage" => stage).absolute(0);
    }
    for reason in POLICY_FREED_REASONS {
        counter!(POLICY_SEATS_FREED, "reason" => reason).absolute(0);
    }
    for name in [
        REPLY_ERRORS,
        EVICTIONS,
        REVOCATIONS,
        GRANTS,
        QUEUE_TIMEOUTS,
        CLAIMED,
        DEAD_LETTERED,
        REPLAYED,
        EVENT_ERRORS,
        REFUSED_REPLY_TO,
        FUTURE_ENTRY_IDS,
        REAPER_HELD_PASSES,
        REAPER_PASSES,
        INVALID_SHED,
        WAIT_CAPPED,
    ] {
        counter!(name).absolute(0);
    }
    for kind in LOG_KINDS {
        counter!(LOG_SUPPRESSED, "kind" => kind).absolute(0);
    }
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    gauge!(READY).set(0.0);
    gauge!(REDIS_UP).set(0.0);
    gauge!(REDIS_OOM).set(0.0);
    gauge!(LIBRARY_FOREIGN).set(0.0);
    gauge!(REAPER_LEADER).set(0.0);
    gauge!(REAPER_GRACE).set(0.0);
}

/// Records one seat-script call, the seed's two metrics: its round trip (for
/// a pipelined call, the round trip of its pipeline) and its result:
/// `success`, `failure` (a refusal such as NO_SEATS_AVAILABLE) or `error`.
pub fn script_call(script: &'static str, outcome: Result<Option<Status>, ()>, elapsed: Duration) {
    histogram!(SCRIPT_LATENCY, "script_name" => script).record(elapsed.as_secs_f64());
    let result = match outcome {
        Ok(Some(status)) if !status.is_ok() => "failure",
        Ok(_) => "success",
        Err(()) => "error",
    };
    counter!(SCRIPT_EXECUTIONS, "script_name" => script, "result" => result).increment(1);
}

/// Counts one answered request and its end-to-end latency. `op` is the op
/// as sent (or empty); anything but a known op is labelled `invalid`.
pub fn request_answered(op: &str, status: &'static str, since_enqueue: Option<Duration>) {
    let op = op_label(op);
    if let Some(d) = since_enqueue {
        histogram!(REQUEST_DURATION, "op" => op).record(d.as_secs_f64());
    }
    counter!(REQUESTS, "op" => op, "status" => status).increment(1);
}

/// The `op` label: one of [`Op::ALL`] or `invalid`, so bounded whatever a
/// caller sent, and a new op gets its own label without a change here.
fn op_label(op: &str) -> &'static str {
    op.parse::<Op>().map_or("invalid", Op::as_str)
}

/// Counts one invalid request by offending field (a closed set of names).
pub fn invalid_request(field: &'static str) {
    counter!(INVALID_REQUESTS, "field" => field).increment(1);
}

/// Counts one reply that could not be written.
pub fn reply_error() {
    counter!(REPLY_ERRORS).increment(1);
}

/// Counts one Redis error at `stage` (`read`, `script`, `reply`, `ack`).
pub fn redis_error(stage: &'static str) {
    counter!(REDIS_ERRORS, "stage" => stage).increment(1);
}

/// Counts one relay of a license's events that failed.
pub fn event_error() {
    counter!(EVENT_ERRORS).increment(1);
}

/// Counts one eviction.
pub fn evicted() {
    counter!(EVICTIONS).increment(1);
}

/// Counts one lingering or borrowed seat freed by the reaper (`reason`:
/// `linger_ended` or `borrow_ended`).
pub fn policy_seat_freed(reason: &'static str) {
    counter!(POLICY_SEATS_FREED, "reason" => reason).increment(1);
}

/// Counts one revocation.
pub fn revoked() {
    counter!(REVOCATIONS).increment(1);
}

/// Records how a wait in the queue ended: granted or timed out. A wait
/// ended by a revocation is counted as a revocation only.
pub fn queue_outcome(status: Status, waited_ms: i64) {
    let outcome = match status {
        Status::Granted => {
            counter!(GRANTS).increment(1);
            "granted"
        }
        Status::QueueTimeout => {
            counter!(QUEUE_TIMEOUTS).increment(1);
            "timeout"
        }
        _ => return,
    };
    histogram!(QUEUE_WAIT, "outcome" => outcome).record(waited_ms.max(0) as f64 / 1000.0);
}

/// Records the duration of one reaper pass.
pub fn reaper_pass(elapsed: Duration) {
    histogram!(REAPER_PASS).record(elapsed.as_secs_f64());
}

/// Records what a reaper pass allowed for under the outage rule: the gap,
/// ms, and the sessions it kept from eviction.
pub fn reaper_grace(gap_ms: i64, held: usize) {
    gauge!(REAPER_GRACE).set(gap_ms.max(0) as f64 / 1000.0);
    if held > 0 {
        counter!(REAPER_HELD_PASSES).increment(1);
    }
}

/// Records that a reaper pass of this process succeeded, now: counts it and
/// sets the time of the last success.
pub fn reaper_succeeded() {
    counter!(REAPER_PASSES).increment(1);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    gauge!(REAPER_LAST_SUCCESS).set(now);
}

/// Records whether this process leads the reaper. A process that stops
/// leading drops its shared-state snapshot at once, so that only the leader
/// exports those series.
pub fn reaper_leader(leader: bool) {
    gauge!(REAPER_LEADER).set(if leader { 1.0 } else { 0.0 });
    if !leader {
        if let Ok(mut shared) = SHARED.lock() {
            *shared = None;
        }
    }
}

/// Records whether `/ready` answers 200.
pub fn ready(ready: bool) {
    gauge!(READY).set(if ready { 1.0 } else { 0.0 });
}

/// Records whether Redis answered this process's last probe.
pub fn redis_up(up: bool) {
    gauge!(REDIS_UP).set(if up { 1.0 } else { 0.0 });
}

/// Sets Redis's memory in use and its limit (`maxmemory`, 0 = none), bytes.
pub fn redis_memory(used: u64, max: u64) {
    gauge!(REDIS_MEMORY_USED).set(used as f64);
    gauge!(REDIS_MAXMEMORY).set(max as f64);
}

/// Sets whether Redis refuses this process's writes with `OOM`.
pub fn redis_oom(oom: bool) {
    gauge!(REDIS_OOM).set(if oom { 1.0 } else { 0.0 });
}

/// Sets how far this host's clock is ahead of the Redis server's, seconds
/// (negative: behind).
pub fn clock_skew(seconds: f64) {
    gauge!(CLOCK_SKEW).set(seconds);
}

/// Sets whether the library on Redis holds code that is not this build's.
pub fn library_foreign(foreign: bool) {
    gauge!(LIBRARY_FOREIGN).set(if foreign { 1.0 } else { 0.0 });
}

/// Counts entries claimed from other consumers.
pub fn claimed(n: usize) {
    counter!(CLAIMED).increment(n as u64);
}

/// Counts one dead-lettered entry.
pub fn dead_lettered() {
    counter!(DEAD_LETTERED).increment(1);
}

/// Counts one request refused (and dead-lettered) for its `reply_to`.
pub fn refused_reply_to() {
    counter!(REFUSED_REPLY_TO).increment(1);
}

/// Counts one replayed (redelivered, deduplicated) entry.
pub fn replayed() {
    counter!(REPLAYED).increment(1);
}

/// Counts one request whose entry id was ahead of the Redis clock.
pub fn future_entry_id() {
    counter!(FUTURE_ENTRY_IDS).increment(1);
}

/// Counts one invalid request dead-lettered past its application's budget.
pub fn invalid_shed() {
    counter!(INVALID_SHED).increment(1);
}

/// Counts one log line of `kind` held back (one of [`LOG_KINDS`]).
pub fn log_suppressed(kind: &'static str) {
    counter!(LOG_SUPPRESSED, "kind" => kind).increment(1);
}

/// Counts one acquire whose `wait_ms` was cut to `queue.max_wait_ms`.
pub fn wait_capped() {
    counter!(WAIT_CAPPED).increment(1);
}

/// Most licenses with series of their own, per per-license metric.
static LICENSE_SERIES_LIMIT: AtomicUsize = AtomicUsize::new(50);

/// How far ahead a license's expiry gets a series of its own: 30 days.
pub const EXPIRY_HORIZON_MS: i64 = 30 * DAY_MS;
/// Most licenses with an expiry series (and, apart, with an invalid-expiry
/// series): the soonest to expire first, then the latest expired. The
/// counts ([`LICENSES_EXPIRING`], [`LICENSES_EXPIRED`],
/// [`LICENSES_EXPIRY_INVALID`]) cover every license past it.
pub const EXPIRY_SERIES_LIMIT: usize = 1000;
/// One day, ms.
const DAY_MS: i64 = 86_400_000;
/// The windows of [`LICENSES_EXPIRING`], as its `within` label and ms.
const EXPIRY_WINDOWS: [(&str, i64); 3] = [("1d", DAY_MS), ("7d", 7 * DAY_MS), ("30d", EXPIRY_HORIZON_MS)];

/// A license's `expires_at_ms` as the reaper read it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Expiry {
    /// 0 or absent: it never expires.
    #[default]
    Never,
    /// It expires at this unix ms (978307200000 or later).
    At(i64),
    /// A value that breaks the rule: the scripts answer LICENSE_INVALID.
    Invalid,
}

impl Expiry {
    /// The field's raw value (`None`: absent), checked as the scripts check it.
    pub fn read(raw: Option<&str>) -> Expiry {
        match raw.map(|raw| seatgate_core::license::Field::ExpiresAtMs.check(raw)) {
            None | Some(Ok(0)) => Expiry::Never,
            Some(Ok(ms)) => i64::try_from(ms).map_or(Expiry::Invalid, Expiry::At),
            Some(Err(_)) => Expiry::Invalid,
        }
    }
}

/// Puts `item` in its place in the sorted `items`, which keeps only the
/// first [`EXPIRY_SERIES_LIMIT`].
fn keep_first<T: Ord>(items: &mut Vec<T>, item: T) {
    let at = items.partition_point(|e| *e < item);
    if at < EXPIRY_SERIES_LIMIT {
        items.insert(at, item);
        items.truncate(EXPIRY_SERIES_LIMIT);
    }
}

/// The expiries of every license of one census, as of the Redis clock when
/// each was read: counts by window over all of them, and series for at most
/// [`EXPIRY_SERIES_LIMIT`] expiring within [`EXPIRY_HORIZON_MS`] or expired
/// (and as many invalid), so its memory stays bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpiryCensus {
    /// (order, license, unix ms), in order: the soonest to expire first,
    /// then the expired, the latest first.
    dated: Vec<(i64, String, i64)>,
    /// Licenses whose value breaks the rule, sorted.
    invalid: Vec<String>,
    /// Per [`EXPIRY_WINDOWS`]: licenses not yet expired that expire within it.
    expiring: [usize; EXPIRY_WINDOWS.len()],
    /// Licenses expired.
    expired: usize,
    /// Licenses with an invalid value.
    invalid_count: usize,
}

impl ExpiryCensus {
    /// Counts one license's expiry, read when the Redis clock said `now_ms`.
    pub fn add(&mut self, license: &str, expiry: Expiry, now_ms: i64) {
        match expiry {
            Expiry::Never => {}
            Expiry::Invalid => {
                self.invalid_count += 1;
                keep_first(&mut self.invalid, license.to_owned());
            }
            Expiry::At(ms) => {
                let left = ms - now_ms;
                if left <= 0 {
                    self.expired += 1;
                }
                for (n, (_, window)) in self.expiring.iter_mut().zip(EXPIRY_WINDOWS) {
                    *n += usize::from(left > 0 && left <= window);
                }
                if left > EXPIRY_HORIZON_MS {
                    return;
                }
                // Expiring: how soon; expired: after every one expiring, the latest first.
                let order = if left > 0 { left } else { EXPIRY_HORIZON_MS - left };
                keep_first(&mut self.dated, (order, license.to_owned(), ms));
            }
        }
    }

    /// Adds the counts and series of `other` (another walk's licenses).
    pub fn merge(&mut self, other: &ExpiryCensus) {
        for entry in &other.dated {
            keep_first(&mut self.dated, entry.clone());
        }
        for license in &other.invalid {
            keep_first(&mut self.invalid, license.clone());
        }
        for (n, m) in self.expiring.iter_mut().zip(other.expiring) {
            *n += m;
        }
        self.expired += other.expired;
        self.invalid_count += other.invalid_count;
    }
}

/// The seats of one license, as the reaper saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LicenseSeats {
    /// The license id (or [`OTHER`] for the sum over the rest).
    pub license: String,
    /// Seats held.
    pub used: i64,
    /// Seats of the license (0 when it has no record).
    pub total: i64,
    /// Sessions waiting.
    pub queued: i64,
    /// Of `used`, the seats lingering after a release.
    pub lingering: i64,
    /// Of `used`, the seats borrowed.
    pub borrowed: i64,
    /// When the license expires (not summed: [`ExpiryCensus`] counts them).
    pub expiry: Expiry,
}

impl LicenseSeats {
    /// Used over total; a license without seats that someone still holds
    /// ranks above any other, one nobody holds below.
    fn utilisation(&self) -> f64 {
        match (self.used, self.total) {
            (0, _) => 0.0,
            (_, t) if t <= 0 => f64::INFINITY,
            (u, t) => u as f64 / t as f64,
        }
    }

    /// The order licenses get series in: highest utilisation first, then
    /// the longer queue, the more seats held, the license id.
    fn rank(&self, other: &LicenseSeats) -> std::cmp::Ordering {
        other
            .utilisation()
            .total_cmp(&self.utilisation())
            .then(other.queued.cmp(&self.queued))
            .then(other.used.cmp(&self.used))
            .then_with(|| self.license.cmp(&other.license))
    }
}

/// The seats of every license of one census (the reaper's walk over the
/// license index, runtime::due), summed as they come in: the fleet totals,
/// the licenses counted, and only the top `metrics.license_series_limit` by
/// utilisation, so its memory stays bounded however many licenses there are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeatCensus {
    /// The top licenses so far, in [`LicenseSeats::rank`] order.
    top: Vec<LicenseSeats>,
    /// Sums over every license counted.
    fleet: LicenseSeats,
    /// Licenses counted.
    licenses: usize,
    /// The expiry of every license counted, whatever its rank.
    expiry: ExpiryCensus,
}

impl SeatCensus {
    /// Counts one license, read when the Redis clock said `now_ms`.
    pub fn add(&mut self, seats: LicenseSeats, now_ms: i64) {
        self.expiry.add(&seats.license, seats.expiry, now_ms);
        self.fleet.used += seats.used;
        self.fleet.total += seats.total;
        self.fleet.queued += seats.queued;
        self.fleet.lingering += seats.lingering;
        self.fleet.borrowed += seats.borrowed;
        self.licenses += 1;
        let limit = LICENSE_SERIES_LIMIT.load(Ordering::Relaxed);
        let at = self.top.partition_point(|l| l.rank(&seats).is_lt());
        if at < limit {
            self.top.insert(at, seats);
            self.top.truncate(limit);
        }
    }

    /// Licenses counted.
    pub fn licenses(&self) -> usize {
        self.licenses
    }

    /// Adds the expiries of licenses outside the license index (records
    /// written as their hash alone, found by the walk over the keyspace).
    pub fn add_expiries(&mut self, unindexed: &ExpiryCensus) {
        self.expiry.merge(unindexed);
    }
}

/// What the seat gauges show: the top licenses, the rest summed, the fleet.
#[derive(Debug, Clone)]
struct SeatSummary {
    /// The top `limit` licenses by utilisation, highest first.
    top: Vec<LicenseSeats>,
    /// The sum over every other license, as license [`OTHER`].
    other: LicenseSeats,
    /// Sums over every license counted.
    fleet: LicenseSeats,
    /// Licenses counted.
    licenses: usize,
    /// Every license's expiry.
    expiry: ExpiryCensus,
}

impl From<SeatCensus> for SeatSummary {
    fn from(c: SeatCensus) -> SeatSummary {
        let limit = LICENSE_SERIES_LIMIT.load(Ordering::Relaxed);
        let mut top = c.top;
        top.truncate(limit);
        let other = LicenseSeats {
            license: OTHER.to_owned(),
            used: c.fleet.used - top.iter().map(|l| l.used).sum::<i64>(),
            total: c.fleet.total - top.iter().map(|l| l.total).sum::<i64>(),
            queued: c.fleet.queued - top.iter().map(|l| l.queued).sum::<i64>(),
            lingering: c.fleet.lingering - top.iter().map(|l| l.lingering).sum::<i64>(),
            borrowed: c.fleet.borrowed - top.iter().map(|l| l.borrowed).sum::<i64>(),
            expiry: Expiry::Never,
        };
        SeatSummary {
            top,
            other,
            fleet: c.fleet,
            licenses: c.licenses,
            expiry: c.expiry,
        }
    }
}

/// The requests backlog of one requests stream shard (`XINFO GROUPS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHealth {
    /// The shard's stream key.
    pub stream: String,
    /// Delivered to a consumer, not yet acknowledged.
    pub pending: i64,
    /// Not yet delivered to the group; `None` when Redis cannot tell (after
    /// an XDEL in the middle of the stream, say).
    pub lag: Option<i64>,
}

/// The shared state the reaper leader exports, as of its last pass.
#[derive(Debug, Clone)]
struct Shared {
    /// Seats and queues as of the last complete census; `None` until this
    /// process, leading, has completed one.
    seats: Option<SeatSummary>,
    /// Per requests shard.
    streams: Vec<StreamHealth>,
    /// Length of the dead-letter stream, when it could be read.
    dead_letters: Option<i64>,
    /// After this the snapshot is too old to export: the leader stopped passing.
    expires: Instant,
}

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// Publishes the reaper leader's view of the shared state, exported until
/// `valid_for` has passed without a newer one (the reaper lock's lifetime:
/// by then another process may lead). Only the top
/// `metrics.license_series_limit` licenses by utilisation get series of their
/// own; the rest are summed into `license="_other"`, so a sum over licenses
/// is always the fleet total and the label set stays bounded. `census` is
/// `None` when the pass completed no census of the licenses (a census of
/// many licenses takes several passes): the seats of the last one stay.
pub fn shared_state(
    census: Option<SeatCensus>,
    streams: Vec<StreamHealth>,
    dead_letters: Option<i64>,
    valid_for: Duration,
) {
    let Ok(mut shared) = SHARED.lock() else { return };
    let seats = match census {
        Some(census) => Some(SeatSummary::from(census)),
        // Only from a snapshot still in force: one that expired (this
        // process stopped leading meanwhile) may be arbitrarily old.
        None => shared
            .take()
            .filter(|s| s.expires > Instant::now())
            .and_then(|s| s.seats),
    };
    *shared = Some(Shared {
        seats,
        streams,
        dead_letters,
        expires: Instant::now() + valid_for,
    });
}

/// Keeps the last snapshot exported for `valid_for` more: the leader still
/// holds the lock and its pass is still running, so the snapshot is the
/// newest there is.
pub fn shared_state_extend(valid_for: Duration) {
    if let Ok(mut shared) = SHARED.lock() {
        if let Some(s) = shared.as_mut() {
            s.expires = s.expires.max(Instant::now() + valid_for);
        }
    }
}

/// A license keeps its denial series this long after its last denial before
/// another license may take its place.
const DENIAL_SERIES_HOLD: Duration = Duration::from_secs(15 * 60);
/// Most licenses remembered (with their counts) after losing their series;
/// past it, licenses never seen before are counted under `_other` only.
const DENIAL_MEMORY: usize = 100_000;

/// Denials of one license in this process.
#[derive(Debug, Clone)]
struct LicenseDenials {
    /// Per [`DENIAL_REASONS`] index: the value of its series, which only grows.
    counts: [u64; DENIAL_REASONS.len()],
    /// When it was last denied.
    last: Instant,
    /// Whether it has series of its own now.
    exported: bool,
}

/// This process's denial counters: a series per license for at most
/// `limit` licenses, the rest under `_other`.
#[derive(Debug, Default)]
struct DenialTable {
    licenses: HashMap<String, LicenseDenials>,
    /// Licenses with series of their own now.
    exported: usize,
    /// Per reason: denials of licenses while they had no series of their own.
    other: [u64; DENIAL_REASONS.len()],
}

impl DenialTable {
    /// Counts one denial. A license gets series of its own while fewer than
    /// `limit` licenses have them, or by taking the place of the license
    /// denied longest ago, once that one has been quiet for
    /// [`DENIAL_SERIES_HOLD`]; otherwise it counts under `_other`. A license
    /// that loses its place keeps its counts, and resumes from them if it
    /// gets a place again: no series ever goes backwards, and each denial is
    /// counted in exactly one series.
    fn count(&mut self, license: &str, reason: usize, limit: usize, now: Instant) {
        let known = self.licenses.get(license).map(|d| d.exported);
        if known != Some(true) && !self.place(license, known.is_some(), limit, now) {
            self.other[reason] += 1;
            return;
        }
        if let Some(d) = self.licenses.get_mut(license) {
            d.counts[reason] += 1;
            d.last = now;
        }
    }

    /// Finds `license` a place among the exported series.
    fn place(&mut self, license: &str, known: bool, limit: usize, now: Instant) -> bool {
        if !known && self.licenses.len() >= DENIAL_MEMORY {
            return false;
        }
        if self.exported >= limit {
            let quietest = self
                .licenses
                .iter_mut()
                .filter(|(_, d)| d.exported)
                .min_by_key(|(_, d)| d.last)
                .map(|(_, d)| d);
            match quietest {
                Some(d) if now.duration_since(d.last) >= DENIAL_SERIES_HOLD => {
                    d.exported = false;
                    self.exported -= 1;
                }
                _ => return false,
            }
        }
        let entry = self.licenses.entry(license.to_owned()).or_insert(LicenseDenials {
            counts: [0; DENIAL_REASONS.len()],
            last: now,
            exported: false,
        });
        entry.exported = true;
        self.exported += 1;
        true
    }
}

static DENIALS_TABLE: Mutex<Option<DenialTable>> = Mutex::new(None);

/// Counts a refusal answered for `license`, when `status` is a denial
/// (NO_SEATS_AVAILABLE, QUEUE_TIMEOUT, LICENSE_*, RATE_LIMITED); other
/// statuses are ignored. An unknown license (LICENSE_NOT_FOUND, or no
/// license at all) always counts under `_other`: its id is the caller's
/// choice, not a bounded set.
pub fn denial(license: &str, status: Status) {
    let Some(reason) = DENIAL_REASONS.iter().position(|r| *r == status) else {
        return;
    };
    let Ok(mut table) = DENIALS_TABLE.lock() else {
        return;
    };
    let table = table.get_or_insert_with(DenialTable::default);
    if license.is_empty() || status == Status::LicenseNotFound {
        table.other[reason] += 1;
        return;
    }
    let limit = LICENSE_SERIES_LIMIT.load(Ordering::Relaxed);
    table.count(license, reason, limit, Instant::now());
}

/// Describes and records the snapshot series into the current recorder:
/// `ops::telemetry` calls it at each scrape with a recorder made for that
/// scrape. Denials are this process's own (every process has them);
/// seats, queues and streams only while this process leads the reaper and
/// its last pass is recent.
pub fn record_snapshots() {
    describe_counter!(
        DENIALS,
        "Refusals answered, by license (at most metrics.license_series_limit licenses per process, the rest as _other) and reason."
    );
    if let Ok(mut table) = DENIALS_TABLE.lock() {
        let table = table.get_or_insert_with(DenialTable::default);
        for (i, reason) in DENIAL_REASONS.iter().enumerate() {
            counter!(DENIALS, "license" => OTHER, "reason" => reason.as_str()).absolute(table.other[i]);
        }
        for (license, d) in table.licenses.iter().filter(|(_, d)| d.exported) {
            // LICENSE_NOT_FOUND is never counted per license (see `denial`).
            let reasons = DENIAL_REASONS.iter().enumerate();
            for (i, reason) in reasons.filter(|(_, r)| **r != Status::LicenseNotFound) {
                counter!(DENIALS, "license" => license.clone(), "reason" => reason.as_str())
                    .absolute(d.counts[i]);
            }
        }
    }

    let Ok(mut shared) = SHARED.lock() else { return };
    if shared.as_ref().is_some_and(|s| s.expires <= Instant::now()) {
        *shared = None;
    }
    let Some(shared) = shared.as_ref() else { return };
    describe_gauge!(
        SEATS_USED,
        "Seats held, per license: the top metrics.license_series_limit by utilisation, the rest summed as _other."
    );
    describe_gauge!(
        SEATS_CAPACITY,
        "Seats of the license, per license (same licenses as seatgate_seats_used)."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Sessions waiting, per license (same licenses as seatgate_seats_used)."
    );
    describe_gauge!(
        SEATS_LINGERING,
        "Of the seats held, those lingering after a release (linger_ms), per license (same licenses as seatgate_seats_used)."
    );
    describe_gauge!(
        SEATS_BORROWED,
        "Of the seats held, those borrowed (held without heartbeats), per license (same licenses as seatgate_seats_used)."
    );
    describe_gauge!(
        LICENSE_EXPIRY,
        "When the license expires, unix seconds, for every license that expires within 30 days or has expired, whatever its utilisation (at most 1000, the soonest first; seatgate_licenses_expiring counts them all)."
    );
    describe_gauge!(
        LICENSE_EXPIRY_INVALID,
        "1 per license whose expires_at_ms breaks the rule (every acquire is refused LICENSE_INVALID); at most 1000."
    );
    describe_gauge!(
        LICENSES_EXPIRING,
        "Licenses not yet expired that expire within 1d, 7d or 30d (cumulative), every license counted."
    );
    describe_gauge!(LICENSES_EXPIRED, "Licenses whose expiry has passed.");
    describe_gauge!(
        LICENSES_EXPIRY_INVALID,
        "Licenses whose expires_at_ms breaks the rule (LICENSE_INVALID)."
    );
    describe_gauge!(FLEET_SEATS_USED, "Seats held over all licenses.");
    describe_gauge!(FLEET_SEATS_LINGERING, "Seats lingering over all licenses.");
    describe_gauge!(FLEET_SEATS_BORROWED, "Seats borrowed over all licenses.");
    describe_gauge!(FLEET_SEATS_CAPACITY, "Seats over all licenses.");
    describe_gauge!(QUEUED_SESSIONS, "Sessions waiting over all licenses.");
    describe_gauge!(
        LICENSES,
        "Licenses in the license index, as the reaper's last complete census counted them."
    );
    describe_gauge!(
        STREAM_PENDING,
        "Requests delivered to a worker and not yet acknowledged, per requests stream shard."
    );
    describe_gauge!(
        STREAM_LAG,
        "Requests not yet delivered to any worker, per requests stream shard."
    );
    describe_gauge!(DEAD_LETTERS, "Entries in the dead-letter stream.");
    if let Some(s) = &shared.seats {
        for l in s.top.iter().chain([&s.other]) {
            gauge!(SEATS_USED, "license" => l.license.clone()).set(l.used as f64);
            gauge!(SEATS_CAPACITY, "license" => l.license.clone()).set(l.total as f64);
            gauge!(QUEUE_DEPTH, "license" => l.license.clone()).set(l.queued as f64);
            gauge!(SEATS_LINGERING, "license" => l.license.clone()).set(l.lingering as f64);
            gauge!(SEATS_BORROWED, "license" => l.license.clone()).set(l.borrowed as f64);
        }
        let e = &s.expiry;
        for (_, license, ms) in &e.dated {
            gauge!(LICENSE_EXPIRY, "license" => license.clone()).set(*ms as f64 / 1000.0);
        }
        for license in &e.invalid {
            gauge!(LICENSE_EXPIRY_INVALID, "license" => license.clone()).set(1.0);
        }
        for (n, (within, _)) in e.expiring.iter().zip(EXPIRY_WINDOWS) {
            gauge!(LICENSES_EXPIRING, "within" => within).set(*n as f64);
        }
        gauge!(LICENSES_EXPIRED).set(e.expired as f64);
        gauge!(LICENSES_EXPIRY_INVALID).set(e.invalid_count as f64);
        gauge!(FLEET_SEATS_USED).set(s.fleet.used as f64);
        gauge!(FLEET_SEATS_CAPACITY).set(s.fleet.total as f64);
        gauge!(QUEUED_SESSIONS).set(s.fleet.queued as f64);
        gauge!(FLEET_SEATS_LINGERING).set(s.fleet.lingering as f64);
        gauge!(FLEET_SEATS_BORROWED).set(s.fleet.borrowed as f64);
        gauge!(LICENSES).set(s.licenses as f64);
    }
    for st in &shared.streams {
        gauge!(STREAM_PENDING, "stream" => st.stream.clone()).set(st.pending as f64);
        if let Some(lag) = st.lag {
            gauge!(STREAM_LAG, "stream" => st.stream.clone()).set(lag as f64);
        }
    }
    if let Some(n) = shared.dead_letters {
        gauge!(DEAD_LETTERS).set(n as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_is_its_own_label_and_anything_else_is_invalid() {
        for &op in Op::ALL {
            assert_eq!(op_label(op.as_str()), op.as_str());
        }
        for junk in ["", "invalid", "steal", "Acquire", "acquire "] {
            assert_eq!(op_label(junk), "invalid", "{junk:?}");
        }
    }

    fn counts(t: &DenialTable, license: &str) -> Option<u64> {
        t.licenses
            .get(license)
            .filter(|d| d.exported)
            .map(|d| d.counts[0])
    }

    #[test]
    fn denial_series_are_bounded_and_never_go_backwards() {
        let mut t = DenialTable::default();
        let start = Instant::now();
        t.count("a", 0, 2, start);
        t.count("b", 0, 2, start);
        t.count("c", 0, 2, start); // no place: a and b were denied just now
        assert_eq!(
            (counts(&t, "a"), counts(&t, "b"), counts(&t, "c")),
            (Some(1), Some(1), None)
        );
        assert_eq!(t.other[0], 1);

        // b stays busy; a goes quiet for longer than the hold, so c takes its place.
        let later = start + DENIAL_SERIES_HOLD + Duration::from_secs(1);
        t.count("b", 0, 2, later);
        t.count("c", 0, 2, later);
        assert_eq!(
            (counts(&t, "a"), counts(&t, "b"), counts(&t, "c")),
            (None, Some(2), Some(1))
        );

        // a comes back while both places are held: _other, and its series is not back.
        t.count("a", 0, 2, later);
        assert_eq!((counts(&t, "a"), t.other[0]), (None, 2));

        // Once c is quiet, a gets a place again and resumes from 1, not 0.
        let much_later = later + DENIAL_SERIES_HOLD + Duration::from_secs(1);
        t.count("b", 0, 2, much_later);
        t.count("a", 0, 2, much_later);
        assert_eq!(counts(&t, "a"), Some(2));
        assert_eq!(t.exported, 2);
        let total: u64 = t.licenses.values().map(|d| d.counts[0]).sum::<u64>() + t.other[0];
        assert_eq!(total, 8, "every denial counted exactly once");
    }

    #[test]
    fn top_licenses_by_utilisation_and_the_rest_as_other() {
        let seat = |license: &str, used, total, queued| LicenseSeats {
            license: license.into(),
            used,
            total,
            queued,
            ..LicenseSeats::default()
        };
        LICENSE_SERIES_LIMIT.store(2, Ordering::Relaxed);
        let mut census = SeatCensus::default();
        for l in [
            seat("half", 1, 2, 0),
            seat("idle", 0, 10, 0),
            seat("full", 3, 3, 4),
            seat("tenth", 1, 10, 0),
        ] {
            census.add(l, 0);
        }
        shared_state(Some(census), vec![], Some(0), Duration::from_secs(60));
        let s = SHARED.lock().unwrap().clone().unwrap().seats.unwrap();
        let names: Vec<&str> = s.top.iter().map(|l| l.license.as_str()).collect();
        assert_eq!(names, ["full", "half"]);
        assert_eq!(s.other, seat(OTHER, 1, 20, 0));
        assert_eq!(s.fleet, seat("", 5, 25, 4));
        assert_eq!(s.licenses, 4);
        // A pass that completed no census keeps the seats of the last one.
        shared_state(None, vec![], Some(1), Duration::from_secs(60));
        let kept = SHARED.lock().unwrap().clone().unwrap();
        assert_eq!((kept.seats.unwrap().licenses, kept.dead_letters), (4, Some(1)));
        reaper_leader(false);
        assert!(
            SHARED.lock().unwrap().is_none(),
            "a process that stops leading exports none"
        );
    }

    #[test]
    fn every_license_expiring_within_30_days_or_expired_has_a_series_whatever_its_rank() {
        let seat = |license: &str, used, expiry| LicenseSeats {
            license: license.into(),
            used,
            total: 10,
            expiry,
            ..LicenseSeats::default()
        };
        // The limit every test of the snapshot uses (the statics are shared).
        LICENSE_SERIES_LIMIT.store(2, Ordering::Relaxed);
        let now = 2_000_000_000_000;
        let hours = |h: i64| Expiry::At(now + h * 3_600_000);
        let mut census = SeatCensus::default();
        for l in [
            seat("busy", 9, hours(24 * 60)), // 60 days: beyond the horizon
            seat("full", 10, Expiry::Never),
            seat("idle", 0, hours(12)), // the lowest rank: a series all the same
            seat("week", 0, hours(24 * 6)),
            seat("gone", 1, hours(-5)),
            seat("bad", 0, Expiry::Invalid),
            seat("month", 0, hours(24 * 29)),
        ] {
            census.add(l, now);
        }
        let s = SeatSummary::from(census);
        let top: Vec<&str> = s.top.iter().map(|l| l.license.as_str()).collect();
        assert_eq!(top, ["full", "busy"]);
        let dated: Vec<(&str, i64)> = s
            .expiry
            .dated
            .iter()
            .map(|(_, l, ms)| (l.as_str(), (ms - now) / 3_600_000))
            .collect();
        assert_eq!(
            dated,
            [("idle", 12), ("week", 144), ("month", 696), ("gone", -5)],
            "the soonest first, then the expired"
        );
        assert_eq!(s.expiry.expiring, [1, 2, 3], "1d, 7d, 30d, cumulative");
        assert_eq!((s.expiry.expired, s.expiry.invalid_count), (1, 1));
        assert_eq!(s.expiry.invalid, ["bad"]);

        // Licenses written as their hash alone, counted by the other walk.
        let mut unindexed = ExpiryCensus::default();
        unindexed.add("billing-1", hours(2), now);
        unindexed.add("billing-2", Expiry::Invalid, now);
        let mut census = SeatCensus::default();
        census.add(seat("week", 0, hours(24 * 6)), now);
        census.add_expiries(&unindexed);
        let e = SeatSummary::from(census).expiry;
        let names: Vec<&str> = e.dated.iter().map(|(_, l, _)| l.as_str()).collect();
        assert_eq!(names, ["billing-1", "week"]);
        assert_eq!((e.expiring, e.invalid_count), ([1, 2, 2], 1));
    }

    #[test]
    fn expiry_series_are_bounded_and_the_counts_cover_the_rest() {
        let now = 2_000_000_000_000;
        let mut e = ExpiryCensus::default();
        // Counted latest first: the cap must keep the soonest whatever the order.
        for i in (0..EXPIRY_SERIES_LIMIT as i64 + 10).rev() {
            e.add(&format!("l{i}"), Expiry::At(now + 60_000 * (i + 1)), now);
        }
        e.add("expired", Expiry::At(now - 1), now);
        assert_eq!(e.dated.len(), EXPIRY_SERIES_LIMIT);
        assert_eq!(e.dated[0].1, "l0");
        assert!(
            e.dated.iter().all(|(_, l, _)| l != "expired"),
            "expiring ones first"
        );
        assert_eq!(e.expiring[0], EXPIRY_SERIES_LIMIT + 10);
        assert_eq!(e.expired, 1);
    }

    #[test]
    fn an_expiry_reads_as_the_scripts_read_it() {
        assert_eq!(Expiry::read(None), Expiry::Never);
        assert_eq!(Expiry::read(Some("0")), Expiry::Never);
        assert_eq!(Expiry::read(Some("1800000000000")), Expiry::At(1_800_000_000_000));
        // Seconds mistaken for ms, and junk: LICENSE_INVALID, not a 1970 expiry.
        assert_eq!(Expiry::read(Some("1800000000")), Expiry::Invalid);
        assert_eq!(Expiry::read(Some("soon")), Expiry::Invalid);
    }

    /// Every metric name declared in this file has HELP text: a new metric
    /// without a `describe_*!` line fails here, not on an operator's dashboard.
    #[test]
    fn every_metric_name_is_described() {
        let source = include_str!("metrics.rs");
        // The first argument of every `describe_*!(NAME, …)` call.
        let described: Vec<&str> = source
            .split("describe_")
            .skip(1)
            .filter_map(|call| {
                let args = call.split_once("!(")?.1;
                let name = args.split_once(',')?.0.trim();
                name.chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
                    .then_some(name)
            })
            .collect();
        for line in source.lines() {
            let Some(rest) = line.strip_prefix("pub const ") else {
                continue;
            };
            let Some((name, value)) = rest.split_once(": &str = ") else {
                continue;
            };
            if !value.starts_with("\"seatgate_") && !value.starts_with("\"license_lua_script") {
                continue;
            }
            assert!(described.contains(&name), "{name} has no describe_*! call");
        }
    }
}
