//! `seatgate acquire`, `release` and `heartbeat`: one request through the
//! Rust client, its reply printed as one line (or JSON), exit 0 when it got
//! what it asked for, 1 when refused.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::views::printable;
use seatgate_client::{Call, Reply, SeatOp};
use seatgate_core::policy::RequestPolicy;
use seatgate_core::protocol::Lease;
use seatgate_core::status::Status;

use super::EXIT_REFUSED;

#[derive(Debug, Args)]
pub(super) struct ClientArgs {
    /// License id.
    #[arg(long)]
    license: String,
    /// Session id (one per running copy of the product).
    #[arg(long)]
    session: String,
    /// Session metadata, a JSON object (acquire only).
    #[arg(long, value_name = "JSON")]
    meta: Option<String>,
    /// Wait this long in the license's queue when no seat is free (acquire only), e.g. 30s.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// The lease the seat is bound to, as `acquire` printed it (`lease=…`):
    /// heartbeat and release must send it. With acquire: bind the seat to
    /// this one instead of a new random one (to re-send an acquire).
    /// A lease may start with `-` (its charset has it): taken as the value.
    /// Other users of the machine can read a command line: prefer
    /// SEATGATE_LEASE or --lease-file.
    #[arg(
        long,
        value_name = "LEASE",
        allow_hyphen_values = true,
        env = "SEATGATE_LEASE",
        hide_env_values = true
    )]
    lease: Option<String>,
    /// A file whose first line is the lease (instead of --lease).
    #[arg(long, value_name = "FILE", conflicts_with = "lease")]
    lease_file: Option<std::path::PathBuf>,
    /// The user the seat counts for, under the license's max_per_user (acquire only).
    #[arg(long, value_name = "ID")]
    user: Option<String>,
    /// The group the seat counts for, under the license's group_max and group_reserve (acquire only).
    #[arg(long, value_name = "ID")]
    group: Option<String>,
    /// Place in the queue, 0-9: higher goes first, capped by the license's max_priority (acquire only).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=9))]
    priority: u8,
    /// Borrow the seat: hold it this long without heartbeats, e.g. 3d (acquire only;
    /// at most the license's max_borrow).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    borrow: Option<Duration>,
    /// How long to wait for the reply, e.g. 5s.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The request is decided within this long of reaching Redis or not at
    /// all (answered REQUEST_EXPIRED), e.g. 5s; sent as `ttl_ms`. Default:
    /// the `client.ttl_ms` setting.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// Print the reply as JSON.
    #[arg(long)]
    json: bool,
}

