//! The Rust client's conformance agent: seatgate-client's seat handle
//! driven by JSON lines on stdin, answering JSON lines on stdout (the
//! contract all three clients' agents keep: docs/testing.md, "The client
//! conformance suite"). Diagnostics go to stderr.
//!
//! ```text
//! seatgate-conformance-agent --redis <url> [--application <app>]
//! ```
//! The Redis password, if any, comes from `SEATGATE_REDIS_PASSWORD`.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use seatgate_client::{
    AcquireError, Call, Client, Lease, RedisSettings, Released, Seat, SeatOptions, SeatState,
};
use serde_json::{json, Map, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{watch, Mutex};

/// What `exit` may take in all, releases and close included.
const EXIT_WITHIN: Duration = Duration::from_millis(1800);

/// One line of output, written and flushed at once.
fn say(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// One named seat handle: its seat once held, and whether its acquire ended.
#[derive(Clone)]
struct Handle {
    license: String,
    session: String,
    lease: Lease,
    seat: Arc<Mutex<Option<Seat>>>,
    done: watch::Receiver<bool>,
    /// Aborts the acquire (its undo releases what it may have taken).
    acquiring: tokio::task::AbortHandle,
}

fn args() -> Result<(String, Option<String>), String> {
    let mut it = std::env::args().skip(1);
    let (mut redis, mut app) = (None, None);
    while let Some(a) = it.next() {
        let value = it.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--redis" => redis = Some(value),
            "--application" => app = Some(value),
            _ => return Err(format!("unexpected argument {a}")),
        }
    }
    Ok((redis.ok_or("give --redis <url>")?, app))
}

#[tokio::main]
async fn main() {
    let (url, app) = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("seatgate-conformance-agent: {e}");
            std::process::exit(2);
        }
    };
    let mut redis = RedisSettings {
        url,
        ..RedisSettings::default()
    };
    if let Ok(password) = std::env::var("SEATGATE_REDIS_PASSWORD") {
        redis.password = password.into();
    }
    let mut builder = Client::builder().redis(redis);
    if let Some(app) = app {
        builder = builder.application(app);
    }
    let client = match builder.connect().await {
        Ok(c) => c,
        Err(e) => {
            say(json!({"event": "error", "error": e.to_string()}));
            std::process::exit(3);
        }
    };
    say(json!({"event": "ready"}));
    let mut handles: HashMap<String, Handle> = HashMap::new();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        let cmd: Map<String, Value> = match serde_json::from_str(&line) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                say(json!({"event": "error", "error": "bad JSON: a command is a JSON object"}));
                continue;
            }
            Err(e) => {
                say(json!({"event": "error", "error": format!("bad JSON: {e}")}));
                continue;
            }
        };
        let name = cmd.get("name").and_then(Value::as_str).map(str::to_owned);
        let result = match cmd.get("cmd").and_then(Value::as_str) {
            Some("acquire") => acquire(&client, &cmd, &mut handles),
            Some("release") => release(&cmd, &handles),
            Some("exit") => break,
            other => Err(format!(
                "unknown command {}",
                other.map_or("null".into(), |c| format!("\"{c}\""))
            )),
        };
        if let Err(error) = result {
            let mut v = json!({"event": "error", "error": error});
            if let Some(name) = name {
                v["name"] = name.into();
            }
            say(v);
        }
    }
    exit(client, handles).await;
}

fn text(cmd: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match cmd.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{field} must be a string")),
    }
}

fn number(cmd: &Map<String, Value>, field: &str) -> Result<Option<u64>, String> {
    match cmd.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or(format!("{field} must be a whole number")),
    }
}

