//! The HTTP endpoints beside the worker: `/metrics` for Prometheus, `/live`
//! (the process runs), `/ready` (it can reach Redis and serve requests), and
//! the status page ([`crate::service::page`]) on the same listener or on one of
//! its own (`http.page_listen`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
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

/// Binds `addr` and serves `/metrics`, `/live`, `/ready` and `page` (when
/// given) until `shutdown` is cancelled. Returns the bound address (useful
/// with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    ready: Readiness,
    page: Option<PageRoutes>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let (listener, bound) = bind("metrics.listen", addr).await?;
    let mut app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AppState>| async move { telemetry::render(&s.metrics, s.ready.get()) }),
        )
        .route("/live", get(|| async { "live\n" }))
        .route(
            "/ready",
            get(|State(s): State<AppState>| async move {
                if s.ready.get() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }),
        )
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
