//! The HTTP API (docs/gateway.md): acquire, heartbeat and release a seat,
//! follow it or its wait over server-sent events, and read a license's
//! availability. Every seat request goes to the workers through the Rust
//! client on the caller's application's requests stream, with the user and
//! group of the caller's credential: the gateway has no other way to a seat.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::Stream;
use ring::hmac;
use seatgate_client::{Call, Lease, Reply, RequestPolicy, SeatOp};
use seatgate_core::keys::Keys;
use seatgate_core::protocol::valid_id;
use seatgate_core::status::Status;
use serde::{Deserialize, Serialize};
use tracing::warn;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::events::SeatEvent;
use crate::metrics;
use crate::problem::{http_status, Problem};
use crate::state::Gateway;
use crate::tokens::now_ms;

/// The header carrying a seat's lease (never the URL: URLs are logged).
pub const LEASE_HEADER: &str = "seatgate-lease";
/// The header that makes an acquire safe to send again.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// An acquire.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The session (1–128 of `A-Z a-z 0-9 . _ - : @`). Absent: the gateway
    /// makes one (the same one for every retry with the same `Idempotency-Key`).
    pub session: Option<String>,
    /// Metadata kept with the seat and shown to operators (a JSON object).
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
    /// How long to wait in the queue when no seat is free, ms (0: do not wait).
    #[serde(default)]
    pub wait_ms: u64,
    /// Queue priority 0–9 (the license's `max_priority` caps it).
    #[serde(default)]
    pub priority: u8,
    /// Borrow the seat for this long, ms: it is held without heartbeats
    /// until then, and the answer carries a signed borrow token.
    #[serde(default)]
    pub borrow_ms: u64,
    /// The machine a borrow is for; goes into the borrow token and the seat's metadata.
    pub hardware_id: Option<String>,
    /// Must be the credential's user if given: the gateway decides who asks.
    pub user: Option<String>,
    /// Must be the credential's group if given.
    pub group: Option<String>,
}

/// A seat, or a place in the queue.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq)]
pub struct SeatResponse {
    /// `ACQUIRED`, `ALREADY_ACTIVE` or `QUEUED`.
    pub status: String,
    /// The license.
    pub license: String,
    /// The session.
    pub session: String,
    /// The seat's lease: send it in the `Seatgate-Lease` header of every
    /// heartbeat, release and events request of this session.
    pub lease: String,
    /// Seats in use.
    pub seats_used: u64,
    /// Seats of the license.
    pub seats_total: u64,
    /// Heartbeat at least every third of this, ms (a seat).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout_ms: Option<u64>,
    /// When the seat's heartbeat clock started, Unix ms (a seat).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_since_ms: Option<u64>,
    /// The place in the queue, 1 = next (QUEUED).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// When a borrowed seat comes back, Unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub borrowed_until_ms: Option<u64>,
    /// A borrowed seat's signed token (JWS, EdDSA; keys at `/.well-known/jwks.json`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub borrow_token: Option<String>,
    /// Where to follow the seat or the wait (server-sent events), with the
    /// cursor from which nothing is missed.
    pub events: String,
}

/// A heartbeat's or release's answer.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq)]
pub struct SessionResponse {
    /// `HEARTBEAT_UPDATED`, `QUEUED` (a heartbeat of a waiting session:
    /// it keeps its place), `RELEASED` or `LEFT_QUEUE`.
    pub status: String,
    /// The license.
    pub license: String,
    /// The session.
    pub session: String,
    /// Seats in use.
    pub seats_used: u64,
    /// Seats of the license.
    pub seats_total: u64,
    /// The heartbeat timeout in force, ms (heartbeat).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout_ms: Option<u64>,
    /// Where a waiting session stands, 1-based (`QUEUED`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
}

/// A license's availability.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq)]
pub struct LicenseResponse {
    /// The license.
    pub license: String,
    /// Seats of the license.
    pub seats_total: u64,
    /// Seats in use.
    pub seats_used: u64,
    /// Seats free now.
    pub seats_free: u64,
    /// Sessions waiting.
    pub waiting: u64,
    /// Whether the license hands out seats (not inactive, not expired).
    pub active: bool,
    /// When it expires, Unix ms (absent: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

/// A seat's place in the URL.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SeatPath {
    /// The license.
    pub license: String,
    /// The session.
    pub session: String,
}

