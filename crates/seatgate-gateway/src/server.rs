//! The listener: HTTPS on rustls (the certificate reloaded on SIGHUP) or
//! plain HTTP on loopback, bounded heads and bodies, a head-read timeout
//! against slow clients, the `Host` allow-list, CORS only for allow-listed
//! origins, and the routes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use axum_server::tls_rustls::RustlsConfig;
use axum_server::Handle;
use metrics_exporter_prometheus::PrometheusHandle;
use seatgate_core::db::Db;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api;
use crate::auth::{Authenticator, Oidc};
use crate::borrow::BorrowSigner;
use crate::config::GatewaySettings;
use crate::error::GatewayError;
use crate::events::EventHub;
use crate::openapi;
use crate::problem::Problem;
use crate::state::{Clients, Deployment, Gateway, Limits};
use crate::tokens::{random_bytes, TokenStore};

/// How long a stopping gateway lets requests in flight finish.
const DRAIN: Duration = Duration::from_secs(10);

/// The names a request's `Host` may carry.
#[derive(Debug, Clone)]
struct AllowedHosts(Vec<String>);

impl AllowedHosts {
    fn allows(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            // [v6]:port
            Some(rest) => {
                return rest
                    .split(']')
                    .next()
                    .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
            }
            None => host.rsplit_once(':').map_or(host, |(name, port)| {
                if port.bytes().all(|b| b.is_ascii_digit()) {
                    name
                } else {
                    host
                }
            }),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name.parse::<std::net::Ipv4Addr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.0.iter().any(|h| h.eq_ignore_ascii_case(&name))
    }
}

async fn check_host(State(hosts): State<Arc<AllowedHosts>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    match host {
        Some(host) if hosts.allows(&host) => next.run(request).await,
        _ => Problem::new(
            StatusCode::MISDIRECTED_REQUEST,
            "MISDIRECTED",
            "this gateway answers an IP address, a loopback name or a name in gateway.allowed_hosts; add it there",
        )
        .into_response(),
    }
}

/// CORS for the allow-listed origins only: a request from any other origin
/// gets no CORS header (the browser refuses it), a preflight from one 403.
async fn cors(State(origins): State<Arc<Vec<String>>>, request: Request, next: Next) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    let allowed = origin
        .as_ref()
        .filter(|o| origins.iter().any(|a| a == *o))
        .cloned();
    if request.method() == Method::OPTIONS && origin.is_some() {
        let Some(origin) = allowed else {
            return Problem::forbidden("this origin is not in gateway.cors_allowed_origins").into_response();
        };
        let mut response = StatusCode::NO_CONTENT.into_response();
        let h = response.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(
                "authorization, content-type, seatgate-lease, idempotency-key, last-event-id",
            ),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        h.insert(header::VARY, HeaderValue::from_static("origin"));
        return response;
    }
    let mut response = next.run(request).await;
    if let Some(origin) = allowed {
        if let Ok(v) = HeaderValue::from_str(&origin) {
            response
                .headers_mut()
                .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
            response
                .headers_mut()
                .insert(header::VARY, HeaderValue::from_static("origin"));
        }
    }
    response
}

fn routes(gw: Arc<Gateway>, metrics: PrometheusHandle) -> Router {
    let hosts = Arc::new(AllowedHosts(gw.settings.allowed_hosts.clone()));
    let origins = Arc::new(gw.settings.cors_allowed_origins.clone());
    let db = gw.db.clone();
    let api = Router::new()
        .route("/v1/licenses/{license}/seats", post(api::acquire))
        .route("/v1/licenses/{license}/seats/{session}", delete(api::release))
        .route(
            "/v1/licenses/{license}/seats/{session}/heartbeat",
            post(api::heartbeat),
        )
        .route("/v1/licenses/{license}/seats/{session}/events", get(api::events))
        .route("/v1/licenses/{license}", get(api::license))
        .route("/.well-known/jwks.json", get(api::jwks))
        .with_state(Arc::clone(&gw))
        .route(
            "/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], openapi::document()) }),
        )
        .route("/live", get(|| async { "live\n" }))
        .route(
            "/ready",
            get(move || {
                let db = db.clone();
                async move {
                    let ping = tokio::time::timeout(Duration::from_secs(1), async {
                        redis::cmd("PING").query_async::<String>(&mut db.clone()).await
                    })
                    .await;
                    match ping {
                        Ok(Ok(_)) => (StatusCode::OK, "ready\n".to_owned()),
                        Ok(Err(e)) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: Redis refused PING: {e}\n"),
                        ),
                        Err(_) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "not ready: Redis did not answer PING within 1 s\n".to_owned(),
                        ),
                    }
                }
            }),
        )
        .route("/metrics", get(move || async move { metrics.render() }));
    let mut app = api.layer(DefaultBodyLimit::max(gw.settings.max_body_bytes));
    if !gw.settings.cors_allowed_origins.is_empty() {
        app = app.layer(middleware::from_fn_with_state(origins, cors));
    }
    app.layer(middleware::from_fn_with_state(hosts, check_host))
}

