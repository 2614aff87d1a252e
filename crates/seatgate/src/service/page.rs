//! The live status page: `/` (the page, with `/status.css` and `/status.js`),
//! `/status.json` (a summary row per license, busiest first) and
//! `/license.json?license=<id>&limit=<n>` (one license, its holders and
//! waiters paged). Read-only: no route changes state. Served beside
//! `/metrics` or on a listener of its own (`[http]`, see ops/http.rs).
//!
//! At scale: every viewer is served from one snapshot per refresh interval
//! ([`snapshot`]), so Redis's load does not grow with the number of open
//! pages; the summary is encoded once per snapshot. Personal fields (user,
//! hardware and session ids) reach the JSON only with `http.page_personal`
//! ([`view`]).
//!
//! Protection: the page answers only requests whose `Host` is a loopback
//! name, its listen address or one of `http.allowed_hosts`, and refuses any
//! other with 421, so that a site whose name an attacker re-points at
//! 127.0.0.1 (DNS rebinding) cannot read it from a victim's browser.
//!
//! The page's files are compiled in (no CDN, no web fonts), so it works on an
//! air-gapped host. Every response carries a Content-Security-Policy that
//! allows only this origin's own script, style and fetches: the script builds
//! the DOM with `textContent`, and the policy is the second line of defence
//! should a hardware id ever reach HTML parsing.

pub mod snapshot;
pub mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub use snapshot::Snapshots;
use view::Detail;

const INDEX_HTML: &str = include_str!("page/index.html");
const STATUS_CSS: &str = include_str!("page/status.css");
const STATUS_JS: &str = include_str!("page/status.js");

/// Holders and waiters `/license.json` lists when the page asks for no `limit`.
const DEFAULT_ROWS: usize = 10;
/// The most holders and waiters it lists, whatever the page asks.
const MAX_ROWS: usize = 10_000;

/// Only this origin's files and fetches; no inline script or style, no frames,
/// no plugins, no forms.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// The `Host` header values the page answers: lower-cased host names
/// (any port) and `host:port` pairs (that port only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHosts {
    /// Host names or address literals (`[::1]` with brackets), any port.
    names: Vec<String>,
    /// `host:port`, that port only.
    exact: Vec<String>,
    /// Whether any IP address literal is answered too (the endpoints: a
    /// scraper or probe names the address it reaches; DNS rebinding needs
    /// a name, never an address).
    any_address: bool,
}

impl AllowedHosts {
    /// The loopback names, `listen`'s address (unless it is a wildcard,
    /// which no browser asks for) and `extra` (`http.allowed_hosts`).
    pub fn new(listen: SocketAddr, extra: &[String]) -> AllowedHosts {
        let mut hosts = AllowedHosts {
            names: ["localhost", "127.0.0.1", "[::1]"].map(str::to_owned).to_vec(),
            exact: Vec::new(),
            any_address: false,
        };
        if !listen.ip().is_unspecified() {
            hosts.names.push(match listen {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            });
        }
        for entry in extra {
            let entry = entry.to_ascii_lowercase();
            match split_host(&entry) {
                (_, Some(_)) => hosts.exact.push(entry),
                (name, None) => hosts.names.push(name.to_owned()),
            }
        }
        hosts
    }

    /// The hosts `/metrics`, `/live` and `/ready` answer: those of
    /// [`AllowedHosts::new`] and any IP address literal, so that Prometheus
    /// and a probe reaching the listener by its address need no setting,
    /// while a name an attacker points at it (DNS rebinding) is refused
    /// unless it is listed.
    pub fn for_endpoints(listen: SocketAddr, extra: &[String]) -> AllowedHosts {
        AllowedHosts {
            any_address: true,
            ..AllowedHosts::new(listen, extra)
        }
    }

    /// Whether a request with this `Host` header is answered.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let (name, _) = split_host(&host);
        let address = || {
            let literal = name
                .strip_prefix('[')
                .and_then(|n| n.strip_suffix(']'))
                .unwrap_or(name);
            literal.parse::<std::net::IpAddr>().is_ok()
        };
        self.names.iter().any(|n| *n == name) || self.exact.contains(&host) || (self.any_address && address())
    }
}

/// `host[:port]` split at the port, brackets of an IPv6 literal kept:
/// `("[::1]", Some("9464"))`, `("seats.example.com", None)`.
fn split_host(host: &str) -> (&str, Option<&str>) {
    let port_from = if host.starts_with('[') {
        host.find(']').map(|end| end + 1)
    } else {
        host.rfind(':')
    };
    match port_from.map(|at| host.split_at(at)) {
        Some((name, rest)) if rest.len() > 1 && rest[1..].bytes().all(|b| b.is_ascii_digit()) => {
            (name, Some(&rest[1..]))
        }
        _ => (host, None),
    }
}

