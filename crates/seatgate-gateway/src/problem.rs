//! Errors as RFC 9457 problem details (`application/problem+json`), each
//! carrying the wire status (`code`) when a worker decided the request, and
//! the HTTP status a seat request's answer maps to.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use seatgate_core::status::Status;
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of a problem.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem (RFC 9457).
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq)]
pub struct Problem {
    /// A URI naming the kind of problem: `urn:seatgate:<code>` (lower case).
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened and what to do, for people.
    pub detail: String,
    /// The wire status (`NO_SEATS_AVAILABLE`, …) or a gateway code
    /// (`UNAUTHENTICATED`, `FORBIDDEN`, `RATE_LIMITED`, `BAD_REQUEST`,
    /// `UNAVAILABLE`, `TIMEOUT`).
    pub code: String,
    /// Seats in use, when a worker said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats_used: Option<u64>,
    /// Seats of the license, when a worker said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats_total: Option<u64>,
    /// Seconds to wait before trying again (429 and 503).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
}

impl Problem {
    /// A problem of the gateway's own (`code` one of its codes).
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Problem {
        Problem {
            kind: format!("urn:seatgate:{}", code.to_ascii_lowercase()),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            code: code.to_owned(),
            seats_used: None,
            seats_total: None,
            retry_after_s: None,
        }
    }

    /// 400.
    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", detail)
    }

    /// 403.
    pub fn forbidden(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::FORBIDDEN, "FORBIDDEN", detail)
    }

    /// 503: Redis or the workers cannot be reached.
    pub fn unavailable(detail: impl Into<String>) -> Problem {
        let mut p = Problem::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", detail);
        p.retry_after_s = Some(1);
        p
    }

    /// 429 with the seconds to wait.
    pub fn rate_limited(detail: impl Into<String>, retry_after_s: u64) -> Problem {
        let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED", detail);
        p.retry_after_s = Some(retry_after_s.max(1));
        p
    }

    /// A worker's refusal.
    pub fn from_wire(status: Status, detail: &str, seats: (u64, u64)) -> Problem {
        let http = http_status(status);
        let mut p = Problem::new(http, status.as_str(), detail);
        if p.detail.is_empty() {
            p.detail = status.refusal_reason().unwrap_or(status.as_str()).to_owned();
        }
        p.seats_used = Some(seats.0);
        p.seats_total = Some(seats.1);
        if status == Status::RateLimited {
            p.retry_after_s = Some(1);
        }
        p
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry = self.retry_after_s;
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(s) = retry {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                headers.insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

/// The HTTP status of a worker's answer. A match without a wildcard: a new
/// wire status does not compile until it has its HTTP status here.
pub fn http_status(status: Status) -> StatusCode {
    match status {
        Status::Acquired | Status::Granted => StatusCode::CREATED,
        Status::Queued => StatusCode::ACCEPTED,
        Status::AlreadyActive
        | Status::Released
        | Status::LeftQueue
        | Status::HeartbeatUpdated
        | Status::Revoked => StatusCode::OK,
        Status::NoSeatsAvailable | Status::LimitReached | Status::QueueTimeout => StatusCode::CONFLICT,
        Status::SessionNotFound | Status::SessionNotActive | Status::LicenseNotFound => StatusCode::NOT_FOUND,
        Status::LicenseInactive | Status::LicenseExpired | Status::LeaseMismatch | Status::SessionRevoked => {
            StatusCode::FORBIDDEN
        }
        Status::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Status::InvalidRequest => StatusCode::BAD_REQUEST,
        Status::LicenseInvalid => StatusCode::SERVICE_UNAVAILABLE,
        Status::Error => StatusCode::BAD_GATEWAY,
        Status::RequestExpired => StatusCode::GATEWAY_TIMEOUT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_an_error_status_and_every_success_is_not() {
        for &status in Status::ALL {
            let http = http_status(status);
            let answered = status.is_ok() || status == Status::Queued || status == Status::LeftQueue;
            assert_eq!(http.is_success(), answered, "{status:?} -> {http}");
        }
    }

    #[test]
    fn a_wire_refusal_keeps_its_status_and_seats() {
        let p = Problem::from_wire(Status::NoSeatsAvailable, "", (5, 5));
        assert_eq!((p.status, p.code.as_str()), (409, "NO_SEATS_AVAILABLE"));
        assert_eq!(p.kind, "urn:seatgate:no_seats_available");
        assert_eq!((p.seats_used, p.seats_total), (Some(5), Some(5)));
        assert!(!p.detail.is_empty());
    }
}
