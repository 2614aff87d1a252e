//! The HTTP endpoints beside the worker: `/metrics` for Prometheus, `/live`
//! (the process runs), `/ready` (it can reach Redis and serve requests; when
//! not, one line says why: Redis out of memory, silent, the worker not serving), and
//! the status page ([`crate::service::page`]) on the same listener or on one of
//! its own (`http.page_listen`). Every route checks `Host`: the endpoints
//! answer an IP address, a loopback name or one of `http.allowed_hosts`
//! (license ids and utilisation are not for a site re-pointed at the
//! listener by DNS rebinding), the page a narrower set (`page::AllowedHosts`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::runtime::health::Readiness;
use crate::service::page::{self, AllowedHosts, Snapshots};
use crate::service::telemetry;

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    ready: Readiness,
}

/// The status page to serve on a listener: its data and the extra `Host`
/// names it answers (`http.allowed_hosts`).
#[derive(Clone)]
pub struct PageRoutes {
    /// The shared snapshots.
    pub snapshots: Arc<Snapshots>,
    /// `http.allowed_hosts`; the listener's own address is added when bound.
    pub allowed_hosts: Vec<String>,
}

impl PageRoutes {
    fn on(self, bound: SocketAddr) -> Router {
        page::routes(self.snapshots, AllowedHosts::new(bound, &self.allowed_hosts))
    }
}

/// Binds `addr` (named by `setting` in errors).
async fn bind(
    setting: &'static str,
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen {
            setting,
            addr,
            source,
        })?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Serves `app` on `listener` until `shutdown` is cancelled.
fn spawn(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "http endpoint stopped");
        }
    })
}

/// Refuses a request to an endpoint whose `Host` it does not answer (421).
async fn check_host(State(hosts): State<Arc<AllowedHosts>>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    match host {
        Some(host) if hosts.allows(host) => next.run(request).await,
        _ => (
            StatusCode::MISDIRECTED_REQUEST,
            "this endpoint answers an IP address, a loopback name or a name in http.allowed_hosts; add it there\n",
        )
            .into_response(),
    }
}

/// Binds `addr` and serves `/metrics`, `/live`, `/ready` and `page` (when
/// given) until `shutdown` is cancelled; `allowed_hosts` are the names
/// (`http.allowed_hosts`) the endpoints answer besides addresses and
/// loopback. Returns the bound address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    ready: Readiness,
    page: Option<PageRoutes>,
    allowed_hosts: &[String],
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let (listener, bound) = bind("metrics.listen", addr).await?;
    let hosts = Arc::new(AllowedHosts::for_endpoints(bound, allowed_hosts));
    let mut app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AppState>| async move { telemetry::render(&s.metrics, s.ready.get()) }),
        )
        .route("/live", get(|| async { "live\n" }))
        .route(
            "/ready",
            get(|State(s): State<AppState>| async move {
                match s.ready.reason() {
                    None => (StatusCode::OK, "ready\n".to_owned()),
                    Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
                }
            }),
        )
        .route_layer(middleware::from_fn_with_state(hosts, check_host))
        .with_state(AppState { metrics, ready });
    if let Some(page) = page {
        app = app.merge(page.on(bound));
    }
    Ok((bound, spawn(listener, app, shutdown)))
}

/// Binds `addr` (`http.page_listen`) and serves only the status page there
/// until `shutdown` is cancelled.
pub async fn serve_page(
    addr: SocketAddr,
    page: PageRoutes,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let (listener, bound) = bind("http.page_listen", addr).await?;
    Ok((bound, spawn(listener, page.on(bound), shutdown)))
}