fn acquire(
    client: &Client,
    cmd: &Map<String, Value>,
    handles: &mut HashMap<String, Handle>,
) -> Result<(), String> {
    let (Some(name), Some(license)) = (text(cmd, "name")?, text(cmd, "license")?) else {
        return Err("acquire needs \"name\" and \"license\"".into());
    };
    let session = text(cmd, "session")?.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    // The lease is the agent's, so that its exit can take a queued
    // session out of the queue (below) while the acquire is given up.
    let lease = Lease::parse(&uuid::Uuid::new_v4().simple().to_string()).ok_or("cannot make a lease")?;
    let mut call = Call::acquire(&license, &session).with_lease(lease.clone());
    if let Some(user) = text(cmd, "user")? {
        call = call.with_user(user);
    }
    if let Some(group) = text(cmd, "group")? {
        call = call.with_group(group);
    }
    if let Some(p) = number(cmd, "priority")? {
        call = call.with_priority(u8::try_from(p).map_err(|_| "priority must be 0-9")?);
    }
    if let Some(ms) = number(cmd, "borrow_ms")? {
        call = call.with_borrow(Duration::from_millis(ms));
    }
    if let Some(ms) = number(cmd, "wait_ms")? {
        call = call.with_wait(Duration::from_millis(ms));
    }
    let (done_tx, done) = watch::channel(false);
    let seat_slot = Arc::new(Mutex::new(None));
    let slot = seat_slot.clone();
    let client = client.clone();
    let key = name.clone();
    let task = tokio::spawn(async move {
        let queued_name = name.clone();
        let on_queued = move |r: &seatgate_client::Reply| {
            say(json!({"name": queued_name, "event": "queued", "position": r.int("position")}));
        };
        match client
            .acquire_seat_with(&call, &SeatOptions::default(), on_queued)
            .await
        {
            Ok(seat) => {
                say(
                    json!({"name": name, "event": "held", "status": seat.grant().status().as_str(), "session": seat.session()}),
                );
                let mut state = seat.watch();
                *slot.lock().await = Some(seat);
                tokio::spawn(async move {
                    if let Ok(s) = state.wait_for(|s| !matches!(s, SeatState::Held { .. })).await {
                        if let SeatState::Lost { status, error } = &*s {
                            say(
                                json!({"name": name, "event": "lost", "status": status.as_str(), "reason": error}),
                            );
                        }
                    }
                });
            }
            Err(AcquireError::Refused(reply)) => {
                say(
                    json!({"name": name, "event": "refused", "status": reply.status().as_str(), "error": reply.get("error")}),
                );
            }
            Err(e) => say(json!({"name": name, "event": "error", "error": e.to_string()})),
        }
        let _ = done_tx.send(true);
    });
    let handle = Handle {
        license,
        session,
        lease,
        seat: seat_slot,
        done,
        acquiring: task.abort_handle(),
    };
    handles.insert(key, handle);
    Ok(())
}

/// Releases the seat of `handle` (once its acquire has ended): the outcome line.
async fn release_handle(name: String, handle: Handle) {
    let mut done = handle.done.clone();
    let _ = done.wait_for(|d| *d).await;
    let Some(seat) = handle.seat.lock().await.take() else {
        say(json!({"name": name, "event": "released", "outcome": "already_gone", "status": ""}));
        return;
    };
    match seat.release().await {
        Ok(r) => {
            let outcome = match &r {
                Released::Released(_) => "released",
                Released::AlreadyGone(_) => "already_gone",
                _ => "unknown",
            };
            let status = r.status().map_or("", |s| s.as_str());
            say(json!({"name": name, "event": "released", "outcome": outcome, "status": status}));
        }
        Err(e) => say(json!({"name": name, "event": "error", "error": e.to_string()})),
    }
}

fn release(cmd: &Map<String, Value>, handles: &HashMap<String, Handle>) -> Result<(), String> {
    let name = text(cmd, "name")?.ok_or("release needs \"name\"")?;
    let handle = handles
        .get(&name)
        .ok_or(format!("no handle named \"{name}\""))?
        .clone();
    tokio::spawn(release_handle(name, handle));
    Ok(())
}

/// The handle's normal shutdown, all within [`EXIT_WITHIN`], then `exited`:
/// the acquires under way given up (a queued session leaves the queue,
/// first, so that no seat released next is granted to one of them), every
/// held seat released, the client closed.
async fn exit(client: Client, handles: HashMap<String, Handle>) {
    let releases = async {
        for h in handles.values().filter(|h| !*h.done.borrow()) {
            h.acquiring.abort();
            let leave = Call::release(&h.license, &h.session).with_lease(h.lease.clone());
            let _ = client.call(&leave, Duration::from_millis(800)).await;
        }
        for h in handles.values() {
            if let Some(seat) = h.seat.lock().await.take() {
                let _ = seat.release().await;
            }
        }
        let _ = client.close().await;
    };
    if tokio::time::timeout(EXIT_WITHIN, releases).await.is_err() {
        eprintln!("seatgate-conformance-agent: exit: releases still unanswered after {EXIT_WITHIN:?}");
    }
    say(json!({"event": "exited"}));
    std::process::exit(0);
}