/// Where to resume an event stream from.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// An event id (`id:` of an event, or the cursor of an acquire's
    /// `events` link): only later events are sent. `Last-Event-ID` wins.
    pub after: Option<String>,
}

/// The problems every authenticated route may answer (OpenAPI responses).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(crate) enum CommonProblems {
    /// No valid credential: send `Authorization: Bearer <token>`
    #[response(status = 401, content_type = "application/problem+json")]
    Unauthorized(Problem),
    /// Too many requests with this credential, or failed authentications from this address: wait `Retry-After` seconds
    #[response(status = 429, content_type = "application/problem+json")]
    TooManyRequests(Problem),
    /// Redis or the workers cannot be reached (or, for events, this gateway has gateway.max_event_streams open): retry
    #[response(status = 503, content_type = "application/problem+json")]
    Unavailable(Problem),
}

/// What a handler answers: a JSON body with its status, or a problem.
type Answer<T> = Result<(StatusCode, Json<T>), Problem>;

/// Runs a route's `answer`, counting it and its time (`metrics::answered`).
async fn timed<T>(route: &'static str, answer: impl std::future::Future<Output = Answer<T>>) -> Answer<T> {
    let started = Instant::now();
    let result = answer.await;
    metrics::answered(route, &result, started);
    result
}

/// Authenticates the request and counts it against the credential's rate.
pub(crate) async fn caller(gw: &Gateway, headers: &HeaderMap, peer: SocketAddr) -> Result<Caller, Problem> {
    let ip = peer.ip();
    if let Err(wait) = gw.limits.may_try(ip) {
        metrics::rate_limited("auth_failures");
        return Err(Problem::rate_limited(
            "too many failed authentications from this address (gateway.auth_failures_per_minute): wait and retry with a valid credential",
            wait,
        ));
    }
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let caller = match gw.auth.authenticate(&gw.db, authorization).await {
        Ok(caller) => caller,
        Err(Ok(failure)) => {
            gw.limits.failed(ip);
            metrics::auth_failed(failure);
            let mut p = Problem::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", failure.detail());
            p.title = "Unauthorized".into();
            return Err(p);
        }
        Err(Err(e)) => {
            warn!(error = %e, "cannot look up a token");
            return Err(Problem::unavailable(format!("cannot check the credential: {e}")));
        }
    };
    if !gw.deployment.serves(&caller.app) {
        return Err(Problem::forbidden(format!(
            "this credential's application {:?} is not one of the deployment's applications (stream.applications): ask your administrator",
            caller.app
        )));
    }
    gw.limits
        .check(&caller)
        .inspect_err(|_| metrics::rate_limited("credential"))?;
    Ok(caller)
}

fn checked_id(what: &str, id: &str) -> Result<(), Problem> {
    if valid_id(id) {
        Ok(())
    } else {
        Err(Problem::bad_request(format!(
            "{what} must be 1 to 128 characters of A-Z a-z 0-9 . _ - : @"
        )))
    }
}

fn lease_of(headers: &HeaderMap) -> Result<Lease, Problem> {
    let raw = headers
        .get(LEASE_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Problem::bad_request("send the seat's lease in the Seatgate-Lease header"))?;
    Lease::parse(raw).ok_or_else(|| Problem::bad_request("the Seatgate-Lease header is not a lease"))
}