/// The deployment's gateway secret (`<prefix>:{gateway}:secret`), made by
/// the first gateway to start: every gateway derives the same session and
/// lease from an `Idempotency-Key`.
async fn secret(db: &Db, prefix: &str) -> Result<[u8; 32], GatewayError> {
    let key = format!("{prefix}:{{gateway}}:secret");
    let fresh: String = random_bytes::<32>()?.iter().map(|b| format!("{b:02x}")).collect();
    let _: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg(&fresh)
        .arg("NX")
        .query_async(&mut db.clone())
        .await?;
    let stored: String = redis::cmd("GET").arg(&key).query_async(&mut db.clone()).await?;
    let bytes: Vec<u8> = (0..stored.len() / 2)
        .filter_map(|i| u8::from_str_radix(stored.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    bytes.try_into().map_err(|_| {
        GatewayError::Config(format!(
            "{key} in Redis is not 64 hex digits: delete it and restart the gateways"
        ))
    })
}

/// Installs rustls's provider for the process: the workspace's `ring`, as for
/// Redis (seatgate-core's db module says why: aws-lc-rs costs cmake and most
/// of a minute of a 2-core build; ring has no post-quantum key exchange,
/// hence the `allow`). A second install is a no-op. An HTTP client (reqwest,
/// built without a provider of its own) of the same process needs it first.
#[allow(deprecated)]
pub fn use_ring_for_tls() {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

/// Runs the gateway until `shutdown` is cancelled; `bound` hears the
/// address it listens on once it does.
pub async fn serve(
    settings: GatewaySettings,
    deployment: Deployment,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
    bound: impl FnOnce(SocketAddr),
) -> Result<(), GatewayError> {
    settings.validate().map_err(GatewayError::Config)?;
    use_ring_for_tls();
    let oidc = if settings.oidc.issuer.is_empty() {
        None
    } else {
        let oidc = Oidc::load(&settings.oidc).await?;
        oidc.refresh_periodically(shutdown.clone());
        Some(oidc)
    };
    let signer = BorrowSigner::load(&settings.borrow)?;
    let tls = if settings.tls() {
        Some(
            RustlsConfig::from_pem_file(&settings.tls_cert_file, &settings.tls_key_file)
                .await
                .map_err(|e| {
                    GatewayError::Config(format!(
                        "cannot load gateway.tls_cert_file {} / gateway.tls_key_file {}: {e}",
                        settings.tls_cert_file, settings.tls_key_file
                    ))
                })?,
        )
    } else {
        None
    };
    let db = Db::connect(&deployment.redis).await?;
    let secret = secret(&db, &deployment.key_prefix).await?;
    let gw = Arc::new(Gateway {
        auth: Authenticator::new(
            TokenStore::new(&deployment.key_prefix),
            Duration::from_millis(settings.token_cache_ms),
            oidc,
        ),
        clients: Clients::new(deployment.client.clone()),
        hub: EventHub::new(deployment.redis.clone(), db.clone()),
        limits: Limits::new(&settings),
        signer,
        secret,
        db,
        deployment,
        settings: settings.clone(),
    });
    let app = routes(Arc::clone(&gw), metrics).into_make_service_with_connect_info::<SocketAddr>();
    let listener = std::net::TcpListener::bind(settings.listen).map_err(|source| GatewayError::Listen {
        addr: settings.listen,
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| GatewayError::Listen {
            addr: settings.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| GatewayError::Listen {
        addr: settings.listen,
        source,
    })?;
    let handle: Handle<SocketAddr> = Handle::new();
    let stopper = handle.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        stopper.graceful_shutdown(Some(DRAIN));
    });
    let header_timeout = Duration::from_millis(settings.header_read_timeout_ms);
    info!(%addr, tls = tls.is_some(), "gateway listening");
    bound(addr);
    let result = match tls {
        Some(config) => {
            reload_on_sighup(config.clone(), settings.clone(), shutdown.clone());
            let mut server = axum_server::from_tcp_rustls(listener, config)
                .map_err(|source| GatewayError::Listen { addr, source })?
                .handle(handle);
            tune(server.http_builder(), header_timeout, settings.max_header_bytes);
            server.serve(app).await
        }
        None => {
            let mut server = axum_server::from_tcp(listener)
                .map_err(|source| GatewayError::Listen { addr, source })?
                .handle(handle);
            tune(server.http_builder(), header_timeout, settings.max_header_bytes);
            server.serve(app).await
        }
    };
    for client in gw.clients.take().await {
        let _ = client.close().await;
    }
    result.map_err(|source| GatewayError::Listen { addr, source })
}

/// HTTP/1.1 only, heads bounded and read within `header_timeout`.
fn tune(
    builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    header_timeout: Duration,
    max_header_bytes: usize,
) {
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(max_header_bytes.max(8192));
}

/// Reloads the certificate and key from their files on SIGHUP: a renewed
/// certificate is served without a restart.
fn reload_on_sighup(config: RustlsConfig, settings: GatewaySettings, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            warn!("cannot listen for SIGHUP: the certificate is reloaded only by a restart");
            return;
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            match config
                .reload_from_pem_file(&settings.tls_cert_file, &settings.tls_key_file)
                .await
            {
                Ok(()) => info!(cert = %settings.tls_cert_file, "certificate reloaded"),
                Err(e) => {
                    warn!(error = %e, cert = %settings.tls_cert_file, "cannot reload the certificate; serving the old one")
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_addresses_loopback_names_or_listed() {
        let hosts = AllowedHosts(vec!["seats.example.com".into()]);
        for ok in [
            "127.0.0.1:8443",
            "10.0.0.7",
            "[::1]:8443",
            "localhost:1",
            "Seats.Example.com:443",
            "seats.example.com.",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8443",
            "seats.example.com.evil.example",
            "",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
    }
}