/// The page's routes, for any router state (they carry their own), behind
/// the `Host` check of `hosts`.
pub fn routes<S>(snapshots: Arc<Snapshots>, hosts: AllowedHosts) -> Router<S>
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
        .route("/status.json", get(status_json))
        .route("/license.json", get(license_json))
        .route_layer(middleware::from_fn_with_state(Arc::new(hosts), check_host))
        .with_state(snapshots)
}

/// Refuses a request whose `Host` the page does not answer (421).
async fn check_host(State(hosts): State<Arc<AllowedHosts>>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    match host {
        Some(host) if hosts.allows(host) => next.run(request).await,
        _ => guarded(
            StatusCode::MISDIRECTED_REQUEST,
            "text/plain; charset=utf-8",
            "the status page does not answer to this Host; add it to http.allowed_hosts\n",
        ),
    }
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
        // Status is live data: never serve a stale copy.
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

async fn status_json(State(snapshots): State<Arc<Snapshots>>) -> Response {
    match snapshots.current().await {
        Ok(snapshot) => guarded(StatusCode::OK, "application/json", snapshot.summary_json.clone()),
        Err(error) => failure(StatusCode::SERVICE_UNAVAILABLE, error),
    }
}

async fn license_json(State(snapshots): State<Arc<Snapshots>>, uri: Uri) -> Response {
    let (mut license, mut limit) = (None, DEFAULT_ROWS);
    for (name, value) in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('='))
    {
        match name {
            "license" => license = percent_decoded(value),
            "limit" => match value.parse::<usize>() {
                Ok(n) => limit = n.min(MAX_ROWS),
                Err(_) => {
                    return failure(
                        StatusCode::BAD_REQUEST,
                        format!("limit {value:?} is not a number"),
                    );
                }
            },
            _ => {}
        }
    }
    let Some(license) = license else {
        return failure(StatusCode::BAD_REQUEST, "no license= given".to_owned());
    };
    let snapshot = match snapshots.current().await {
        Ok(snapshot) => snapshot,
        Err(error) => return failure(StatusCode::SERVICE_UNAVAILABLE, error),
    };
    let detail = Detail::of(
        &snapshot.status,
        &license,
        limit,
        snapshots.refresh_ms(),
        snapshots.personal(),
    );
    match detail.map(|d| serde_json::to_string(&d)) {
        Some(Ok(body)) => guarded(StatusCode::OK, "application/json", body),
        Some(Err(e)) => failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode license {license}: {e}"),
        ),
        None => failure(StatusCode::NOT_FOUND, format!("no license {license}")),
    }
}

/// A query value with its `%XX` escapes (and `+`) decoded; `None` when it
/// is not UTF-8 or an escape is broken.
fn percent_decoded(value: &str) -> Option<String> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_check_answers_loopback_the_listen_address_and_the_listed_hosts_only() {
        let listen: SocketAddr = "10.0.0.5:9464".parse().unwrap();
        let hosts = AllowedHosts::new(
            listen,
            &["Seats.Example.com".to_owned(), "proxy.internal:8443".to_owned()],
        );
        for ok in [
            "localhost",
            "localhost:9464",
            "127.0.0.1:9464",
            "[::1]:9464",
            "10.0.0.5:9464",
            "seats.example.com",
            "SEATS.example.com:443",
            "proxy.internal:8443",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:9464",
            "localhost.evil.example",
            "proxy.internal",
            "proxy.internal:80",
            "10.0.0.6:9464",
            "",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
        let wildcard = AllowedHosts::new("0.0.0.0:9464".parse().unwrap(), &[]);
        assert!(!wildcard.allows("0.0.0.0:9464"));
        let v6 = AllowedHosts::new("[fd00::5]:9464".parse().unwrap(), &[]);
        assert!(v6.allows("[fd00::5]:9464") && !v6.allows("[fd00::6]:9464"));
    }

    #[test]
    fn the_endpoints_answer_any_address_too_but_no_unlisted_name() {
        let hosts =
            AllowedHosts::for_endpoints("0.0.0.0:9464".parse().unwrap(), &["seats.internal".to_owned()]);
        for ok in [
            "10.0.0.5:9464",
            "[fd00::5]:9464",
            "192.168.1.20",
            "localhost:9464",
            "seats.internal:9464",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "evil.example:9464",
            "10.0.0.5.evil.example",
            "[evil]:9464",
            "",
            "999.1.1.1",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(percent_decoded("cad%3Asuite").as_deref(), Some("cad:suite"));
        assert_eq!(percent_decoded("a+b").as_deref(), Some("a b"));
        assert_eq!(percent_decoded("bad%4"), None);
        assert_eq!(percent_decoded("bad%zz"), None);
    }
}