/// 32 hex digits of HMAC-SHA256(secret, parts), for a derived session or lease.
fn derived(secret: &[u8; 32], parts: &[&str]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let tag = hmac::sign(&key, parts.join("\u{1f}").as_bytes());
    tag.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A random 32-hex-digit id.
fn random_hex() -> Result<String, Problem> {
    let bytes = crate::tokens::random_bytes::<16>().map_err(|e| Problem::unavailable(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Sends `call` for `caller` and waits for the first answer.
async fn ask(gw: &Gateway, caller: &Caller, call: &Call) -> Result<Reply, Problem> {
    let client = gw.clients.of(&caller.app).await.map_err(|e| {
        warn!(error = %e, app = %caller.app, "cannot connect a client");
        Problem::unavailable(format!("cannot reach Redis: {e}"))
    })?;
    match client.call(call, gw.reply_timeout()).await {
        Ok(reply) => Ok(reply),
        Err(seatgate_client::Error::ReplyTimeout(t)) => Err(Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "TIMEOUT",
            format!("no worker answered within {} ms: the request may still be decided; send it again with the same Idempotency-Key (acquire) or lease", t.as_millis()),
        )),
        Err(e) => Err(Problem::unavailable(format!("cannot send the request to Redis: {e}"))),
    }
}

fn events_link(license: &str, session: &str, cursor: &str) -> String {
    format!("/v1/licenses/{license}/seats/{session}/events?after={cursor}")
}

/// Takes a seat, or a place in the queue.
#[utoipa::path(
    post,
    path = "/v1/licenses/{license}/seats",
    tag = "seats",
    params(
        ("license" = String, Path, description = "The license"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes the request safe to send again: the same key gets the same session and lease, so a retry is answered with the same seat (ALREADY_ACTIVE) or place (QUEUED)")
    ),
    request_body(content = AcquireBody, content_type = "application/json"),
    responses(
        (status = 201, description = "The seat is the session's", body = SeatResponse),
        (status = 200, description = "The session already held it (a retry)", body = SeatResponse),
        (status = 202, description = "Queued: follow `events` for GRANTED or QUEUE_TIMEOUT", body = SeatResponse),
        (status = 400, description = "Invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Refused (another user named, license inactive or expired, revoked)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such license", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "No seat free, or a limit reached", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "No worker answered in time", body = Problem, content_type = "application/problem+json"),
        CommonProblems
    ),
    security(("bearer" = []))
)]
pub(crate) async fn acquire(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(license): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Answer<SeatResponse> {
    timed("acquire", async {
        let body = parse_body(&body)?;
        acquire_inner(&gw, peer, license, headers, body).await
    })
    .await
}

/// The acquire's JSON body; an empty body asks for nothing in particular.
fn parse_body(body: &[u8]) -> Result<AcquireBody, Problem> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(AcquireBody::default());
    }
    serde_json::from_slice(body).map_err(|e| Problem::bad_request(format!("the body is not an acquire: {e}")))
}

async fn acquire_inner(
    gw: &Gateway,
    peer: SocketAddr,
    license: String,
    headers: HeaderMap,
    body: AcquireBody,
) -> Answer<SeatResponse> {
    let caller = caller(gw, &headers, peer).await?;
    checked_id("the license", &license)?;
    if body.user.is_some() && body.user != caller.user {
        return Err(Problem::forbidden(
            "the user is decided by your credential: leave `user` out, or send your own",
        ));
    }
    if body.group.is_some() && body.group != caller.group {
        return Err(Problem::forbidden(
            "the group is decided by your credential: leave `group` out, or send your own",
        ));
    }
    if body.borrow_ms > 0 && gw.signer.is_none() {
        return Err(Problem::bad_request(
            "this gateway signs no borrow tokens (gateway.borrow.signing_key_file is not set): ask without borrow_ms",
        ));
    }
    if let Some(hw) = &body.hardware_id {
        checked_id("hardware_id", hw)?;
    }
    let key = headers.get(IDEMPOTENCY_HEADER).and_then(|v| v.to_str().ok());
    if key.is_some_and(|k| k.is_empty() || k.len() > 256) {
        return Err(Problem::bad_request(
            "Idempotency-Key must be 1 to 256 characters",
        ));
    }
    let session = match (&body.session, key) {
        (Some(s), _) => {
            checked_id("the session", s)?;
            s.clone()
        }
        (None, Some(k)) => format!(
            "h-{}",
            derived(&gw.secret, &["session", &caller.credential, &license, k])
        ),
        (None, None) => format!("h-{}", random_hex()?),
    };
    let lease_text = match key {
        Some(k) => derived(&gw.secret, &["lease", &caller.credential, &license, &session, k]),
        None => random_hex()?,
    };
    let lease = Lease::parse(&lease_text).ok_or_else(|| Problem::unavailable("cannot make a lease"))?;
    let mut meta = body.meta.clone().unwrap_or_default();
    if let Some(hw) = &body.hardware_id {
        meta.insert("hardware_id".into(), serde_json::Value::String(hw.clone()));
    }
    let policy = RequestPolicy {
        user: caller.user.clone(),
        group: caller.group.clone(),
        priority: body.priority,
        borrow_ms: body.borrow_ms,
    };
    let mut call = Call::new(SeatOp::Acquire, &license, &session)
        .with_lease(lease)
        .with_policy(policy)
        .with_ttl(gw.reply_timeout());
    if !meta.is_empty() {
        call = call.with_meta(serde_json::Value::Object(meta));
    }
    if body.wait_ms > 0 {
        call = call.with_wait(Duration::from_millis(body.wait_ms));
    }
    let stream = gw.deployment.events_stream_for(&license);
    let cursor = gw
        .hub
        .cursor(&stream)
        .await
        .map_err(|e| Problem::unavailable(format!("cannot read the events stream from Redis: {e}")))?;
    let reply = ask(gw, &caller, &call).await?;
    let status = reply.status();
    match status {
        Status::Acquired | Status::AlreadyActive | Status::Queued => {}
        other => return Err(Problem::from_wire(other, reply.error(), reply.seats())),
    }
    let (seats_used, seats_total) = reply.seats();
    let held = status != Status::Queued;
    let borrowed_until_ms = Some(reply.int("borrowed_until_ms"))
        .filter(|&t| t > 0)
        .map(|t| t as u64);
    let borrow_token = match (&gw.signer, borrowed_until_ms) {
        (Some(signer), Some(until)) if held => {
            let sub = caller.user.clone().unwrap_or_else(|| caller.app.clone());
            let (token, _) = signer
                .sign(
                    &sub,
                    &caller.app,
                    &license,
                    &session,
                    body.hardware_id.as_deref(),
                    now_ms(),
                    until,
                )
                .map_err(|e| Problem::unavailable(e.to_string()))?;
            metrics::borrow_token();
            Some(token)
        }
        _ => None,
    };
    let response = SeatResponse {
        status: status.as_str().to_owned(),
        license: license.clone(),
        session: session.clone(),
        lease: lease_text,
        seats_used,
        seats_total,
        // Held or waiting, the session must show it is alive within it.
        heartbeat_timeout_ms: reply.heartbeat_timeout().map(|d| d.as_millis() as u64),
        held_since_ms: reply.held_since_ms().filter(|_| held),
        position: (!held).then(|| reply.int("position").max(0) as u64),
        borrowed_until_ms,
        borrow_token,
        events: events_link(&license, &session, &cursor),
    };
    Ok((http_status(status), Json(response)))
}

/// Keeps a seat: restarts its heartbeat clock.
#[utoipa::path(
    post,
    path = "/v1/licenses/{license}/seats/{session}/heartbeat",
    tag = "seats",
    params(SeatPath, ("Seatgate-Lease" = String, Header, description = "The seat's lease")),
    responses(
        (status = 200, description = "HEARTBEAT_UPDATED, or QUEUED for a waiting session, which keeps its place (it must heartbeat while it waits, as a holder does)", body = SessionResponse),
        (status = 400, description = "No lease, or an invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Another lease holds the seat, or it was revoked", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The session holds no seat: acquire again", body = Problem, content_type = "application/problem+json"),
        CommonProblems
    ),
    security(("bearer" = []))
)]
pub(crate) async fn heartbeat(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(SeatPath { license, session }): Path<SeatPath>,
    headers: HeaderMap,
) -> Answer<SessionResponse> {
    timed(
        "heartbeat",
        session_call(&gw, peer, SeatOp::Heartbeat, license, session, &headers),
    )
    .await
}