/// Sends `op` as `args` say and prints its reply.
pub(super) async fn client_call(
    settings: &Settings,
    op: SeatOp,
    args: ClientArgs,
) -> Result<ExitCode, Error> {
    let meta = match &args.meta {
        Some(meta) => {
            let parsed: serde_json::Value = serde_json::from_str(meta)
                .map_err(|e| Error::Usage(format!("--meta is not valid JSON: {e}")))?;
            if !parsed.is_object() {
                return Err(Error::Usage(
                    "--meta must be a JSON object, like '{\"user_email\":\"a@b.c\"}'".into(),
                ));
            }
            Some(parsed)
        }
        None => None,
    };
    let text = match &args.lease_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| Error::Usage(format!("--lease-file {}: {e}", path.display())))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned(),
        ),
        None => args.lease.clone(),
    };
    let lease = match &text {
        Some(text) => Some(Lease::parse(text).ok_or_else(|| {
            Error::Usage(
                "the lease (--lease, SEATGATE_LEASE or --lease-file) must be 16 to 128 characters of A-Z a-z 0-9 _ -, as acquire printed it".into(),
            )
        })?),
        None => None,
    };
    let wait_ms = args.wait.map(|d| d.as_millis() as u64).unwrap_or(0);
    if args.ttl == Some(Duration::ZERO) {
        return Err(Error::Usage("--ttl must be longer than 0".into()));
    }
    let call = Call {
        op,
        license: args.license,
        session: args.session,
        meta,
        wait_ms,
        lease,
        policy: RequestPolicy {
            user: args.user,
            group: args.group,
            priority: args.priority,
            borrow_ms: args.borrow.map_or(0, |d| d.as_millis() as u64),
        },
        ttl_ms: None,
    }
    .with_ttl(args.ttl.unwrap_or(Duration::from_millis(settings.client.ttl_ms)));
    let client = settings.client().connect().await?;
    let result = async {
        let mut pending = client.request(&call).await?;
        let first = pending.reply(args.timeout).await?;
        if first.is_final() {
            return Ok(first);
        }
        print_reply(&first, args.json);
        // The final answer (GRANTED or QUEUE_TIMEOUT) carries the same id. A
        // queued acquire may wait for it as long as it asked to; its
        // QUEUE_TIMEOUT may come up to a reaper period (or a slow pass) late.
        // Meanwhile it keeps its place with a waiter heartbeat every third
        // of the heartbeat timeout, and claims a grant with one at once
        // (docs/protocol.md, "Waiter liveness").
        let wait = Duration::from_millis(wait_ms);
        let deadline = tokio::time::Instant::now() + args.timeout + wait + Duration::from_secs(30);
        let alive = Call {
            op: SeatOp::Heartbeat,
            meta: None,
            wait_ms: 0,
            policy: RequestPolicy::NONE,
            ..call.clone()
        };
        let every = first.heartbeat_timeout().unwrap_or(Duration::from_millis(
            settings.sessions.heartbeat_timeout_ms,
        )) / 3;
        let every = every.max(Duration::from_millis(100));
        let last = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(Error::from(seatgate_client::Error::ReplyTimeout(args.timeout + wait)));
            }
            match pending.final_reply(left.min(every)).await {
                Ok(reply) => break reply,
                Err(seatgate_client::Error::ReplyTimeout(_)) => {
                    let _ = client.send(&alive).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        if last.status() == Status::Granted {
            if let Err(e) = client.call(&alive, args.timeout).await {
                eprintln!("granted, but the claiming heartbeat got no answer ({e}); send `seatgate heartbeat` within the claim window, or the seat goes to the next waiter");
            }
        }
        Ok(last)
    }
    .await;
    let _ = client.close().await;
    Ok(answered(&result?, args.json))
}

/// Prints `reply` and gives the exit code it stands for: 0 when the request
/// got what it asked for (a waiting session's heartbeat kept its place:
/// QUEUED), 1 when it was refused.
pub(super) fn answered(reply: &Reply, json: bool) -> ExitCode {
    print_reply(reply, json);
    let kept_waiting = reply.status() == Status::Queued && reply.get("op") == "heartbeat";
    if reply.ok() || kept_waiting {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    }
}

/// Prints `reply` as one line for people, or as JSON.
pub(super) fn print_reply(reply: &Reply, json: bool) {
    if json {
        println!("{}", serde_json::to_string(reply).unwrap_or_default());
        return;
    }
    let get = |field: &str| printable(reply.get(field)).into_owned();
    let mut line = format!(
        "{}  license={} session={} seats={}/{}",
        get("status"),
        get("license"),
        get("session"),
        get("seats_used"),
        get("seats_total")
    );
    for field in [
        "heartbeats",
        "position",
        "waited_ms",
        "priority",
        "linger_ms",
        "borrowed_until_ms",
        "heartbeat_timeout_ms",
    ] {
        if reply.fields.contains_key(field) {
            line.push_str(&format!(" {field}={}", get(field)));
        }
    }
    // The seat (or place) is bound to the lease: later heartbeats and the
    // release need it (`--lease`). A lease is A-Z a-z 0-9 _ -, safe to print.
    let holds = matches!(
        reply.status(),
        Status::Acquired | Status::AlreadyActive | Status::Queued | Status::Granted
    );
    if let (true, Some(lease)) = (holds, reply.lease()) {
        line.push_str(&format!(" lease={}", lease.as_str()));
    }
    if reply.fields.contains_key("error") {
        line.push_str(&format!("  ({})", get("error")));
    }
    println!("{line}");
}
