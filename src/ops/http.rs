//! The HTTP endpoint beside the worker: `/metrics` for Prometheus, `/live`
//! (the process runs), `/ready` (it can reach Redis and serve requests) and
//! the status page, `/` and `/status.json` ([`crate::ops::page`]).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::ops::page::{self, StatusSource};
use crate::ops::telemetry;
use crate::runtime::health::Readiness;

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    ready: Readiness,
}

/// Binds `addr` and serves until `shutdown` is cancelled. Returns the bound
/// address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    ready: Readiness,
    status: StatusSource,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })?;
    let bound = listener.local_addr()?;
    let app = Router::new()
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
        .merge(page::routes(status))
        .with_state(AppState { metrics, ready });
    let task = tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok((bound, task))
}