/// Gives a seat back, or leaves the queue.
#[utoipa::path(
    delete,
    path = "/v1/licenses/{license}/seats/{session}",
    tag = "seats",
    params(SeatPath, ("Seatgate-Lease" = String, Header, description = "The seat's lease")),
    responses(
        (status = 200, description = "RELEASED, or LEFT_QUEUE", body = SessionResponse),
        (status = 400, description = "No lease, or an invalid request", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Another lease holds the seat, or it was revoked", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The session holds no seat (already gone)", body = Problem, content_type = "application/problem+json"),
        CommonProblems
    ),
    security(("bearer" = []))
)]
pub(crate) async fn release(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(SeatPath { license, session }): Path<SeatPath>,
    headers: HeaderMap,
) -> Answer<SessionResponse> {
    timed(
        "release",
        session_call(&gw, peer, SeatOp::Release, license, session, &headers),
    )
    .await
}

async fn session_call(
    gw: &Gateway,
    peer: SocketAddr,
    op: SeatOp,
    license: String,
    session: String,
    headers: &HeaderMap,
) -> Answer<SessionResponse> {
    let caller = caller(gw, headers, peer).await?;
    checked_id("the license", &license)?;
    checked_id("the session", &session)?;
    let lease = lease_of(headers)?;
    let call = Call::new(op, &license, &session)
        .with_lease(lease)
        .with_ttl(gw.reply_timeout());
    let reply = ask(gw, &caller, &call).await?;
    let status = reply.status();
    match status {
        Status::HeartbeatUpdated | Status::Released | Status::LeftQueue => {}
        Status::Queued if op == SeatOp::Heartbeat => {}
        other => return Err(Problem::from_wire(other, reply.error(), reply.seats())),
    }
    let (seats_used, seats_total) = reply.seats();
    Ok((
        StatusCode::OK,
        Json(SessionResponse {
            status: status.as_str().to_owned(),
            license,
            session,
            seats_used,
            seats_total,
            heartbeat_timeout_ms: reply.heartbeat_timeout().map(|d| d.as_millis() as u64),
            position: (status == Status::Queued).then(|| reply.int("position").max(0) as u64),
        }),
    ))
}

