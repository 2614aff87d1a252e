//! The gateway's metrics, `seatgate_gateway_*`, in its own Prometheus
//! recorder (`/metrics` of the gateway process).

use std::sync::OnceLock;
use std::time::Instant;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::auth::AuthFailure;
use crate::problem::Problem;

/// Requests answered, by route and HTTP status.
pub const REQUESTS: &str = "seatgate_gateway_requests_total";
/// Time from a request's arrival to its answer, by route.
pub const DURATION: &str = "seatgate_gateway_request_duration_seconds";
/// Credentials refused, by reason.
pub const AUTH_FAILURES: &str = "seatgate_gateway_auth_failures_total";
/// Requests refused with 429 by the gateway, by limit (`credential`, `auth_failures`).
pub const RATE_LIMITED: &str = "seatgate_gateway_rate_limited_total";
/// Server-sent event streams open now.
pub const EVENT_STREAMS: &str = "seatgate_gateway_event_streams";
/// Borrow tokens signed.
pub const BORROW_TOKENS: &str = "seatgate_gateway_borrow_tokens_total";

const ROUTES: [&str; 4] = ["acquire", "heartbeat", "release", "license"];
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the recorder once per process and describes every metric.
pub fn install() -> Result<PrometheusHandle, String> {
    static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(DURATION.into()), BUCKETS)
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())?;
            describe_counter!(REQUESTS, "Requests answered, by route and HTTP status code.");
            describe_histogram!(
                DURATION,
                metrics::Unit::Seconds,
                "Time from a request's arrival to its answer, by route."
            );
            describe_counter!(AUTH_FAILURES, "Credentials refused (401), by reason.");
            describe_counter!(
                RATE_LIMITED,
                "Requests the gateway refused with 429, by limit (credential, auth_failures)."
            );
            describe_gauge!(EVENT_STREAMS, "Server-sent event streams open now.");
            describe_counter!(BORROW_TOKENS, "Borrow tokens signed.");
            for failure in AuthFailure::ALL {
                counter!(AUTH_FAILURES, "reason" => failure.label()).absolute(0);
            }
            for limit in ["credential", "auth_failures"] {
                counter!(RATE_LIMITED, "limit" => limit).absolute(0);
            }
            for route in ROUTES {
                counter!(REQUESTS, "route" => route, "code" => "200").absolute(0);
            }
            gauge!(EVENT_STREAMS).set(0.0);
            counter!(BORROW_TOKENS).absolute(0);
            Ok(handle)
        })
        .clone()
}

/// Counts a request of `route` answered with `result`'s status.
pub(crate) fn answered<T>(
    route: &'static str,
    result: &Result<(axum::http::StatusCode, T), Problem>,
    started: Instant,
) {
    let code = match result {
        Ok((status, _)) => status.as_u16(),
        Err(p) => p.status,
    };
    counter!(REQUESTS, "route" => route, "code" => code.to_string()).increment(1);
    histogram!(DURATION, "route" => route).record(started.elapsed().as_secs_f64());
}

pub(crate) fn auth_failed(failure: AuthFailure) {
    counter!(AUTH_FAILURES, "reason" => failure.label()).increment(1);
}

pub(crate) fn rate_limited(limit: &'static str) {
    counter!(RATE_LIMITED, "limit" => limit).increment(1);
}

pub(crate) fn event_streams(delta: f64) {
    gauge!(EVENT_STREAMS).increment(delta);
}

pub(crate) fn borrow_token() {
    counter!(BORROW_TOKENS).increment(1);
}
