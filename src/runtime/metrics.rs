//! Every metric name and the one function that records each.
//!
//! Labels are low-cardinality by construction: script names, ops, statuses
//! and field names are closed sets; a per-license series exists only where it
//! is bounded (`metrics.license_series_limit`), and session ids never become
//! labels. The Prometheus exporter and its buckets are set up in
//! `ops::telemetry`.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::engine::protocol::Op;
use crate::engine::status::Status;

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
/// Waiters granted a seat.
pub const GRANTS: &str = "seatgate_grants_total";
/// Waiters whose wait ran out.
pub const QUEUE_TIMEOUTS: &str = "seatgate_queue_timeouts_total";
/// Time spent in a wait queue, by `outcome` (`granted`, `timeout`).
pub const QUEUE_WAIT: &str = "seatgate_queue_wait_seconds";
/// Sessions waiting, per `license`, for at most `metrics.license_series_limit`
/// licenses (the deepest queues); `seatgate_queued_sessions` is the total over all.
pub const QUEUE_DEPTH: &str = "seatgate_queue_depth";
/// Sessions waiting over all licenses, after the last reaper pass.
pub const QUEUED_SESSIONS: &str = "seatgate_queued_sessions";
/// Duration of one reaper pass over every license.
pub const REAPER_PASS: &str = "seatgate_reaper_pass_seconds";
/// Pending entries claimed from other consumers (XAUTOCLAIM).
pub const CLAIMED: &str = "seatgate_claimed_requests_total";
/// Entries moved to the dead-letter stream.
pub const DEAD_LETTERED: &str = "seatgate_dead_lettered_total";
/// Redelivered entries answered from the dedupe record (no second effect).
pub const REPLAYED: &str = "seatgate_replayed_requests_total";
/// Events that could not be appended to the events stream.
pub const EVENT_ERRORS: &str = "seatgate_event_errors_total";
/// Requests whose stream entry id was ahead of the Redis clock by more than
/// the dedupe window (a caller chose it: docs/operations.md).
pub const FUTURE_ENTRY_IDS: &str = "seatgate_future_entry_ids_total";

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

/// Counts one event that could not be published.
pub fn event_error() {
    counter!(EVENT_ERRORS).increment(1);
}

/// Counts one eviction.
pub fn evicted() {
    counter!(EVICTIONS).increment(1);
}

/// Records how a wait in the queue ended.
pub fn queue_outcome(status: Status, waited_ms: i64) {
    let outcome = if status == Status::Granted {
        counter!(GRANTS).increment(1);
        "granted"
    } else {
        counter!(QUEUE_TIMEOUTS).increment(1);
        "timeout"
    };
    histogram!(QUEUE_WAIT, "outcome" => outcome).record(waited_ms.max(0) as f64 / 1000.0);
}

/// Records one reaper pass: its duration and the queue depths it saw. Only
/// the `limit` deepest queues get a per-license series, which bounds the
/// label cardinality whatever the number of licenses; series that drop out
/// are set to 0 and then expire with the exporter's idle timeout.
pub fn reaper_pass(elapsed: Duration, queues: &[(String, i64)], limit: usize) {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static SHOWN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

    histogram!(REAPER_PASS).record(elapsed.as_secs_f64());
    let mut queues = queues.to_vec();
    queues.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    gauge!(QUEUED_SESSIONS).set(queues.iter().map(|(_, d)| *d).sum::<i64>() as f64);
    let top: HashSet<String> = queues.iter().take(limit).map(|(l, _)| l.clone()).collect();
    for (license, depth) in queues.iter().take(limit) {
        gauge!(QUEUE_DEPTH, "license" => license.clone()).set(*depth as f64);
    }
    let Ok(mut shown) = SHOWN.lock() else { return };
    for gone in shown.get_or_insert_with(HashSet::new).difference(&top) {
        gauge!(QUEUE_DEPTH, "license" => gone.clone()).set(0.0);
    }
    *shown = Some(top);
}

/// Counts entries claimed from other consumers.
pub fn claimed(n: usize) {
    counter!(CLAIMED).increment(n as u64);
}

/// Counts one dead-lettered entry.
pub fn dead_lettered() {
    counter!(DEAD_LETTERED).increment(1);
}

/// Counts one replayed (redelivered, deduplicated) entry.
pub fn replayed() {
    counter!(REPLAYED).increment(1);
}

/// Counts one request whose entry id was ahead of the Redis clock.
pub fn future_entry_id() {
    counter!(FUTURE_ENTRY_IDS).increment(1);
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
}