/// Follows a seat or a wait: server-sent events from the license's events.
#[utoipa::path(
    get,
    path = "/v1/licenses/{license}/seats/{session}/events",
    tag = "seats",
    params(
        SeatPath,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (any gateway)"),
        EventsQuery
    ),
    responses(
        (status = 200, description = "`text/event-stream`: one event per change of the session (`queued`, `granted`, `queue_timeout`, `left_queue`, `acquired`, `released`, `evicted`, `revoked`, `denied`), `data` its fields as JSON, `id` its place; the stream ends after the event that ends the seat or the wait", content_type = "text/event-stream", body = String),
        CommonProblems
    ),
    security(("bearer" = []))
)]
pub(crate) async fn events(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(SeatPath { license, session }): Path<SeatPath>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    match events_inner(gw, peer, license, session, query, headers).await {
        Ok(sse) => sse.into_response(),
        Err(p) => p.into_response(),
    }
}

async fn events_inner(
    gw: Arc<Gateway>,
    peer: SocketAddr,
    license: String,
    session: String,
    query: EventsQuery,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let caller = caller(&gw, &headers, peer).await?;
    checked_id("the license", &license)?;
    checked_id("the session", &session)?;
    if gw.hub.followers() >= gw.settings.max_event_streams {
        return Err(Problem::unavailable(
            "too many event streams are open on this gateway (gateway.max_event_streams): retry, or use another gateway",
        ));
    }
    let cursor = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(query.after);
    if let Some(c) = &cursor {
        let ok = c.split_once('-').is_some_and(|(a, b)| {
            !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
        });
        if !ok {
            return Err(Problem::bad_request(
                "Last-Event-ID (or after) must be an event id, <ms>-<seq>",
            ));
        }
    }
    let kept = gw.deployment.kept_session(&caller.app, &session);
    let user = caller
        .user
        .as_deref()
        .map(|u| gw.deployment.kept_user(&caller.app, u));
    let stream = gw.deployment.events_stream_for(&license);
    let follow = gw
        .hub
        .follow(&stream, &license, &kept, cursor.as_deref())
        .await
        .map_err(|e| Problem::unavailable(format!("cannot read the events stream from Redis: {e}")))?;
    metrics::event_streams(1.0);
    let guard = StreamGuard;
    let sent_session = session.clone();
    let events = futures_util::stream::unfold((follow, guard), move |(mut follow, guard)| {
        let user = user.clone();
        let session = sent_session.clone();
        async move {
            loop {
                let event = follow.next().await?;
                // Only the caller's own: another user's session of the same
                // application is not followed.
                if let (Some(user), Some(theirs)) = (&user, event.fields.get("user")) {
                    if user != theirs {
                        continue;
                    }
                }
                return Some((Ok(sse_event(&event, &session)), (follow, guard)));
            }
        }
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_millis(gw.settings.sse_keepalive_ms))))
}

