//! The HTTP endpoint beside the worker: `/metrics` for Prometheus, `/live`
//! (the process runs) and `/ready` (it can reach Redis and serve requests).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// Shared readiness flag: the worker sets it while it can read its stream.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    /// Whether the process is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

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
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on metrics.listen {addr}: {e}")))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AppState>| async move { s.metrics.render() }),
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
