//! The live status page beside `/metrics`: `/` (the page, with `/status.css`
//! and `/status.js`) and `/status.json`, the data of `seatgate status --json`
//! read fresh from Redis on every request. Read-only: no route changes state.
//!
//! The page's files are compiled in (no CDN, no web fonts), so it works on an
//! air-gapped host. Every response carries a Content-Security-Policy that
//! allows only this origin's own script, style and fetches: the script builds
//! the DOM with `textContent`, and the policy is the second line of defence
//! should a user email or hardware id ever reach HTML parsing.

use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::db::Db;
use crate::engine::keys::Keys;
use crate::views;

const INDEX_HTML: &str = include_str!("page/index.html");
const STATUS_CSS: &str = include_str!("page/status.css");
const STATUS_JS: &str = include_str!("page/status.js");

/// Longest `/status.json` waits for Redis. The page polls every second, so a
/// stuck Redis should turn into a quick 503 (and the page's banner) rather
/// than requests piling up behind the connection's 5 s response timeout.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Only this origin's files and fetches; no inline script or style, no frames,
/// no plugins, no forms.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// Where `/status.json` reads from.
#[derive(Clone)]
pub struct StatusSource {
    /// The shared connection (a clone per request is cheap: it multiplexes).
    db: Db,
    /// The key namespace (`keys.prefix`), as `seatgate status` uses it.
    keys: Keys,
}

impl StatusSource {
    /// Reads licenses through `db` under `keys`.
    pub fn new(db: Db, keys: Keys) -> StatusSource {
        StatusSource { db, keys }
    }
}

/// The page's routes, for any router state (they carry their own).
pub fn routes<S>(source: StatusSource) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/status.css",
            get(|| async { asset("text/css; charset=utf-8", STATUS_CSS) }),
        )
        .route(
            "/status.js",
            get(|| async { asset("text/javascript; charset=utf-8", STATUS_JS) }),
        )
        .route(
            "/status.json",
            get(|source: axum::extract::State<StatusSource>| status_json(source.0)),
        )
        .with_state(source)
}

/// The headers every page response carries.
fn guarded(code: StatusCode, content_type: &'static str, body: impl IntoResponse) -> Response {
    let headers: [(HeaderName, HeaderValue); 5] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // Status is live data, and the page is small: never serve a stale copy.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ];
    (code, headers, body).into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    guarded(StatusCode::OK, content_type, body)
}

/// One line of JSON saying what went wrong, for the page's banner.
fn failure(code: StatusCode, error: String) -> Response {
    let body = serde_json::json!({ "error": error }).to_string();
    guarded(code, "application/json", body)
}

async fn status_json(source: StatusSource) -> Response {
    let StatusSource { mut db, keys } = source;
    match tokio::time::timeout(READ_TIMEOUT, views::status::status(&mut db, &keys, None)).await {
        Ok(Ok(status)) => match serde_json::to_string(&status) {
            Ok(body) => guarded(StatusCode::OK, "application/json", body),
            Err(e) => failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode status: {e}"),
            ),
        },
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "status page cannot read redis");
            failure(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read status: {e}"),
            )
        }
        Err(_) => failure(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("redis did not answer within {READ_TIMEOUT:?}"),
        ),
    }
}