/// Counts an open SSE stream down when it ends.
struct StreamGuard;

impl Drop for StreamGuard {
    fn drop(&mut self) {
        metrics::event_streams(-1.0);
    }
}

/// An events entry as the SSE event a follower gets: its session as the caller names it.
fn sse_event(event: &SeatEvent, session: &str) -> Event {
    let mut data: serde_json::Map<String, serde_json::Value> = event
        .fields
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    data.insert("session".into(), serde_json::Value::String(session.to_owned()));
    Event::default()
        .id(event.id.clone())
        .event(event.kind())
        .data(serde_json::Value::Object(data).to_string())
}

/// A license's availability.
#[utoipa::path(
    get,
    path = "/v1/licenses/{license}",
    tag = "licenses",
    params(("license" = String, Path, description = "The license")),
    responses(
        (status = 200, description = "Seats total, in use, free; sessions waiting", body = LicenseResponse),
        (status = 403, description = "The license is not for this application", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such license", body = Problem, content_type = "application/problem+json"),
        CommonProblems
    ),
    security(("bearer" = []))
)]
pub(crate) async fn license(
    State(gw): State<Arc<Gateway>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(license): Path<String>,
    headers: HeaderMap,
) -> Answer<LicenseResponse> {
    timed("license", license_inner(&gw, peer, license, headers)).await
}

async fn license_inner(
    gw: &Gateway,
    peer: SocketAddr,
    license: String,
    headers: HeaderMap,
) -> Answer<LicenseResponse> {
    let caller = caller(gw, &headers, peer).await?;
    checked_id("the license", &license)?;
    let keys = Keys::new(&gw.deployment.key_prefix).license(&license);
    let app_field = format!("application:{}", caller.app);
    let (record, used, waiting, any_app): (Vec<Option<String>>, u64, u64, Vec<String>) = redis::pipe()
        .cmd("HMGET")
        .arg(&keys.license)
        .arg(&["seats_total", "active", "expires_at_ms", &app_field])
        .zcard(&keys.holders)
        .zcard(&keys.queue)
        .hkeys(&keys.license)
        .query_async(&mut gw.db.clone())
        .await
        .map_err(|e| Problem::unavailable(format!("cannot read the license from Redis: {e}")))?;
    let get = |i: usize| record.get(i).cloned().flatten();
    let Some(total) = get(0) else {
        return Err(Problem::from_wire(Status::LicenseNotFound, "", (0, 0)));
    };
    let restricted = any_app.iter().any(|f| f.starts_with("application:"));
    if restricted && get(3).as_deref() != Some("1") {
        return Err(Problem::forbidden("this license is not for your application"));
    }
    let seats_total: u64 = total.parse().unwrap_or(0);
    let expires_at_ms = get(2).and_then(|e| e.parse::<u64>().ok()).filter(|&e| e > 0);
    let active = get(1).as_deref() != Some("0") && expires_at_ms.is_none_or(|e| e > now_ms());
    Ok((
        StatusCode::OK,
        Json(LicenseResponse {
            license,
            seats_total,
            seats_used: used,
            seats_free: seats_total.saturating_sub(used),
            waiting,
            active,
            expires_at_ms,
        }),
    ))
}

/// The public keys that verify borrow tokens (RFC 7517).
#[utoipa::path(
    get,
    path = "/.well-known/jwks.json",
    tag = "borrow",
    responses((status = 200, description = "A JWKS document: the Ed25519 keys (`kty` OKP, `alg` EdDSA) that sign borrow tokens", body = Object))
)]
pub(crate) async fn jwks(State(gw): State<Arc<Gateway>>) -> Response {
    let keys = gw
        .signer
        .as_ref()
        .map(|s| s.jwks().clone())
        .unwrap_or_else(|| serde_json::json!({ "keys": [] }));
    Json(keys).into_response()
}
